"""Repeated-signature dispatch: calling one compiled executable again at a few microseconds' cost.

Working out which executable a call needs (flatten the argument trees, build the signature key,
look it up) costs more than running a small model's step. A caller that calls with the same
signature again and again can skip that work: a :class:`Route` is everything needed to run one
executable for one signature (its input dtypes, its device, the function that executes it, the
one that rebuilds the output tree), and a :class:`RouteCache` keeps routes under keys the caller
chooses, so the next call is one dict lookup plus the execution.

Every ``kn.jit`` function has one ``RouteCache`` (``jitted.routes``): ``kn.jit`` itself files a
route for each all-plain-array call signature under the key ``((type, shape, dtype), ...)`` of
its arguments, and ``kn.train`` files the routes of its training steps there under its own keys.
There is one home for cached routes, next to the executable cache they point into.

A caller's key must determine the signature completely: two calls that map to one key must be
calls that ``kn.jit`` would have traced into the same executable. Keys from different callers
never meet as long as each caller's keys have their own shape (``kn.jit``'s are tuples of
``(type, shape, dtype)`` triples; give yours a distinct first element).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaun_ir import tree
from kaun_ir.runtime.xla import transfer

__all__ = ["Route", "RouteCache"]


#: how many distinct sharding objects equal to its own a route remembers (see ``Route.place``): a
#: loop that cycles through device arrays made by ``jax.device_put`` meets one per array
_MAX_EQUAL = 1024


def _first(outs):
    return outs[0]


class Route:
    """How to run one compiled executable for one call signature.

    ``executable``: the :class:`~kaun_ir.runtime.Executable`; ``in_dtypes``: the dtype of each
    flat input; ``out_treedef``: the structure of the result; ``run(device_arrays) -> list``:
    execute on device arrays already placed (see :meth:`place`); ``unflatten(outputs)``: the
    result tree of the flat outputs; ``meta``: whatever the caller that filed the route keeps
    with it (``None`` for ``kn.jit``'s own routes).
    """

    __slots__ = (
        "executable",
        "in_dtypes",
        "out_treedef",
        "run",
        "unflatten",
        "device",
        "meta",
        "_device_type",
        "_sharding",
        "_equal",
    )

    def __init__(self, executable, out_treedef, in_dtypes: list, meta: Any = None):
        self.executable, self.out_treedef, self.in_dtypes = executable, out_treedef, list(in_dtypes)
        self.device = executable.device
        self._sharding = getattr(executable, "sharding", None)  # None on a mesh (see place)
        # sharding objects found equal to ``_sharding``, by id (each kept alive here, so an id
        # is never reused): jax's ``Sharding.__eq__`` is Python (~1 µs), an identity test is not
        self._equal: dict = {}
        self.run: Callable[[list], list] = executable.run
        self.meta = meta
        self._device_type = transfer.array_types()[-1]
        if out_treedef == tree.LEAF:
            self.unflatten = _first
        elif out_treedef[0] == "tuple" and all(d == tree.LEAF for d in out_treedef[1]):
            self.unflatten = tuple
        else:
            self.unflatten = tree.unflattener(out_treedef)

    def with_meta(self, meta: Any) -> Route:
        """A copy of this route carrying ``meta`` (the executable is shared, not copied)."""
        route = Route.__new__(Route)
        for name in Route.__slots__:
            setattr(route, name, getattr(self, name))
        route.meta, route._equal = meta, {}
        return route

    def place(self, arrays, start: int = 0) -> list:
        """``arrays`` (inputs ``start, start+1, ...`` of the executable) as device arrays of the
        input dtypes laid out as the executable takes them (on its device, or sharded over its
        mesh); device arrays already right pass through, others are moved."""
        exe = self.executable
        if self._sharding is None:  # over a mesh, or another compiler's executable (IREE)
            return [exe.put(start + i, a) for i, a in enumerate(arrays)]
        device_type, device, placed, equal = self._device_type, self.device, self._sharding, self._equal
        dtypes = self.in_dtypes[start : start + len(arrays)] if start else self.in_dtypes
        # an array on another device (or sharded over several) is moved, not handed to XLA
        return [
            a
            if type(a) is device_type
            and a.dtype == dt
            and ((s := a.sharding) is placed or equal.get(id(s)) is s or self._same(s))
            else transfer.to_device(a, dt, device)
            for a, dt in zip(arrays, dtypes)
        ]

    def _same(self, sharding) -> bool:
        """Whether ``sharding`` equals the executable's; equal ones are remembered (up to ``_MAX_EQUAL``)."""
        if sharding != self._sharding:
            return False
        if len(self._equal) >= _MAX_EQUAL:
            self._equal.clear()
        self._equal[id(sharding)] = sharding
        return True

    def __call__(self, arrays) -> Any:
        """Run on the flat input arrays (host or device) and return the result tree."""
        return self.unflatten(self.run(self.place(arrays)))


class RouteCache:
    """Routes by caller-chosen hashable keys (see the module docstring for what a key must
    determine). ``get(key)`` is ``None`` for an unknown key."""

    __slots__ = ("_routes", "get")

    def __init__(self):
        self._routes: dict[Any, Route] = {}
        self.get: Callable[[Any], Route | None] = self._routes.get

    def put(self, key: Any, route: Route) -> Route:
        """File ``route`` under ``key`` (replacing any route there) and return it."""
        self._routes[key] = route
        return route

    def clear(self) -> None:
        """Forget every route (the executables stay in their own caches)."""
        self._routes.clear()

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, key: Any) -> bool:
        return key in self._routes

    def __repr__(self) -> str:
        return f"RouteCache({len(self._routes)} routes)"

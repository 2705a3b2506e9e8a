"""Device meshes and partition specs: the data that sharded compilation is described with.

A :class:`Mesh` is an n-dimensional grid of devices with a name per axis; a :class:`Spec` says,
per array dimension, which mesh axes that dimension is split over. Both are plain values; the
jaxlib objects built from them (shardings of result arrays) come from the jaxlib adapter
(:mod:`kaun_ir.runtime.xla.shardings`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.ops.sharding import check_spec
from kaun_ir.runtime.xla import backend


class Spec:
    """A partition spec: one entry per array dimension, each ``None`` (not split), an axis name,
    or a tuple of axis names (split over their product, major to minor). Trailing dimensions
    without an entry are not split. ``Spec("data", None)`` splits dimension 0 over ``"data"``.
    """

    __slots__ = ("dims",)

    def __init__(self, *entries):
        dims = []
        for entry in entries:
            if entry is None:
                dims.append(())
            elif isinstance(entry, str):
                dims.append((entry,))
            elif isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
                dims.append(tuple(entry))
            else:
                raise TypeError(
                    f"a partition spec entry is None, an axis name or a tuple of axis names; got {entry!r}"
                )
        while dims and dims[-1] == ():
            dims.pop()  # Spec("data") == Spec("data", None): both leave dimension 1 unsplit
        self.dims: tuple[tuple[str, ...], ...] = tuple(dims)

    def __eq__(self, other):
        return isinstance(other, Spec) and other.dims == self.dims

    def __hash__(self):
        return hash(("Spec", self.dims))

    def __repr__(self):
        parts = ["None" if not d else repr(d[0]) if len(d) == 1 else repr(d) for d in self.dims]
        return f"Spec({', '.join(parts)})"

    def padded(self, rank: int) -> tuple[tuple[str, ...], ...]:
        """The spec's per-dimension axes for an array of ``rank`` dimensions (unnamed trailing
        dimensions are not split)."""
        return self.dims + ((),) * (rank - len(self.dims))


REPLICATED = Spec()


def _is_jax_spec(value: Any) -> bool:
    """JAX's ``PartitionSpec`` (``jax.P`` in recent releases), recognised without importing jax."""
    return type(value).__module__.split(".")[0] == "jax" and type(value).__name__ in ("PartitionSpec", "P")


def as_spec(value: Any) -> Spec:
    """A :class:`Spec` from a Spec, ``None`` (replicated), a tuple/list of entries, a single axis
    name, or JAX's ``PartitionSpec`` (an iterable of the same entries)."""
    if isinstance(value, Spec):
        return value
    if value is None:
        return REPLICATED
    if isinstance(value, str):
        return Spec(value)
    if isinstance(value, (tuple, list)) or _is_jax_spec(value):
        return Spec(*list(value))
    raise TypeError(
        f"expected a partition spec (kn.sharding.Spec, a tuple of axis names/None, or "
        f"None), got {type(value).__name__}: {value!r}"
    )


class Mesh:
    """Devices arranged in a grid with named axes: ``Mesh((2, 4), ("data", "model"), devices)``.

    ``devices``: the devices in row-major grid order (default: the first ``prod(shape)`` devices
    of the backend, across all processes). Attributes: ``shape`` (tuple), ``axis_names``,
    ``axes`` (``((name, size), ...)``, what the IR records), ``devices`` (NumPy object array of
    the grid), ``size``.
    """

    def __init__(self, shape: Sequence[int], axis_names: Sequence[str], devices: Iterable | None = None):
        shape = tuple(int(s) for s in shape)
        names = tuple(axis_names)
        if len(shape) != len(names):
            raise ValueError(f"mesh shape {shape} has {len(shape)} axes but {len(names)} names {names}")
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"mesh axis names must be distinct non-empty strings, got {names}")
        if any(s <= 0 for s in shape):
            raise ValueError(f"mesh shape {shape} must be positive")
        size = math.prod(shape)
        if devices is None:
            available = backend.global_devices()
            if size > len(available):
                raise ValueError(
                    f"mesh {dict(zip(names, shape))} needs {size} devices, but the {backend.backend_name()} "
                    f"backend has {len(available)}; on the CPU, set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count={size} before the backend starts"
                )
            devices = available[:size]
        devices = list(devices)
        for d in devices:
            if not hasattr(d, "platform") or not hasattr(d, "id"):
                available = ", ".join(str(a) for a in backend.devices())
                raise TypeError(
                    f"mesh {dict(zip(names, shape))}: devices= must hold devices of kn.runtime.devices() "
                    f"(here: {available}), got {d!r:.40}"
                )
        if len(devices) != size:
            raise ValueError(f"mesh {dict(zip(names, shape))} needs {size} devices, got {len(devices)}")
        if len({id(d) for d in devices}) != size:
            raise ValueError("a mesh lists the same device twice")
        grid = np.empty(size, dtype=object)
        grid[:] = devices
        self.shape, self.axis_names, self.size = shape, names, size
        self.devices = grid.reshape(shape)
        self.axes = tuple(zip(names, shape))
        self._key = (self.axes, tuple((d.platform, d.id) for d in devices))

    @property
    def device_list(self) -> list:
        return list(self.devices.flat)

    def __eq__(self, other):
        return isinstance(other, Mesh) and other._key == self._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"Mesh({dict(self.axes)}, {self.devices.flat[0].platform} x{self.size})"

    # -- checks ----------------------------------------------------------------------------------
    def check(self, shape: Sequence[int], spec: Spec, what: str) -> None:
        """Raise ``ShapeError`` unless ``spec`` lays out an array of ``shape`` on this mesh."""
        check_spec(tuple(shape), self.axes, spec.dims, what)

    def shard_shape(self, shape: Sequence[int], spec: Spec) -> tuple[int, ...]:
        """The shape of one device's piece of an array of ``shape`` laid out as ``spec``."""
        sizes = dict(self.axes)
        dims = spec.padded(len(shape))
        return tuple(n // math.prod(sizes[a] for a in axes) for n, axes in zip(shape, dims))


def mesh_of_axes(axes) -> Mesh:
    """The default-device mesh of an IR ``mesh`` attribute (for graphs compiled without a mesh)."""
    return Mesh([s for _, s in axes], [n for n, _ in axes])


def constraint_meshes(graph) -> set:
    """The ``mesh`` attributes of every ``sharding_constraint`` in ``graph`` and its regions."""
    found = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.nodes:
            if node.op == "sharding_constraint":
                found.add(node.attr("mesh"))
            stack.extend(node.regions)
    return found


def check_graph_mesh(graph, mesh: Mesh) -> None:
    """Every constraint in ``graph`` must use ``mesh``'s axes (Shardy partitions over one mesh)."""
    for axes in constraint_meshes(graph):
        if tuple(axes) != mesh.axes:
            raise ShapeError(
                f"a sharding_constraint uses mesh {dict(axes)}, but the function is "
                f"compiled for mesh {dict(mesh.axes)}"
            )


# -- the mesh in scope while tracing (``kn.sharding.constrain`` without an explicit mesh) ------


class _Scope(threading.local):
    """Each thread's stack of meshes in scope (a thread traces with its own)."""

    def __init__(self):
        self.stack: list[Mesh] = []


_SCOPE = _Scope()


def active() -> Mesh | None:
    """The innermost mesh of :func:`use` in this thread, or None."""
    stack = _SCOPE.stack
    return stack[-1] if stack else None


@contextlib.contextmanager
def use(mesh: Mesh | None):
    """Make ``mesh`` the one that constraints without an explicit mesh refer to (None: no change)."""
    if mesh is None:
        yield None
        return
    stack = _SCOPE.stack
    stack.append(mesh)
    try:
        yield mesh
    finally:
        stack.pop()

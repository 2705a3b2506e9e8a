"""``kn.jit``: trace once per input signature, run the pass pipeline, compile, cache, execute."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from kaun_ir import passes, tree
from kaun_ir.runtime import backends, explain, partitioned, sharding_args
from kaun_ir.runtime.compilation import FunctionCache, compile_function
from kaun_ir.runtime.dispatch import Route
from kaun_ir.runtime.executable import Executable
from kaun_ir.runtime.pipelines import jit_pipeline
from kaun_ir.runtime.xla import shardings, transfer
from kaun_ir.surface.tensor import Tensor
from kaun_ir.surface.trace import is_array_leaf, leaf_type


def _raise_if_donated(f, arrays) -> None:
    """After a failed execution: a ``ValueError`` naming the argument whose buffer an earlier call
    consumed (``donate_argnums``), instead of the runtime's "buffer deleted or donated"."""
    for i, array in enumerate(arrays):
        is_deleted = getattr(array, "is_deleted", None)
        if callable(is_deleted) and is_deleted():
            name = getattr(f, "__qualname__", repr(f))
            raise ValueError(
                f"kn.jit({name}): array argument {i} was donated to an earlier call "
                "(donate_argnums) and its buffer is gone; pass the array that call returned "
                "instead of the consumed one"
            ) from None


def _unflattenable(x: Any) -> bool:
    try:
        tree.flatten(x)
    except TypeError:
        return True
    return False


def _unhashable(x: Any) -> bool:
    for leaf in tree.flatten(x)[0]:
        if not is_array_leaf(leaf):
            try:
                hash(leaf)
            except TypeError:
                return True
    return False


class Jitted:
    """A compiled-on-demand function; see :func:`jit`.

    ``trace_count`` counts traces (one per distinct signature); ``lower(*args)`` returns the
    StableHLO and ``graph(*args)`` the optimised IR for a signature.
    """

    def __init__(
        self,
        f: Callable,
        donate_argnums: Sequence[int] = (),
        pipeline=None,
        device=None,
        mesh=None,
        in_shardings=None,
        out_shardings=None,
        backend: str | None = None,
    ):
        if not callable(f):
            raise TypeError(
                f"kn.jit: the function to compile must be callable, got {type(f).__name__} {f!r:.40}"
            )
        if isinstance(donate_argnums, int):
            donate_argnums = (donate_argnums,)
        try:
            bad = [i for i in donate_argnums if isinstance(i, bool) or int(i) != i or int(i) < 0]
        except (TypeError, ValueError):
            bad = [donate_argnums]
        if bad:
            raise TypeError(
                "kn.jit: donate_argnums must be non-negative argument positions (ints), "
                f"got {donate_argnums!r}"
            )
        self.f = f
        self.donate_argnums = tuple(sorted({int(i) for i in donate_argnums}))
        self._pipeline = pipeline  # None, a pipeline string / Pipeline, or a callable giving one
        if device is not None and mesh is not None:
            raise ValueError("kn.jit: give either device= or mesh=, not both")
        if mesh is None and (in_shardings is not None or out_shardings is not None):
            raise ValueError("kn.jit: in_shardings / out_shardings need a mesh= to refer to")
        self.device = device
        self.mesh = mesh
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        if backend is not None:  # an unknown name fails here; None reads $KAUN_IR_BACKEND when compiling
            backend = backends.resolve(backend, "kn.jit: backend")
        self._backend = backend
        #: the compiled routes by signature, and (``routes``) by fast-path key: calls whose
        #: arguments are all plain arrays (no containers, no kwargs) skip tree flattening, keyed
        #: by ``(type, shape, dtype)`` per argument; other callers (``kn.train``) file routes
        #: there too. Creating the wrapper starts nothing: no XLA client, no device lookup.
        self._compiled = FunctionCache()
        self.routes = self._compiled.routes
        functools.update_wrapper(self, f)

    @property
    def trace_count(self) -> int:
        """How many times ``f`` was traced (one per distinct signature)."""
        return self._compiled.trace_count

    def _signature(self, args, kwargs):
        try:
            leaves, treedef = tree.flatten((args, kwargs))
        except TypeError as err:  # a dict whose keys do not sort
            raise TypeError(
                f"{self._name()}: {self._where(args, kwargs, _unflattenable)} holds a dict whose keys "
                f"do not sort ({err})"
            ) from None
        key = [treedef]
        arrays = []
        for leaf in leaves:
            if is_array_leaf(leaf):
                if isinstance(leaf, Tensor):
                    return None, leaves, None
                arrays.append(leaf)
                key.append((tuple(leaf.shape), leaf.dtype) if hasattr(leaf, "dtype") else leaf_type(leaf))
                if self.mesh is not None and self.in_shardings is None:  # inputs keep their layout
                    key.append(shardings.spec_on_mesh(leaf, self.mesh))
            else:
                try:
                    hash(leaf)
                except TypeError:
                    raise TypeError(
                        f"{self._name()}: {self._where(args, kwargs, _unhashable)} is a static (non-array) "
                        f"argument of type {type(leaf).__name__}, which is not hashable: static arguments "
                        "key the compiled code, so pass a hashable value (a tuple, a frozenset) or an array"
                    ) from None
                # NaN != NaN: key it by name so a static NaN does not retrace on every call;
                # 0.0 == -0.0 (and hash alike), but 1 / x tells them apart: the sign is keyed too
                sign = math.copysign(1.0, leaf) if isinstance(leaf, float) else None
                key.append(("static", type(leaf), "nan" if leaf != leaf else leaf, sign))
        return tuple(key), leaves, arrays

    def _name(self) -> str:
        return f"kn.jit({getattr(self.f, '__qualname__', type(self.f).__name__)})"

    @staticmethod
    def _where(args, kwargs, bad: Callable[[Any], bool]) -> str:
        """``args[i]`` or ``kwargs['k']``: the top-level argument for which ``bad`` holds."""
        for i, arg in enumerate(args):
            if bad(arg):
                return f"args[{i}]"
        for name, arg in kwargs.items():
            if bad(arg):
                return f"kwargs[{name!r}]"
        return "an argument"

    def __call__(self, *args, **kwargs):
        if not kwargs:
            try:
                fast_key = tuple([(type(a), a.shape, a.dtype) for a in args])
            except AttributeError:
                fast_key = None
            route = self.routes.get(fast_key)
            if route is not None:
                try:
                    return route.unflatten(route.run(route.place(args)))
                except Exception:
                    _raise_if_donated(self.f, args)
                    raise
        key, leaves, arrays = self._signature(args, kwargs)
        if key is None:  # called inside another trace: trace through (inline)
            return self.f(*args, **kwargs)
        route = self._compiled.get(key) or self._entry(args, kwargs, key)
        if not kwargs and self.mesh is None and all(type(a) in transfer.array_types() for a in args):
            self.routes.put(tuple([(type(a), a.shape, a.dtype) for a in args]), route)
        try:
            return route.unflatten(route.run(route.place(arrays)))
        except Exception:
            _raise_if_donated(self.f, arrays)
            raise

    def route(self, *args, **kwargs) -> tuple[Route | None, list | None]:
        """``(route, arrays)`` for these arguments without executing: the route of their
        signature (traced and compiled on first use) and their array leaves in input order, so
        ``route(arrays)`` is the call. For callers that file the route in :attr:`routes` under
        a key of their own and dispatch themselves (``kn.train``); ``(None, None)`` inside
        another trace."""
        key, leaves, arrays = self._signature(args, kwargs)
        if key is None:
            return None, None
        return self._compiled.get(key) or self._entry(args, kwargs, key), arrays

    @property
    def pipeline(self) -> str:
        """The pipeline the next compilation runs (the environment is read at compile time)."""
        requested = self._pipeline() if callable(self._pipeline) else self._pipeline
        return jit_pipeline(None if requested is None else str(requested), self.backend)

    @property
    def backend(self) -> str:
        """The compiler the next compilation uses: ``"xla"``, ``"iree-cpu"``... (the ``backend=``
        given, else ``$KAUN_IR_BACKEND`` read now, else ``"xla"``)."""
        return self._backend or backends.resolve(None)

    def _entry(self, args, kwargs, key) -> Route:
        """The route of signature ``key``, compiled by exactly one thread; the others wait for it."""
        return self._compiled.entry(key, lambda: self._compile(args, kwargs, key))

    def _compile(self, args, kwargs, key) -> Route:
        pipeline = passes.Pipeline.parse(self.pipeline)  # unknown passes fail before tracing
        if explain.enabled():
            explain.log(
                getattr(self.f, "__qualname__", repr(self.f)),
                self._compiled.trace_count + 1,
                self._compiled.signatures(),
                key,
                args,
                kwargs,
            )
        resolve = None
        if self.mesh is not None:

            def resolve(traced, n_inputs, n_outputs):
                return sharding_args.resolve(self, args, kwargs, traced, n_inputs, n_outputs)

        return compile_function(
            self.f,
            args,
            kwargs,
            pipeline,
            device=self.device,
            mesh=self.mesh,
            donated_positions=lambda positions: self._donated_inputs(args, positions),
            shardings=resolve,
            cache=self._compiled,
            backend=self.backend,
        )

    def _donated_inputs(self, args, positions) -> list[int]:
        if not self.donate_argnums:
            return []
        owner = []  # top-level positional argument of every flat leaf (-1 for kwargs)
        for i, arg in enumerate(args):
            owner += [i] * len(tree.flatten(arg)[0])
        owner += [-1] * (max(positions, default=-1) + 1 - len(owner))
        return [k for k, pos in enumerate(positions) if owner[pos] in self.donate_argnums]

    def graph(self, *args, stage: str = "optimized", **kwargs):
        """The IR for this signature (traces and compiles if needed): ``stage="optimized"`` the
        graph after the pipeline, ``"partitioned"`` that graph with every value's layout on the
        mesh in its type (``f32[8@data,16@model]``, see
        :func:`kaun_ir.runtime.partitioned.partitioned_graph`; needs ``mesh=``)."""
        if stage not in ("optimized", "partitioned"):
            raise ValueError(f"kn.jit(...).graph: stage must be 'optimized' or 'partitioned', got {stage!r}")
        key, _, _ = self._signature(args, kwargs)
        entry = self._compiled.get(key) or self._entry(args, kwargs, key)
        if stage == "partitioned":
            return partitioned.partitioned_graph(entry.executable)
        return entry.executable.graph

    def lower(self, *args, **kwargs) -> str:
        """The StableHLO text for this signature."""
        key, _, _ = self._signature(args, kwargs)
        entry = self._compiled.get(key) or self._entry(args, kwargs, key)
        return entry.executable.mlir

    def executables(self) -> list[Executable]:
        """The executables compiled so far, one per traced signature, oldest first."""
        return [route.executable for route in self._compiled.values()]

    def executable(self, *args, **kwargs) -> Executable:
        """The compiled executable for this signature."""
        key, _, _ = self._signature(args, kwargs)
        return (self._compiled.get(key) or self._entry(args, kwargs, key)).executable


def jit(
    f: Callable | None = None,
    donate_argnums: Sequence[int] = (),
    pipeline=None,
    device=None,
    mesh=None,
    in_shardings=None,
    out_shardings=None,
    backend: str | None = None,
):
    """Compile ``f`` with kaun_ir: trace per input signature, optimise, lower, XLA-compile, cache.

    The signature is the tree structure of the arguments, the shape and dtype of every array
    leaf, and the value of every static (Python scalar / string) leaf. A second call with the
    same signature neither retraces nor recompiles. ``donate_argnums``: positional arguments
    whose buffers XLA may reuse for outputs (the caller must not use them afterwards).
    ``pipeline``: the pass pipeline run before lowering, e.g. ``"cse,dce"`` or ``""`` for none
    (a string, a ``kn.passes.Pipeline``, or a zero-argument callable returning one, called at
    each compilation). Default: ``$KAUN_IR_PIPELINE`` if set when compiling, else
    ``kn.runtime.pipelines.default_jit_pipeline()`` (per backend). ``executable(...).pipeline``
    records what ran.
    Inside another trace, a jitted function is traced through (inlined).

    ``device``: run on this device (default: the first); arrays on another device are moved.
    ``mesh`` (``kn.sharding.mesh``): compile one SPMD program partitioned over the mesh by XLA.
    ``in_shardings``: one entry per positional argument, each None (the array's own layout when
    it is a ``jax.Array`` laid out on ``mesh``, else replicated), a partition spec applied to
    every array leaf of that argument, or a tree of specs/None shaped like the argument.
    ``out_shardings``: a spec for every output, or a tree of specs/None shaped like the result
    (None: XLA's choice). Results are global ``jax.Array``s with ``NamedSharding``s.

    ``backend``: the compiler, ``"xla"`` (default) or ``"iree"`` / ``"iree-cpu"`` / ``"iree-vulkan"``
    / ``"iree-cuda"`` (the extra ``iree``; results are then NumPy arrays, no buffer is donated,
    no mesh); None: ``$KAUN_IR_BACKEND`` when compiling, else XLA (``kaun_ir.runtime.backends``).
    """
    args = (donate_argnums, pipeline, device, mesh, in_shardings, out_shardings, backend)
    if f is None:
        return lambda g: Jitted(g, *args)
    return Jitted(f, *args)

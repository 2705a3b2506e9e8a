"""Training: ``train.step`` is forward + own-IR autodiff + optimiser update in one XLA executable.

::

    trainer = train.make(model, optim.adam(1e-3))
    st = train.init(trainer)                       # inside a kn.rng scope
    loss, st = train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits, y))
    st = train.fit(trainer, st, batches)           # batches yield (x, loss_fn) pairs

One compiled executable per input signature: the tree structure, shapes and dtypes of the
parameters, layer state, optimiser state, ``x``, the arrays the ``loss_fn`` captures, the
``ctx`` arrays, the value of ``training``, and the ``loss_fn``'s code. The arrays a ``loss_fn``
captures — through its closure, its default arguments, the module globals its code names (a
loop at module level), or the bound arguments of a ``functools.partial`` — are *inputs* of the
executable, so a new ``lambda logits: ...`` over new labels of the same shape runs the same
executable. (Arrays it reaches only through other functions or object attributes are read once,
when the step is traced, and baked into the executable: pass them in one of those ways.)

Parameters, layer state and optimiser state are donated: XLA updates them in place, and the
arrays of the ``State`` passed to ``step`` must not be used afterwards (use the returned one).
Randomness (dropout) comes from ``fold_in(state.key, step)`` computed inside the executable from
the optimiser's step counter, so every step draws fresh masks without recompiling.
"""

from __future__ import annotations

import functools
import sys
import time
import types
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

import numpy as np

from . import checkpoint, dtypes, layer, optim, random, rng, tree
from .autodiff import value_and_grad
from .ir.builder import scope as ir_scope
from .trace import is_array_leaf

__all__ = ["Trainer", "State", "EarlyStop", "make", "init", "make_state", "vars", "step", "steps", "fit",
           "predict", "save", "load", "state_to_tree", "state_of_tree", "step_graph", "forward_graph"]


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` callback to end training; ``fit`` returns the state."""


@dataclass(frozen=True, eq=False)
class Trainer:
    """A model and its optimiser (``train.make``); compiled step functions are cached on it."""

    model: layer.Layer
    optimizer: optim.Algorithm
    #: the pass pipeline of the compiled step; None: ``$KAUN_IR_TRAIN_PIPELINE`` when compiling,
    #: else ``kn.passes.default_train_pipeline()``
    pipeline: str | None = None


@dataclass(frozen=True)
class State:
    """Everything that changes during training.

    ``vars``: the model's ``layer.Vars``; ``opt_state``: the optimiser's ``optim.State``;
    ``step``: number of steps taken (Python int); ``key``: the ``uint32[2]`` base key of the
    per-step randomness.
    """

    vars: layer.Vars
    opt_state: Any
    step: int
    key: Any


def make(model: layer.Layer, optimizer: optim.Algorithm, pipeline: str | None = None) -> Trainer:
    """A trainer for ``model`` with ``optimizer`` (e.g. ``optim.adam(1e-3)``).

    ``pipeline``: the pass pipeline run on the training step before lowering (e.g.
    ``"cse,dce"``); by default ``$KAUN_IR_TRAIN_PIPELINE`` if set when the step is compiled, else
    ``kn.passes.default_train_pipeline()``.
    """
    if not isinstance(model, layer.Layer):
        raise TypeError(f"train.make: model must be a kn.layer.Layer, got {type(model).__name__}")
    if not isinstance(optimizer, optim.Algorithm):
        raise TypeError(f"train.make: optimizer must be a kn.optim algorithm, got {type(optimizer).__name__}")
    if pipeline is not None:
        from . import passes

        pipeline = str(passes.Pipeline.parse(pipeline))  # a bad pipeline fails here, not mid-training
    return Trainer(model, optimizer, pipeline)


def _base_key():
    return rng.next_key() if rng.in_scope() else random.key(0)


def make_state(trainer: Trainer, vars: layer.Vars) -> State:
    """A fresh training state around existing (e.g. loaded) variables: new optimiser state,
    step 0, and a base key from the current ``kn.rng`` scope (seed 0 outside any scope)."""
    return State(vars, optim.init(trainer.optimizer, vars.params), 0, _base_key())


def init(trainer: Trainer, dtype=dtypes.float32, example=None) -> State:
    """Initialise the model (randomness from the current ``kn.rng`` scope) and the optimiser.
    ``example`` (an input array or ``kn.ShapeDtype``) fills in the sizes the model's layers left
    out, as in ``layer.init(model, example)``."""
    return make_state(trainer, layer.init(trainer.model, example, dtype))


def vars(st: State) -> layer.Vars:  # noqa: A001 - the API's name
    """The current model variables."""
    return st.vars


# ------------------------------------------------------------------- closure conversion


class _LossSpec:
    """A ``loss_fn`` without its captured arrays: hashable, so it keys the compile cache.

    The captured values of a Python function are its closure cells, its defaults and
    keyword-only defaults, and the module globals its code names directly (a loop at module
    level, ``for xb, yb in ...: train.step(..., lambda logits: ce(logits, yb))``, reads ``yb``
    as a global); those of a ``functools.partial`` are its bound arguments. Their arrays become
    inputs of the executable, everything else is static (part of the key). Two loss functions
    made by the same code over arrays of the same shapes are equal specs.
    """

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"loss_fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.leaves, self.treedef, self.key = [], None, ("object", id(fn))
        self.global_names: tuple = ()
        if isinstance(fn, functools.partial):
            static, contents = ("partial", fn.func), [fn.args, fn.keywords]
        elif isinstance(fn, types.FunctionType):
            try:
                cells = [cell.cell_contents for cell in (fn.__closure__ or ())]
            except ValueError:
                raise ValueError("loss_fn closes over a variable that is not assigned yet") from None
            self.global_names = _array_globals(fn)
            globals_ = [fn.__globals__[name] for name in self.global_names]
            static = ("function", fn.__code__, id(fn.__globals__), self.global_names)
            contents = [cells, fn.__defaults__, fn.__kwdefaults__, globals_]
        else:  # builtins, callable objects: this exact object only
            return
        leaves, treedef = tree.flatten(contents)
        # (type, value): 1, 1.0 and True are equal in Python but may trace differently
        statics = tuple(None if is_array_leaf(leaf) else (type(leaf), leaf) for leaf in leaves)
        try:
            key = (static, treedef, statics)
            hash(key)
        except TypeError:  # unhashable captured values: this exact function object only
            return
        self.leaves, self.treedef, self.key = leaves, treedef, key

    def arrays(self) -> list:
        return [leaf for leaf in self.leaves if is_array_leaf(leaf)]

    def rebuild(self, arrays: list) -> Callable:
        """The loss function with its captured arrays replaced (by traced inputs)."""
        if self.treedef is None:
            return self.fn
        it = iter(arrays)
        leaves = [next(it) if is_array_leaf(leaf) else leaf for leaf in self.leaves]
        contents = tree.unflatten(self.treedef, leaves)
        if isinstance(self.fn, functools.partial):
            args, keywords = contents
            return functools.partial(self.fn.func, *args, **keywords)
        cells, defaults, kwdefaults, globals_ = contents
        namespace = self.fn.__globals__
        if self.global_names:  # a copy of the module namespace with the traced arrays in it
            namespace = dict(namespace)
            namespace.update(zip(self.global_names, globals_))
        fn = types.FunctionType(self.fn.__code__, namespace, self.fn.__name__, defaults,
                                tuple(types.CellType(value) for value in cells))
        fn.__kwdefaults__ = kwdefaults
        return fn

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _LossSpec) and self.key == other.key


def _code_names(code: types.CodeType) -> set:
    """The global names ``code`` and the functions defined inside it may read."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@functools.lru_cache(maxsize=4096)
def _sorted_code_names(code: types.CodeType) -> tuple:
    """``sorted(_code_names(code))``, computed once per code object (a pure function of it)."""
    return tuple(sorted(_code_names(code)))


def _array_globals(fn: types.FunctionType) -> tuple:
    """The module globals named by ``fn``'s code whose value holds arrays (sorted names)."""
    found = []
    for name in _sorted_code_names(fn.__code__):
        value = fn.__globals__.get(name, None)
        if isinstance(value, (types.ModuleType, type)) or callable(value):
            continue
        try:
            leaves = tree.flatten(value)[0]
        except TypeError:  # e.g. a dict with keys that do not sort
            continue
        if any(is_array_leaf(leaf) for leaf in leaves):
            found.append(name)
    return tuple(found)


# ------------------------------------------------------------------------------ the step


def _step_body(trainer: Trainer, params, state, opt_state, key, x, captured, ctx, spec: _LossSpec,
               training: bool, dtype_name: str):
    """One training step, traced: forward, loss, own-IR autodiff, optimiser update."""
    loss_fn = spec.rebuild(captured)
    alg = trainer.optimizer
    count = opt_state[0]
    ctx = dict(ctx)
    with ir_scope("rng"):
        ctx["rng"] = random.fold_in(key, count)
    dtype = dtypes.from_short_name(dtype_name)

    def objective(p):
        y, new_vars = layer.apply(trainer.model, layer.Vars(p, state, dtype), x, training=training, ctx=ctx)
        with ir_scope("loss"):  # the loss's nodes (and their backward) are grouped as "loss"
            value = loss_fn(y)
        shape = getattr(value, "shape", ())
        if tuple(shape) != ():
            raise ValueError(f"loss_fn must return a scalar, returned shape {list(shape)}")
        return value, new_vars.state

    (loss_value, new_state), grads = value_and_grad(objective, has_aux=True)(params)
    new_params, new_opt = optim.update(alg, opt_state, params, grads)
    return loss_value, new_params, new_state, tuple(new_opt)


def _compiled(trainer: Trainer, attr: str, body: Callable, name: str):
    """``body(trainer, ...)`` under ``kn.jit`` with params/state/optimiser state donated, made once
    per trainer and kept on it under ``attr``."""
    compiled = trainer.__dict__.get(attr)
    if compiled is None:
        from . import passes
        from .runtime import jit

        def traced(params, state, opt_state, key, x, captured, ctx, spec, training, dtype_name):
            return body(trainer, params, state, opt_state, key, x, captured, ctx, spec, training, dtype_name)

        traced.__name__ = name
        # resolved at each compilation, so $KAUN_IR_TRAIN_PIPELINE is read at compile time
        pipeline = functools.partial(passes.train_pipeline, trainer.pipeline)
        compiled = jit(traced, donate_argnums=(0, 1, 2), pipeline=pipeline)
        object.__setattr__(trainer, attr, compiled)  # a cache, not a field
    return compiled


def _compiled_step(trainer: Trainer):
    return _compiled(trainer, "_step", _step_body, "train_step")


def _block_body(trainer: Trainer, params, state, opt_state, key, xs, captured, ctx, spec: _LossSpec,
                training: bool, dtype_name: str):
    """``K = xs.shape[0]`` training steps in one ``while`` op: step ``i`` trains on ``xs[i]``
    with the loss function rebuilt over ``captured[j][i]``. Each iteration is exactly
    :func:`_step_body` (its gradient is traced inside the loop body, so the loop itself needs no
    derivative; its dropout key is ``fold_in(key, count)`` with the in-loop step counter)."""
    from .control import fori_loop
    from .indexing import dynamic_slice, dynamic_update_slice
    from .numeric import reshape

    steps = int(xs.shape[0])

    def row(stacked, i):
        shape = tuple(stacked.shape[1:])
        block = dynamic_slice(stacked, [i] + [0] * len(shape), (1,) + shape)
        return reshape(block, shape)

    def body(i, carry):
        p, s, o, losses = carry
        loss_value, p, s, o = _step_body(trainer, p, s, o, key, row(xs, i), [row(c, i) for c in captured],
                                         ctx, spec, training, dtype_name)
        losses = dynamic_update_slice(losses, reshape(loss_value, (1,)), [i])
        return p, s, o, losses

    init = (params, state, opt_state, np.zeros((steps,), np.float32))
    new_params, new_state, new_opt, losses = fori_loop(0, steps, body, init)
    return losses, new_params, new_state, tuple(new_opt)


def _compiled_block(trainer: Trainer):
    return _compiled(trainer, "_block", _block_body, "train_block")


def _stack(arrays: list):
    """The arrays stacked on a new leading axis (NumPy on the host when all are NumPy arrays,
    else one XLA ``stack`` so device arrays stay on the device)."""
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.stack(arrays)
    from .numeric import stack

    return stack(list(arrays))


def _block_step(trainer: Trainer, st: State, batches: list, training: bool, ctx: dict | None):
    """``K`` steps over ``batches`` (``(x, loss_fn)`` pairs) in one executable, or ``None`` when
    they cannot share one block (different shapes or loss-function specs)."""
    specs = [_LossSpec(fn) for _, fn in batches]
    xs = [x for x, _ in batches]
    first = specs[0]
    if first.treedef is None or any(spec != first for spec in specs[1:]):
        return None
    captured = [spec.arrays() for spec in specs]
    sig = lambda arrays: [(tuple(getattr(a, "shape", ())), np.dtype(getattr(a, "dtype", type(a)))) for a in arrays]
    head = sig([xs[0]] + captured[0])
    if any(sig([x] + c) != head for x, c in zip(xs[1:], captured[1:])):
        return None
    stacked = [_stack(list(column)) for column in zip(*captured)]
    return _run_block(trainer, st, _stack(xs), first, stacked, training, ctx)


def _run_block(trainer: Trainer, st: State, xs: Any, spec: _LossSpec, stacked: list, training: bool,
               ctx: dict | None) -> tuple[Any, State]:
    compiled = _compiled_block(trainer)
    v = st.vars
    losses, params, state, opt_state = compiled(v.params, v.state, tuple(st.opt_state), st.key, xs,
                                                stacked, dict(ctx or {}), spec, bool(training),
                                                dtypes.short_name(v.dtype))
    new_opt = optim.state_of_trees(trainer.optimizer, opt_state[0], opt_state[1])
    return losses, State(layer.Vars(params, state, v.dtype), new_opt, st.step + int(xs.shape[0]), st.key)


def steps(trainer: Trainer, st: State, xs: Any, loss_fn: Callable, training: bool = True,
          ctx: dict | None = None) -> tuple[Any, State]:
    """``K = xs.shape[0]`` training steps in ONE executable (a ``while`` loop on the device):
    ``(losses, new_state)`` with ``losses: f32[K]``, equal to ``K`` calls of :func:`step`.

    ``xs: [K, *x.shape]`` holds the ``K`` batches stacked; every array ``loss_fn`` captures
    carries the same leading ``K`` axis (labels ``[K, B]``), and step ``i`` sees row ``i`` of
    each: ``train.steps(tr, st, xs, lambda logits: loss.cross_entropy_sparse(logits, ys))``
    trains on ``(xs[0], ys[0]), ..., (xs[K-1], ys[K-1])``. With device-resident blocks this
    removes the per-step Python dispatch altogether; :func:`fit` with ``steps_per_call=K``
    stacks its batches and calls this. The ``State`` passed in is consumed (donated)."""
    _check_state(st, "steps")
    k = getattr(xs, "shape", (None,))[0] if getattr(xs, "ndim", 0) else None
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"train.steps: xs must be an array with a leading axis of K >= 1 batches, "
                         f"got shape {getattr(xs, 'shape', None)}")
    spec = _LossSpec(loss_fn)
    if spec.treedef is None:  # its arrays cannot be found, so they cannot be sliced per step
        raise ValueError("train.steps: loss_fn must be a plain function or functools.partial whose "
                         "captured arrays carry the K axis (callable objects and closures over "
                         "unhashable values are not supported)")
    stacked = spec.arrays()
    bad = [tuple(np.shape(a)) for a in stacked if not np.ndim(a) or np.shape(a)[0] != k]
    if bad:
        raise ValueError(f"train.steps: every array the loss_fn captures needs a leading axis of K = {k} "
                         f"(one row per step); got shape(s) {bad}")
    return _run_block(trainer, st, xs, spec, stacked, training, ctx)


def _check_state(st, where: str) -> None:
    """``TypeError`` unless ``st`` is a State; ``ValueError`` if a step already consumed it."""
    if not isinstance(st, State):
        raise TypeError(f"train.{where}: st must be a train.State (from train.init), got {type(st).__name__}")
    leaves = tree.flatten(st.vars.params)[0]
    if leaves and callable(getattr(leaves[0], "is_deleted", None)) and leaves[0].is_deleted():
        raise ValueError(f"train.{where}: this train.State was consumed by an earlier train.step (its "
                         "buffers were donated to XLA); use the state that step returned")


def _step_args(st: State, x: Any, spec: _LossSpec, training: bool, ctx: dict | None) -> tuple:
    v = st.vars
    return (v.params, v.state, tuple(st.opt_state), st.key, x, spec.arrays(), dict(ctx or {}), spec,
            bool(training), dtypes.short_name(v.dtype))


def step(trainer: Trainer, st: State, x: Any, loss_fn: Callable, training: bool = True,
         ctx: dict | None = None) -> tuple[Any, State]:
    """One step: ``(loss, new_state)``. ``loss_fn(y_pred) -> scalar`` closes over the batch's
    targets. The ``State`` passed in is consumed (its buffers are donated).

    A ``State`` returned by ``step`` remembers its flattened arrays, so the next step on it skips
    re-flattening (see :class:`_Dispatch`); treat it as immutable (make a new one with
    ``dataclasses.replace`` / :func:`make_state` to change it, never edit its dicts in place)."""
    if not ctx and type(st) is State:
        flat = st.__dict__.get("_flat")
        if flat is not None:
            result = _fast_step(trainer, st, flat, x, loss_fn, training)
            if result is not None:
                return result
    _check_state(st, "step")
    spec = _LossSpec(loss_fn)
    compiled = _compiled_step(trainer)
    args = _step_args(st, x, spec, training, ctx)
    entry, arrays = compiled.entry_for(*args)
    outs = entry.execute(compiled._on_device(arrays, entry))
    loss_value, params, state, opt_state = entry.unflatten(outs)
    new_opt = optim.state_of_trees(trainer.optimizer, opt_state[0], opt_state[1])
    v = st.vars
    new = State(layer.Vars(params, state, v.dtype), new_opt, st.step + 1, st.key)
    if not ctx:
        _record_dispatch(trainer, st, x, loss_fn, training, entry, compiled, outs, new)
    return loss_value, new


# ---------------------------------------------------------------- cheap repeated dispatch


class _Struct:
    """An interned token for the structure, shapes and dtypes of a state's arrays (identity
    compared, so the per-step check is one dict lookup, not a tree walk)."""

    __slots__ = ("description",)

    def __init__(self, description):
        self.description = description


def _struct_of(trainer: Trainer, leaves: list, treedef, dtype_name: str) -> _Struct | None:
    if not all(is_array_leaf(leaf) and hasattr(leaf, "shape") for leaf in leaves):
        return None
    description = (treedef, dtype_name, tuple((tuple(a.shape), np.dtype(a.dtype)) for a in leaves))
    table = trainer.__dict__.setdefault("_structs", {})
    return table.setdefault(description, _Struct(description))


def _state_leaves(st: State) -> tuple[list, Any]:
    v = st.vars
    return tree.flatten((v.params, v.state, tuple(st.opt_state), st.key))


class _Dispatch:
    """One cached signature of ``train.step``: the executable's entry, how to move the inputs to
    the device and the structure token of the state it returns."""

    __slots__ = ("entry", "on_device", "out_struct", "rebuild", "n_state", "tail")

    def __init__(self, entry, on_device, out_struct, n_state):
        self.entry, self.on_device, self.out_struct, self.n_state = entry, on_device, out_struct, n_state
        self.tail = _Inputs(entry, entry.dtypes[n_state:])
        self.rebuild = tree.unflattener(entry.out_treedef)


_STATIC_CELL_TYPES = (int, float, bool, str, type(None), types.FunctionType, types.BuiltinFunctionType,
                      types.ModuleType)


def _fast_fn_key(fn, array_types) -> tuple | None:
    """``(key, captured arrays)`` of a plain closure whose cells are arrays or simple statics and
    which has no defaults and names no global holding arrays; ``None`` otherwise (then the
    general :class:`_LossSpec` path runs). The key determines the ``_LossSpec`` key exactly."""
    if type(fn) is not types.FunctionType or fn.__defaults__ is not None or fn.__kwdefaults__ is not None:
        return None
    arrays, statics = [], []
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            return None
        if type(value) in array_types:
            arrays.append(value)
            statics.append(None)
        elif isinstance(value, _STATIC_CELL_TYPES) and value == value:  # NaN: general path
            statics.append((type(value), value))
        else:
            return None
    namespace = fn.__globals__
    for name in _sorted_code_names(fn.__code__):
        value = namespace.get(name)
        if value is None or isinstance(value, _STATIC_CELL_TYPES) or isinstance(value, type):
            continue
        if callable(value):
            continue
        return None  # a global that might hold arrays: the general path decides
    return (fn.__code__, id(namespace), tuple(statics)), arrays


def _record_dispatch(trainer, st, x, loss_fn, training, entry, compiled, outs, new) -> None:
    """After a general step: remember its entry for the fast path and tag ``new`` with its
    flattened arrays."""
    array_types = compiled._array_types
    fast = _fast_fn_key(loss_fn, array_types)
    if fast is None or type(x) not in array_types:
        return
    fn_key, captured = fast
    dtype_name = dtypes.short_name(st.vars.dtype)
    leaves, treedef = _state_leaves(st)
    in_struct = _struct_of(trainer, leaves, treedef, dtype_name)
    new_leaves, new_def = _state_leaves(new)
    out_struct = _struct_of(trainer, new_leaves, new_def, dtype_name)
    if in_struct is None or out_struct is None:
        return
    sig = ((x.shape, np.dtype(x.dtype)),) + tuple((a.shape, np.dtype(a.dtype)) for a in captured)
    table = trainer.__dict__.setdefault("_dispatch", {})
    table[(in_struct, fn_key, bool(training), sig)] = _Dispatch(entry, compiled._on_device, out_struct,
                                                                len(leaves))
    # the base key is the same every step: move it to the device once, not on every dispatch
    key_dtype = entry.dtypes[len(leaves) - 1:len(leaves)]
    new_leaves[-1] = compiled._on_device([new_leaves[-1]], _Inputs(entry, key_dtype))[0]
    object.__setattr__(new, "_flat", (out_struct, new_leaves))


class _Inputs:
    """Some of an entry's inputs, for ``Jitted._on_device``: the executable and their dtypes."""

    def __init__(self, entry, dtypes_: list):
        self.executable, self.dtypes = entry.executable, dtypes_


def _fast_step(trainer, st, flat, x, loss_fn, training):
    """``train.step`` for a signature seen before on a state returned by ``step``; ``None``
    when anything differs (the general path then runs)."""
    table = trainer.__dict__.get("_dispatch")
    if table is None:
        return None
    struct, leaves = flat
    if leaves and leaves[0].is_deleted():
        return None  # the general path raises the clear error
    compiled = trainer.__dict__["_step"]
    fast = _fast_fn_key(loss_fn, compiled._array_types)
    if fast is None:
        return None
    fn_key, captured = fast
    try:
        sig = ((x.shape, np.dtype(x.dtype)),) + tuple((a.shape, np.dtype(a.dtype)) for a in captured)
    except AttributeError:
        return None
    record = table.get((struct, fn_key, bool(training), sig))
    if record is None:
        return None
    entry = record.entry
    # the state's leaves are outputs of this executable: already on its device, right dtypes
    outs = entry.execute(leaves + record.on_device([x, *captured], record.tail))
    loss_value, params, state, (count, trees) = record.rebuild(outs)
    new = State(layer.Vars(params, state, st.vars.dtype), optim.State(count, trees), st.step + 1, st.key)
    new_leaves = outs[1:]
    new_leaves.append(leaves[-1])  # the base key, already on the device
    object.__setattr__(new, "_flat", (record.out_struct, new_leaves))
    return loss_value, new


def step_graph(trainer: Trainer, st: State, x: Any, loss_fn: Callable, training: bool = True,
               ctx: dict | None = None, optimized: bool = False):
    """The IR of the training step for these inputs: as traced (forward, the autodiff pass's
    backward and the optimiser update in one graph) or, with ``optimized=True``, after the
    pipeline that runs before lowering. Nothing is executed and ``st`` is not consumed."""
    _check_state(st, "step_graph")
    compiled = _compiled_step(trainer)
    args = _step_args(st, x, _LossSpec(loss_fn), training, ctx)
    if optimized:
        return compiled.graph(*args)
    from .trace import trace_flat

    return trace_flat(compiled.f, args, {}).graph


def forward_graph(trainer: Trainer, st: State, x: Any, training: bool = False, ctx: dict | None = None):
    """The traced IR of the model's forward pass alone."""
    _check_state(st, "forward_graph")
    from .trace import trace

    def forward(params, state, x):
        return layer.apply(trainer.model, layer.Vars(params, state, st.vars.dtype), x,
                           training=training, ctx=ctx)[0]

    return trace(forward, st.vars.params, st.vars.state, x)


# ------------------------------------------------------------------------------- the loop


class _Progress:
    """A one-line progress bar on a terminal (stderr); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.perf_counter()

    def update(self, count: int, loss_value: Callable[[], float], final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.1:
            return
        self.last = now
        rate = count / max(now - self.start, 1e-9)
        if self.total:
            width = 24
            filled = int(width * count / self.total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {count}/{self.total}"
        else:
            bar = f"step {count}"
        sys.stderr.write(f"\r{bar}  loss {loss_value():.4f}  {rate:.1f} steps/s")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def fit(trainer: Trainer, st: State, data: Iterable, report: Callable | None = None,
        ctx: dict | None = None, progress: bool | None = None, steps_per_call: int = 1) -> State:
    """Run :func:`step` over ``data``, an iterable (e.g. a ``kn.data`` pipeline) of
    ``(x, loss_fn)`` pairs; returns the final state.

    A ``kn.data`` pipeline is ``reset()`` first, so calling ``fit`` once per epoch works.
    ``report(step=, loss=, state=)`` is called after each step (1-based ``step`` counts the
    steps of this call; ``loss`` is a Python float); raising :class:`EarlyStop` inside it ends
    training and returns the state at that point. A progress bar with the running loss is shown
    when stderr is a terminal (``progress=`` forces it on or off).

    ``steps_per_call=K > 1`` fuses training: ``K`` consecutive batches with the same shapes and
    the same loss-function code are stacked (``xs: [K, *x.shape]``, each captured array
    likewise) and ``K`` steps run inside ONE executable (a ``while`` loop), giving the same
    result as ``K`` single steps (one executable per block signature). ``report`` is then
    called for each of the ``K`` steps afterwards, in order, with that step's loss and the
    state *after the whole block*; :class:`EarlyStop` is honoured at block granularity: the
    steps of the block already ran and stay applied (no roll-back), and the remaining reports
    of the block are skipped. A final partial block (fewer than ``K`` batches left), or a
    block whose batches differ in shapes or loss code, runs as single steps.
    """
    _check_state(st, "fit")
    if isinstance(steps_per_call, bool) or not isinstance(steps_per_call, int) or steps_per_call < 1:
        raise ValueError(f"train.fit: steps_per_call must be an int >= 1, got {steps_per_call!r}")
    if hasattr(data, "reset"):
        data.reset()
    total = None
    try:
        total = len(data)  # type: ignore[arg-type]
    except TypeError:
        pass
    bar = _Progress(total, sys.stderr.isatty() if progress is None else progress)
    last_loss = None
    count = 0
    pending: list = []

    def run_single(batch) -> bool:
        """One step; ``False`` when ``report`` asked to stop."""
        nonlocal st, last_loss, count
        last_loss, st = step(trainer, st, batch[0], batch[1], ctx=ctx)
        count += 1
        if report is not None:
            try:
                report(step=count, loss=float(last_loss), state=st)
            except EarlyStop:
                return False
        bar.update(count, lambda: float(last_loss))
        return True

    def run_block(batches) -> bool:
        nonlocal st, last_loss, count
        result = _block_step(trainer, st, batches, True, ctx)
        if result is None:  # the batches cannot share a block: single steps
            return all(run_single(batch) for batch in batches)
        losses, st = result
        host = np.asarray(losses)
        last_loss, start = host[-1], count
        for value in host:
            count += 1
            if report is not None:
                try:
                    report(step=count, loss=float(value), state=st)
                except EarlyStop:
                    count = start + len(host)  # every step of the block ran
                    return False
        bar.update(count, lambda: float(last_loss))
        return True

    stopped = False
    for item in data:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError("train.fit: data must yield (x, loss_fn) pairs")
        if steps_per_call == 1:
            if not run_single(item):
                stopped = True
                break
            continue
        pending.append(item)
        if len(pending) == steps_per_call:
            batches, pending = pending, []
            if not run_block(batches):
                stopped = True
                break
    if not stopped:
        for item in pending:  # the final partial block
            if not run_single(item):
                break
    if count:
        bar.update(count, lambda: float(last_loss), final=True)
    return st


def predict(trainer: Trainer, st: State, x: Any, ctx: dict | None = None) -> Any:
    """Inference (``training=False``): the model's output only."""
    _check_state(st, "predict")
    return layer.apply(trainer.model, st.vars, x, training=False, ctx=ctx)[0]


# ------------------------------------------------------------------------------ checkpoints


def state_to_tree(st: State) -> dict:
    """A plain tree of the whole training state (for ``kn.checkpoint``)."""
    count, trees = optim.state_to_trees(st.opt_state)
    return {"params": st.vars.params, "state": st.vars.state,
            "optimizer": {"count": count, "trees": list(trees)},
            "step": np.asarray(st.step, np.int64), "key": st.key}


def state_of_tree(trainer: Trainer, data: dict, dtype=None) -> State:
    """Inverse of :func:`state_to_tree`."""
    dt = dtypes.canonical(dtype) if dtype is not None else _dtype_of_params(data["params"])
    opt = optim.state_of_trees(trainer.optimizer, data["optimizer"]["count"], tuple(data["optimizer"]["trees"]))
    return State(layer.Vars(data["params"], data["state"], dt), opt, int(np.asarray(data["step"])),
                 data["key"])


def _dtype_of_params(params) -> np.dtype:
    for leaf in tree.flatten(params)[0]:
        if hasattr(leaf, "dtype") and dtypes.is_float(leaf.dtype):
            return np.dtype(leaf.dtype)
    return dtypes.float32


def save(path: str, st: State) -> None:
    """Write the whole training state (parameters, layer state, optimiser state, step, key)
    atomically as SafeTensors."""
    _check_state(st, "save")
    checkpoint.save(path, state_to_tree(st))


def load(path: str, trainer: Trainer, like: State) -> State:
    """Read a state written by :func:`save`; ``like`` (e.g. ``train.init(trainer)``) gives the
    structure, shapes and dtypes. Resuming gives bit-for-bit the same run as not stopping."""
    data = checkpoint.load(path, like=state_to_tree(like))
    return replace(state_of_tree(trainer, data, like.vars.dtype))

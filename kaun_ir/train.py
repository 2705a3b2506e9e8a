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
from .trace import is_array_leaf

__all__ = ["Trainer", "State", "EarlyStop", "make", "init", "make_state", "vars", "step", "fit",
           "predict", "save", "load", "state_to_tree", "state_of_tree", "step_graph", "forward_graph"]


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` callback to end training; ``fit`` returns the state."""


@dataclass(frozen=True, eq=False)
class Trainer:
    """A model and its optimiser (``train.make``); compiled step functions are cached on it."""

    model: layer.Layer
    optimizer: optim.Algorithm
    #: the pass pipeline of the compiled step; None: ``$KAUN_IR_TRAIN_PIPELINE`` when compiling,
    #: else ``kn.passes.DEFAULT_TRAIN_PIPELINE``
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
    ``kn.passes.DEFAULT_TRAIN_PIPELINE``.
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


def init(trainer: Trainer, dtype=dtypes.float32) -> State:
    """Initialise the model (randomness from the current ``kn.rng`` scope) and the optimiser."""
    return make_state(trainer, layer.init(trainer.model, dtype))


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


def _array_globals(fn: types.FunctionType) -> tuple:
    """The module globals named by ``fn``'s code whose value holds arrays (sorted names)."""
    found = []
    for name in sorted(_code_names(fn.__code__)):
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
    ctx["rng"] = random.fold_in(key, count)
    dtype = dtypes.from_short_name(dtype_name)

    def objective(p):
        y, new_vars = layer.apply(trainer.model, layer.Vars(p, state, dtype), x, training=training, ctx=ctx)
        value = loss_fn(y)
        shape = getattr(value, "shape", ())
        if tuple(shape) != ():
            raise ValueError(f"loss_fn must return a scalar, returned shape {list(shape)}")
        return value, new_vars.state

    (loss_value, new_state), grads = value_and_grad(objective, has_aux=True)(params)
    new_params, new_opt = optim.update(alg, opt_state, params, grads)
    return loss_value, new_params, new_state, tuple(new_opt)


def _compiled_step(trainer: Trainer):
    compiled = trainer.__dict__.get("_step")
    if compiled is None:
        from .runtime import jit

        def train_step(params, state, opt_state, key, x, captured, ctx, spec, training, dtype_name):
            return _step_body(trainer, params, state, opt_state, key, x, captured, ctx, spec,
                              training, dtype_name)

        from . import passes

        # resolved at each compilation, so $KAUN_IR_TRAIN_PIPELINE is read at compile time
        pipeline = functools.partial(passes.train_pipeline, trainer.pipeline)
        compiled = jit(train_step, donate_argnums=(0, 1, 2), pipeline=pipeline)
        object.__setattr__(trainer, "_step", compiled)  # a cache, not a field
    return compiled


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
    targets. The ``State`` passed in is consumed (its buffers are donated)."""
    _check_state(st, "step")
    spec = _LossSpec(loss_fn)
    compiled = _compiled_step(trainer)
    v = st.vars
    loss_value, params, state, opt_state = compiled(*_step_args(st, x, spec, training, ctx))
    new_opt = optim.state_of_trees(trainer.optimizer, opt_state[0], opt_state[1])
    return loss_value, State(layer.Vars(params, state, v.dtype), new_opt, st.step + 1, st.key)


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
        ctx: dict | None = None, progress: bool | None = None) -> State:
    """Run :func:`step` over ``data``, an iterable (e.g. a ``kn.data`` pipeline) of
    ``(x, loss_fn)`` pairs; returns the final state.

    A ``kn.data`` pipeline is ``reset()`` first, so calling ``fit`` once per epoch works.
    ``report(step=, loss=, state=)`` is called after each step (1-based ``step`` counts the
    steps of this call; ``loss`` is a Python float); raising :class:`EarlyStop` inside it ends
    training and returns the state at that point. A progress bar with the running loss is shown
    when stderr is a terminal (``progress=`` forces it on or off).
    """
    _check_state(st, "fit")
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
    for item in data:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise TypeError("train.fit: data must yield (x, loss_fn) pairs")
        x, loss_fn = item
        last_loss, st = step(trainer, st, x, loss_fn, ctx=ctx)
        count += 1
        if report is not None:
            try:
                report(step=count, loss=float(last_loss), state=st)
            except EarlyStop:
                break
        bar.update(count, lambda: float(last_loss))
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

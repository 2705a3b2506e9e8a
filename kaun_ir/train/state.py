"""The records of training: a :class:`Trainer` (what to train, how) and a :class:`State` (what
changes from step to step), with the functions that make them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kaun_ir import dtypes, layer, optim, passes, ptree, rng, tree
from kaun_ir.layer.given import check_given, expected_vars
from kaun_ir.precision import as_policy as as_precision_policy
from kaun_ir.precision import loss_scaled
from kaun_ir.runtime.backends import resolve as resolve_backend
from kaun_ir.sharding.pipeline import Pipeline
from kaun_ir.sharding.policy import check_training_layout, place_state
from kaun_ir.sharding.stages import locate as locate_run
from kaun_ir.surface import random
from kaun_ir.transforms.remat import as_policy as as_remat_policy

__all__ = [
    "Trainer",
    "State",
    "TrainerCache",
    "make",
    "init",
    "make_state",
    "vars",
    "check_state",
    "describe_optimizer",
    "successor",
]


class TrainerCache:
    """What a trainer compiles and remembers, kept apart from its (immutable) definition.

    ``step`` / ``block``: the ``kn.jit`` functions of the single step and of ``train.steps``
    (None until first used); their ``routes`` hold the fast-dispatch routes of repeated steps.
    ``structs``: interned tokens of state structures. ``opaque``: keys of closure-form loss
    functions found to read arrays that cannot be lifted to inputs (they take the probing path).
    ``output_types``: the model's output types per input signature (for that path).
    """

    __slots__ = ("step", "block", "structs", "opaque", "output_types")

    def __init__(self):
        self.step = None
        self.block = None
        self.structs: dict = {}
        self.opaque: set = set()
        self.output_types: dict = {}

    def __repr__(self) -> str:
        traced = [name for name in ("step", "block") if getattr(self, name) is not None]
        return f"TrainerCache(compiled={traced})"


@dataclass(frozen=True, eq=False)
class Trainer:
    """A model, its optimiser and (in the explicit form) its loss: see :func:`make`.

    Compared by identity. ``cache`` holds what was compiled for it (a :class:`TrainerCache`);
    ``dataclasses.replace`` gives a trainer with a fresh, empty cache.
    """

    model: layer.Layer
    optimizer: optim.Algorithm
    #: ``loss(outputs, *targets) -> scalar`` (explicit form), or None (closure form)
    loss: Callable | None = None
    #: the pass pipeline of the compiled step; None: ``$KAUN_IR_TRAIN_PIPELINE`` when compiling,
    #: else ``kn.runtime.pipelines.default_train_pipeline()``
    pipeline: str | None = None
    #: the device mesh the step is partitioned over (``kn.sharding.mesh``), or None: one device
    mesh: Any = None
    #: the mesh axis the batch is split over (data parallelism); None on a mesh of stages alone
    data_axis: str | None = "data"
    #: how parameters and optimiser state are laid out on the mesh (see ``kn.sharding_policy``)
    param_sharding: Any = None
    #: ``(RematPolicy, depth)`` when the step rematerialises (``make(remat=...)``); None: the
    #: automatic default (see ``make``); False: never
    remat: Any = None
    #: the ``kn.precision.Policy`` of the step (``make(precision=...)``), else None
    precision: Any = None
    #: the number of micro-batches a step's batch is split into (``make(accumulate=N)``)
    accumulate: int = 1
    #: the ``kn.sharding.pipeline(...)`` layout when the step is pipeline parallel, else None
    stages: Any = None
    backend: str | None = None  #: the step's compiler (None: $KAUN_IR_BACKEND, else XLA), "iree-cpu"...
    cache: TrainerCache = field(default_factory=TrainerCache, init=False, repr=False, compare=False)


class StateCache:
    """Per-state dispatch memo: ``flat`` is ``(struct token, flat device arrays)`` for a state
    returned by ``train.step`` (so the next step skips flattening it), else None."""

    __slots__ = ("flat",)

    def __init__(self):
        self.flat = None


@dataclass(frozen=True)
class State:
    """Everything that changes during training.

    ``vars``: the model's ``layer.Vars``; ``opt_state``: the optimiser's ``optim.State``;
    ``step``: number of steps taken (Python int); ``key``: the ``uint32[2]`` base key of the
    per-step randomness; ``optimizer``: which optimiser the state belongs to (see
    :func:`describe_optimizer`; ``""`` when unknown), recorded by checkpoints so that a state is
    never resumed under another optimiser. Treat it as immutable: make changed copies with
    ``dataclasses.replace`` (the copy starts with an empty ``cache``).
    """

    vars: layer.Vars
    opt_state: Any
    step: int
    key: Any
    optimizer: str = ""
    cache: StateCache = field(default_factory=StateCache, init=False, repr=False, compare=False)


_new_object = object.__new__
_set_field = object.__setattr__


def successor(
    st: State, params: Any, state: Any, opt_state: Any, steps_taken: int, flat: Any = None
) -> State:
    """The state after ``steps_taken`` steps from ``st``: ``params``, layer ``state`` and
    ``opt_state`` replaced, the dtype, base key and optimiser description kept, and ``flat`` (see
    :class:`StateCache`) in its cache. Built field by field, without the dataclasses'
    ``__init__``: every field comes from a state already made, so there is nothing to check, and
    on the per-step dispatch path of a small model the generated constructors cost as much as a
    few kernels."""
    v = _new_object(layer.Vars)
    _set_field(v, "__dict__", {"params": params, "state": state, "dtype": st.vars.dtype})
    cache = StateCache()
    cache.flat = flat
    new = _new_object(State)
    _set_field(
        new,
        "__dict__",
        {
            "vars": v,
            "opt_state": opt_state,
            "step": st.step + steps_taken,
            "key": st.key,
            "optimizer": st.optimizer,
            "cache": cache,
        },
    )
    return new


def _check_pieces(model: Any, optimizer: Any, loss: Any) -> None:
    """``TypeError`` unless ``train.make`` got a layer, an optimiser and a callable loss (or None)."""
    if not isinstance(model, layer.Layer):
        raise TypeError(f"train.make: model must be a kn.layer.Layer, got {type(model).__name__}")
    if not isinstance(optimizer, optim.Algorithm):
        raise TypeError(f"train.make: optimizer must be a kn.optim algorithm, got {type(optimizer).__name__}")
    if loss is not None and not callable(loss):
        raise TypeError(
            f"train.make: loss must be a function loss(outputs, *targets) -> scalar, got "
            f"{type(loss).__name__}"
        )


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"train.make: {name} must be a positive int, got {value!r}")
    return value


def _check_accumulate(accumulate: int, loss: Any, stages: Any) -> None:
    """Gradient accumulation splits the targets, so it needs ``loss=``, and no pipeline schedule
    that splits the batch itself."""
    if accumulate > 1 and loss is None:
        raise ValueError(
            "train.make: accumulate= splits the targets into micro-batches, so it needs the explicit "
            "form: train.make(model, optimizer, loss=fn, accumulate=N)"
        )
    if accumulate > 1 and stages is not None:
        raise ValueError(
            "train.make: accumulate= and a pipeline-parallel pipeline= both split the batch into "
            "micro-batches; give the pipeline more microbatches instead"
        )


def make(
    model: layer.Layer,
    optimizer: optim.Algorithm,
    loss: Callable | None = None,
    *,
    pipeline: Any = None,
    mesh: Any = None,
    data_axis: str = "data",
    param_sharding: Any = None,
    remat: Any = None,
    remat_depth: int = 1,
    precision: Any = None,
    accumulate: int = 1,
    backend: str | None = None,
) -> Trainer:
    """A trainer for ``model`` with ``optimizer`` (e.g. ``optim.adam(1e-3)``).

    ``loss``: ``loss(outputs, *targets) -> scalar``, the explicit-targets form (preferred):
    ``train.step(trainer, st, x, *targets)`` passes the targets as ordinary inputs of the
    compiled step. Without it, each ``train.step`` takes a loss closure ``loss_fn(outputs)``.
    ``pipeline``: the pass pipeline run on the training step before lowering (e.g.
    ``"cse,dce"``); by default ``$KAUN_IR_TRAIN_PIPELINE`` if set when the step is compiled, else
    ``kn.runtime.pipelines.default_train_pipeline()``. ``pipeline=kn.sharding.pipeline(stages=S,
    microbatches=M, schedule=...)`` instead makes the step pipeline parallel: the model's run of
    identical blocks split over the mesh's ``stage`` axis (see ``kaun_ir.sharding.stages``).

    ``mesh`` (``kn.sharding.mesh``): train on every device of the mesh, one SPMD program
    partitioned by XLA. The batch (``x`` and the targets) is split along its first dimension
    over ``data_axis``; ``param_sharding`` lays out parameters and optimiser state: ``None``
    (replicated: data parallelism, XLA all-reduces the gradients), ``"fsdp"`` (split along
    ``data_axis``: FSDP / ZeRO-3), or a rule table of ``(path pattern, spec)`` pairs /
    ``kn.sharding.rules(table, fsdp=...)`` (tensor parallelism, see ``kn.sharding``). In a
    multi-process run (``kn.distributed``) ``x`` and the targets are this process's rows.

    ``remat``: a rematerialisation policy (``"nothing"``, ``"dots"``, a list of layer-path
    patterns to save, or a ``kn.RematPolicy``; see docs/memory.md): the forward values of each
    layer at depth ``remat_depth`` of the layer path (``1``: the model's top-level layers, e.g.
    the blocks of a ``sequential``) are recomputed in the backward pass instead of kept.
    ``None`` (the default) applies ``"dots"`` on one device, with the default pipeline, when the
    step's residuals are large (``kaun_ir.train.step_memory``: the segments are chosen from the
    graph); ``False`` never rematerialises.

    ``precision``: ``"bfloat16"``, ``"float16"`` or a ``kn.precision.Policy``: matrix products
    of the step in that dtype, parameters and optimiser state float32; ``"float16"`` adds
    dynamic loss scaling (the trainer's optimizer then keeps two more slots, ``loss_scale`` and
    ``finite_steps``; a step with a non-finite gradient only halves the scale). See docs/memory.md.

    ``accumulate=N``: gradient accumulation inside the compiled step (explicit form only). The
    batch (``x`` and every target, leading size a multiple of ``N``) is split into ``N``
    micro-batches run in a loop on the device; their gradients are averaged and the optimiser
    updates once: for a mean loss the whole-batch step up to rounding, with one micro-batch's
    activation memory. The loss reported is the micro-batches' mean; layer state is threaded
    through them; dropout draws from ``fold_in(step key, i)`` for micro-batch ``i``.

    ``backend``: the step's compiler, as ``kn.jit``'s (``"iree"``: IREE on this CPU; no mesh).
    """
    _check_pieces(model, optimizer, loss)
    stages = None
    if isinstance(pipeline, Pipeline):
        stages, pipeline = pipeline, None
    if pipeline is not None:
        pipeline = str(passes.Pipeline.parse(pipeline))  # a bad pipeline fails here, not mid-training
    if mesh is not None:  # a mesh of pipeline stages alone has no data axis: data_axis becomes None
        data_axis = check_training_layout(mesh, data_axis, param_sharding, stages)
    elif param_sharding is not None:
        raise ValueError("train.make: param_sharding needs a mesh= to lay parameters out on")
    if remat is not None and remat is not False:
        remat = (as_remat_policy(remat), _positive_int(remat_depth, "remat_depth"))
    if precision is not None:
        precision = as_precision_policy(precision)
        if precision.loss_scale is not None:
            optimizer = loss_scaled(optimizer, precision)
    _check_accumulate(_positive_int(accumulate, "accumulate"), loss, stages)
    backend = None if backend is None else resolve_backend(backend, "train.make: backend")
    fields = (pipeline, mesh, data_axis, param_sharding, remat, precision, accumulate, stages, backend)
    return Trainer(model, optimizer, loss, *fields)


def _base_key():
    return rng.next_key() if rng.in_scope() else random.key(0)


def describe_optimizer(alg: optim.Algorithm) -> str:
    """What identifies an optimiser's state: its name and slot names, e.g. ``"adam(mu,nu)"``,
    ``"chain(1.mu,1.nu)"`` (hyper-parameters such as the learning rate may change on resume)."""
    return f"{alg.name}({','.join(alg.slots)})"


def make_state(trainer: Trainer, vars: layer.Vars) -> State:
    """A fresh training state around existing (e.g. loaded) variables: new optimiser state,
    step 0, and a base key from the current ``kn.rng`` scope (seed 0 outside any scope). On a
    trainer's mesh, parameters and optimiser state are laid out as the trainer says."""
    if trainer.stages is not None:  # a model the pipeline cannot split is refused here, not mid-step
        locate_run(trainer.stages.stages, trainer.model, vars.params, vars.state)
    opt_state = optim.init(trainer.optimizer, vars.params)
    if trainer.mesh is not None:
        params, opt_state = place_state(
            trainer.mesh, trainer.param_sharding, trainer.data_axis, vars.params, opt_state
        )
        vars = layer.Vars(params, vars.state, vars.dtype)
    return State(vars, opt_state, 0, _base_key(), describe_optimizer(trainer.optimizer))


def init(trainer: Trainer, dtype=dtypes.float32, example=None, vars: Any = None) -> State:  # noqa: A002
    """Initialise the model (randomness from the current ``kn.rng`` scope) and the optimiser.
    ``example`` (an input array or ``kn.ShapeDtype``) fills in the sizes the model's layers left
    out, as in ``layer.init(model, example)``.

    ``vars``: start from given weights instead (fine-tuning): a ``layer.Vars``, anything with a
    ``.vars`` (``kn.models.from_pretrained``'s result), or a parameter tree alone (from
    ``checkpoint.load``, another framework ...; the layer state is then the model's fresh one).
    They are checked against the tree the model's ``init`` makes (traced abstractly, nothing
    runs): a missing or extra path, or a shape that differs, is a ``kn.ShapeError`` naming the
    path and both shapes; a leaf that is not a float array where the model has one, or a host
    array holding NaN or inf, is refused too. The given arrays are used as they are (``dtype`` is
    theirs; a float64 tree needs ``dtype=kn.float64``, so NumPy's default float type never turns
    the whole step into float64 unasked); the optimiser state is fresh and the step count 0."""
    if vars is None:
        return make_state(trainer, layer.init(trainer.model, example, dtype))
    return make_state(trainer, _given_vars(trainer, vars, example, dtype))


def _given_vars(trainer: Trainer, given: Any, example: Any, requested: Any) -> layer.Vars:
    if not isinstance(given, layer.Vars) and isinstance(getattr(given, "vars", None), layer.Vars):
        given = given.vars  # e.g. kn.models.from_pretrained(...)
    if isinstance(given, layer.Vars):
        params, state, dtype = given.params, given.state, given.dtype
    elif isinstance(given, (dict, list, tuple)):
        params, state, dtype = given, None, _float_dtype_of(given, requested)
    else:
        raise TypeError(
            "train.init: vars must be a layer.Vars, a parameter tree (dict / list of arrays) or a "
            f"model from kn.models.from_pretrained, got {type(given).__name__}"
        )
    want_params, want_state = expected_vars(trainer.model, example, dtype)
    check_given(trainer.model, WHO, "parameters", want_params, params)
    if state is None:
        state = layer.init(trainer.model, example, dtype).state if tree.flatten(want_state)[0] else want_state
    else:
        check_given(trainer.model, WHO, "layer state", want_state, state)
    return layer.Vars(params, state, dtype)


WHO = "train.init(vars=...)"


def _float_dtype_of(params: Any, requested: Any) -> Any:
    """The one float dtype of the given parameters. float64 only when asked for with ``dtype=``
    (a NumPy float64 tree is a common accident: it would turn the whole step into float64)."""
    found = {}
    for path, leaf in ptree.flatten_with_paths(params):
        dt = getattr(leaf, "dtype", None)
        if dt is not None and dtypes.is_float(dtypes.canonical(dt)):
            found.setdefault(dtypes.canonical(dt), path)
    if len(found) > 1:
        named = ", ".join(f"{dtypes.short_name(d)} at {p!r}" for d, p in found.items())
        raise TypeError(f"{WHO}: the parameters mix float dtypes ({named}); convert them to one")
    dtype = next(iter(found), dtypes.float32)
    if dtype == dtypes.float64 and dtypes.canonical(requested) != dtypes.float64:
        raise TypeError(
            f"{WHO}: the parameters are float64 (e.g. {found[dtype]!r}) but the state would be "
            f"{dtypes.short_name(requested)}; convert them (np.asarray(w, np.float32)) or ask for "
            "float64 training with train.init(trainer, dtype=kn.float64, vars=...)"
        )
    return dtype


def vars(st: State) -> layer.Vars:  # noqa: A001 - the API's name
    """The current model variables."""
    return st.vars


def check_state(st: Any, where: str) -> None:
    """``TypeError`` unless ``st`` is a State; ``ValueError`` if a step already consumed it."""
    if not isinstance(st, State):
        raise TypeError(f"train.{where}: st must be a train.State (from train.init), got {type(st).__name__}")
    leaves = tree.flatten(st.vars.params)[0]
    if leaves and callable(getattr(leaves[0], "is_deleted", None)) and leaves[0].is_deleted():
        raise ValueError(
            f"train.{where}: this train.State was consumed by an earlier train.step (its "
            "buffers were donated to XLA); use the state that step returned"
        )

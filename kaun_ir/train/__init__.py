"""``kn.train``: one training step is forward + own-IR autodiff + optimiser update in one XLA
executable.

Explicit targets (the primary form)::

    trainer = train.make(model, optim.adam(1e-3), loss=loss.cross_entropy_sparse)
    st = train.init(trainer)                       # inside a kn.rng scope
    loss_value, st = train.step(trainer, st, x, y) # loss(model(x), y); y is an input like x
    st = train.fit(trainer, st, batches)           # batches yield (x, y) tuples

The Kaun closure form (no ``loss=``)::

    loss_value, st = train.step(trainer, st, x, lambda logits: loss.cross_entropy_sparse(logits, y))

One compiled executable per input signature: the tree structure, shapes and dtypes of the
parameters, layer state, optimiser state, ``x``, the targets (or the arrays the loss closure
holds), the ``ctx`` arrays, the value of ``training``, and the loss. In the closure form a new
``lambda`` of the same code over new arrays of the same shapes runs the same executable, and a
closure that reads data some other way is traced again on each call (with a warning) rather than
ever running on stale data: see :mod:`kaun_ir.train.capture`.

Parameters, layer state and optimiser state are donated: XLA updates them in place, and the
arrays of the ``State`` passed to ``step`` must not be used afterwards (use the returned one).
Randomness (dropout) comes from ``fold_in(state.key, step)`` computed inside the executable from
the optimiser's step counter, so every step draws fresh masks without recompiling.

The modules: :mod:`.state` (``Trainer``, ``State``, ``make``, ``init``), :mod:`.capture` (the
three ways a loss is called), :mod:`.builder` (what a step traces into and its compiled
functions), :mod:`.dispatch` (repeated steps through ``kaun_ir.runtime``'s routes), :mod:`.stepping`
(``step``, ``steps``, ``predict``), :mod:`.loop` (``fit``, with :mod:`.fit_options` its
``FitOptions`` and :mod:`.progress` its progress bar), :mod:`.inspection` (a step's graphs
and executable), :mod:`.io` (saving and restoring a state), :mod:`.callbacks` (``fit``'s callbacks
and the JSON-lines, CSV and TensorBoard metric writers, with :mod:`.tfevents`), :mod:`.evaluation`
(``evaluate``), :mod:`.checkpointing` (``fit``'s background checkpoints and resuming) and
:mod:`.profiling` (``fit(profile_steps=)``).
"""

import importlib as _importlib

from kaun_ir.names import public_dir
from kaun_ir.train.state import State, Trainer, TrainerCache, init, make, make_state, vars  # noqa: A004
from kaun_ir.train.stepping import ema_vars, predict, step, steps

# the rest loads when first used (``train.fit``, the writers, checkpoints): a program that only
# steps never imports them, and the first step does not pay for them
_LAZY = {
    "kaun_ir.train.callbacks": "Callback CsvWriter JsonlWriter MetricWriter TensorBoardWriter",
    "kaun_ir.train.checkpointing": "checkpoint_steps latest_checkpoint",
    "kaun_ir.train.evaluation": "evaluate",
    "kaun_ir.train.fit_options": "FitOptions",
    "kaun_ir.train.inspection": "forward_graph step_executable step_graph",
    "kaun_ir.train.io": "load save state_of_tree state_to_tree",
    "kaun_ir.train.loop": "EarlyStop fit",
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names.split()}


def __getattr__(name: str):
    """Load ``train.NAME`` from the module that defines it (once; later lookups hit the global)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'kaun_ir.train' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "Trainer",
    "TrainerCache",
    "State",
    "EarlyStop",
    "make",
    "init",
    "make_state",
    "vars",
    "step",
    "steps",
    "fit",
    "FitOptions",
    "evaluate",
    "Callback",
    "MetricWriter",
    "JsonlWriter",
    "CsvWriter",
    "TensorBoardWriter",
    "latest_checkpoint",
    "checkpoint_steps",
    "predict",
    "ema_vars",
    "save",
    "load",
    "state_to_tree",
    "state_of_tree",
    "step_graph",
    "forward_graph",
    "step_executable",
]

__dir__ = public_dir(__all__)

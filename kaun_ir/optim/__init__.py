"""``kn.optim``: optimisers as data plus pure functions, and learning-rate schedules.

```python
alg = optim.adam(optim.schedule.cosine_decay(1e-3, decay_steps=1000))
state = optim.init(alg, params)
params, state = optim.update(alg, state, params, grads)   # or step + apply_updates
```

Optimisers compose: ``optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(3e-4,
weight_decay=0.1, mask=lambda path, p: p.ndim >= 2))`` is an optimiser too. For float16 /
bfloat16 parameters the optimiser state and its arithmetic are float32 (``state_dtype=``).
``adam``, ``adamw`` and ``lion`` are themselves chains of optax-style building blocks
(``scale_by_adam`` / ``scale_by_lion``, ``add_decayed_weights``, ``scale_by_learning_rate``); the
others are ``scale``, ``ema``,
``apply_every``, ``multi_steps`` and ``freeze``.

An :class:`Algorithm` is a record ``(init, step, name, hyperparams, slots)``; a :class:`State`
is ``(count, trees)``. Everything works on concrete arrays (one compiled graph per call
signature) and inside ``kn.jit`` / ``train.step`` (traced into the surrounding graph, with the
schedule evaluated on the traced step count so the compiled step never retraces).
"""

from kaun_ir.names import public_dir
from kaun_ir.optim import schedule
from kaun_ir.optim.algorithms import adagrad, adam, adamw, lion, rmsprop, sgd
from kaun_ir.optim.compose import chain, clip_by_global_norm
from kaun_ir.optim.core import (
    Algorithm,
    State,
    apply_updates,
    clip_grads_by_global_norm,
    global_norm,
    init,
    slot_dtype,
    state_of_trees,
    state_to_trees,
    step,
    update,
)
from kaun_ir.optim.freezing import freeze
from kaun_ir.optim.transforms import (
    add_decayed_weights,
    apply_every,
    ema,
    ema_params,
    multi_steps,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
)

__all__ = [
    "Algorithm",
    "State",
    "init",
    "step",
    "update",
    "apply_updates",
    "global_norm",
    "clip_by_global_norm",
    "clip_grads_by_global_norm",
    "chain",
    "scale",
    "scale_by_learning_rate",
    "scale_by_adam",
    "scale_by_lion",
    "add_decayed_weights",
    "ema",
    "ema_params",
    "apply_every",
    "multi_steps",
    "freeze",
    "slot_dtype",
    "state_to_trees",
    "state_of_trees",
    "sgd",
    "adam",
    "adamw",
    "lion",
    "rmsprop",
    "adagrad",
    "schedule",
]

__dir__ = public_dir(__all__)

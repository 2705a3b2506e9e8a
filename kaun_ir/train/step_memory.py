"""What a training step does by default to hold less memory and copy less: the parameter
updates ordered after the backward pass (:func:`ordered_updates`), and rematerialisation where
the activations are large (:func:`with_auto_remat`). ``kaun_ir.train.builder`` applies both."""

from __future__ import annotations

import os

from kaun_ir import dtypes, tree
from kaun_ir.ir.builder import scope as ir_scope
from kaun_ir.runtime.backends import is_iree
from kaun_ir.runtime.backends import resolve as resolve_backend
from kaun_ir.runtime.pipelines import TRAIN_PIPELINE_ENV
from kaun_ir.surface.elementwise import abs as absolute
from kaun_ir.surface.elementwise import where
from kaun_ir.surface.promotion import astype, dtype_of
from kaun_ir.surface.reductions import sum as reduce_sum
from kaun_ir.surface.shapes import concatenate, reshape
from kaun_ir.surface.sorting import sort
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["AUTO_REMAT_MIN_BYTES", "ORDER_UPDATES_MIN_BYTES", "ordered_updates", "with_auto_remat"]

#: the default rematerialisation (``train.make(remat=None)``, one device): ``"dots"`` over segments
#: chosen from the graph (``kaun_ir.transforms.remat.auto_depth``) when the residuals it would
#: recompute add up to at least this many bytes. The sum counts every residual value, also those
#: XLA fuses away, so it overstates the saving (the transformer12 bench workload: 520 MiB
#: counted, 45 MiB of XLA's temporaries saved), and XLA compiles a rematerialised step about
#: twice as long (GPT-2 124M: 2.3 -> 4.8 s; transformer12's first step 4.1 -> 7.2 s), which pays
#: where much memory is at stake: GPT-2 124M 949 -> 693 MiB of temporaries and 0.90x the step
#: (6 GiB counted; docs/memory.md). Smaller steps, where recomputation can also cost time
#: (lstm: 1.12x the step), stay as they are.
AUTO_REMAT_MIN_BYTES = 1 << 30


def _xla_on_one_device(trainer) -> bool:
    """Whether the trainer's step is one XLA program on one device (what both defaults were
    measured on: IREE and partitioned programs keep the step as it is)."""
    return trainer.mesh is None and not is_iree(trainer.backend or resolve_backend(None))


def with_auto_remat(trainer, pipeline: str) -> str:
    """``pipeline`` after the default ``remat`` pass (see :data:`AUTO_REMAT_MIN_BYTES`), for an
    XLA trainer on one device whose pipeline is the default one: a pipeline given to
    ``train.make`` or in ``$KAUN_IR_TRAIN_PIPELINE`` runs as written."""
    if not _xla_on_one_device(trainer) or trainer.pipeline is not None or TRAIN_PIPELINE_ENV in os.environ:
        return pipeline
    return f'remat{{policy="dots" depth=0 min_bytes={AUTO_REMAT_MIN_BYTES}}},{pipeline}'


def ordered_updates(trainer, params, grads, new_params):
    """``new_params`` through :func:`after_backward` for an XLA trainer on one device with at
    least :data:`ORDER_UPDATES_MIN_BYTES` of parameters; unchanged otherwise."""
    if not _xla_on_one_device(trainer) or float_bytes(params) < ORDER_UPDATES_MIN_BYTES:
        return new_params
    with ir_scope("optimizer"):  # part of the update (and shown with it by kaun-ir viz)
        return after_backward(params, grads, new_params)


#: parameters below this many bytes keep XLA's copies (see :func:`after_backward`): the few
#: extra kernels cost more than the copies in a step of microseconds (mlp_small: +8%)
ORDER_UPDATES_MIN_BYTES = 1 << 20


def float_bytes(params) -> int:
    """Bytes of the float leaves of a (traced) parameter tree."""
    types = [type_of(p) for p in tree.flatten(params)[0]]
    return sum(t.nbytes for t in types if dtypes.is_float(t.dtype))


def after_backward(params, grads, new_params):
    """``new_params`` with ``-0.0`` added to every updated float leaf, computed from one element
    of each such leaf's gradient.

    XLA keeps a copy of every donated parameter that the backward pass reads, because nothing
    orders that read before the update that writes the new value into the parameter's buffer (a
    weight's update reads its own gradient, not the input gradient its backward read computes).
    With every update reading a value that exists only once all gradients do, the order is
    proven and the copies go: one copy of every weight per step less (GPT-2 124M: 472 MiB; the
    transformer12 bench step 0.96x the time, docs/performance.md). The value has to be real data:
    XLA CPU drops an ``optimization_barrier`` before it decides on copies. It is ``-0.0 *
    |t|`` (``t`` the sum of the first elements, through a ``sort`` that XLA never duplicates
    into each update; a non-finite ``t`` counts as 0). ``p + -0.0`` is ``p``, but XLA may fuse the
    updates differently then: results agree to rounding (1e-7), not bit for bit."""
    new_leaves, treedef = tree.flatten(new_params)
    grad_leaves = tree.flatten(grads)[0]
    # a frozen leaf comes back as the parameter itself (optim's apply skips zero updates)
    pairs = zip(tree.flatten(params)[0], grad_leaves, new_leaves)
    updated = [
        k
        for k, (p, g, new) in enumerate(pairs)
        if dtypes.is_float(dtype_of(new)) and type_of(g).size > 0 and new.value is not p.value
    ]
    if not updated:
        return new_params
    firsts = [astype(reshape(grad_leaves[k], (-1,))[:1], dtypes.float32) for k in updated]
    total = reduce_sum(sort(concatenate(firsts)))
    zero = where(apply("is_finite", total), absolute(total), 0.0) * -0.0
    for k in updated:
        new_leaves[k] = new_leaves[k] + astype(zero, dtype_of(new_leaves[k]))
    return tree.unflatten(treedef, new_leaves)

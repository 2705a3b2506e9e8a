"""One process of a multi-process data-parallel run (tests/test_distributed.py starts two).

``python distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR [closure [K]]``: joins the run on
127.0.0.1:PORT with 2 virtual CPU devices, trains a small MLP for ``STEPS`` steps with
``train.fit`` on a mesh over all processes' devices, each process loading only its own batches
(``kn.data.shard``), saves the state as a sharded checkpoint in OUT_DIR/ckpt and writes its
final parameters and losses to OUT_DIR/result-<id>.json. :func:`train_run` without a mesh is
the one-process reference. With ``closure`` the trainer has no ``loss=`` and ``train.fit`` runs
over ``(x, loss_closure)`` pairs (Kaun's closure form: each closure holds this process's targets
and a replicated weight vector), ``K`` steps per call.
"""

from __future__ import annotations

import json
import os
import sys

STEPS = 5
LOCAL_BATCH = 8


def problem():
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((96, 6)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((6, 3))).astype(np.float32)
    return x, y


def model():
    from kaun_ir import layer

    return layer.sequential([layer.linear(6, 16), layer.tanh(), layer.linear(16, 3)])


def train_run(batches, mesh=None):
    """``(params, state, losses)`` after ``train.fit`` over ``batches`` (``(x, y)`` pairs) with
    Adam on the mean squared error. With ``mesh`` spanning the processes, each process passes
    its own batches: the global batch is their concatenation, split over ``"data"``."""
    from kaun_ir import optim, rng, train
    from kaun_ir.nn import loss

    trainer = train.make(model(), optim.adam(0.05), loss=loss.mse, mesh=mesh)
    st = rng.run(0, lambda: train.init(trainer))
    losses = []
    st = train.fit(trainer, st, batches, report=lambda step, loss, state: losses.append(float(np_of(loss))))
    return train.vars(st).params, st, losses


def closure_run(batches, mesh, steps_per_call=1):
    """:func:`train_run` in the closure form: ``batches`` of ``(x, y)`` become ``(x, loss_fn)``
    pairs whose closures hold ``y`` (this process's rows) and a weight per output (the same in
    every process); with weights of one the loss is the explicit form's."""
    import numpy as np

    from kaun_ir import optim, rng, train
    from kaun_ir.nn import loss

    weights = np.ones(3, np.float32)

    def closure(y):
        return lambda outputs: loss.mse(outputs * weights, y)

    pairs = [(xb, closure(yb)) for xb, yb in batches]
    trainer = train.make(model(), optim.adam(0.05), mesh=mesh)
    st = rng.run(0, lambda: train.init(trainer, example=pairs[0][0]))
    losses = []
    st = train.fit(
        trainer,
        st,
        pairs,
        report=lambda step, loss, state: losses.append(float(np_of(loss))),
        steps_per_call=steps_per_call,
    )
    return train.vars(st).params, st, losses


def np_of(array):
    """The host value of a (possibly multi-process, replicated) array."""
    import numpy as np

    shards = getattr(array, "addressable_shards", None)
    return np.asarray(shards[0].data) if shards else np.asarray(array)


def main() -> None:
    process_id, count, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["KAUN_IR_BACKEND"] = "cpu"

    import kaun_ir as kn
    from kaun_ir import data

    kn.distributed.initialize(f"127.0.0.1:{port}", count, process_id, timeout_s=60)
    mesh = kn.sharding.mesh((len(kn.runtime.devices()),), ("data",))
    x, y = problem()
    batches = data.shard(
        kn.distributed.process_index(), kn.distributed.process_count(), data.prepare((x, y), LOCAL_BATCH)
    )
    local = data.to_array(batches)[:STEPS]
    if len(sys.argv) > 5 and sys.argv[5] == "closure":
        steps_per_call = int(sys.argv[6]) if len(sys.argv) > 6 else 1
        params, st, losses = closure_run(list(data.of_array(local)), mesh, steps_per_call)
    else:
        params, st, losses = train_run(data.of_array(local), mesh)
    kn.checkpoint.save_sharded(os.path.join(out, "ckpt"), kn.train.state_to_tree(st))
    leaves = [(path, np_of(leaf).tolist()) for path, leaf in kn.ptree.flatten_with_paths(params)]
    result = {
        "process": kn.distributed.process_index(),
        "count": kn.distributed.process_count(),
        "devices": len(kn.runtime.devices()),
        "local": len(kn.distributed.local_devices()),
        "params": leaves,
        "losses": losses,
    }
    kn.fileio.atomic_write(os.path.join(out, f"result-{process_id}.json"), json.dumps(result))
    kn.distributed.shutdown()


if __name__ == "__main__":
    main()

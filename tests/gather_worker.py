"""One process of a two-process FSDP run that reads its results back (tests/test_distributed_gather.py
starts two).

``python gather_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR``: joins the run on
127.0.0.1:PORT with 2 virtual CPU devices, trains a small MLP with FSDP (every parameter split
over the four devices of both processes), then gathers the parameters (to every process and to
process 0), predicts on its own rows, prints the state, and writes what it saw to
OUT_DIR/result-<id>.json. :func:`reference` is the one-process run the test compares with.
"""

from __future__ import annotations

import json
import os
import sys

STEPS = 3
LOCAL_BATCH = 8


def problem():
    import numpy as np

    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((6, 4))).astype(np.float32)
    return x, y


def trainer(mesh=None):
    from kaun_ir import layer, optim, train
    from kaun_ir.nn import loss

    model = layer.sequential([layer.linear(6, 16), layer.tanh(), layer.linear(16, 4)])
    if mesh is None:
        return train.make(model, optim.adam(0.05), loss=loss.mse)
    return train.make(model, optim.adam(0.05), loss=loss.mse, mesh=mesh, param_sharding="fsdp")


def batches(process: int, count: int):
    """This process's ``STEPS`` batches of ``LOCAL_BATCH`` rows (rows ``process, process + count, ...``
    of every global batch, so the global batch is the processes' rows concatenated)."""
    x, y = problem()
    out = []
    for k in range(STEPS):
        gx = x[k * LOCAL_BATCH * count : (k + 1) * LOCAL_BATCH * count]
        gy = y[k * LOCAL_BATCH * count : (k + 1) * LOCAL_BATCH * count]
        out.append(
            (
                gx[process * LOCAL_BATCH : (process + 1) * LOCAL_BATCH],
                gy[process * LOCAL_BATCH : (process + 1) * LOCAL_BATCH],
            )
        )
    return out


def reference(count: int = 2):
    """``(params, predictions of the first global batch)`` of the same training in one process
    on one device, on the global batches."""
    import numpy as np

    from kaun_ir import rng, train

    x, y = problem()
    tr = trainer()
    st = rng.run(0, lambda: train.init(tr))
    n = LOCAL_BATCH * count
    for k in range(STEPS):
        _, st = train.step(tr, st, x[k * n : (k + 1) * n], y[k * n : (k + 1) * n])
    return train.vars(st).params, np.asarray(train.predict(tr, st, x[:n]))


def main() -> None:
    process_id, count, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["KAUN_IR_BACKEND"] = "cpu"

    import numpy as np

    import kaun_ir as kn
    from kaun_ir import rng, train

    kn.distributed.initialize(f"127.0.0.1:{port}", count, process_id, timeout_s=60)
    mesh = kn.sharding.mesh((len(kn.runtime.devices()),), ("data",))
    tr = trainer(mesh)
    st = rng.run(0, lambda: train.init(tr))
    mine = batches(process_id, count)
    for bx, by in mine:
        _, st = train.step(tr, st, bx, by)
    params = train.vars(st).params
    try:
        np.asarray(params[0]["weight"])
        direct = "no error"
    except Exception as err:  # JAX's error for an array split over several processes
        direct = f"{type(err).__name__}: {err}"
    everywhere = kn.sharding.gather(params)
    whole_state = kn.sharding.gather(st)  # a train.State: gathered as train.state_to_tree(st)
    same = [
        np.array_equal(a, b)
        for (_, a), (_, b) in zip(
            kn.ptree.flatten_with_paths(whole_state["params"]), kn.ptree.flatten_with_paths(everywhere)
        )
    ]
    on_zero = kn.sharding.gather(params, to=0)
    # evaluation: each process predicts on its own rows of the first global batch; process 0
    # gathers the predictions whole
    predictions = train.predict(tr, st, mine[0][0])
    gathered = kn.sharding.gather(predictions, to=0)
    result = {
        "process": kn.distributed.process_index(),
        "direct": direct,
        "weight_shards": sorted({tuple(s.data.shape) for s in params[0]["weight"].addressable_shards}),
        "params": [(p, np.asarray(v).tolist()) for p, v in kn.ptree.flatten_with_paths(everywhere)],
        "on_zero": None
        if on_zero is None
        else [(p, np.asarray(v).tolist()) for p, v in kn.ptree.flatten_with_paths(on_zero)],
        "predictions": None if gathered is None else np.asarray(gathered).tolist(),
        "local_rows": sorted({tuple(s.data.shape) for s in predictions.addressable_shards}),
        "state_params_same": all(same) and len(same) == 4,
        "state_keys": sorted(whole_state),
        "state_text": str(st),
        "vars_text": repr(train.vars(st)),
    }
    kn.fileio.atomic_write(os.path.join(out, f"result-{process_id}.json"), json.dumps(result))
    kn.distributed.shutdown()


if __name__ == "__main__":
    main()

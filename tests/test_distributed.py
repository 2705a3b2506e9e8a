"""Two processes x two virtual CPU devices on 127.0.0.1 train like one process.

The processes join through PJRT's distributed runtime (kn.distributed.initialize) and XLA's
collectives run between them over gloo; each loads only its own batches (kn.data.shard).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np

import kaun_ir as kn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import distributed_worker as worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_train_like_one(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    script = os.path.join(HERE, "distributed_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), "2", str(port), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(2)]
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["count"] == 2 and r["devices"] == 4 and r["local"] == 2 for r in results)

    # the one-process reference: the global batches are the two processes' batches, in order
    x, y = worker.problem()
    batches = kn.data.to_array(kn.data.prepare((x, y), 2 * worker.LOCAL_BATCH))[: worker.STEPS]
    params, st, losses = worker.train_run(kn.data.of_array(batches))
    want = dict(kn.ptree.flatten_with_paths(params))
    for r in results:
        assert len(r["losses"]) == worker.STEPS
        np.testing.assert_allclose(r["losses"], losses, rtol=1e-5, atol=1e-6)
        for path, value in r["params"]:
            np.testing.assert_allclose(np.asarray(value), np.asarray(want[path]), rtol=1e-5, atol=1e-6)

    # the sharded checkpoint: one file per process plus the index, loadable in this process
    files = sorted(os.listdir(tmp_path / "ckpt"))
    assert files == ["index.json", "shards-00000-of-00002.safetensors", "shards-00001-of-00002.safetensors"]
    back = kn.checkpoint.load_sharded(tmp_path / "ckpt", kn.train.state_to_tree(st))
    for path, leaf in kn.ptree.flatten_with_paths(back):
        np.testing.assert_allclose(
            np.asarray(leaf),
            np.asarray(dict(kn.ptree.flatten_with_paths(kn.train.state_to_tree(st)))[path]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=path,
        )

"""Reading a two-process run back: ``kn.sharding.gather`` of parameters split over both
processes (to every process and to process 0), ``train.predict`` on a multi-process state, and a
sharded state printed without error. Two processes x two virtual CPU devices on 127.0.0.1; the
oracle is the same training in this process on one device."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import kaun_ir as kn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gather_worker as worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gather")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    script = os.path.join(HERE, "gather_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), "2", str(port), str(out)],
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
    return [json.loads((out / f"result-{i}.json").read_text()) for i in range(2)]


def test_parameters_are_split_over_processes(results):
    for r in results:
        assert r["weight_shards"] == [[6, 4]]  # [6, 16] split over 4 devices, 2 per process
        assert "addressable" in r["direct"], r["direct"]  # np.asarray alone cannot read it


def test_gather_to_all_and_to_zero_equal_one_process(results):
    params, _ = worker.reference()
    want = dict(kn.ptree.flatten_with_paths(params))
    for r in results:
        for path, value in r["params"]:
            np.testing.assert_allclose(np.asarray(value), np.asarray(want[path]), rtol=1e-5, atol=1e-6)
    assert results[1]["on_zero"] is None
    for r in results:  # a whole training state: its tree, parameters as gathered alone
        assert r["state_params_same"] and {"params", "state", "step"} <= set(r["state_keys"])
    assert results[0]["on_zero"] == results[0]["params"]


def test_predict_on_a_multi_process_state(results):
    _, predictions = worker.reference()
    assert all(r["local_rows"] == [[4, 4]] for r in results)  # 8 rows per process, 2 per device
    np.testing.assert_allclose(np.asarray(results[0]["predictions"]), predictions, rtol=1e-5, atol=1e-6)
    assert results[1]["predictions"] is None


def test_sharded_state_prints(results):
    for r in results:
        assert r["state_text"].startswith("State(") and "adam" in r["state_text"]
        assert r["vars_text"].startswith("Vars(")


def test_gather_arguments():
    from kaun_ir import layer, optim, rng, train
    from kaun_ir.nn import loss

    tr = train.make(layer.linear(3, 2), optim.adam(1e-2), loss=loss.mse)
    st = rng.run(0, lambda: train.init(tr))
    whole = kn.sharding.gather(st)
    np.testing.assert_array_equal(whole["params"]["weight"], np.asarray(train.vars(st).params["weight"]))
    x = np.arange(6.0)
    assert kn.sharding.gather({"a": [x, 3]}, to=0)["a"][1] == 3
    with pytest.raises(ValueError, match="process index"):
        kn.sharding.gather(x, to=1)
    with pytest.raises(ValueError, match="process index"):
        kn.sharding.gather(x, to=True)

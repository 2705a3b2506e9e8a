"""Two processes x two virtual CPU devices on 127.0.0.1 train like one process.

The processes join through PJRT's distributed runtime (kn.distributed.initialize) and XLA's
collectives run between them over gloo; each loads only its own batches (kn.data.shard).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import kaun_ir as kn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import distributed_worker as worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_two(tmp_path, *mode):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    script = os.path.join(HERE, "distributed_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, str(i), "2", str(port), str(tmp_path), *mode],
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
    return [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(2)]


def test_two_processes_train_like_one(tmp_path):
    results = run_two(tmp_path)
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


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_closure_form_across_two_processes_trains_like_the_explicit_form(tmp_path, steps_per_call):
    """Kaun's closure form (``(x, loss_closure)`` pairs, no ``loss=``) on a mesh over two
    processes: each closure's targets are that process's rows, like the explicit form's targets;
    the one-process explicit run over the concatenated batches is the reference."""
    results = run_two(tmp_path, "closure", str(steps_per_call))
    x, y = worker.problem()
    batches = kn.data.to_array(kn.data.prepare((x, y), 2 * worker.LOCAL_BATCH))[: worker.STEPS]
    params, _, losses = worker.train_run(kn.data.of_array(batches))
    want = dict(kn.ptree.flatten_with_paths(params))
    for r in results:
        np.testing.assert_allclose(r["losses"], losses, rtol=1e-5, atol=1e-6)
        for path, value in r["params"]:
            np.testing.assert_allclose(np.asarray(value), np.asarray(want[path]), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ faults: arguments, waits, peers
FAULT_WORKER = os.path.join(HERE, "distributed_fault_worker.py")


def start_fault_worker(address, count, process_id, timeout_s, *extra):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen(
        [sys.executable, FAULT_WORKER, address, str(count), str(process_id), str(timeout_s), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish(proc, timeout=60):
    try:
        out = proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


def report_of(out):
    return next(json.loads(line) for line in out.splitlines() if line.startswith("{"))


@pytest.mark.parametrize(
    ("args", "error", "pattern"),
    [
        (
            ("127.0.0.1:abc", 2, 0),
            ValueError,
            r"'127.0.0.1:abc': the port must be a number in 1..65535, got 'abc'",
        ),
        (("127.0.0.1:70000", 2, 0), ValueError, r"port must be a number in 1..65535, got '70000'"),
        (("127.0.0.1:12\u00b2", 2, 0), ValueError, r"port must be a number in 1..65535"),
        (("127.0.0.1", 2, 0), ValueError, r"'127.0.0.1' is not 'host:port'"),
        ((":1234", 2, 0), ValueError, r"not 'host:port'"),
        (("::1:1234", 2, 0), ValueError, r"\[::1\]:1234"),
        ((1234, 2, 0), TypeError, r"coordinator_address must be a 'host:port' string"),
        (("127.0.0.1:1234", 0, 0), ValueError, r"num_processes must be >= 1, got 0"),
        (("127.0.0.1:1234", 2.0, 0), TypeError, r"num_processes must be an int, got 2.0"),
        (("127.0.0.1:1234", 2, 2), ValueError, r"process_id 2 is not in \[0, 2\)"),
        (("127.0.0.1:1234", 2, -1), ValueError, r"process_id must be >= 0"),
        (("127.0.0.1:1234", 2, True), TypeError, r"process_id must be an int"),
        (("127.0.0.1:1234", 2, 0, [0, "a"]), TypeError, r"local_device_ids\[\] must be an int"),
        (("127.0.0.1:1234", 2, 0, None, 0), ValueError, r"timeout_s must be a positive number of seconds"),
        (
            ("127.0.0.1:1234", 2, 0, None, 10, float("nan")),
            ValueError,
            r"heartbeat_timeout_s must be a positive",
        ),
    ],
)
def test_initialize_arguments_are_checked_before_anything_connects(args, error, pattern):
    with pytest.raises(error, match=pattern):
        kn.distributed.initialize(*args)
    assert not kn.distributed.is_initialized()


def test_unreachable_coordinator_raises_after_the_timeout_instead_of_aborting():
    address = f"127.0.0.1:{free_port()}"  # nobody listens there
    code, out = finish(start_fault_worker(address, 2, 1, 2))
    assert code == 0, out[-2000:]  # the process lives on: an exception, not XLA's abort
    report = report_of(out)
    assert report["raised"] == "DistributedError" and report["kaun"], report
    assert f"process 1 could not reach the coordinator at {address} within timeout_s=2 s" in report["message"]
    assert "Connection refused" in report["message"]
    assert 1.9 < report["seconds"] < 30  # the timeout, plus importing jax on a loaded machine


def test_coordinator_port_in_use_is_a_clear_error_in_process_zero():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, out = finish(start_fault_worker(f"127.0.0.1:{port}", 2, 0, 5))
    assert code == 0, out[-2000:]
    report = report_of(out)
    assert report["raised"] == "DistributedError", report
    assert f"process 0 cannot listen on port {port}" in report["message"]


def test_processes_that_disagree_on_num_processes_both_raise_naming_the_other():
    address = f"127.0.0.1:{free_port()}"
    procs = [start_fault_worker(address, 2, 0, 15), start_fault_worker(address, 3, 1, 15)]
    (code0, out0), (code1, out1) = finish(procs[0]), finish(procs[1])
    assert (code0, code1) == (0, 0), out0[-2000:] + out1[-2000:]
    first, second = report_of(out0), report_of(out1)
    assert first["raised"] == second["raised"] == "DistributedError", (first, second)
    assert (
        "process 1 was started with num_processes=3, this process (process 0) with num_processes=2"
        in (first["message"])
    )
    assert (
        "process 0 was started with num_processes=2, this process (process 1) with num_processes=3"
        in (second["message"])
    )
    assert first["seconds"] < 40 and second["seconds"] < 40  # bounded: no wait for a third process


def test_a_killed_peer_ends_the_survivor_within_the_heartbeat_timeout_naming_it():
    """XLA's coordination agent ends the survivor (it cannot raise: the survivor is blocked in a
    collective that never returns, and the agent's error handler is fatal); what kaun_ir controls
    is that it happens within ``heartbeat_timeout_s`` and that the output names the dead process."""
    address = f"127.0.0.1:{free_port()}"
    procs = [start_fault_worker(address, 2, i, 30, "steps", "3") for i in range(2)]
    try:
        lines = []
        for line in procs[1].stdout:  # wait until both step together
            lines.append(line)
            if line.startswith("step 2"):
                break
        else:
            raise AssertionError("".join(lines)[-3000:])
        procs[1].kill()
        killed = time.monotonic()
        code, out = finish(procs[0], timeout=40)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert code != 0, out[-2000:]
    assert time.monotonic() - killed < 20
    assert re.search(r"tasks are unhealthy \(stopped sending heartbeats\):\s*1\b", out), out[-3000:]


def test_process_zero_expecting_more_processes_waits_only_timeout_s_and_says_why():
    """Process 0 started with a larger count waits in XLA's connect for processes that never
    come; XLA ends both processes when ``timeout_s`` runs out (it cannot raise there), after
    kaun_ir's one-line notice naming the count."""
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    procs = [start_fault_worker(address, 3, 0, 4), start_fault_worker(address, 2, 1, 4)]
    (code0, out0), (code1, out1) = finish(procs[0]), finish(procs[1])
    assert time.monotonic() - start < 40
    assert code0 != 0 and code1 != 0
    assert re.search(
        r"kaun_ir: .*process 0 has waited timeout_s=4 s for the 3 processes .*num_processes", out0
    )
    assert re.search(r"process 1 has waited timeout_s=4 s for the 2 processes", out1)


def test_the_checks_before_connecting_name_the_address():
    from kaun_ir.errors import DistributedError
    from kaun_ir.runtime.xla import backend

    with pytest.raises(
        DistributedError, match=r"coordinator host 'nohost\.invalid' of nohost\.invalid:1234 does not"
    ):
        backend._check_listenable("nohost.invalid", 1234, "nohost.invalid:1234")
    port = free_port()
    start = time.monotonic()
    with pytest.raises(
        DistributedError, match=rf"process 3 could not reach the coordinator at 127\.0\.0\.1:{port}"
    ):
        backend._wait_reachable("127.0.0.1", port, f"127.0.0.1:{port}", 3, 0.5, time.monotonic() + 0.5)
    assert time.monotonic() - start < 3
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        backend._wait_reachable("127.0.0.1", port, f"127.0.0.1:{port}", 1, 5, time.monotonic() + 5)  # returns

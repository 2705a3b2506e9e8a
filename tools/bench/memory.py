"""Peak memory and the first step of one ``kaun-ir bench`` row, measured in a fresh child process
(see the ``kaun-ir bench`` help, item 4), and :func:`run_child`, which the compile report uses too."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from kaun_ir.runtime.malloc_tuning import without_heap_keeping
from kaun_ir.tools.bench.runners import make_runner
from kaun_ir.tools.bench.workloads import Setup

#: calls measured for the training-phase peak memory (after the first)
MEMORY_CALLS = 3
#: a child process' result line starts with this
_CHILD_TAG = "kaun-ir-bench-child:"


def _proc_status() -> dict:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of this process in bytes, from ``/proc/self/status``."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024  # "123 kB"
    return out


def _reset_peak() -> None:
    """Reset the kernel's peak-RSS counter (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim_heap() -> None:
    """Collect garbage and hand freed heap back to the OS (glibc ``malloc_trim``), so the RSS
    reflects live memory rather than what an earlier phase left in the allocator's free lists."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def wait_for(value) -> None:
    """Return once ``value`` (a loss) is computed."""
    np.asarray(value)  # waits for the result (XLA dispatch is asynchronous)


def measure_here(
    name: str, impl: str, small: bool, steps_per_call: int = 0, calls: int = MEMORY_CALLS
) -> dict:
    """In this (fresh) process: build implementation ``impl`` of workload ``name``, time its
    first step and measure its memory (see the module docstring). Returns a dict of byte counts
    and seconds."""
    if impl in ("torch", "torch.compile"):
        import torch  # imported before the baseline, like jax for the others

        torch.ones(2, requires_grad=True).square().sum().backward()  # autograd warmed up
    else:
        import jax
        import optax  # noqa: F401

        # the XLA client exists, and both jit machineries have run once, before the baseline:
        # Setup below compiles kaun_ir's layer init, so JAX's tracing and lowering get the same
        # warm start (each side's first *step* compile is what is timed)
        jax.jit(jax.grad(lambda v: (v * v).sum()))(np.ones(2, np.float32)).block_until_ready()
    setup = Setup(name, small)
    _trim_heap()
    before = _proc_status()["VmRSS"]
    _reset_peak()
    start = time.perf_counter()
    runner = make_runner(impl, setup, steps_per_call)
    wait_for(runner.call())
    first = time.perf_counter() - start
    compile_peak = _proc_status()["VmHWM"] - before
    _trim_heap()
    _reset_peak()
    for _ in range(calls):
        wait_for(runner.call())
    status = _proc_status()
    return {
        "peak_bytes": status["VmHWM"] - before,
        "compile_peak_bytes": compile_peak,
        "rss_before_bytes": before,
        "first_step_s": first,
        "xla": runner.memory_analysis(),
    }


def _child_main(spec_json: str) -> None:
    """Entry point of the child process: measure, print one tagged JSON line."""
    spec = json.loads(spec_json)
    result = measure_here(
        spec["workload"], spec["impl"], spec["small"], spec["steps_per_call"], spec["calls"]
    )
    print(_CHILD_TAG + json.dumps(result), flush=True)


def measure_in_child(
    name: str,
    impl: str,
    small: bool,
    steps_per_call: int = 0,
    calls: int = MEMORY_CALLS,
    timeout: float = 900,
) -> dict:
    """:func:`measure_here` in a fresh Python process; ``{"error": reason}`` when it fails.

    The child inherits this process' persistent compilation cache setting (``kaun-ir bench`` turns
    the cache off unless ``KAUN_IR_CACHE_DIR`` is set, so its first step is a cold one)."""
    if not (os.path.exists("/proc/self/status") and os.path.exists("/proc/self/clear_refs")):
        return {"error": "no /proc/self/status and clear_refs (Linux only)"}
    spec = {"workload": name, "impl": impl, "small": small, "steps_per_call": steps_per_call, "calls": calls}
    # the heap keeps no freed memory there: the resident size is what the implementation holds
    env = without_heap_keeping(dict(os.environ))
    return run_child("kaun_ir.tools.bench.memory", spec, _CHILD_TAG, timeout, env=env)


def warm_first_step(name: str, impl: str, small: bool, steps_per_call: int = 0, timeout: float = 900):
    """The first step of a kaun_ir row with a warm persistent compilation cache, in seconds (None
    when a child fails): two fresh child processes share a new private cache directory, the first
    fills it, the second's first step is returned. The directory is removed afterwards."""
    root = tempfile.mkdtemp(prefix="kaun-ir-bench-cache-")  # private to the user (mode 0700)
    spec = {"workload": name, "impl": impl, "small": small, "steps_per_call": steps_per_call, "calls": 1}
    env = dict(os.environ, KAUN_IR_CACHE_DIR=root)
    try:
        measured = {}
        for _ in range(2):
            measured = run_child("kaun_ir.tools.bench.memory", spec, _CHILD_TAG, timeout, env)
            if "error" in measured:
                return None
        return measured.get("first_step_s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_child(module: str, spec: dict, tag: str, timeout: float, env: dict | None = None) -> dict:
    """``module._child_main(json spec)`` in a fresh Python process (with the environment ``env``,
    default this one's); the dict it prints after ``tag``, or ``{"error": reason}`` when it fails
    or times out."""
    code = f"import sys; from {module} import _child_main; _child_main(sys.argv[1])"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(tag):
            return json.loads(line[len(tag) :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"child exited with {proc.returncode}: {tail}"}

"""The timing side of ``kaun-ir bench``: one workload's rows built, run for ``N`` steps, timed over
alternating rounds, compared with JAX (the loss after ``N`` steps, or the workload's
``loss_steps``; steps/s, GFLOP/s) and, with
``memory``, measured again in child processes (see the ``kaun-ir bench`` help for the method)."""

from __future__ import annotations

import statistics
import time

from kaun_ir import runtime
from kaun_ir.runtime import disk_cache
from kaun_ir.tools.bench import flops as bench_flops
from kaun_ir.tools.bench.memory import measure_in_child, warm_first_step
from kaun_ir.tools.bench.reference import torch_status
from kaun_ir.tools.bench.runners import TORCH_COMPILE, implementations, make_runner, variant_name
from kaun_ir.tools.bench.workloads import Setup

LOSS_RTOL = 1e-4
#: PyTorch vs JAX: other kernels, other float rounding (see the ``kaun-ir bench`` help)
TORCH_LOSS_RTOL = 1e-3
#: kaun_ir[K] vs JAX: XLA may pick other kernels for ops inside the fused loop (on CPU a
#: convolution in a ``while`` body is compiled differently, in JAX's own ``fori_loop`` too)
FUSED_LOSS_RTOL = 1e-3
#: kaun_ir[bfloat16] / kaun_ir[float16] vs JAX in float32: products in 8 / 11 mantissa bits
MIXED_LOSS_RTOL = 5e-2
#: seconds of idle time before each timed run (see _timed_rounds)
PAUSE_S = 0.02


#: the XLA rows on a GPU: XLA's default precision multiplies float32 in TensorFloat-32 (10
#: mantissa bits) there, so two equivalent graphs (merged or reordered products) round apart
ACCELERATOR_LOSS_RTOL = 1e-3


def loss_rtol(impl: str, backend: str = "cpu") -> float:
    """The relative tolerance of row ``impl``'s compared loss against JAX's (``backend``: the
    XLA backend the rows ran on; off the CPU the exact rows get :data:`ACCELERATOR_LOSS_RTOL`)."""
    exact = {
        "jax",
        "kaun_ir",
        *(
            variant_name(v)
            for v in ("remat=nothing", "remat=dots", "closure", "roll", "user", "user-closure")
        ),
    }
    if impl in exact:  # the same XLA kernels as the JAX step
        return LOSS_RTOL if backend == "cpu" else ACCELERATOR_LOSS_RTOL
    if impl in ("torch", TORCH_COMPILE):
        return TORCH_LOSS_RTOL
    if impl in (variant_name("bfloat16"), variant_name("float16")):
        return MIXED_LOSS_RTOL
    return FUSED_LOSS_RTOL


def _run_calls(runner, calls: int) -> float:
    """``calls`` calls, blocking on the last; returns the last step's loss."""
    value = None
    for _ in range(calls):
        value = runner.call()
    return runner.last_loss(value)


def _rotated(items: list, by: int) -> list:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def _check_arguments(steps: int, rounds: int, steps_per_call: int) -> None:
    if steps < 1 or rounds < 0 or steps_per_call < 0:
        raise ValueError("steps must be >= 1, rounds >= 0 and steps_per_call >= 0")
    if steps_per_call and steps % steps_per_call:
        raise ValueError(f"steps ({steps}) must be a multiple of steps_per_call ({steps_per_call})")


def loss_steps(workload, steps: int, steps_per_call: int) -> int:
    """The steps after which every row's loss is compared with JAX's: ``workload.loss_steps``
    (or ``steps``, whichever is fewer), rounded up to whole calls of the fused row's
    ``steps_per_call`` steps (0: no fused row), so all rows compare at the same step."""
    wanted = min(workload.loss_steps or steps, steps)
    if steps_per_call:
        wanted = -(-wanted // steps_per_call) * steps_per_call
    return min(wanted, steps)


def _first_steps(schedule: list, setup: Setup, steps: int, steps_per_call: int, entries: dict) -> dict:
    """Build every row in ``schedule`` order, time its first call and train it to ``steps`` steps;
    returns the runners by name."""
    runners = {}
    check = loss_steps(setup.workload, steps, steps_per_call)
    for impl in schedule:
        entry = entries[impl]
        start = time.perf_counter()
        runner = runners[impl] = make_runner(impl, setup, steps_per_call)
        first_loss = _run_calls(runner, 1)
        entry["first_step_in_process_s"] = time.perf_counter() - start
        entry["steps_per_call"] = runner.steps_per_call
        entry["first_call_loss"] = first_loss
        calls, check_calls = steps // runner.steps_per_call, check // runner.steps_per_call
        entry["loss_steps"] = check
        entry["loss_after_steps"] = _run_calls(runner, check_calls - 1) if check_calls > 1 else first_loss
        if calls > check_calls:
            _run_calls(runner, calls - check_calls)
        entry["steps_per_s_rounds"] = []
    return runners


def _timed_rounds(schedule: list, runners: dict, entries: dict, steps: int, rounds: int) -> None:
    """``rounds`` rounds of ``steps`` steps per row; appends each round's steps/s."""
    for round_ in range(rounds):
        # each round starts with another implementation, and every timed run starts after a
        # short pause: PyTorch's OpenMP workers keep spinning for a while after its steps end,
        # which would otherwise slow whatever always ran right after it
        for impl in _rotated(schedule, round_):
            runner = runners[impl]
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            _run_calls(runner, steps // runner.steps_per_call)
            entries[impl]["steps_per_s_rounds"].append(steps / (time.perf_counter() - start))


def _compare(entries: dict, rounds: int, flops: int | None) -> None:
    """Median steps/s, GFLOP/s, the ratio to JAX's steps/s and the loss check of every row."""
    for entry in entries.values():
        entry["steps_per_s"] = statistics.median(entry["steps_per_s_rounds"]) if rounds else None
        entry["gflops"] = flops * entry["steps_per_s"] / 1e9 if flops and rounds else None
    ref = entries["jax"]
    backend = runtime.backend_name()
    for impl, entry in entries.items():
        entry["ratio_vs_jax"] = entry["steps_per_s"] / ref["steps_per_s"] if rounds else None
        a, b = entry["loss_after_steps"], ref["loss_after_steps"]
        entry["loss_rel_diff_vs_jax"] = abs(a - b) / max(abs(b), 1e-30)
        entry["loss_rtol"] = loss_rtol(impl, backend)
        entry["loss_agrees"] = bool(entry["loss_rel_diff_vs_jax"] <= entry["loss_rtol"])
        entry["memory"] = None
        entry["first_step_child_s"] = None


def _memory(
    entries: dict, schedule: list, name: str, small: bool, steps_per_call: int, memory: bool, warm=False
) -> None:
    """With ``memory``, every row again in a child process; then each row's first step and peak
    memory (the child's figures when there are any). With ``warm`` too, each kaun_ir row's first
    step with a warm persistent compilation cache (``first_step_warm_s``, else None)."""
    for entry in entries.values():
        entry["first_step_warm_s"] = None
    if memory:
        for impl in schedule:
            measured = measure_in_child(name, impl, small, steps_per_call)
            entries[impl]["memory"] = measured
            entries[impl]["first_step_child_s"] = measured.get("first_step_s")
            if warm and impl.startswith("kaun_ir"):
                entries[impl]["first_step_warm_s"] = warm_first_step(name, impl, small, steps_per_call)
    ref = entries["jax"]
    for entry in entries.values():
        child = entry["first_step_child_s"]
        entry["first_step_s"] = child if child is not None else entry["first_step_in_process_s"]
        peak = (entry["memory"] or {}).get("peak_bytes")
        ref_peak = (ref["memory"] or {}).get("peak_bytes")
        entry["peak_memory_bytes"] = peak
        entry["peak_memory_ratio_vs_jax"] = peak / ref_peak if peak is not None and ref_peak else None


def bench_workload(
    name: str,
    steps: int,
    rounds: int,
    small: bool = False,
    steps_per_call: int = 0,
    memory: bool = False,
    torch: bool | None = None,
    order: int = 0,
    variants: tuple = (),
    torch_compile: bool = False,
    warm: bool = False,
) -> dict:
    """Benchmark one workload (see the ``kaun-ir bench`` help); returns a result dict.

    ``small``: the tiny test sizes; ``steps_per_call``: K of the fused row (0: no such row;
    ``steps`` must be a multiple of it); ``memory``: child-process memory and first-step
    measurement; ``torch``: include PyTorch (None: when importable); ``order``: how far the
    order of the implementations is rotated (the CLI passes the workload's index);
    ``torch_compile``: add the ``torch.compile`` row (with PyTorch); ``warm`` (with ``memory``):
    also each kaun_ir row's first step with a warm persistent compilation cache."""
    _check_arguments(steps, rounds, steps_per_call)
    torch_ok, torch_line = torch_status()
    if torch is None:
        torch = torch_ok
    elif torch and not torch_ok:
        raise RuntimeError(torch_line)
    setup = Setup(name, small)
    names = implementations(steps_per_call, torch, tuple(variants), torch_compile)
    entries: dict[str, dict] = {impl: {} for impl in names}  # in table order
    schedule = _rotated(names, order)
    runners = _first_steps(schedule, setup, steps, steps_per_call, entries)
    _timed_rounds(schedule, runners, entries, steps, rounds)
    flops = bench_flops.step_flops(runners["kaun_ir"]) if "kaun_ir" in runners else None
    del runners  # free the arrays before any child process runs
    _compare(entries, rounds, flops)
    _memory(entries, schedule, name, small, steps_per_call, memory, warm)
    return {
        "workload": name,
        "description": setup.workload.description,
        "steps": steps,
        "rounds": rounds,
        "steps_per_call": steps_per_call,
        "small": small,
        "memory": memory,
        # the persistent compilation cache of the measured first steps (None: off, cold)
        "compilation_cache": disk_cache.directory(),
        "gflop_per_step": flops / 1e9 if flops else None,
        "order": schedule,
        "torch": torch_line if torch or not torch_ok else "not run (torch=False)",
        "implementations": entries,
        "losses_agree": all(entry["loss_agrees"] for entry in entries.values()),
    }

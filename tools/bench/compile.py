"""``kaun-ir bench --compile``: where the time to the first training step goes.

For every workload (and the bench transformer at several depths, ``--layers``, once with its
blocks unrolled and once rolled into a loop: ``layer.sequential(..., roll=True)``, the row
``transformer-N rolled``, which shares the JAX measurement of its depth), two fresh Python
processes each build the workload and run its first training step: one with kaun_ir, recording
every compilation stage (``kaun_ir.runtime.stages``: trace, each pass, lowering, XLA compile),
one with the JAX + optax reference (``jax.jit`` tracing, lowering and XLA compile inside its
first call). Each process first compiles something small with both kaun_ir and JAX, so neither
side pays for starting XLA; the first step is the first compilation of its kind in the process.

Reported per case: the nodes kaun_ir traced and kept after the passes, seconds per stage, nodes
per second of our own stages (trace + passes + lowering), the whole first step of each side
and their ratio, the process CPU seconds (all threads) of each first step and their ratio (the
figure to compare on a shared machine, where wall time depends on the other jobs), and the size of
the module each side hands to XLA (StableHLO ops). The persistent compilation cache is off
(cold first steps) unless ``KAUN_IR_CACHE_DIR`` is set; with it set, a repeated run
reads the pass pipeline's result (stage ``pass-cache``, shown as "(cache)" in the passes column)
and loads the XLA executable (stage ``xla-load``) from the persistent cache.
"""

from __future__ import annotations

import json
import re
import resource
import sys
import time

import numpy as np

from kaun_ir.tools.bench.memory import run_child, wait_for
from kaun_ir.tools.bench.reference import JaxRunner
from kaun_ir.tools.bench.runners import KaunRunner
from kaun_ir.tools.bench.workloads import Setup

_TAG = "kaun-ir-bench-compile:"
DEFAULT_LAYERS = (2, 8, 24)


def cases(workloads: list[str], layers: tuple[int, ...], small: bool) -> list[tuple[str, str, dict]]:
    """``(label, workload, config overrides)`` of every case to measure."""
    out = [(name, name, {}) for name in workloads]
    if "transformer" in workloads:
        for n in layers:
            out.append((f"transformer-{n}", "transformer", {"layers": n, "roll": False}))
            out.append((f"transformer-{n} rolled", "transformer", {"layers": n, "roll": True}))
    return out


def _stablehlo_ops(text: str) -> int:
    """Operations in a StableHLO module, generic (ours) or pretty (JAX's) form."""
    return len(re.findall(r'^\s*(?:%[\w#:, %]+ = )?"?(?:stablehlo|chlo|sdy)\.[a-z_]+', text, re.M))


def _cpu_seconds() -> float:
    """CPU time of this process, all threads (XLA compiles and runs on several)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_here(workload: str, overrides: dict, impl: str, small: bool) -> dict:
    """In this (fresh) process: the first step of ``impl`` on the workload, timed."""
    import jax

    from kaun_ir.runtime import jit, stages

    # start XLA and both tracing machineries before timing (see the module docstring)
    jax.jit(jax.grad(lambda v: (v * v).sum()))(np.ones(2, np.float32)).block_until_ready()
    np.asarray(jit(lambda v: (v * v).sum())(np.ones(2, np.float32)))
    setup = Setup(workload, small, overrides)
    if impl == "kaun_ir":
        start, cpu = time.perf_counter(), _cpu_seconds()
        with stages.record() as rec:
            runner = KaunRunner(setup)
            wait_for(runner.call())
        total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        executable = runner.trainer.cache.step.executables()[-1]
        traced = next((n for name, _, n in rec.stages if name == "trace"), None)
        return {
            "first_step_s": total,
            "first_step_cpu_s": cpu,
            "stages": rec.stages,
            "nodes_traced": traced,
            "nodes_optimised": len(executable.graph.nodes),
            "stablehlo_ops": _stablehlo_ops(executable.mlir),
        }
    start, cpu = time.perf_counter(), _cpu_seconds()
    runner = JaxRunner.of(setup)
    wait_for(runner.call())
    total, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    x, y = runner.batches[0]
    text = runner.jax_step.lower(runner.params, runner.opt_state, x, y).as_text()
    return {"first_step_s": total, "first_step_cpu_s": cpu, "stablehlo_ops": _stablehlo_ops(text)}


def _child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    result = measure_here(spec["workload"], spec["overrides"], spec["impl"], spec["small"])
    print(_TAG + json.dumps(result), flush=True)


def measure_in_child(workload: str, overrides: dict, impl: str, small: bool, timeout: float = 900) -> dict:
    """:func:`measure_here` in a fresh process; ``{"error": reason}`` if it fails."""
    spec = {"workload": workload, "overrides": overrides, "impl": impl, "small": small}
    return run_child("kaun_ir.tools.bench.compile", spec, _TAG, timeout)


def summarise(label: str, ours: dict, theirs: dict) -> dict:
    """One row of the report from the two children's measurements."""
    row = {"case": label, "kaun_ir": ours, "jax": theirs}
    if "error" in ours or "error" in theirs:
        return row
    by_stage: dict[str, float] = {}
    for name, seconds, _ in ours["stages"]:
        key = "passes" if name.startswith("pass:") else name
        by_stage[key] = by_stage.get(key, 0.0) + seconds
    row["seconds"] = by_stage
    own = sum(by_stage.get(k, 0.0) for k in ("trace", "passes", "pass-cache", "lower"))
    row["own_nodes_per_s"] = ours["nodes_traced"] / own if own > 0 else None
    row["ratio_vs_jax"] = ours["first_step_s"] / theirs["first_step_s"]
    row["cpu_ratio_vs_jax"] = ours["first_step_cpu_s"] / theirs["first_step_cpu_s"]
    return row


def format_report(rows: list[dict]) -> str:
    """The rows of a compile-time run as a Markdown table (the one in docs/performance-results.md)."""
    head = (
        "| case | nodes traced → kept | trace s | passes s | lower s | XLA s | own nodes/s | "
        "first step s | JAX first step s | ratio | CPU s (ours / JAX) | CPU ratio | "
        "StableHLO ops (ours / JAX) |"
    )
    lines = [head, "|" + "---|" * 13]
    for row in rows:
        ours, theirs = row["kaun_ir"], row["jax"]
        if "seconds" not in row:
            lines.append(f"| {row['case']} | {ours.get('error') or theirs.get('error')} |" + " |" * 11)
            continue
        s = row["seconds"]
        xla = s.get("xla-compile", 0.0) + s.get("xla-load", 0.0)
        # the graph cache's lookup (and store, on a miss) counts with the passes
        passes = s.get("passes", 0.0) + s.get("pass-cache", 0.0)
        passes_hit = "pass-cache" in s and "passes" not in s
        nodes = f"{ours['nodes_traced']} → {ours['nodes_optimised']}"
        lines.append(
            f"| {row['case']} | {nodes} | {s.get('trace', 0):.2f} | "
            f"{passes:.2f}{' (cache)' if passes_hit else ''} | {s.get('lower', 0):.2f} | {xla:.2f}"
            f"{' (cache)' if 'xla-load' in s else ''} | {row['own_nodes_per_s']:,.0f} | "
            f"{ours['first_step_s']:.2f} | {theirs['first_step_s']:.2f} | {row['ratio_vs_jax']:.2f} | "
            f"{ours['first_step_cpu_s']:.2f} / {theirs['first_step_cpu_s']:.2f} | "
            f"{row['cpu_ratio_vs_jax']:.2f} | {ours['stablehlo_ops']} / {theirs['stablehlo_ops']} |"
        )
    return "\n".join(lines)


def slowest_passes(rows: list[dict], top: int = 4) -> str:
    """The passes that took longest, summed over the cases (a pointer to where to look)."""
    totals: dict[str, float] = {}
    for row in rows:
        for name, seconds, _ in row["kaun_ir"].get("stages", []):
            if name.startswith("pass:"):
                base = name[len("pass:") :].split(" (#")[0]
                totals[base] = totals.get(base, 0.0) + seconds
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return "slowest passes over all cases: " + ", ".join(f"{n} {s:.2f} s" for n, s in ranked)


def run(names: list[str], layers: tuple[int, ...], small: bool, as_json: bool) -> int:
    """The ``--compile`` report; returns the exit status."""
    rows: list[dict] = []
    jax_done: dict[tuple, dict] = {}
    plan = cases(names, layers, small)
    for i, (label, workload, overrides) in enumerate(plan):
        if sys.stderr.isatty():
            sys.stderr.write(f"\rkaun-ir bench --compile: {label} ({i + 1}/{len(plan)})...\033[K")
            sys.stderr.flush()
        # alternate which side runs first, so a machine that slows down over time favours neither
        order = ["kaun_ir", "jax"] if i % 2 == 0 else ["jax", "kaun_ir"]
        # rolling is kaun_ir's: the rolled and unrolled rows share one JAX measurement
        jax_key = (workload, json.dumps({k: v for k, v in overrides.items() if k != "roll"}, sort_keys=True))
        measured = {}
        for impl in order:
            if impl == "jax" and jax_key in jax_done:
                measured[impl] = jax_done[jax_key]
                continue
            measured[impl] = measure_in_child(workload, overrides, impl, small)
        jax_done[jax_key] = measured["jax"]
        rows.append(summarise(label, measured["kaun_ir"], measured["jax"]))
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    failed = [r["case"] for r in rows if "seconds" not in r]
    if as_json:
        print(json.dumps({"rows": rows, "failed": failed}, indent=1))
    else:
        print("first training step in a fresh process: kaun_ir's stages against JAX's whole first step\n")
        print(format_report(rows))
        print()
        print(slowest_passes(rows))
    return 1 if failed else 0

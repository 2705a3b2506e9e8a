"""The output of ``kaun-ir bench``: the Markdown table, the footer under it, and the JSON document."""

from __future__ import annotations

import json
import os

from kaun_ir.tools.bench import flops as bench_flops
from kaun_ir.tools.bench.measure import FUSED_LOSS_RTOL, LOSS_RTOL, MIXED_LOSS_RTOL, TORCH_LOSS_RTOL
from kaun_ir.tools.bench.reference import torch_status


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _fmt_bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    mib = value / 2**20
    return f"{mib:.0f} MiB" if abs(mib) >= 100 else f"{mib:.1f} MiB"


def _fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def _fmt_gflops(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _first_step(entry: dict) -> str:
    """The first step's cell: the (cold) figure, and the warm-cache one when measured."""
    cold = _fmt_seconds(entry["first_step_s"])
    warm = entry.get("first_step_warm_s")
    return cold if warm is None else f"{cold} (warm {_fmt_seconds(warm)})"


def format_table(results: list[dict]) -> str:
    """A Markdown table: one row per workload and implementation."""
    lines = [
        "| workload | implementation | steps/s | first step | peak memory | N | loss after N | "
        "ratio vs JAX | GFLOP/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for impl, entry in r["implementations"].items():
            ratio = "" if entry["ratio_vs_jax"] is None else f"{entry['ratio_vs_jax']:.2f}"
            loss = f"{entry['loss_after_steps']:.6g}" + ("" if entry["loss_agrees"] else " (!)")
            lines.append(
                f"| {r['workload']} | {impl} | {_fmt_rate(entry['steps_per_s'])} | "
                f"{_first_step(entry)} | "
                f"{_fmt_bytes(entry['peak_memory_bytes'])} | {entry.get('loss_steps', r['steps'])} | "
                f"{loss} | {ratio} | "
                f"{_fmt_gflops(entry.get('gflops'))} |"
            )
    return "\n".join(lines)


def format_footer(results: list[dict], matmul: dict | None = None) -> str:
    """Per workload: loss agreement, peak memory relative to JAX's and XLA's memory analysis;
    the matmul microbenchmark against the steps' GFLOP/s; then what the columns mean."""
    lines = []
    for r in results:
        entries = r["implementations"]
        others = [impl for impl in entries if impl != "jax"]
        diffs = ", ".join(f"{impl} {entries[impl]['loss_rel_diff_vs_jax']:.1e}" for impl in others)
        bad = [impl for impl in others if not entries[impl]["loss_agrees"]]
        verdict = f"DISAGREE: {', '.join(bad)}" if bad else "agree"
        after = next(iter(entries.values())).get("loss_steps", r["steps"])  # the same for every row
        line = f"{r['workload']}: losses after {after} steps vs JAX {diffs} ({verdict})"
        ratios = [
            f"{impl} {entries[impl]['peak_memory_ratio_vs_jax']:.2f}x"
            for impl in others
            if entries[impl]["peak_memory_ratio_vs_jax"] is not None
        ]
        if ratios:
            line += f"; peak memory vs JAX {', '.join(ratios)}"
        xla = [
            f"{impl} {_fmt_bytes(e['memory']['xla']['total_bytes'])}"
            for impl, e in entries.items()
            if (e["memory"] or {}).get("xla")
        ]
        if xla:
            line += f"; XLA buffers {', '.join(xla)}"
        errors = [
            f"{impl}: {e['memory']['error']}"
            for impl, e in entries.items()
            if (e["memory"] or {}).get("error")
        ]
        if errors:
            line += f"; memory n/a ({'; '.join(errors)})"
        lines.append(line)
    lines.append(
        f"relative loss tolerances: kaun_ir {LOSS_RTOL:.0e}, kaun_ir[K] {FUSED_LOSS_RTOL:.0e}, "
        f"torch {TORCH_LOSS_RTOL:.0e}, kaun_ir[bfloat16|float16] {MIXED_LOSS_RTOL:.0e}, "
        f"kaun_ir[remat=...|closure] {LOSS_RTOL:.0e}, kaun_ir[iree] {FUSED_LOSS_RTOL:.0e}. "
        "steps/s: median of the rounds; ratio: steps/s over JAX's."
    )
    where = (
        "in a fresh process"
        if any(r["memory"] for r in results)
        else "in this process, implementation order rotated per workload"
    )
    caches = {r.get("compilation_cache") for r in results}
    cache = "off (cold)" if caches == {None} else "on (" + ", ".join(sorted(map(str, caches))) + ")"
    warm = any(e.get("first_step_warm_s") is not None for r in results for e in r["implementations"].values())
    lines.append(
        f"first step: build + trace + compile + first finished call (K steps for kaun_ir[K]) {where}; "
        f"persistent compilation cache {cache}"
        + ("; (warm ...): a fresh process whose cache a first one filled." if warm else ".")
    )
    if any(r["memory"] for r in results):
        lines.append(
            "peak memory: peak RSS while training (after the first call) minus RSS before building, "
            "a fresh process per implementation."
        )
    else:
        lines.append("peak memory: not measured (--no-memory).")
    lines.append(
        "GFLOP/s: the step's FLOPs (kaun_ir's cost model over the optimised step graph, the same "
        "count for every row) times steps/s."
    )
    matmul_line = bench_flops.format_line(matmul, results)
    if matmul_line:
        lines.append(matmul_line)
    lines.append(f"PyTorch: {results[0]['torch'] if results else torch_status()[1]}")
    lines.append(malloc_line())
    return "\n".join(lines)


def malloc_line() -> str:
    """Which C heap every row ran with: glibc's tunables (``kaun-ir bench`` restarts with them
    unless ``KAUN_IR_MALLOC_TUNING=0``) or the defaults a plain ``python train.py`` gets, which
    change the ratios (docs/performance.md, knob 9 and round 7)."""
    tunables = os.environ.get("GLIBC_TUNABLES")
    if tunables:
        return f"malloc: GLIBC_TUNABLES={tunables} for every row (docs/performance.md, knob 9)."
    return (
        "malloc: the C library's defaults for every row, as in a plain process "
        "(docs/performance.md, knob 9: kaun_ir's steps gain more than PyTorch's from the tunables)."
    )


def print_json(results: list[dict], matmul: dict | None, ok: bool) -> None:
    """The whole run as one JSON document on stdout."""
    from kaun_ir import runtime

    print(
        json.dumps(
            {
                "backend": runtime.backend_name(),
                "loss_rtol": LOSS_RTOL,
                "torch_loss_rtol": TORCH_LOSS_RTOL,
                "torch": torch_status()[1],
                "matmul": matmul,
                "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
                "results": results,
                "ok": ok,
            },
            indent=1,
        )
    )


def print_text(results: list[dict], matmul: dict | None, rounds: int) -> None:
    """The heading, the workloads' descriptions, the table and its footer on stdout."""
    from kaun_ir import runtime
    from kaun_ir.version import __version__

    print(
        f"kaun_ir {__version__} on XLA '{runtime.backend_name()}': {rounds} alternating "
        f"rounds of N steps per implementation\n"
    )
    for r in results:
        print(f"- {r['workload']}: {r['description']}")
    print()
    print(format_table(results))
    print()
    print(format_footer(results, matmul))

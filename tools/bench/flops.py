"""Achieved GFLOP/s in ``kaun-ir bench``: the FLOPs of a training step (kaun_ir's cost model,
``kaun_ir.ir.cost``, over the optimised step graph) times steps/s, against a matmul
microbenchmark run in the same bench run: XLA's own ``n x n @ n x n`` float32 matmul compiled
and run through kaun_ir's runtime (``kn.jit``), and ``torch.mm`` when PyTorch is importable.

The count is the model's arithmetic (2*M*N*K per matmul, one FLOP per element of element-wise
ops and reductions, nothing for data movement), the same for every implementation of a
workload, so GFLOP/s compares like steps/s does; against the matmul's rate it says how far a
step is from the machine's dense-matmul peak.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

#: the microbenchmark's matrix size (``--small``: MATMUL_SMALL_N)
MATMUL_N = 1024
MATMUL_SMALL_N = 64
#: timed calls of each matmul (the median is kept), after WARMUP untimed ones
MATMUL_CALLS = 15
WARMUP = 3


def step_flops(runner: Any) -> int | None:
    """FLOPs of one training step of a kaun_ir runner (``runners.KaunRunner``), from the cost model
    over the optimised step graph; None when the graph is not available."""
    from kaun_ir import train
    from kaun_ir.ir.cost import graph_cost

    x, y = runner.batches[0]
    try:
        graph = train.step_graph(runner.trainer, runner.state, x, y, optimized=True)
    except Exception:  # a variant the inspection does not cover: no figure rather than no bench
        return None
    return int(graph_cost(graph)[0])


def _median_seconds(call, block) -> float:
    for _ in range(WARMUP):
        block(call())
    times = []
    for _ in range(MATMUL_CALLS):
        start = time.perf_counter()
        block(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rates(n: int = MATMUL_N, torch: bool = True) -> dict:
    """GFLOP/s of an ``n x n`` float32 matmul: ``xla`` (XLA's dot through kaun_ir's runtime) and
    ``torch`` (``torch.mm``, None when not run); medians of MATMUL_CALLS blocking calls."""
    from kaun_ir.runtime import jit
    from kaun_ir.runtime.xla import backend, transfer

    r = np.random.default_rng(0)
    a, b = (r.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    flops = 2.0 * n**3
    device = backend.default_device()
    da, db = transfer.to_device(a, a.dtype, device), transfer.to_device(b, b.dtype, device)
    matmul = jit(lambda u, v: u @ v)
    out: dict[str, Any] = {"n": n, "flops": flops}
    out["xla"] = flops / _median_seconds(lambda: matmul(da, db), lambda v: v.block_until_ready()) / 1e9
    out["torch"] = None
    if torch:
        import torch as torch_

        ta, tb = torch_.from_numpy(a), torch_.from_numpy(b)
        out["torch"] = flops / _median_seconds(lambda: torch_.mm(ta, tb), lambda v: None) / 1e9
    return out


def format_line(rates: dict | None, results: list[dict]) -> str | None:
    """The footer line: the matmul rates and each workload's kaun_ir GFLOP/s against XLA's."""
    if rates is None:
        return None
    n = rates["n"]
    parts = [f"matmul {n}x{n}x{n} f32 in this run: XLA (kaun_ir runtime) {rates['xla']:.1f} GFLOP/s"]
    if rates["torch"] is not None:
        parts.append(f"torch.mm {rates['torch']:.1f} GFLOP/s")
    line = ", ".join(parts)
    shares = []
    for r in results:
        entry = r["implementations"].get("kaun_ir", {})
        if entry.get("gflops") is not None:
            shares.append(
                f"{r['workload']} {entry['gflops']:.1f} GFLOP/s ({entry['gflops'] / rates['xla']:.0%} of it)"
            )
    if shares:
        line += "; kaun_ir steps: " + ", ".join(shares)
    return line

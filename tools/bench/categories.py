"""``kaun-ir bench --categories``: the same training step of kaun_ir, PyTorch eager and
``torch.compile`` profiled side by side, time per step by category.

kaun_ir's step is recorded with ``kn.profile`` (XLA's trace; every kernel row carries its HLO
instruction and the layer path of the op it computes); PyTorch's with ``torch.profiler`` over the
CPU (self time of each ATen op; for ``torch.compile``, inductor's generated kernels are recorded
one by one, ``cpp.enable_kernel_profile``). Each kernel goes into one category:

- ``products``: matrix products and convolutions outside attention;
- ``attention products``: the batched products of attention (``q k^T`` and ``weights v``);
- ``softmax``: the exponentials and reductions of attention's softmax;
- ``norms``: layer and batch normalisation;
- ``element-wise``: the remaining arithmetic, activations, the loss;
- ``copies / transposes``: copies, transposes, concatenations, layout changes;
- ``optimiser``: the parameter update;
- ``idle``: the step's wall time not covered by any kernel (dispatch, waiting between kernels).

The split is by names (HLO fusion kinds and layer paths on one side, ATen op and inductor kernel
names on the other), so it is an estimate: a fused kernel counts whole in the category of the op
it is named after. A profiler slows what it records (PyTorch's per-op hooks much more than XLA's
per-kernel trace), so each column is scaled to its implementation's step time measured over the
same number of steps without the profiler: the shares are the profile's, the total is the real
step.
"""

from __future__ import annotations

import gzip
import json
import tempfile
import time
from typing import Any

CATEGORIES = (
    "products",
    "attention products",
    "softmax",
    "norms",
    "element-wise",
    "copies / transposes",
    "optimiser",
    "idle",
)
_COPIES = ("copy", "transpose", "concatenate", "bitcast", "reshape", "pad", "slice", "clone", "contiguous")
_NORMS = ("norm", "ln1", "ln2", "bn", "batch_norm", "layer_norm")


def _in_attention(path: str) -> bool:
    return "attention" in path or "/attn/" in path or "sdpa" in path or "scaled_dot_product" in path


def xla_category(hlo_op: str, op_name: str) -> str:
    """The category of one XLA kernel from its HLO instruction (``ynn_fusion.3``,
    ``multiply_erf_fusion``) and the layer path of the op it computes (``2.block/attention/exp``)."""
    kind = hlo_op.split(".")[0]
    op = op_name.rsplit("/", 1)[-1]
    path = op_name.lower()
    if path.startswith("optimizer"):
        return "optimiser"
    # XLA CPU's YNNPACK / XNNPACK fusions are matrix products, whatever op their root is named
    # after (a transposed operand's product carries the transpose's name)
    product = kind in ("dot", "convolution", "dot_general", "ynn_fusion", "xnn_fusion") or op in (
        "dot_general",
        "conv_general",
        "convolution",
    )
    if product and not kind.endswith("copy_fusion"):
        return "attention products" if "/attention/dot_general" in path else "products"
    if _in_attention(path) and op in ("exponential", "reduce", "reduce_max", "subtract", "divide", "maximum"):
        return "softmax"
    if any(token in path for token in _NORMS):
        return "norms"
    if (
        kind.startswith(_COPIES)
        or kind.endswith("copy_fusion")
        or op in ("transpose", "reshape", "concatenate")
    ):
        return "copies / transposes"
    return "element-wise"


def torch_category(name: str) -> str:
    """The category of one PyTorch profiler event (an ATen op, or an inductor kernel named
    ``cpp_fused_<ops>_<n>``)."""
    n = name.lower()
    if "optimizer" in n or "adam" in n or "_foreach" in n:
        return "optimiser"
    if "scaled_dot_product" in n or "flash_attention" in n or "bmm" in n or "baddbmm" in n:
        return "attention products"
    if any(
        k in n for k in ("::mm", "addmm", "matmul", "convolution", "mkldnn", "::linear", "extern_kernels")
    ):
        return "products"
    if "softmax" in n:
        return "softmax"
    if any(k in n for k in ("layer_norm", "batch_norm", "native_batch_norm", "var_mean")):
        return "norms"
    if any(k in n for k in ("copy", "transpose", "permute", "clone", "contiguous", "cat", "_unsafe_view")):
        return "copies / transposes"
    return "element-wise"


def _empty() -> dict[str, float]:
    return dict.fromkeys(CATEGORIES, 0.0)


def _steps(runner: Any, steps: int) -> float:
    """Run ``steps`` steps and wait for the last; the wall time in ms."""
    start = time.perf_counter()
    value = None
    for _ in range(steps):
        value = runner.call()
    runner.last_loss(value)
    return (time.perf_counter() - start) * 1e3


def profile_kaun(runner: Any, steps: int) -> dict[str, float]:
    """Milliseconds per step by category of ``steps`` kaun_ir steps (``runner`` warmed up). The
    profiled window is the span of the kernels (the profiler's own start and stop left out)."""
    from kaun_ir.runtime.profiling import profile

    with tempfile.TemporaryDirectory() as logdir:
        with profile(logdir, print_table=False, steps=steps) as prof:
            _steps(runner, steps)
        with gzip.open(prof.trace, "rt", encoding="utf-8") as handle:
            trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})]
    out = _empty()
    for event in kernels:
        category = xla_category(event["args"]["hlo_op"], event["args"].get("kaun_ir.op_name", ""))
        out[category] += float(event.get("dur", 0.0)) / 1e3
    span = max(e["ts"] + e.get("dur", 0.0) for e in kernels) - min(e["ts"] for e in kernels)
    return _per_step(out, span / 1e3, steps)


def profile_torch(runner: Any, steps: int) -> dict[str, float]:
    """Milliseconds per step by category of ``steps`` PyTorch steps (eager or compiled)."""
    import torch

    out = _empty()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        wall = _steps(runner, steps)
    for row in prof.key_averages():
        name = row.key
        if name.startswith(("ProfilerStep", "Torch-Compiled", "CompiledFunction", "## ", "autograd::")):
            continue
        out[torch_category(name)] += row.self_cpu_time_total / 1e3
    return _per_step(out, wall, steps)


def _per_step(totals: dict[str, float], wall_ms: float, steps: int) -> dict[str, float]:
    busy = sum(v for k, v in totals.items() if k != "idle")
    totals["idle"] = max(0.0, wall_ms - busy)
    return {k: v / steps for k, v in totals.items()}


def _scaled(shares: dict[str, float], step_ms: float) -> dict[str, float]:
    """``shares`` (ms per step under the profiler) scaled to sum to ``step_ms``."""
    total = sum(shares.values()) or 1.0
    out = {k: v * step_ms / total for k, v in shares.items()}
    out["step"] = step_ms
    out["profiled"] = total
    return out


def run(name: str, steps: int, small: bool, torch_compile: bool) -> dict[str, dict[str, float]]:
    """``{implementation: {category: ms per step}}`` for workload ``name`` (each implementation
    warmed up with four steps first)."""
    from kaun_ir.tools.bench import runners
    from kaun_ir.tools.bench.reference import torch_status
    from kaun_ir.tools.bench.workloads import Setup

    setup = Setup(name, small)
    impls = ["kaun_ir"]
    if torch_status()[0]:
        impls.append("torch")
        if torch_compile:
            import torch._inductor.config as inductor  # noqa: PLC0415 - optional

            inductor.cpp.enable_kernel_profile = True  # each generated kernel a profiler event
            impls.append(runners.TORCH_COMPILE)
    results = {}
    for impl in impls:
        runner = runners.make_runner(impl, setup)
        _steps(runner, 4)  # compile (torch.compile may compile again on its second call) and warm up
        step_ms = min(_steps(runner, steps) for _ in range(3)) / steps
        shares = (profile_kaun if impl == "kaun_ir" else profile_torch)(runner, steps)
        results[impl] = _scaled(shares, step_ms)
    return results


def table(name: str, results: dict[str, dict[str, float]]) -> str:
    """One Markdown table: a row per category, a column per implementation (ms per step)."""
    impls = list(results)
    lines = [
        f"| {name}: ms per step | " + " | ".join(impls) + " |",
        "|---|" + "---:|" * len(impls),
    ]
    for category in (*CATEGORIES, "step", "profiled"):
        cells = " | ".join(f"{results[i][category]:.2f}" for i in impls)
        label = {"step": "**step (no profiler)**", "profiled": "step under the profiler"}.get(
            category, category
        )
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)

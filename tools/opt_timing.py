"""``kaun-ir opt --backend B --time N``: a pipeline's effect on run time, on each compiler.

The input graph and the pipeline's result are both compiled on every backend named (XLA, IREE)
and run ``N`` times on the same seeded random inputs (floats from N(0, 0.5), integers in
[0, 2)); the report (stderr) gives each one's compile time and median time per call, and the
change the pipeline made. See docs/passes.md ("Measuring a pass on both compilers").
"""

from __future__ import annotations

import statistics
import time


def _measure(graph, backend: str, inputs: list, calls: int) -> tuple[float, float]:
    """(compile seconds, median seconds per call) of ``graph`` on ``backend``."""
    import numpy as np

    from kaun_ir.runtime.compilation import compile_graph

    start = time.perf_counter()
    exe = compile_graph(graph, backend=backend)
    np.asarray(exe(*inputs)[0])  # the first call, finished (results are read back)
    compiled = time.perf_counter() - start
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        outs = exe(*inputs)
        np.asarray(outs[0])
        times.append(time.perf_counter() - start)
    return compiled, statistics.median(times)


def report(before, after, backends: list[str], calls: int, seed: int = 0) -> str:
    """The timing table of ``before`` and ``after`` (graphs with the same inputs) on ``backends``."""
    from kaun_ir.runtime import backends as names
    from kaun_ir.runtime.diff_backends import random_inputs

    inputs = random_inputs(before, seed)
    lines = [
        f"run time of the graph before and after the pipeline ({calls} calls each, median; "
        "seeded random inputs)",
        f"{'backend':<12} {'compile before':>15} {'compile after':>14} {'call before':>12} "
        f"{'call after':>11} {'change':>8}",
    ]
    for backend in backends:
        name = names.resolve(backend, "--backend")
        compile_a, call_a = _measure(before, name, inputs, calls)
        compile_b, call_b = _measure(after, name, inputs, calls)
        change = (call_b - call_a) / call_a * 100 if call_a > 0 else 0.0
        lines.append(
            f"{name:<12} {compile_a * 1e3:>12.1f} ms {compile_b * 1e3:>11.1f} ms "
            f"{call_a * 1e6:>9.1f} µs {call_b * 1e6:>8.1f} µs {change:>+7.1f}%"
        )
    return "\n".join(lines) + "\n"

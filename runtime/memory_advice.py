"""The last part of a memory report: what to try, in words, from what the peak holds and what
the rematerialisation policies measured.

Rematerialisation recomputes the activations a segment (a top-level layer, with ``remat_depth=1``)
saved for the backward pass, keeping only the values entering the segment. It can only lower a
peak made of saved activations, and only where a segment spans several layers: in a flat model
each segment is one layer, and the value entering it is the previous layer's output, the very
activation that was saved, so the recomputation keeps the same bytes and adds its own buffers.
"""

from __future__ import annotations

__all__ = ["advice"]

#: a policy must lower the replayed peak by at least this fraction to be worth recommending
_WORTH = 0.05
#: what each built-in policy costs
_COST = {
    "nothing": "recomputes each segment's forward pass in the backward pass (about a third more work)",
    "dots": "keeps the matrix products and recomputes only the element-wise work between them",
}


def _share(report, kind: str) -> float:
    return report.by_kind.get(kind, 0) / max(report.peak_bytes, 1)


def _percent(share: float) -> str:
    return "under 1%" if share < 0.01 else f"{100 * share:.0f}%"


def _composition(report) -> str:
    mib = 1 << 20
    parts = sorted(report.by_kind.items(), key=lambda item: -item[1])
    shown = [
        f"{kind} {size / mib:.2f} MiB ({_percent(size / max(report.peak_bytes, 1))})"
        for kind, size in parts[:3]
    ]
    return f"The peak of {report.peak_bytes / mib:.2f} MiB holds " + ", ".join(shown)


def _not_activations(report) -> str:
    """What to try when the peak is not saved activations."""
    if not report.training:
        return (
            "most of it is the inputs and the temporaries of the computation (no backward pass "
            "here, so remat does not apply): a smaller batch lowers the batch-sized buffers, and "
            "bfloat16 inputs and weights halve them"
        )
    weights = _share(report, "parameters") + _share(report, "optimiser state")
    if weights >= 0.5:
        return (
            "most of it is parameters and optimiser state, which every step keeps: an optimiser "
            "with fewer slots (optim.lion or optim.sgd keep one or none, Adam two), or spreading "
            "them over devices (kn.sharding), lowers it; remat and a smaller batch do not"
        )
    return (
        "most of it is temporaries of the backward pass and the update (gradients, the "
        "optimiser's new values): a smaller batch, or train.make(..., accumulate=N) over "
        "micro-batches N times smaller, lowers the batch-sized ones; "
        "precision='bfloat16' halves the products' temporaries"
    )


def _why_remat_failed(report) -> str:
    if _share(report, "activations saved for backward") < 0.3:
        return (
            f"only {_percent(_share(report, 'activations saved for backward'))} of the peak is "
            "activations saved for the backward pass, the one thing remat recomputes; "
            + _not_activations(report)
        )
    return (
        "the activations are saved by separate top-level layers, and a remat segment is one "
        "top-level layer (remat_depth=1): the value entering each segment, which remat keeps, "
        "is the previous layer's output, the same activation, so nothing is freed and the "
        "recomputation adds buffers of its own. Group consecutive layers into blocks "
        "(layer.sequential([...]) per block) so that a segment keeps only its block's input, or "
        "lower the activations themselves with a smaller batch or train.make(..., accumulate=N)"
    )


def _remat_lines(report) -> list[str]:
    base = max(report.peak_bytes, 1)
    measured = [
        (policy, peak / base, stats["temp"] / max(report.stats["temp"], 1))
        for policy, stats, peak in report.remat
    ]
    best = min(measured, key=lambda row: row[1])
    if best[1] <= 1 - _WORTH:
        policy, peak_ratio, temp_ratio = best
        cost = _COST.get(policy, "recomputes what the policy does not keep")
        return [
            f"Try train.make(..., remat={policy!r}): it lowers the replayed peak to {peak_ratio:.2f} x "
            f"and XLA's temporaries to {temp_ratio:.2f} x (measured by compiling it); it {cost}."
        ]
    changes = ", ".join(f"{policy!r} {100 * (ratio - 1):+.0f}%" for policy, ratio, _ in measured)
    verdict = "makes the peak larger" if best[1] > 1.005 else f"saves less than {_WORTH:.0%} of the peak"
    return [
        f"Remat will not help here: every policy measured {verdict} ({changes}); "
        + _why_remat_failed(report)
        + "."
    ]


def advice(report) -> list[str]:
    """Sentences saying what to try for ``report`` (a :class:`~kaun_ir.runtime.memory.MemoryReport`)."""
    lines = [_composition(report) + "."]
    if report.remat:
        return lines + _remat_lines(report)
    if _share(report, "activations saved for backward") >= 0.3:
        lines.append(
            "Activations saved for the backward pass are a large part of it: measure rematerialisation "
            "with kn.memory_report(trainer, st, x, y, remat=('nothing', 'dots')) or kaun-ir memory "
            "--remat nothing dots before choosing a policy."
        )
    else:
        text = _not_activations(report)
        lines.append(text[0].upper() + text[1:] + ".")
    return lines

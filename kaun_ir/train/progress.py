"""What ``train.fit`` shows and logs while it trains: the progress bar, the learning rate at a
step, and the examples and tokens of a batch (for the throughput figures)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import tree

__all__ = ["Progress", "batch_sizes", "learning_rate", "length", "progress_line"]


class Progress:
    """A one-line progress bar on a terminal (stderr); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.perf_counter()

    def update(
        self,
        count: int,
        loss_value: Callable[[], float],
        final: bool = False,
        extra: Callable[[], str] | None = None,
    ) -> None:
        """Redraw the line after ``count`` steps (at most ten times a second unless ``final``);
        ``loss_value()`` reads the loss only when the line is drawn."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.1:
            return
        self.last = now
        sys.stderr.write(
            f"\r{progress_line(count, self.total, loss_value(), count / max(now - self.start, 1e-9))}"
        )
        if extra is not None:
            sys.stderr.write(extra())
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def progress_line(count: int, total: int | None, loss: float, steps_per_s: float) -> str:
    """The progress bar's text: ``[####....] 12/40  loss 0.5213  31.2 steps/s``."""
    if total:
        width = 24
        filled = min(width, int(width * count / total))
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {count}/{total}"
    else:
        bar = f"step {count}"
    return f"{bar}  loss {loss:.4f}  {steps_per_s:.1f} steps/s"


def learning_rate(optimizer: Any, t: int) -> float | None:
    """The learning rate ``optimizer`` uses at the 1-based step ``t`` (its ``lr`` hyper-parameter,
    a schedule evaluated at ``t``; searched through chains), or None when it has none."""
    hyper = getattr(optimizer, "hyperparams", None) or {}
    for key in ("lr", "learning_rate"):
        if key in hyper:
            lr = hyper[key]
            return float(np.asarray(lr(np.int32(t)) if callable(lr) else lr))
    for value in hyper.values():
        for inner in value if isinstance(value, (list, tuple)) else [value]:
            if hasattr(inner, "hyperparams"):
                found = learning_rate(inner, t)
                if found is not None:
                    return found
    return None


def batch_sizes(x: Any) -> tuple[int, int | None]:
    """Examples and tokens in a batch's inputs: the first axis of the first array, and the
    element count of integer inputs of rank >= 2 (token ids ``[batch, time]``), else None."""
    leaves = [leaf for leaf in tree.flatten(x)[0] if hasattr(leaf, "shape") and len(leaf.shape)]
    if not leaves:
        return 0, None
    first = leaves[0]
    examples = int(first.shape[0])
    dtype = np.dtype(getattr(first, "dtype", np.float32))
    tokens = int(np.prod(first.shape)) if dtype.kind in "iu" and len(first.shape) >= 2 else None
    return examples, tokens


def length(data: Iterable) -> int | None:
    """``len(data)``, or None for an iterable without a length."""
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None

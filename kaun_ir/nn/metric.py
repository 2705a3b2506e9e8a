"""``kn.metric``: classification metrics and a running-mean tracker.

Metrics are evaluated on concrete arrays (NumPy arrays or ``jax.Array``s, e.g. a model's
predictions) and computed on the host with NumPy, which is simpler than a compiled graph and
cheap next to the model; they return Python floats. Calling one inside a trace raises
``TypeError``.

Predictions and targets may each be given as

* class scores ``[..., C]`` (logits or probabilities; the predicted class is the ``argmax``), or
* integer class labels ``[...]`` (for targets also a one-hot / score array ``[..., C]``, whose
  ``argmax`` is the label).

When both have the same rank they are both labels (integer predictions) or, for rank >= 2 and
float predictions, scores and one-hot ``[..., C]``; when the predictions have one axis more they
are scores and the targets labels. Float predictions of rank 1 with labels are rejected (use
``binary_accuracy`` for probabilities of a yes/no problem).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.names import public_dir
from kaun_ir.surface.tensor import Tensor

__all__ = ["accuracy", "binary_accuracy", "precision", "recall", "f1", "tracker", "Tracker", "Summary"]


def _host(x: Any, name: str) -> np.ndarray:
    if isinstance(x, Tensor):
        raise TypeError(
            f"metric.{name} works on concrete arrays; it cannot run inside a trace "
            "(return the predictions from the compiled function and measure them outside)"
        )
    return np.asarray(x)


def _is_integral(a: np.ndarray) -> bool:
    return a.dtype.kind in "iub"


def _labels(name: str, preds: Any, targets: Any) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Flat predicted and target labels, and the class count implied by a ``[..., C]`` input."""
    p, t = _host(preds, name), _host(targets, name)
    classes = None
    if p.ndim == t.ndim + 1:
        if p.ndim < 1 or p.shape[-1] == 0:
            raise ShapeError(f"metric.{name}: predictions {list(p.shape)} need a non-empty class axis")
        if not _is_integral(t):
            raise TypeError(
                f"metric.{name}: targets of shape {list(t.shape)} are class labels and must "
                f"be integers, got {t.dtype}"
            )
        classes = p.shape[-1]
        p = np.argmax(p, axis=-1)
    elif p.ndim == t.ndim:
        if _is_integral(p) and _is_integral(t):
            pass
        elif p.ndim >= 2 and not _is_integral(p):  # scores [..., C] and one-hot [..., C]
            if p.shape[-1] == 0:
                raise ShapeError(f"metric.{name}: predictions {list(p.shape)} have an empty class axis")
            classes = p.shape[-1]
            p, t = np.argmax(p, axis=-1), np.argmax(t, axis=-1)
        else:
            raise TypeError(
                f"metric.{name}: predictions {p.dtype}{list(p.shape)} and targets "
                f"{t.dtype}{list(t.shape)} of the same rank must both be integer labels or "
                "both [..., C] scores (for binary probabilities use metric.binary_accuracy)"
            )
    else:
        raise ShapeError(
            f"metric.{name}: predictions {list(p.shape)} and targets {list(t.shape)}: expected "
            "scores [..., C] with labels [...] or one-hot [..., C], or labels with labels"
        )
    if p.shape != t.shape:
        raise ShapeError(
            f"metric.{name}: predictions give labels of shape {list(p.shape)}, targets {list(t.shape)}"
        )
    if p.size == 0:
        raise ValueError(f"metric.{name}: no examples")
    return p.reshape(-1).astype(np.int64), t.reshape(-1).astype(np.int64), classes


def accuracy(preds: Any, targets: Any) -> float:
    """The fraction of examples whose predicted class equals the target class.

    preds ``[N, C]`` scores or ``[N]`` integer labels (any leading shape instead of ``N``);
    targets ``[N]`` integer labels or ``[N, C]`` one-hot. Returns a float in [0, 1].
    """
    p, t, _ = _labels("accuracy", preds, targets)
    return float(np.mean(p == t))


def binary_accuracy(preds: Any, targets: Any, threshold: float = 0.5) -> float:
    """The fraction of correct yes/no predictions.

    preds ``[...]`` probabilities (a prediction is positive when ``> threshold``) or bools;
    targets ``[...]`` (same shape) 0/1 or bools (positive when ``>= 0.5``). For logits pass
    ``threshold=0.0``.
    """
    p, t = _host(preds, "binary_accuracy"), _host(targets, "binary_accuracy")
    if p.shape != t.shape:
        raise ShapeError(
            f"metric.binary_accuracy: predictions {list(p.shape)} and targets "
            f"{list(t.shape)} must have the same shape"
        )
    if p.size == 0:
        raise ValueError("metric.binary_accuracy: no examples")
    predicted = p.astype(np.float64) > threshold
    actual = t.astype(np.float64) >= 0.5
    return float(np.mean(predicted == actual))


_AVERAGES = ("macro", "micro", "weighted", None)


def _scores(name: str, preds: Any, targets: Any, average: str | None, num_classes: int | None):
    """Per-class true positives, false positives, false negatives and the classes present."""
    if average not in _AVERAGES:
        raise ValueError(f"metric.{name}: average must be one of {list(_AVERAGES)}, got {average!r}")
    p, t, implied = _labels(name, preds, targets)
    if num_classes is None:
        num_classes = implied if implied is not None else int(max(p.max(), t.max())) + 1
    elif implied is not None and implied != num_classes:
        raise ShapeError(f"metric.{name}: num_classes={num_classes} but the class axis has {implied}")
    low, high = int(min(p.min(), t.min())), int(max(p.max(), t.max()))
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"metric.{name}: labels must lie in [0, {num_classes}), got values from {low} to {high}"
        )
    true_pos = np.bincount(t[p == t], minlength=num_classes).astype(np.float64)
    predicted = np.bincount(p, minlength=num_classes).astype(np.float64)
    support = np.bincount(t, minlength=num_classes).astype(np.float64)
    return true_pos, predicted - true_pos, support - true_pos, support


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """``numerator / denominator`` with 0 where the denominator is 0 (sklearn's zero_division=0)."""
    safe = np.where(denominator > 0, denominator, 1.0)
    return np.where(denominator > 0, numerator / safe, 0.0)


def _average(per_class: np.ndarray, support: np.ndarray, present: np.ndarray, average: str | None):
    if average is None:
        return per_class
    if average == "weighted":
        return float(np.sum(per_class * support) / np.sum(support)) if np.sum(support) else 0.0
    return float(np.mean(per_class[present]))  # macro


def _metric(name: str, preds, targets, average, num_classes, numerator, denominator):
    tp, fp, fn, support = _scores(name, preds, targets, average, num_classes)
    if average == "micro":
        total = _ratio(numerator(tp.sum(), fp.sum(), fn.sum()), denominator(tp.sum(), fp.sum(), fn.sum()))
        return float(total)
    per_class = _ratio(numerator(tp, fp, fn), denominator(tp, fp, fn))
    present = (tp + fp + fn) > 0  # classes that occur in the predictions or the targets
    return _average(per_class, support, present, average)


def precision(preds: Any, targets: Any, average: str | None = "macro", num_classes: int | None = None):
    """Precision: of the examples predicted as class c, the fraction that are c.

    preds and targets as for :func:`accuracy` (scores ``[N, C]`` or labels ``[N]``; labels or
    one-hot ``[N, C]``). Per class c: ``tp / (tp + fp)``, 0 when the denominator is 0.
    ``average``: ``"macro"`` (unweighted mean over the classes that occur in preds or targets,
    like scikit-learn), ``"micro"`` (from the totals over all classes), ``"weighted"`` (mean
    weighted by each class's number of targets), or ``None`` (a NumPy array with one score per
    class ``0 .. num_classes-1``). ``num_classes`` defaults to ``C`` of a ``[N, C]`` input, else
    to the largest label + 1. Returns a float.
    """
    return _metric(
        "precision", preds, targets, average, num_classes, lambda tp, fp, fn: tp, lambda tp, fp, fn: tp + fp
    )


def recall(preds: Any, targets: Any, average: str | None = "macro", num_classes: int | None = None):
    """Recall: of the examples of class c, the fraction predicted as c.

    Per class c: ``tp / (tp + fn)``, 0 when the denominator is 0. The arguments, ``average``
    (``"macro"``, ``"micro"``, ``"weighted"`` or ``None`` for per-class scores) and
    ``num_classes`` are as for :func:`precision`. Returns a float.
    """
    return _metric(
        "recall", preds, targets, average, num_classes, lambda tp, fp, fn: tp, lambda tp, fp, fn: tp + fn
    )


def f1(preds: Any, targets: Any, average: str | None = "macro", num_classes: int | None = None):
    """F1: the harmonic mean of precision and recall.

    Per class c: ``2 tp / (2 tp + fp + fn)``, 0 when the denominator is 0. The arguments,
    ``average`` (``"macro"``, ``"micro"``, ``"weighted"`` or ``None`` for per-class scores) and
    ``num_classes`` are as for :func:`precision`. Returns a float.
    """
    return _metric(
        "f1",
        preds,
        targets,
        average,
        num_classes,
        lambda tp, fp, fn: 2 * tp,
        lambda tp, fp, fn: 2 * tp + fp + fn,
    )


# ------------------------------------------------------------------------------ tracker


class Summary(dict):
    """``{name: mean}`` in the order the names were first observed; prints as
    ``loss: 0.2315  accuracy: 0.9531``."""

    def __str__(self) -> str:
        return "  ".join(f"{name}: {value:.4g}" for name, value in self.items())


class Tracker:
    """A host-side accumulator of running (weighted) means, e.g. per epoch.

    ``observe(name, value, weight=1.0)`` records a scalar (Python number, NumPy or ``jax.Array``
    scalar); device values are read lazily, in batches, so observing does not wait for the
    device after every step. ``mean(name)``, ``count(name)``, ``summary()``, ``reset()``.
    """

    _PENDING_LIMIT = 64  # device scalars kept before they are read and folded into the sums

    def __init__(self):
        self._sums: dict[str, list] = {}  # name -> [weighted sum, total weight, observations]
        self._pending: dict[str, list] = {}

    def observe(self, name: str, value: Any, weight: float = 1.0) -> None:
        """Record ``value`` (a scalar) under ``name`` with ``weight`` (e.g. the batch size)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"metric.tracker: a metric name must be a non-empty string, got {name!r}")
        if isinstance(value, Tensor):
            raise TypeError("metric.tracker: observe needs a concrete value, got a traced tensor")
        if getattr(value, "shape", ()) not in ((), (1,)) or isinstance(value, (list, tuple, dict)):
            raise ValueError(f"metric.tracker: {name!r} must be a scalar, got shape {list(np.shape(value))}")
        if not weight >= 0:
            raise ValueError(f"metric.tracker: weight must be >= 0, got {weight}")
        self._sums.setdefault(name, [0.0, 0.0, 0])
        pending = self._pending.setdefault(name, [])
        pending.append((value, float(weight)))
        if len(pending) >= self._PENDING_LIMIT:
            self._fold(name)

    def _fold(self, name: str) -> None:
        entry = self._sums[name]
        for value, weight in self._pending.pop(name, []):
            entry[0] += float(np.asarray(value).reshape(())) * weight
            entry[1] += weight
            entry[2] += 1

    def _entry(self, name: str) -> list:
        if name not in self._sums:
            raise KeyError(f"metric.tracker: nothing observed under {name!r} (observed: {list(self._sums)})")
        self._fold(name)
        return self._sums[name]

    def mean(self, name: str) -> float:
        """The weighted mean of everything observed under ``name`` (NaN if all weights are 0)."""
        total, weight, _ = self._entry(name)
        return total / weight if weight else float("nan")

    def count(self, name: str) -> int:
        """How many values were observed under ``name``."""
        return self._entry(name)[2]

    def names(self) -> list[str]:
        """The names observed so far, in first-observed order."""
        return list(self._sums)

    def summary(self) -> Summary:
        """``{name: mean}`` for every name, in first-observed order."""
        return Summary((name, self.mean(name)) for name in self._sums)

    def reset(self) -> None:
        """Forget everything (e.g. at the start of an epoch)."""
        self._sums.clear()
        self._pending.clear()

    def __str__(self) -> str:
        return str(self.summary())

    def __repr__(self) -> str:
        return f"Tracker({self.summary()})"


def tracker() -> Tracker:
    """A new, empty :class:`Tracker`."""
    return Tracker()


__dir__ = public_dir(__all__)

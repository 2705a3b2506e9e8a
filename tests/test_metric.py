"""kn.metric against plain-Python reference implementations written here (loops over examples
and classes, no shared code with kaun_ir.nn.metric), and the tracker."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import ShapeError
from kaun_ir.nn import metric

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------- references


def ref_labels(preds, targets):
    """Predicted and true labels as Python lists, by explicit loops."""
    preds, targets = np.asarray(preds), np.asarray(targets)

    def argmax(row):
        best = 0
        for j, v in enumerate(row):
            if v > row[best]:
                best = j
        return best

    p = (
        [argmax(r) for r in preds.reshape(-1, preds.shape[-1])]
        if preds.dtype.kind == "f"
        else list(preds.reshape(-1))
    )
    t = (
        [argmax(r) for r in targets.reshape(-1, targets.shape[-1])]
        if targets.dtype.kind == "f"
        else list(targets.reshape(-1))
    )
    return [int(v) for v in p], [int(v) for v in t]


def ref_accuracy(preds, targets):
    p, t = ref_labels(preds, targets)
    return sum(1 for a, b in zip(p, t) if a == b) / len(p)


def ref_scores(kind, preds, targets, average, num_classes=None):
    p, t = ref_labels(preds, targets)
    classes = range(num_classes if num_classes else max(p + t) + 1)
    tp = {c: sum(1 for a, b in zip(p, t) if a == c and b == c) for c in classes}
    fp = {c: sum(1 for a, b in zip(p, t) if a == c and b != c) for c in classes}
    fn = {c: sum(1 for a, b in zip(p, t) if a != c and b == c) for c in classes}

    def score(tp_, fp_, fn_):
        prec = tp_ / (tp_ + fp_) if tp_ + fp_ else 0.0
        rec = tp_ / (tp_ + fn_) if tp_ + fn_ else 0.0
        f = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        return {"precision": prec, "recall": rec, "f1": f}[kind]

    if average == "micro":
        return score(sum(tp.values()), sum(fp.values()), sum(fn.values()))
    per_class = {c: score(tp[c], fp[c], fn[c]) for c in classes}
    if average is None:
        return [per_class[c] for c in classes]
    present = [c for c in classes if c in p or c in t]
    if average == "macro":
        return sum(per_class[c] for c in present) / len(present)
    support = {c: t.count(c) for c in classes}
    return sum(per_class[c] * support[c] for c in classes) / len(t)


# ---------------------------------------------------------------------------------- tests


SCORES = RNG.standard_normal((40, 4)).astype(np.float32)
TRUE = RNG.integers(0, 4, size=40).astype(np.int32)
TRUE[:10] = np.argmax(SCORES[:10], axis=1)  # some correct predictions


def test_accuracy_forms():
    expected = ref_accuracy(SCORES, TRUE)
    assert 0 < expected < 1
    one_hot = np.eye(4, dtype=np.float32)[TRUE]
    labels = np.argmax(SCORES, axis=1).astype(np.int64)
    forms = [
        (SCORES, TRUE),
        (SCORES, one_hot),
        (labels, TRUE),
        (jnp.asarray(SCORES), jnp.asarray(TRUE)),
        (kn.softmax(SCORES), TRUE),
    ]
    for preds, targets in forms:
        value = metric.accuracy(preds, targets)
        assert isinstance(value, float)
        assert value == pytest.approx(expected)
    # leading axes other than one batch axis
    assert metric.accuracy(SCORES.reshape(8, 5, 4), TRUE.reshape(8, 5)) == pytest.approx(expected)
    assert metric.accuracy(np.asarray([1, 2, 3]), np.asarray([1, 2, 0])) == pytest.approx(2 / 3)


def test_binary_accuracy():
    probs = RNG.uniform(size=(30,)).astype(np.float32)
    targets = RNG.integers(0, 2, size=30)
    expected = sum(1 for p, t in zip(probs, targets) if (p > 0.5) == (t == 1)) / 30
    assert metric.binary_accuracy(probs, targets) == pytest.approx(expected)
    assert metric.binary_accuracy(probs, targets.astype(bool)) == pytest.approx(expected)
    expected_03 = sum(1 for p, t in zip(probs, targets) if (p > 0.3) == (t == 1)) / 30
    assert metric.binary_accuracy(probs, targets, threshold=0.3) == pytest.approx(expected_03)
    logits = np.log(probs / (1 - probs))
    assert metric.binary_accuracy(logits, targets, threshold=0.0) == pytest.approx(expected)
    assert metric.binary_accuracy(probs > 0.5, targets) == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["precision", "recall", "f1"])
@pytest.mark.parametrize("average", ["macro", "micro", "weighted", None])
def test_precision_recall_f1(kind, average):
    fn = getattr(metric, kind)
    got = fn(SCORES, TRUE, average=average)
    want = ref_scores(kind, SCORES, TRUE, average)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # labels that skip a class, with an explicit class count: class 2 never occurs
    preds = np.asarray([0, 1, 1, 3, 3, 0, 4, 4], np.int32)
    targets = np.asarray([0, 1, 3, 3, 0, 0, 4, 1], np.int32)
    got = fn(preds, targets, average=average, num_classes=6)
    np.testing.assert_allclose(got, ref_scores(kind, preds, targets, average, num_classes=6), rtol=1e-12)


def test_micro_scores_equal_accuracy_for_single_label():
    accuracy = metric.accuracy(SCORES, TRUE)
    for fn in (metric.precision, metric.recall, metric.f1):
        assert fn(SCORES, TRUE, average="micro") == pytest.approx(accuracy)


def test_perfect_and_degenerate():
    labels = np.asarray([0, 1, 2, 2], np.int32)
    for fn in (metric.precision, metric.recall, metric.f1, metric.accuracy):
        assert fn(labels, labels) == 1.0
    # a class that is predicted but never true: precision 0 for it, recall undefined -> 0
    assert metric.precision(np.asarray([0, 0]), np.asarray([1, 1])) == 0.0


def test_metric_errors():
    with pytest.raises(ShapeError):
        metric.accuracy(SCORES, TRUE[:5])
    with pytest.raises(TypeError, match="integers"):
        metric.accuracy(SCORES, TRUE.astype(np.float32))
    with pytest.raises(TypeError, match="binary_accuracy"):
        metric.accuracy(np.asarray([0.2, 0.9]), np.asarray([0, 1]))
    with pytest.raises(ShapeError):
        metric.binary_accuracy(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="average"):
        metric.f1(SCORES, TRUE, average="samples")
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        metric.recall(np.asarray([0, 1, 5]), np.asarray([0, 1, 2]), num_classes=3)
    with pytest.raises(ValueError, match="no examples"):
        metric.accuracy(np.zeros((0, 3), np.float32), np.zeros((0,), np.int32))
    with pytest.raises(TypeError, match="concrete"):
        kn.trace(lambda x: metric.accuracy(x, TRUE), SCORES)


def test_tracker():
    tr = metric.tracker()
    losses = RNG.uniform(size=150)
    for i, value in enumerate(losses):
        tr.observe("loss", jnp.asarray(value, jnp.float32) if i % 2 else float(value))
        if i % 3 == 0:
            tr.observe("accuracy", np.float32(i / 150), weight=2.0)
    assert tr.count("loss") == 150
    assert tr.mean("loss") == pytest.approx(float(np.mean(losses.astype(np.float32))), rel=1e-6)
    accuracies = [i / 150 for i in range(150) if i % 3 == 0]
    assert tr.mean("accuracy") == pytest.approx(sum(accuracies) / len(accuracies), rel=1e-6)
    summary = tr.summary()
    assert isinstance(summary, dict) and list(summary) == ["loss", "accuracy"]
    assert summary["loss"] == tr.mean("loss")
    text = str(summary)
    assert text.startswith("loss: ") and "accuracy: " in text and str(tr) == text
    tr.observe("weighted", 1.0, weight=1)
    tr.observe("weighted", 4.0, weight=3)
    assert tr.mean("weighted") == pytest.approx(13 / 4)
    with pytest.raises(KeyError, match="'lost'.*observed"):
        tr.mean("lost")
    with pytest.raises(ValueError, match="scalar"):
        tr.observe("loss", np.ones(3))
    tr.reset()
    assert tr.summary() == {} and tr.names() == []

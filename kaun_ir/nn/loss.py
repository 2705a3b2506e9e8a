"""``kn.loss``: loss functions. Each returns the scalar mean over all examples.

All are composites of differentiable ops (``kn.grad`` works, and grad of grad), run inside a
trace or, on concrete arrays, as one compiled graph per signature; the two softmax
cross-entropies also have a derivative rule of their own (below), itself differentiable.
Shapes are checked strictly: predictions and targets must have exactly the shapes stated (no
broadcasting, which would hide an ``[N, 1]`` vs ``[N]`` mistake); a mismatch raises
:class:`kaun_ir.ShapeError`. Integer or bool targets are converted to the predictions' float
dtype; integer predictions to float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.names import public_dir
from kaun_ir.nn.functional import compute_dtype
from kaun_ir.surface import reductions
from kaun_ir.surface.elementwise import abs as absolute
from kaun_ir.surface.elementwise import (
    add,
    bitwise_and,
    clip,
    exp,
    greater_equal,
    less,
    log1p,
    maximum,
    minimum,
    multiply,
    negative,
    subtract,
    where,
)
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.shapes import expand_dims
from kaun_ir.surface.take import one_hot as _one_hot
from kaun_ir.surface.take import take_along_axis
from kaun_ir.transforms.custom import custom_vjp

__all__ = ["cross_entropy", "cross_entropy_sparse", "binary_cross_entropy", "mse", "mae", "huber"]


def _shape_text(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _float(x: Any) -> Any:
    return x if dtypes.is_float(dtype_of(x)) else astype(x, dtypes.float32)


def _same_shape(name: str, what: tuple[str, str], a: Any, b: Any) -> None:
    sa, sb = shape_of(a), shape_of(b)
    if sa != sb:
        raise ShapeError(
            f"loss.{name}: {what[0]} {_shape_text(sa)} and {what[1]} {_shape_text(sb)} "
            "must have the same shape"
        )


def _pair(name: str, what: tuple[str, str], predictions: Any, targets: Any) -> tuple[Any, Any]:
    """Predictions as float and targets in the same dtype, after the shape check."""
    _same_shape(name, what, predictions, targets)
    predictions = _float(predictions)
    return predictions, astype(targets, dtype_of(predictions))


def _class_axis(name: str, logits: Any) -> None:
    if len(shape_of(logits)) == 0:
        raise ShapeError(f"loss.{name}: logits must have a class axis (shape [..., C]), got a scalar")


@op_function
def cross_entropy(logits, one_hot):
    """Softmax cross-entropy with (one-hot or soft) target distributions.

    logits ``[..., C]``, one_hot ``[..., C]`` (same shape) -> scalar
    ``mean(-sum(one_hot * log_softmax(logits), axis=-1))`` over the leading axes
    (optax ``softmax_cross_entropy(...).mean()``, PyTorch ``cross_entropy`` with probabilities).
    Float16 / bfloat16 logits are computed in float32 and the result returned in their dtype.

    Like :func:`cross_entropy_sparse`'s, its gradient has a rule of its own: ``(softmax(logits) *
    sum(targets) - targets) / N`` for the logits, ``-log_softmax(logits) / N`` for the targets,
    the softmax recomputed from the logits and their saved logsumexp, so no ``exp(logits)`` buffer
    is kept for the backward pass.
    """
    _class_axis("cross_entropy", logits)
    return _soft_mean(*_pair("cross_entropy", ("logits", "one_hot"), logits, one_hot))


def _soft_parts(logits, targets):
    """``(mean loss in the logits' dtype, logsumexp)``, computed in the compute dtype."""
    compute = compute_dtype(dtype_of(logits))
    x, t = astype(logits, compute), astype(targets, compute)
    lse = reductions.logsumexp(x, axis=-1)
    log_probs = subtract(x, expand_dims(lse, -1))
    value = reductions.mean(negative(reductions.sum(multiply(t, log_probs), axis=-1)))
    return astype(value, dtype_of(logits)), lse


def _with_rule(name: str, parts, bwd):
    """The loss ``parts(logits, targets)[0]`` with the derivative rule ``bwd((logits, lse,
    targets), g)``, ``lse`` the logsumexp that ``parts`` returns with the loss; ``name`` is the
    ``custom_vjp`` node's in the IR."""

    def mean_loss(logits, targets):
        return parts(logits, targets)[0]

    mean_loss.__name__ = name
    mean_loss = custom_vjp(mean_loss)

    def fwd(logits, targets):
        value, lse = parts(logits, targets)
        return value, (logits, lse, targets)

    mean_loss.defvjp(fwd, bwd)
    return mean_loss


def _backward_terms(logits, lse, g):
    """What both cross-entropy rules start from: ``(log_softmax(logits), g / N)`` in the compute
    dtype, the log-softmax recomputed from the saved logsumexp (N: the examples, at least 1)."""
    shape = shape_of(logits)
    compute = compute_dtype(dtype_of(logits))
    count = max(int(np.prod(shape[:-1], dtype=np.int64)), 1)  # no examples: empty gradients
    log_probs = subtract(astype(logits, compute), expand_dims(lse, -1))
    return log_probs, multiply(astype(g, compute), 1.0 / count)


def _soft_mean_bwd(residuals, g):
    # d/dlogits = (softmax * sum(targets) - targets) * g / N, d/dtargets = -log_softmax * g / N:
    # element-wise passes over the logits that recompute the softmax from the saved logsumexp
    # (differentiating the composite keeps exp(logits) as a full-size buffer)
    logits, lse, targets = residuals
    log_probs, scale = _backward_terms(logits, lse, g)
    t = astype(targets, dtype_of(log_probs))
    total = reductions.sum(t, axis=-1, keepdims=True)
    dx = multiply(subtract(multiply(exp(log_probs), total), t), scale)
    dt = multiply(negative(log_probs), scale)
    return astype(dx, dtype_of(logits)), astype(dt, dtype_of(targets))


_soft_mean = _with_rule("cross_entropy", _soft_parts, _soft_mean_bwd)


def _check_labels_on_host(labels: Any, num_classes: int) -> None:
    """Out-of-range labels cannot be detected while tracing; NumPy labels are checked here."""
    if isinstance(labels, np.ndarray):
        host = labels
        if host.size and host.dtype.kind in "iu" and (host.min() < 0 or host.max() >= num_classes):
            raise ValueError(
                f"loss.cross_entropy_sparse: labels must lie in [0, {num_classes}), got "
                f"values from {host.min()} to {host.max()}"
            )


@op_function
def _cross_entropy_sparse(logits, labels):
    _class_axis("cross_entropy_sparse", logits)
    shape = shape_of(logits)
    if shape_of(labels) != shape[:-1]:
        raise ShapeError(
            f"loss.cross_entropy_sparse: labels {_shape_text(shape_of(labels))} must have "
            f"the logits' shape without the class axis, {_shape_text(shape[:-1])} (logits "
            f"{_shape_text(shape)})"
        )
    if not dtypes.is_integer(dtype_of(labels)):
        raise TypeError(
            f"loss.cross_entropy_sparse: labels must be integers, got {dtype_of(labels)} "
            "(use loss.cross_entropy for one-hot or soft targets)"
        )
    return _sparse_mean(_float(logits), labels)


def _in_range(labels, classes: int):
    return bitwise_and(greater_equal(labels, 0), less(labels, classes))


def _sparse_parts(logits, labels):
    """``(mean loss in the logits' dtype, logsumexp)``: per example ``lse - logits[label]``, and
    ``0 * lse`` (0, or NaN where the row is not finite) for a label outside ``[0, C)``, in the
    compute dtype."""
    classes = shape_of(logits)[-1]
    x = astype(logits, compute_dtype(dtype_of(logits)))
    lse = reductions.logsumexp(x, axis=-1)
    valid = _in_range(labels, classes)
    index = expand_dims(clip(labels, 0, max(classes - 1, 0)), -1)
    picked = take_along_axis(x, index, axis=-1)[..., 0]
    per_example = where(valid, subtract(lse, picked), multiply(lse, 0.0))
    return astype(reductions.mean(per_example), dtype_of(logits)), lse


def _sparse_mean_bwd(residuals, g):
    # d/dlogits = (softmax(logits) - one_hot(label)) * g / N: one element-wise pass over the
    # logits, the softmax recomputed from them and the saved logsumexp. Differentiating the
    # composite instead keeps exp(logits) and the one-hot product as full-size buffers (with a
    # large vocabulary the biggest of the step: GPT-2 124M, 4 x 128 tokens: 98 MiB each).
    logits, lse, labels = residuals
    log_probs, scale = _backward_terms(logits, lse, g)
    classes = shape_of(logits)[-1]
    probs = where(expand_dims(_in_range(labels, classes), -1), exp(log_probs), 0.0)
    grad = multiply(subtract(probs, _one_hot(labels, classes, dtype=dtype_of(log_probs))), scale)
    return astype(grad, dtype_of(logits)), None


_sparse_mean = _with_rule("cross_entropy_sparse", _sparse_parts, _sparse_mean_bwd)


def cross_entropy_sparse(logits, labels):
    """Softmax cross-entropy with integer class labels.

    logits ``[..., C]``, labels integer ``[...]`` in ``[0, C)`` -> scalar
    ``mean(-log_softmax(logits)[..., label])`` (optax
    ``softmax_cross_entropy_with_integer_labels(...).mean()``, PyTorch ``cross_entropy``).
    NumPy labels out of range raise ``ValueError``; inside a trace such a label contributes 0
    (and gets no gradient). Float16 / bfloat16 logits are computed in float32 and the result
    returned in their dtype.

    Its gradient has a rule of its own: ``(softmax(logits) - one_hot(labels)) / N``, the softmax
    recomputed from the logits and their saved logsumexp in the same element-wise pass, so a
    training step keeps no ``[..., C]`` buffer besides the logits and their gradient (GPT-2
    124M: 98 MiB less at its peak, docs/performance.md).
    """
    if isinstance(labels, list):
        labels = np.asarray(labels)
    shape = shape_of(logits)
    if shape:
        _check_labels_on_host(labels, shape[-1])
    return _cross_entropy_sparse(logits, labels)


@op_function
def binary_cross_entropy(logits, labels):
    """Sigmoid cross-entropy on logits (not probabilities), computed stably.

    logits ``[...]``, labels ``[...]`` (same shape; 0/1 or soft targets in [0, 1]) -> scalar
    ``mean(max(x, 0) - x * y + log(1 + exp(-|x|)))`` = ``mean(-y log sigmoid(x) - (1 - y)
    log(1 - sigmoid(x)))`` (optax ``sigmoid_binary_cross_entropy(...).mean()``, PyTorch
    ``binary_cross_entropy_with_logits``).
    """
    x, y = _pair("binary_cross_entropy", ("logits", "labels"), logits, labels)
    per_element = add(
        subtract(maximum(x, 0.0), multiply(x, y)),
        log1p(exp(negative(absolute(x)))),
    )
    return reductions.mean(per_element)


@op_function
def mse(predictions, targets):
    """Mean squared error: ``[...]`` and ``[...]`` (same shape) -> scalar ``mean((p - t)**2)``."""
    p, t = _pair("mse", ("predictions", "targets"), predictions, targets)
    error = subtract(p, t)
    return reductions.mean(multiply(error, error))


@op_function
def mae(predictions, targets):
    """Mean absolute error: ``[...]`` and ``[...]`` (same shape) -> scalar ``mean(|p - t|)``."""
    p, t = _pair("mae", ("predictions", "targets"), predictions, targets)
    return reductions.mean(absolute(subtract(p, t)))


@op_function
def huber(predictions, targets, delta=1.0):
    """Huber loss: ``[...]`` and ``[...]`` (same shape) -> scalar mean of ``0.5 * e**2`` where
    ``|e| <= delta`` and ``delta * (|e| - 0.5 * delta)`` beyond, ``e = p - t`` (optax
    ``huber_loss(...).mean()``; PyTorch ``huber_loss``). ``delta > 0``."""
    if isinstance(delta, (int, float)) and not delta > 0:
        raise ValueError(f"loss.huber: delta must be > 0, got {delta}")
    p, t = _pair("huber", ("predictions", "targets"), predictions, targets)
    abs_error = absolute(subtract(p, t))
    quadratic = minimum(abs_error, delta)
    linear = subtract(abs_error, quadratic)
    return reductions.mean(add(multiply(0.5, multiply(quadratic, quadratic)), multiply(delta, linear)))


__dir__ = public_dir(__all__)

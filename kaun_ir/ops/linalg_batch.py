"""Batching rules of the contractions (declared with ``dot_general`` and ``convolution`` in
``linalg.py``): the batch axis becomes a batch, free, feature or group axis of the op itself."""

from __future__ import annotations

from kaun_ir.ops.batching import by_loop, move_axis, shift
from kaun_ir.ops.rules import apply


def dot_general_batch(
    batched, size, lhs, rhs, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, **extra
):
    """Both batched: the batch axis becomes a new leading dot batch axis. One batched: it is a
    free axis of that operand, which the result holds after the batch axes (and, for the rhs,
    after the lhs's free axes); it is moved to the front."""
    lb, rb, lc, rc = map(tuple, (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting))
    if batched[0] and batched[1]:
        return apply(
            "dot_general",
            lhs,
            rhs,
            lhs_batch=(0,) + shift(lb),
            rhs_batch=(0,) + shift(rb),
            lhs_contracting=shift(lc),
            rhs_contracting=shift(rc),
            **extra,
        )
    if batched[0]:
        out = apply(
            "dot_general",
            lhs,
            rhs,
            lhs_batch=shift(lb),
            rhs_batch=rb,
            lhs_contracting=shift(lc),
            rhs_contracting=rc,
            **extra,
        )
        return move_axis(out, len(lb), 0)
    out = apply(
        "dot_general",
        lhs,
        rhs,
        lhs_batch=lb,
        rhs_batch=shift(rb),
        lhs_contracting=lc,
        rhs_contracting=shift(rc),
        **extra,
    )
    lhs_free = lhs.ndim - len(lb) - len(lc)
    return move_axis(out, len(lb) + lhs_free, 0)


def _merge(x, axis: int, groups: int = 1):
    """Fold the leading batch axis of ``x`` into ``axis`` (an axis of the example, counted without
    the batch axis), inside each of its ``groups`` contiguous groups: ``(G, D/G)`` -> ``(G, B, D/G)``."""
    size, shape = x.shape[0], list(x.shape[1:])
    d = shape[axis]
    split = shape[:axis] + [groups, d // groups] + shape[axis + 1 :]
    x = apply("reshape", x, shape=(size,) + tuple(split))
    x = move_axis(x, 0, axis + 1)  # now (..., G, B, D/G, ...)
    merged = shape[:axis] + [d * size] + shape[axis + 1 :]
    return apply("reshape", x, shape=tuple(merged))


def _split(y, axis: int, size: int, groups: int = 1):
    """The inverse of :func:`_merge` on a result: axis ``axis`` holds ``(G, B, D/G)``; the batch
    axis goes to the front."""
    shape = list(y.shape)
    d = shape[axis] // size
    y = apply("reshape", y, shape=tuple(shape[:axis] + [groups, size, d // groups] + shape[axis + 1 :]))
    y = move_axis(y, axis + 1, 0)
    return apply("reshape", y, shape=(size,) + tuple(shape[:axis] + [d] + shape[axis + 1 :]))


_conv_by_loop = by_loop("convolution")


def convolution_batch(batched, size, lhs, rhs, **attrs):
    """Input batched: the batch axis joins the convolution's batch. Kernel batched: it joins the
    kernel's output features (inside each feature group). Both: each example becomes its own
    feature group (input features and kernel output features grow by the batch size). With
    ``batch_group_count > 1`` the op runs once per example (a while loop)."""
    if attrs.get("batch_group_count", 1) != 1:
        return _conv_by_loop(batched, size, lhs, rhs, **attrs)
    lhs_spec, rhs_spec, out_spec = attrs["lhs_spec"], attrs["rhs_spec"], attrs["out_spec"]
    groups = attrs.get("feature_group_count", 1)
    if batched[0] and not batched[1]:
        out = apply("convolution", _merge(lhs, lhs_spec[0]), rhs, **attrs)
        return _split(out, out_spec[0], size)
    if batched[1] and not batched[0]:
        out = apply("convolution", lhs, _merge(rhs, rhs_spec[0], groups), **attrs)
        return _split(out, out_spec[1], size, groups)
    attrs = dict(attrs, feature_group_count=groups * size)
    out = apply("convolution", _merge(lhs, lhs_spec[1]), _merge(rhs, rhs_spec[0]), **attrs)
    return _split(out, out_spec[1], size)

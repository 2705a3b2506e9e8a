"""``reduce_window``: pooling, every window of an operand combined with ``sum``, ``max`` or
``min`` (with base and window dilations and padding), and its derivative and batching rules."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import by_loop
from kaun_ir.ops.emit import dense_literal, i64_array, padding_literal
from kaun_ir.ops.rules import apply
from kaun_ir.ops.window_common import (
    check_init,
    check_window,
    filled,
    first_hits,
    init_cotangent,
    is_constant,
    pad_and_dilate,
    random_array,
    scalar_constant,
    unpad_cotangent,
    window_output_shape,
    window_size,
    window_taps,
)

_KINDS = {
    "sum": ("stablehlo.add", np.add),
    "max": ("stablehlo.maximum", np.maximum),
    "min": ("stablehlo.minimum", np.minimum),
}


def _pad_with(x: np.ndarray, value, dilations, padding) -> np.ndarray:
    """``x`` spread out by ``dilations`` and padded, holes and borders filled with ``value``;
    negative padding crops."""
    shape = [(n - 1) * d + 1 if n else 0 for n, d in zip(x.shape, dilations)]
    spread = np.full(shape, value, x.dtype)
    spread[tuple(slice(None, None, d) for d in dilations)] = x
    grown = np.pad(spread, [(max(lo, 0), max(hi, 0)) for lo, hi in padding], constant_values=value)
    crop = tuple(
        slice(-lo if lo < 0 else 0, n + hi if hi < 0 else None) for n, (lo, hi) in zip(grown.shape, padding)
    )
    return grown[crop]


def _rw_infer(
    x: TensorType,
    init: TensorType,
    kind,
    window_dimensions,
    window_strides,
    base_dilations,
    window_dilations,
    padding,
) -> TensorType:
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    check_init(x, init)
    if dtypes.is_bool(x.dtype):
        raise TypeError("reduce_window needs a numeric operand, got bool")
    check_window(x, window_dimensions, window_strides, padding, base_dilations, window_dilations)
    return TensorType(
        x.dtype,
        window_output_shape(
            x.shape, window_dimensions, window_strides, padding, base_dilations, window_dilations
        ),
    )


def _identity(kind: str, dtype) -> np.ndarray:
    """The identity of ``kind`` for ``dtype``: what padding and holes hold in the references."""
    dt = np.dtype(dtype)
    if kind == "sum":
        return np.zeros((), dt)
    if dtypes.is_float(dt):
        return np.array(-np.inf if kind == "max" else np.inf, dt)
    info = np.iinfo(dt)
    return np.array(info.min if kind == "max" else info.max, dt)


def _rw_reference(
    x, init, kind, window_dimensions, window_strides, base_dilations, window_dilations, padding
):
    combine = _KINDS[kind][1]
    out_shape = window_output_shape(
        x.shape, window_dimensions, window_strides, padding, base_dilations, window_dilations
    )
    # padding and holes are skipped (they hold the identity) and every window starts from init once
    padded = _pad_with(x, _identity(kind, x.dtype), base_dilations, padding)
    out = np.full(out_shape, init, x.dtype)
    if 0 in out_shape:
        return out
    # combine, for every window at once, the elements at one offset inside the window
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        taken = tuple(
            slice(k * d, k * d + s * (m - 1) + 1, s)
            for k, d, s, m in zip(offset, window_dilations, window_strides, out_shape)
        )
        out = combine(out, padded[taken])
    return out.astype(x.dtype)


def _rw_emit(em, node, x, init):
    scalar = node.inputs[1].type
    kind = node.attr("kind")
    mlir = _KINDS[kind][0]
    region = em.region([scalar, scalar], lambda inner, args: inner.op(mlir, args, [scalar] * 2, [scalar]))
    a = node.attr
    attrs = {
        "window_dimensions": i64_array(a("window_dimensions")),
        "window_strides": i64_array(a("window_strides")),
        "base_dilations": i64_array(a("base_dilations")),
        "window_dilations": i64_array(a("window_dilations")),
        "padding": padding_literal(a("padding")),
    }
    if kind != "sum" or is_constant(node.inputs[1], 0):
        return em.simple("stablehlo.reduce_window", node, x, init, regions=[region], attrs=attrs)
    # A sum whose init is not 0: how often padding and holes add the init is backend-defined
    # (the StableHLO spec pads with it, XLA's CPU backend skips padding), so reduce from 0 and
    # add the init once per window, which is this op's semantics on every backend.
    zero = em.op(
        "stablehlo.constant", [], [], [scalar], {"value": dense_literal(np.zeros((), scalar.dtype))}
    )[0]
    out_type = node.types[0]
    total = em.op(
        "stablehlo.reduce_window",
        [x, zero],
        [node.inputs[0].type, scalar],
        [out_type],
        attrs,
        regions=[region],
    )[0]
    spread = em.op(
        "stablehlo.broadcast_in_dim", [init], [scalar], [out_type], {"broadcast_dimensions": i64_array(())}
    )[0]
    return em.op("stablehlo.add", [total, spread], [out_type, out_type], [out_type])


def _rw_attrs(kind, window, strides=None, padding=None, base=None, wdil=None):
    ones = (1,) * len(window)
    return {
        "kind": kind,
        "window_dimensions": window,
        "window_strides": strides or ones,
        "base_dilations": base or ones,
        "window_dilations": wdil or ones,
        "padding": padding or ((0, 0),) * len(window),
    }


def _rw_samples(rng):
    ninf = np.float32(-np.inf)
    # 2x2 max pool, NCHW
    yield Sample((random_array(rng, (2, 3, 6, 6)), ninf), _rw_attrs("max", (1, 1, 2, 2), (1, 1, 2, 2)))
    # overlapping 3x3 windows with padding (filled with the init value)
    yield Sample(
        (random_array(rng, (1, 2, 5, 7)), ninf),
        _rw_attrs("max", (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))),
    )
    yield Sample(
        (random_array(rng, (2, 6, 5)), np.float32(0)),
        _rw_attrs("sum", (1, 2, 3), (1, 2, 1), ((0, 0), (1, 0), (2, 1))),
    )
    yield Sample((random_array(rng, (4, 7)), np.float32(np.inf)), _rw_attrs("min", (2, 3), (1, 2)))
    # dilations: base dilation puts init-valued holes between elements
    yield Sample(
        (random_array(rng, (6, 8)), np.float32(0)),
        _rw_attrs("sum", (2, 2), (1, 2), ((0, 1), (1, 0)), base=(1, 2), wdil=(2, 1)),
    )
    yield Sample(
        (random_array(rng, (5, 6)), ninf),
        _rw_attrs("max", (2, 2), (2, 1), ((1, 0), (0, 2)), base=(2, 1), wdil=(1, 3)),
    )
    yield Sample((random_array(rng, (3, 8), np.float64), np.float64(0)), _rw_attrs("sum", (1, 4), (1, 4)))
    yield Sample(
        (random_array(rng, (3, 8), np.int32), np.int32(np.iinfo(np.int32).min)),
        _rw_attrs("max", (2, 3), (1, 1), ((0, 1), (1, 1))),
    )
    yield Sample((random_array(rng, (3, 8), np.int32), np.int32(0)), _rw_attrs("sum", (3, 3), (2, 2)))
    yield Sample(
        (random_array(rng, (2, 8), dtypes.bfloat16), np.array(0, dtypes.bfloat16)),
        _rw_attrs("sum", (1, 3), (1, 1)),
        rtol=2e-2,
        atol=5e-2,
    )
    yield Sample((random_array(rng, (2, 2)), np.float32(0)), _rw_attrs("sum", (1, 3), (1, 1)))  # empty result
    # an init that is not the identity: added once per window (padding and holes do not add it)
    yield Sample(
        (random_array(rng, (3, 4)), np.float32(1.5)),
        _rw_attrs("sum", (2, 3), (1, 2), ((1, 1), (2, 1)), base=(2, 1)),
    )
    # max / min whose init wins some windows (it then gets their cotangent)
    yield Sample(
        (random_array(rng, (4, 7)), np.float32(0.5)), _rw_attrs("max", (1, 2), (1, 1), ((0, 0), (1, 0)))
    )
    yield Sample((random_array(rng, (3, 6)), np.float32(-0.25)), _rw_attrs("min", (2, 2), (1, 2)))
    # min with base dilation only; a max with negative padding (cropping)
    yield Sample(
        (random_array(rng, (4, 5)), np.float32(np.inf)),
        _rw_attrs("min", (3, 2), (2, 1), ((1, 1), (0, 0)), base=(2, 2)),
    )
    yield Sample((random_array(rng, (6, 7)), ninf), _rw_attrs("max", (2, 3), (2, 2), ((-1, 0), (1, -2))))


# The derivative of reduce_window:
# - sum: the cotangent spread back over each window (jax's transpose rule: ct padded with
#   stride - 1 holes, then a window sum with the base dilation as the stride); the init is added
#   once per window, so it gets the sum of the cotangent.
# - max / min: a window's cotangent goes to its first maximal (minimal) element in row-major
#   window order, like select_and_scatter_add and jax, unless the init wins the window (the
#   result equals the init: the init value, padding and holes never lose a tie), in which case
#   the init gets it. An init that is the constant identity (-inf for max, the usual pooling)
#   is left out, so even a window of nothing but -inf routes to its first element, like
#   select_and_scatter_add and PyTorch (jax's VJP drops such windows). Without window dilation
#   this is one select_and_scatter_add; with it, a loop over the window offsets (jax has no VJP
#   there).
# NaN inputs are not handled specially (a window whose maximum is NaN routes nothing).


def _rw_sum_ct(ct, x, window_dimensions, window_strides, base_dilations, window_dilations, padding):
    pads = []
    for n, w, s, m, (lo, _), b, d in zip(
        x.shape, window_dimensions, window_strides, ct.shape, padding, base_dilations, window_dilations
    ):
        n_in, n_window, n_out = (n - 1) * b + 1, (w - 1) * d + 1, (m - 1) * s + 1
        before = n_window - lo - 1
        pads.append((before, n_in + n_window - 1 - n_out - before))
    spread = apply(
        "pad",
        ct,
        scalar_constant(0, ct.dtype),
        low=tuple(p for p, _ in pads),
        high=tuple(p for _, p in pads),
        interior=tuple(s - 1 for s in window_strides),
    )
    return apply(
        "reduce_window",
        spread,
        scalar_constant(0, ct.dtype),
        kind="sum",
        window_dimensions=window_dimensions,
        window_strides=tuple(base_dilations),
        base_dilations=(1,) * x.ndim,
        window_dilations=tuple(window_dilations),
        padding=((0, 0),) * x.ndim,
    )


def _route_to_first_max(
    x, out, ct, window_dimensions, window_strides, base_dilations, window_dilations, padding
):
    """Each window's ``ct`` added at the first real element of ``x`` equal to the window's result
    ``out`` (every window routed here with a nonzero ``ct`` has one)."""
    no_dilation = all(d == 1 for d in base_dilations) and all(d == 1 for d in window_dilations)
    if no_dilation and all(lo >= 0 and hi >= 0 for lo, hi in padding):
        return apply(
            "select_and_scatter_add",
            x,
            ct,
            scalar_constant(0, x.dtype),
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            padding=padding,
        )
    # padding and holes hold -inf: below every routed window's result unless all of the window's
    # elements are -inf too (then the cotangent may land on padding and is dropped)
    padded = pad_and_dilate(x, -np.inf, padding, base_dilations)
    zeros = filled(0, ct.shape, ct.dtype)
    taps = list(window_taps(padded, window_dimensions, window_strides, window_dilations, ct.shape))
    total = None
    for (start, limit, _), first in zip(taps, first_hits([t for _, _, t in taps], out)):
        routed = apply("select", first, ct, zeros)
        back = apply(
            "pad",
            routed,
            scalar_constant(0, ct.dtype),
            low=start,
            high=tuple(n - lim for n, lim in zip(padded.shape, limit)),
            interior=tuple(s - 1 for s in window_strides),
        )
        total = back if total is None else apply("add", total, back)
    return unpad_cotangent(total, padding, base_dilations)


def _rw_vjp(ct, out, x, init, *, kind, **window):
    if not dtypes.is_float(x.dtype):
        return None, None
    if ct.size == 0 or x.size == 0:
        return filled(0, x.shape, x.dtype), init_cotangent(init, ct)
    if kind == "sum":
        return _rw_sum_ct(ct, x, **window), init_cotangent(init, ct)
    if is_constant(init.value, _identity(kind, x.dtype)):
        # the usual pooling init (-inf for max): no window is taken from the real elements, and
        # none needs masking (a constant has no cotangent)
        init_ct = None
    else:
        zeros = filled(0, ct.shape, ct.dtype)
        init_wins = apply(
            "compare",
            out,
            apply("broadcast_in_dim", init, shape=out.shape, broadcast_dimensions=()),
            direction="EQ",
        )
        init_ct = init_cotangent(init, apply("select", init_wins, ct, zeros))
        ct = apply("select", init_wins, zeros, ct)
    if kind == "min":  # the first minimum of x is the first maximum of -x
        x, out = apply("negate", x), apply("negate", out)
    return _route_to_first_max(x, out, ct, **window), init_ct


# Batching: the batch axis becomes a window axis of size 1 (stride 1, no padding or dilation).
# An init value that differs per example has no vectorised form (the init is one scalar for the
# whole op), so those cases run once per example (a while loop).


_rw_by_loop = by_loop("reduce_window")


def _rw_batch(batched, size, x, init, **attrs):
    if batched[1]:
        return _rw_by_loop(batched, size, x, init, **attrs)
    widened = {
        key: (1,) + tuple(attrs[key])
        for key in ("window_dimensions", "window_strides", "base_dilations", "window_dilations")
    }
    return apply(
        "reduce_window", x, init, kind=attrs["kind"], padding=((0, 0),) + tuple(attrs["padding"]), **widened
    )


def _reduce_window_flops(inputs, outputs, **attrs) -> int:
    """One operation per output element and window position."""
    return outputs[0].size * window_size(attrs)


OPS = [
    OpDef(
        name="reduce_window",
        traits=(),
        flops=_reduce_window_flops,
        arity=2,
        batch=_rw_batch,
        attrs=(
            "kind",
            "window_dimensions",
            "window_strides",
            "base_dilations",
            "window_dilations",
            "padding",
        ),
        infer=_rw_infer,
        reference=_rw_reference,
        emit=_rw_emit,
        samples=_rw_samples,
        vjp=_rw_vjp,
        doc="reduce_window(x, init): combine every window of x with ``kind`` (sum/max/min), starting "
        "from the scalar init. The input is first spread out by base_dilations and padded with "
        "(low, high) ``padding`` pairs (negative crops); holes and padding are skipped, so each "
        "result is init combined once with the window's real elements. Windows have "
        "window_dimensions (spread by window_dilations) and move by window_strides. Derivative: "
        "max/min send a window's cotangent to its first extreme element (row-major window "
        "order), or to init when the result equals init.",
    ),
]

"""Window primitives: reduce_window (pooling) and select_and_scatter_add (max-pool's gradient)."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import by_loop, materialize
from kaun_ir.ops.emit import dense_literal, i64_array, padding_literal
from kaun_ir.ops.rules import apply

_KINDS = {
    "sum": ("stablehlo.add", np.add),
    "max": ("stablehlo.maximum", np.maximum),
    "min": ("stablehlo.minimum", np.minimum),
}


def _rand(rng, shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt in dtypes.INTEGERS:
        return rng.integers(-9, 10, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _check_window(
    x: TensorType, window_dimensions, window_strides, padding, base_dilations=None, window_dilations=None
) -> None:
    fields = {"window_dimensions": window_dimensions, "window_strides": window_strides, "padding": padding}
    if base_dilations is not None:
        fields.update(base_dilations=base_dilations, window_dilations=window_dilations)
    for name, values in fields.items():
        if len(values) != x.ndim:
            raise ShapeError(f"{name} needs one entry per axis ({x.ndim}), got {len(values)}")
    if any(len(p) != 2 for p in padding):
        raise ShapeError("padding must be (low, high) pairs")
    for name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
        if name in fields and min(fields[name], default=1) < 1:
            raise ShapeError(f"{name} must be at least 1, got {list(fields[name])}")


def _check_init(x: TensorType, init: TensorType, what: str = "init value") -> None:
    if init.shape != ():
        raise ShapeError(f"{what} must be a scalar, got {init}")
    if init.dtype != x.dtype:
        raise TypeError(
            f"{what} must have the operand's dtype {dtypes.short_name(x.dtype)}, "
            f"got {dtypes.short_name(init.dtype)}"
        )


def window_output_shape(
    shape, window_dimensions, window_strides, padding, base_dilations=None, window_dilations=None
) -> tuple[int, ...]:
    """Number of windows along each axis (dilated and padded input, dilated window)."""
    out = []
    for i, size in enumerate(shape):
        base = base_dilations[i] if base_dilations else 1
        wdil = window_dilations[i] if window_dilations else 1
        padded = ((size - 1) * base + 1 if size else 0) + padding[i][0] + padding[i][1]
        window = (window_dimensions[i] - 1) * wdil + 1
        out.append((padded - window) // window_strides[i] + 1 if padded >= window else 0)
    return tuple(out)


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


# reduce_window --------------------------------------------------------------------------------


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
    _check_init(x, init)
    if dtypes.is_bool(x.dtype):
        raise TypeError("reduce_window needs a numeric operand, got bool")
    _check_window(x, window_dimensions, window_strides, padding, base_dilations, window_dilations)
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


def _is_constant(value, expected=None) -> bool:
    """Whether IR value ``value`` is produced by a constant node (equal to ``expected`` if given)."""
    node = value.node
    if node is None or node.op != "constant":
        return False
    return expected is None or bool(np.all(node.attr("value").array == expected))


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
    if kind != "sum" or _is_constant(node.inputs[1], 0):
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
    yield Sample((_rand(rng, (2, 3, 6, 6)), ninf), _rw_attrs("max", (1, 1, 2, 2), (1, 1, 2, 2)))
    # overlapping 3x3 windows with padding (filled with the init value)
    yield Sample(
        (_rand(rng, (1, 2, 5, 7)), ninf),
        _rw_attrs("max", (1, 1, 3, 3), (1, 1, 2, 2), ((0, 0), (0, 0), (1, 1), (1, 1))),
    )
    yield Sample(
        (_rand(rng, (2, 6, 5)), np.float32(0)),
        _rw_attrs("sum", (1, 2, 3), (1, 2, 1), ((0, 0), (1, 0), (2, 1))),
    )
    yield Sample((_rand(rng, (4, 7)), np.float32(np.inf)), _rw_attrs("min", (2, 3), (1, 2)))
    # dilations: base dilation puts init-valued holes between elements
    yield Sample(
        (_rand(rng, (6, 8)), np.float32(0)),
        _rw_attrs("sum", (2, 2), (1, 2), ((0, 1), (1, 0)), base=(1, 2), wdil=(2, 1)),
    )
    yield Sample(
        (_rand(rng, (5, 6)), ninf),
        _rw_attrs("max", (2, 2), (2, 1), ((1, 0), (0, 2)), base=(2, 1), wdil=(1, 3)),
    )
    yield Sample((_rand(rng, (3, 8), np.float64), np.float64(0)), _rw_attrs("sum", (1, 4), (1, 4)))
    yield Sample(
        (_rand(rng, (3, 8), np.int32), np.int32(np.iinfo(np.int32).min)),
        _rw_attrs("max", (2, 3), (1, 1), ((0, 1), (1, 1))),
    )
    yield Sample((_rand(rng, (3, 8), np.int32), np.int32(0)), _rw_attrs("sum", (3, 3), (2, 2)))
    yield Sample(
        (_rand(rng, (2, 8), dtypes.bfloat16), np.array(0, dtypes.bfloat16)),
        _rw_attrs("sum", (1, 3), (1, 1)),
        rtol=2e-2,
        atol=5e-2,
    )
    yield Sample((_rand(rng, (2, 2)), np.float32(0)), _rw_attrs("sum", (1, 3), (1, 1)))  # empty result
    # an init that is not the identity: added once per window (padding and holes do not add it)
    yield Sample(
        (_rand(rng, (3, 4)), np.float32(1.5)), _rw_attrs("sum", (2, 3), (1, 2), ((1, 1), (2, 1)), base=(2, 1))
    )
    # max / min whose init wins some windows (it then gets their cotangent)
    yield Sample((_rand(rng, (4, 7)), np.float32(0.5)), _rw_attrs("max", (1, 2), (1, 1), ((0, 0), (1, 0))))
    yield Sample((_rand(rng, (3, 6)), np.float32(-0.25)), _rw_attrs("min", (2, 2), (1, 2)))
    # min with base dilation only; a max with negative padding (cropping)
    yield Sample(
        (_rand(rng, (4, 5)), np.float32(np.inf)),
        _rw_attrs("min", (3, 2), (2, 1), ((1, 1), (0, 0)), base=(2, 2)),
    )
    yield Sample((_rand(rng, (6, 7)), ninf), _rw_attrs("max", (2, 3), (2, 2), ((-1, 0), (1, -2))))


# select_and_scatter_add -----------------------------------------------------------------------


def _ss_infer(
    x: TensorType, source: TensorType, init: TensorType, window_dimensions, window_strides, padding
) -> TensorType:
    _check_init(x, init)
    if source.dtype != x.dtype:
        raise TypeError("source must have the operand's dtype")
    if dtypes.is_bool(x.dtype):
        raise TypeError("select_and_scatter_add needs a numeric operand, got bool")
    _check_window(x, window_dimensions, window_strides, padding)
    windows = window_output_shape(x.shape, window_dimensions, window_strides, padding)
    if source.shape != windows:
        raise ShapeError(
            f"source must have one element per window, shape {list(windows)}, got {list(source.shape)}"
        )
    return x


def _ss_reference(x, source, init, window_dimensions, window_strides, padding):
    out = np.full(x.shape, init, x.dtype)
    for window in itertools.product(*(range(n) for n in source.shape)):
        # the first maximal in-bounds element of this window (padding is never selected)
        best = None
        for offset in itertools.product(*(range(w) for w in window_dimensions)):
            index = tuple(i * s + k - lo for i, s, k, (lo, _) in zip(window, window_strides, offset, padding))
            if all(0 <= j < n for j, n in zip(index, x.shape)) and (best is None or not x[best] >= x[index]):
                best = index
        if best is not None:
            out[best] = out[best] + source[window]
    return out


def _ss_emit(em, node, x, source, init):
    scalar = node.inputs[2].type
    flag = TensorType(dtypes.bool_, ())
    kind = (
        "FLOAT"
        if dtypes.is_float(scalar.dtype)
        else "UNSIGNED"
        if dtypes.is_unsigned(scalar.dtype)
        else "SIGNED"
    )
    # select(current, candidate): keep the current choice unless the candidate is strictly larger,
    # so ties go to the first element of the window
    select = em.region(
        [scalar, scalar],
        lambda inner, args: inner.op(
            "stablehlo.compare",
            args,
            [scalar] * 2,
            [flag],
            attrs={
                "comparison_direction": "#stablehlo<comparison_direction GE>",
                "compare_type": f"#stablehlo<comparison_type {kind}>",
            },
        ),
        result_types=[flag],
    )
    scatter = em.region(
        [scalar, scalar], lambda inner, args: inner.op("stablehlo.add", args, [scalar] * 2, [scalar])
    )
    a = node.attr
    return em.simple(
        "stablehlo.select_and_scatter",
        node,
        x,
        source,
        init,
        regions=[select, scatter],
        attrs={
            "window_dimensions": i64_array(a("window_dimensions")),
            "window_strides": i64_array(a("window_strides")),
            "padding": padding_literal(a("padding")),
        },
    )


def _ss_samples(rng):
    def case(x, window, strides, padding=None, **tol):
        padding = padding or ((0, 0),) * x.ndim
        windows = window_output_shape(x.shape, window, strides, padding)
        source = _rand(rng, windows, x.dtype)
        return Sample(
            (x, source, np.zeros((), x.dtype)),
            {"window_dimensions": window, "window_strides": strides, "padding": padding},
            **tol,
        )

    yield case(_rand(rng, (2, 2, 6, 6)), (1, 1, 2, 2), (1, 1, 2, 2))
    # overlapping windows: one element can be chosen by several windows (the values are summed)
    yield case(_rand(rng, (1, 1, 7, 7)), (1, 1, 3, 3), (1, 1, 1, 1))
    yield case(_rand(rng, (7, 6)), (3, 2), (2, 1), ((1, 1), (0, 1)))
    # ties: small integers and a constant block, the first maximum in each window wins
    yield case(rng.integers(0, 2, size=(6, 8)).astype(np.float32), (2, 3), (1, 2))
    yield case(np.ones((4, 4), np.float32), (2, 2), (1, 1), ((1, 0), (0, 1)))
    yield case(rng.integers(-2, 3, size=(5, 5)).astype(np.int32), (3, 3), (2, 2), ((1, 1), (1, 1)))
    yield case(_rand(rng, (3, 8), np.float64), (1, 4), (1, 4))


# VJP rules -------------------------------------------------------------------------------------
#
# reduce_window:
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
# select_and_scatter_add:
# - x: only chooses where values land, so its derivative is zero (almost everywhere);
# - source: linear; each window's cotangent is the output cotangent at the element it chose
#   (a "select and gather", written as a loop over the window offsets);
# - init: every output element starts from it, so it gets the sum of the cotangent.
# NaN inputs are not handled specially (a window whose maximum is NaN routes nothing).


def _scalar(value, dtype):
    return apply("constant", value=np.asarray(value, dtype))


def _full(value, shape, dtype):
    scalar = _scalar(value, dtype)
    return apply("broadcast_in_dim", scalar, shape=tuple(shape), broadcast_dimensions=()) if shape else scalar


def _total(x):
    """Sum of all elements (a scalar)."""
    return apply("reduce", x, kind="sum", dimensions=tuple(range(x.ndim))) if x.ndim else x


def _padded(x, value, padding, dilations=None):
    """``x`` spread by ``dilations`` and padded with the scalar ``value`` (negative padding crops)."""
    dilations = dilations or (1,) * x.ndim
    if all(d == 1 for d in dilations) and all(lo == 0 and hi == 0 for lo, hi in padding):
        return x
    return apply(
        "pad",
        x,
        _scalar(value, x.dtype),
        low=tuple(lo for lo, _ in padding),
        high=tuple(hi for _, hi in padding),
        interior=tuple(d - 1 for d in dilations),
    )


def _unpadded(ct, padding, dilations=None):
    """The cotangent of :func:`_padded`'s ``x`` from the cotangent of its result."""
    dilations = dilations or (1,) * ct.ndim
    if any(lo != 0 or hi != 0 for lo, hi in padding):
        ct = apply(
            "pad",
            ct,
            _scalar(0, ct.dtype),
            low=tuple(-lo for lo, _ in padding),
            high=tuple(-hi for _, hi in padding),
            interior=(0,) * ct.ndim,
        )
    if any(d != 1 for d in dilations):
        ct = apply(
            "slice", ct, start_indices=(0,) * ct.ndim, limit_indices=ct.shape, strides=tuple(dilations)
        )
    return ct


def _taps(padded, window_dimensions, window_strides, window_dilations, out_shape):
    """For every offset inside the window (row-major), the element at that offset of every window:
    ``(start, limit, strided slice of padded with out_shape)``."""
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        start = tuple(k * d for k, d in zip(offset, window_dilations))
        limit = tuple(st + s * (m - 1) + 1 for st, s, m in zip(start, window_strides, out_shape))
        yield (
            start,
            limit,
            apply("slice", padded, start_indices=start, limit_indices=limit, strides=tuple(window_strides)),
        )


def _first_hits(taps, target, valid_taps=None):
    """Per tap, the mask of windows whose first element equal to ``target`` is this tap."""
    found = None
    for k, tap in enumerate(taps):
        hit = apply("compare", tap, target, direction="EQ")
        if valid_taps is not None:
            hit = apply("and", hit, valid_taps[k])
        first = hit if found is None else apply("and", hit, apply("not", found))
        found = hit if found is None else apply("or", found, hit)
        yield first


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
        _scalar(0, ct.dtype),
        low=tuple(p for p, _ in pads),
        high=tuple(p for _, p in pads),
        interior=tuple(s - 1 for s in window_strides),
    )
    return apply(
        "reduce_window",
        spread,
        _scalar(0, ct.dtype),
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
            _scalar(0, x.dtype),
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            padding=padding,
        )
    # padding and holes hold -inf: below every routed window's result unless all of the window's
    # elements are -inf too (then the cotangent may land on padding and is dropped)
    padded = _padded(x, -np.inf, padding, base_dilations)
    zeros = _full(0, ct.shape, ct.dtype)
    taps = list(_taps(padded, window_dimensions, window_strides, window_dilations, ct.shape))
    total = None
    for (start, limit, _), first in zip(taps, _first_hits([t for _, _, t in taps], out)):
        routed = apply("select", first, ct, zeros)
        back = apply(
            "pad",
            routed,
            _scalar(0, ct.dtype),
            low=start,
            high=tuple(n - lim for n, lim in zip(padded.shape, limit)),
            interior=tuple(s - 1 for s in window_strides),
        )
        total = back if total is None else apply("add", total, back)
    return _unpadded(total, padding, base_dilations)


def _init_ct(init, ct):
    """The init's cotangent, the sum of ``ct``; None when init is a constant (nothing to emit)."""
    return None if _is_constant(init.value, None) else _total(ct)


def _rw_vjp(ct, out, x, init, *, kind, **window):
    if not dtypes.is_float(x.dtype):
        return None, None
    if ct.size == 0 or x.size == 0:
        return _full(0, x.shape, x.dtype), _init_ct(init, ct)
    if kind == "sum":
        return _rw_sum_ct(ct, x, **window), _init_ct(init, ct)
    if _is_constant(init.value, _identity(kind, x.dtype)):
        # the usual pooling init (-inf for max): no window is taken from the real elements, and
        # none needs masking (a constant has no cotangent)
        init_ct = None
    else:
        zeros = _full(0, ct.shape, ct.dtype)
        init_wins = apply(
            "compare",
            out,
            apply("broadcast_in_dim", init, shape=out.shape, broadcast_dimensions=()),
            direction="EQ",
        )
        init_ct = _init_ct(init, apply("select", init_wins, ct, zeros))
        ct = apply("select", init_wins, zeros, ct)
    if kind == "min":  # the first minimum of x is the first maximum of -x
        x, out = apply("negate", x), apply("negate", out)
    return _route_to_first_max(x, out, ct, **window), init_ct


def _ss_source_ct(ct, x, window_dimensions, window_strides, padding):
    """Per window, ``ct`` at the element select_and_scatter_add chose: the first real (not padding)
    element equal to the window's maximum."""
    ones = (1,) * x.ndim
    best = apply(
        "reduce_window",
        x,
        _scalar(-np.inf, x.dtype),
        kind="max",
        window_dimensions=window_dimensions,
        window_strides=window_strides,
        base_dilations=ones,
        window_dilations=ones,
        padding=padding,
    )
    out_shape = best.shape
    x_taps = [
        t
        for _, _, t in _taps(_padded(x, -np.inf, padding), window_dimensions, window_strides, ones, out_shape)
    ]
    real = _padded(_full(True, x.shape, dtypes.bool_), False, padding)
    valid = [t for _, _, t in _taps(real, window_dimensions, window_strides, ones, out_shape)]
    ct_taps = [
        t for _, _, t in _taps(_padded(ct, 0, padding), window_dimensions, window_strides, ones, out_shape)
    ]
    zeros = _full(0, out_shape, ct.dtype)
    total = None
    for ct_tap, first in zip(ct_taps, _first_hits(x_taps, best, valid)):
        picked = apply("select", first, ct_tap, zeros)
        total = picked if total is None else apply("add", total, picked)
    return total


def _ss_vjp(ct, out, x, source, init, *, window_dimensions, window_strides, padding):
    if not dtypes.is_float(x.dtype):
        return None, None, None
    if source.size == 0:
        source_ct = _full(0, source.shape, source.dtype)
    else:
        source_ct = _ss_source_ct(ct, x, window_dimensions, window_strides, padding)
    return None, source_ct, _init_ct(init, ct)


# Batching rules: the batch axis becomes a window axis of size 1 (stride 1, no padding or
# dilation). An init value that differs per example has no vectorised form (the init is one
# scalar for the whole op), so those cases run once per example (a while loop).

_rw_by_loop = by_loop("reduce_window")
_ss_by_loop = by_loop("select_and_scatter_add")


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


def _ss_batch(batched, size, x, source, init, window_dimensions, window_strides, padding):
    if batched[2]:
        return _ss_by_loop(
            batched,
            size,
            x,
            source,
            init,
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            padding=padding,
        )
    x, source = materialize([x, source], batched[:2], size)
    return apply(
        "select_and_scatter_add",
        x,
        source,
        init,
        window_dimensions=(1,) + tuple(window_dimensions),
        window_strides=(1,) + tuple(window_strides),
        padding=((0, 0),) + tuple(padding),
    )


def _window_size(attrs) -> int:
    size = 1
    for d in attrs["window_dimensions"]:
        size *= d
    return size


def _reduce_window_flops(inputs, outputs, **attrs) -> int:
    """One operation per output element and window position."""
    return outputs[0].size * _window_size(attrs)


def _select_and_scatter_flops(inputs, outputs, **attrs) -> int:
    """One operation per source element (the pooled gradient) and window position."""
    return inputs[1].size * _window_size(attrs)


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
    OpDef(
        name="select_and_scatter_add",
        traits=(),
        stablehlo="stablehlo.select_and_scatter",
        flops=_select_and_scatter_flops,
        arity=3,
        batch=_ss_batch,
        attrs=("window_dimensions", "window_strides", "padding"),
        infer=_ss_infer,
        reference=_ss_reference,
        emit=_ss_emit,
        samples=_ss_samples,
        vjp=_ss_vjp,
        doc="select_and_scatter_add(x, source, init): for every window of x (windows as in "
        "reduce_window without dilations) pick the first maximal element (padding is never "
        "picked) and add that window's source value there; the result has x's shape, init "
        "elsewhere. This is max pooling's gradient. Derivative: zero w.r.t. x, a gather of the "
        "cotangent at the chosen elements w.r.t. source, the cotangent's sum w.r.t. init.",
    ),
]

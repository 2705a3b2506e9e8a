"""``select_and_scatter_add``: max pooling's gradient, each window's source value added at the
window's first maximal element, and its derivative and batching rules."""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import by_loop, materialize
from kaun_ir.ops.emit import i64_array, padding_literal
from kaun_ir.ops.rules import apply
from kaun_ir.ops.window_common import (
    check_init,
    check_window,
    filled,
    first_hits,
    init_cotangent,
    pad_and_dilate,
    random_array,
    scalar_constant,
    window_output_shape,
    window_size,
    window_taps,
)


def _ss_infer(
    x: TensorType, source: TensorType, init: TensorType, window_dimensions, window_strides, padding
) -> TensorType:
    check_init(x, init)
    if source.dtype != x.dtype:
        raise TypeError("source must have the operand's dtype")
    if dtypes.is_bool(x.dtype):
        raise TypeError("select_and_scatter_add needs a numeric operand, got bool")
    check_window(x, window_dimensions, window_strides, padding)
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
    # select(current, candidate): keep the current choice unless the candidate is strictly larger,
    # so ties go to the first element of the window
    select = em.region(
        [scalar, scalar],
        lambda inner, args: [inner.compare(*args, scalar, "GE")],
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
        source = random_array(rng, windows, x.dtype)
        return Sample(
            (x, source, np.zeros((), x.dtype)),
            {"window_dimensions": window, "window_strides": strides, "padding": padding},
            **tol,
        )

    yield case(random_array(rng, (2, 2, 6, 6)), (1, 1, 2, 2), (1, 1, 2, 2))
    # overlapping windows: one element can be chosen by several windows (the values are summed)
    yield case(random_array(rng, (1, 1, 7, 7)), (1, 1, 3, 3), (1, 1, 1, 1))
    yield case(random_array(rng, (7, 6)), (3, 2), (2, 1), ((1, 1), (0, 1)))
    # ties: small integers and a constant block, the first maximum in each window wins
    yield case(rng.integers(0, 2, size=(6, 8)).astype(np.float32), (2, 3), (1, 2))
    yield case(np.ones((4, 4), np.float32), (2, 2), (1, 1), ((1, 0), (0, 1)))
    yield case(rng.integers(-2, 3, size=(5, 5)).astype(np.int32), (3, 3), (2, 2), ((1, 1), (1, 1)))
    yield case(random_array(rng, (3, 8), np.float64), (1, 4), (1, 4))


# The derivative of select_and_scatter_add:
# - x: only chooses where values land, so its derivative is zero (almost everywhere);
# - source: linear; each window's cotangent is the output cotangent at the element it chose
#   (a "select and gather", written as a loop over the window offsets);
# - init: every output element starts from it, so it gets the sum of the cotangent.


def _ss_source_ct(ct, x, window_dimensions, window_strides, padding):
    """Per window, ``ct`` at the element select_and_scatter_add chose: the first real (not padding)
    element equal to the window's maximum."""
    ones = (1,) * x.ndim
    best = apply(
        "reduce_window",
        x,
        scalar_constant(-np.inf, x.dtype),
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
        for _, _, t in window_taps(
            pad_and_dilate(x, -np.inf, padding), window_dimensions, window_strides, ones, out_shape
        )
    ]
    real = pad_and_dilate(filled(True, x.shape, dtypes.bool_), False, padding)
    valid = [t for _, _, t in window_taps(real, window_dimensions, window_strides, ones, out_shape)]
    ct_taps = [
        t
        for _, _, t in window_taps(
            pad_and_dilate(ct, 0, padding), window_dimensions, window_strides, ones, out_shape
        )
    ]
    zeros = filled(0, out_shape, ct.dtype)
    total = None
    for ct_tap, first in zip(ct_taps, first_hits(x_taps, best, valid)):
        picked = apply("select", first, ct_tap, zeros)
        total = picked if total is None else apply("add", total, picked)
    return total


def _ss_vjp(ct, out, x, source, init, *, window_dimensions, window_strides, padding):
    if not dtypes.is_float(x.dtype):
        return None, None, None
    if source.size == 0:
        source_ct = filled(0, source.shape, source.dtype)
    else:
        source_ct = _ss_source_ct(ct, x, window_dimensions, window_strides, padding)
    return None, source_ct, init_cotangent(init, ct)


# Batching: the batch axis becomes a window axis of size 1; an init that differs per example
# runs once per example, as for reduce_window.


_ss_by_loop = by_loop("select_and_scatter_add")


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


def _select_and_scatter_flops(inputs, outputs, **attrs) -> int:
    """One operation per source element (the pooled gradient) and window position."""
    return inputs[1].size * window_size(attrs)


OPS = [
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

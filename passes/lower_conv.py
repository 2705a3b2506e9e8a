"""``lower-conv``: small convolutions as strided slices + one ``dot_general`` (im2col).

A convolution sums, for every output position ``s`` and output feature ``o``, the products
``lhs[b, i, s * stride + k * dilation] * rhs[o, i, k]`` over input features ``i`` and kernel
positions ``k``. With few kernel positions or few output positions, that sum is one matrix
product over slices of the (zero-padded) input:

- **over kernel positions** (forward convolutions, input gradients: ``K`` kernel positions,
  many output positions): for every kernel position ``k``, the input elements it meets form one
  strided slice shaped like the output; the ``K`` slices concatenated along the feature axis
  (``k``-major) are the "patches", contracted with the kernel reshaped to ``[K * I, O]``;
- **over output positions** (kernel gradients: the "kernel" is the output cotangent, so the
  output is small, e.g. ``3 x 3``): for every output position ``s``, the window it reads is one
  slice shaped like the kernel; the slices concatenated along the batch axis are contracted with
  the kernel over (features, kernel positions) in one ``dot_general``.

The form with fewer slices is used, and only when that number is at most ``max_slices``. Only
plain convolutions are rewritten: no lhs dilation (transposed convolutions), one feature and
batch group, non-negative padding; any layout, stride and kernel dilation. Results equal the
``convolution``'s up to floating-point summation order.

Measured on XLA CPU (2 cores, XLA's convolutions run as YNNPACK fusions) on the ``cnn``
workload, the lowering *loses*: alone, the ``[64,32,14,14] * [64,32,3,3]`` forward takes
2.6 ms native NHWC / 3.5 ms NCHW against 5.5 / 8.3 ms as im2col, and only the one-channel
kernel gradient gains (~0.3 ms); in the training step the patches are materialised and then
copied again into the dot's operand layout, and the step goes from 19 ms to 57 ms (im2col of
every convolution). So it is not in the default pipelines (docs/passes.md, section 9). It is
here to be measured on other backends and shapes: ``lower-conv{mode=im2col max_slices=9}``.

Options: ``mode`` (``im2col`` or ``native``: leave every convolution alone), ``max_slices``,
``max_features`` (only convolutions contracting at most this many input features; 0: any).
Statistics: ``convolutions lowered``, ``convolutions lowered over kernel positions``,
``convolutions lowered over output positions``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules


def _padded(rw: Rewriter, x: Value, spatial_axes, padding) -> Value:
    """``x`` with zeros around its spatial axes (``padding``: one (low, high) pair per axis)."""
    if all(lo == 0 and hi == 0 for lo, hi in padding):
        return x
    low, high = [0] * len(x.shape), [0] * len(x.shape)
    for axis, (lo, hi) in zip(spatial_axes, padding):
        low[axis], high[axis] = lo, hi
    zero = rw.constant(np.zeros((), x.dtype))
    return rw.emit("pad", x, zero, low=tuple(low), high=tuple(high), interior=(0,) * len(x.shape))


def _window_slice(rw: Rewriter, x: Value, spatial_axes, starts, sizes, steps) -> Value:
    """Along each spatial axis, ``sizes[d]`` elements from ``starts[d]`` every ``steps[d]``."""
    start, limit, stride = [0] * len(x.shape), list(x.shape), [1] * len(x.shape)
    for axis, first, n, step in zip(spatial_axes, starts, sizes, steps):
        start[axis], limit[axis], stride[axis] = first, first + (n - 1) * step + 1, step
    return rw.emit("slice", x, start_indices=tuple(start), limit_indices=tuple(limit), strides=tuple(stride))


def _over_kernel_positions(rw: Rewriter, node: Node, lhs: Value, kernel, out_spatial) -> Value:
    a = node.attr_dict
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    rhs = node.inputs[1]
    nd = len(kernel)
    taps = [
        _window_slice(
            rw, lhs, ls[2:], [k * d for k, d in zip(pos, a["rhs_dilation"])], out_spatial, a["window_strides"]
        )
        for pos in itertools.product(*(range(n) for n in kernel))
    ]
    patches = taps[0] if len(taps) == 1 else rw.emit("concatenate", *taps, dimension=ls[1])
    # the kernel as [k..., I, O] -> [K * I, O], k-major like the patches' feature axis
    in_features, out_features = rhs.shape[rs[1]], rhs.shape[rs[0]]
    matrix = rw.emit("transpose", rhs, permutation=tuple(rs[2:]) + (rs[1], rs[0]))
    matrix = rw.emit("reshape", matrix, shape=(math.prod(kernel) * in_features, out_features))
    product = rw.emit(
        "dot_general",
        patches,
        matrix,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(ls[1],),
        rhs_contracting=(0,),
    )
    # product axes: the lhs axes but its feature axis (in order), then the output features
    kept = [axis for axis in range(nd + 2) if axis != ls[1]]
    role_axis = [kept.index(ls[0]), nd + 1] + [kept.index(ls[2 + d]) for d in range(nd)]
    return _to_out_layout(rw, product, role_axis, os_)


def _over_output_positions(rw: Rewriter, node: Node, lhs: Value, kernel, out_spatial) -> Value:
    a = node.attr_dict
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    rhs = node.inputs[1]
    nd = len(kernel)
    taps = [
        _window_slice(
            rw, lhs, ls[2:], [s * st for s, st in zip(pos, a["window_strides"])], kernel, a["rhs_dilation"]
        )
        for pos in itertools.product(*(range(n) for n in out_spatial))
    ]
    stacked = taps[0] if len(taps) == 1 else rw.emit("concatenate", *taps, dimension=ls[0])
    product = rw.emit(
        "dot_general",
        stacked,
        rhs,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(ls[1],) + tuple(ls[2:]),
        rhs_contracting=(rs[1],) + tuple(rs[2:]),
    )
    # product: [S * B, O] with S output positions (row-major) major -> [s..., B, O]
    batch, out_features = lhs.shape[ls[0]], rhs.shape[rs[0]]
    product = rw.emit("reshape", product, shape=tuple(out_spatial) + (batch, out_features))
    role_axis = [nd, nd + 1] + list(range(nd))
    return _to_out_layout(rw, product, role_axis, os_)


def _to_out_layout(rw: Rewriter, product: Value, role_axis, out_spec) -> Value:
    """``product`` (axis ``role_axis[r]`` holding role r: batch, feature, spatial...) in out_spec's layout."""
    perm = [0] * len(out_spec)
    for role, axis in enumerate(out_spec):
        perm[axis] = role_axis[role]
    if perm == list(range(len(perm))):
        return product
    return rw.emit("transpose", product, permutation=tuple(perm))


def _lower(node: Node, rw: Rewriter, max_slices: int, max_features: int):
    a = node.attr_dict
    lhs, rhs = node.inputs
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    if (
        any(d != 1 for d in a["lhs_dilation"])
        or a["feature_group_count"] != 1
        or a["batch_group_count"] != 1
        or any(lo < 0 or hi < 0 for lo, hi in a["padding"])
        or node.outputs[0].type.size == 0
        or lhs.type.size == 0
        or rhs.type.size == 0
    ):
        return None
    if max_features > 0 and rhs.shape[rs[1]] > max_features:
        return None
    kernel = [rhs.shape[axis] for axis in rs[2:]]
    out_spatial = [node.outputs[0].shape[axis] for axis in os_[2:]]
    k_count, s_count = math.prod(kernel), math.prod(out_spatial)
    if min(k_count, s_count) > max_slices:
        return None
    padded = _padded(rw, lhs, ls[2:], a["padding"])
    if k_count <= s_count:
        statistic("convolutions lowered over kernel positions")
        result = _over_kernel_positions(rw, node, padded, kernel, out_spatial)
    else:
        statistic("convolutions lowered over output positions")
        result = _over_output_positions(rw, node, padded, kernel, out_spatial)
    statistic("convolutions lowered")
    return result


@register(
    "lower-conv",
    options={
        "mode": Option(
            str,
            "im2col",
            "im2col: small convolutions as slices + dot_general; native: leave them alone",
            choices=("im2col", "native"),
        ),
        "max_slices": Option(
            int,
            9,
            "lower only when the slices (kernel or output positions, the fewer) are at most this many",
            min=0,
        ),
        "max_features": Option(
            int,
            0,
            "lower only convolutions contracting at most this many input features (0: any)",
            min=0,
        ),
    },
)
def lower_conv(graph: Graph, mode: str, max_slices: int, max_features: int) -> Graph:
    """Small convolutions as strided slices + one dot_general (im2col); exact up to summation order."""
    if mode == "native" or not any(node.op == "convolution" for node in graph.walk()):
        return graph
    table = RuleTable()
    table.rule("im2col", "convolution")(lambda node, rw: _lower(node, rw, max_slices, max_features))
    return apply_rules(graph, table, label="lower-conv").graph

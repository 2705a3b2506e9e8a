"""``winograd-conv``: 3x3 stride-1 convolutions as Winograd F(2x2, 3x3) transforms + batched matmuls.

A direct 3x3 convolution spends 9 multiplies per output element and input feature. Winograd's
minimal filtering algorithm F(2x2, 3x3) computes each 2x2 output tile from a 4x4 input tile
with 16 multiplies per input feature (2.25x fewer)::

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A        (.) elementwise, per input/output feature pair

``B^T d B`` (input transform) and ``A^T m A`` (output transform) only add and subtract, and
``G g G^T`` (filter transform) is computed once per step from the small kernel. Summed over
input features, the middle product is 16 independent matrix products, one per position of the
4x4 transformed tile: ``[tiles, I] x [I, O]``. In the IR that is strided ``slice`` +
``add``/``subtract`` (fused by XLA into a loop), one batched ``dot_general`` (batch axis of 16),
and slices + adds again.

Two shapes of convolution are rewritten, in any layout (the specs are followed, not assumed):

- **3x3 kernels** (forward convolutions, and the input gradients reverse-mode emits for them,
  which are 3x3 stride-1 convolutions of the output cotangent with the reversed kernel): the
  output is tiled by 2x2 (padded to even sizes with zeros, the extra outputs sliced off);
- **3x3 outputs with a larger kernel** (the kernel gradients reverse-mode emits: the input
  convolved with the output cotangent as kernel): the gradient of the Winograd formula above,
  ``dg = G^T [ sum over tiles (A dY A^T) (.) (B^T d B) ] G``, where the sum over tiles and
  batch is the contraction of the 16 matrix products ``[I, tiles] x [tiles, O]``.

Only plain convolutions qualify: 2-d, stride 1, no dilation, one feature and batch group,
non-negative padding, float32/float64 (the transforms lose about one extra bit per stage; half
precisions are left to the direct convolution), and at least ``min_features`` features on both
sides of the matrix products (a one-channel convolution would be a product with a contraction
of 1: all overhead).

**Accuracy.** Not bit-exact: the sums are reassociated and the transforms add and subtract
neighbouring values. Against a float64 direct convolution, float32 results stay within
``TOLERANCE`` x (the same sum taken over absolute values) elementwise, the bound the tests check
(docs/performance-results.md, CNN section, gives the measured errors and speeds).

Options: ``min_features`` (default 8), ``forward`` / ``kernel_gradient`` turn the two rewrites on
or off. Statistics: ``convolutions rewritten (3x3 kernel)``, ``convolutions rewritten (3x3
output)``.
"""

from __future__ import annotations

import numpy as np

from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules

#: Relative error bound (against |x| * |w| summed the same way) that the tests check for float32.
TOLERANCE = 1e-5

# F(2x2, 3x3): Y = A^T [(G g G^T) * (B^T d B)] A (Lavin & Gray, 2016)
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
#: the filter transform of a kernel flattened row-major: [16 (4x4 tile), 9 (3x3 kernel)]
FILTER_TRANSFORM = np.kron(_G, _G)
#: G^T m G for a 4x4 tile flattened row-major: [9, 16]
FILTER_GRADIENT_TRANSFORM = FILTER_TRANSFORM.T
_FLOAT_DTYPES = ("float32", "float64")


def _dtype_name(value: Value) -> str:
    return np.dtype(value.dtype).name


def _slice_axis(rw: Rewriter, x: Value, axis: int, start: int, count: int, step: int) -> Value:
    """``count`` elements of ``x`` along ``axis`` from ``start`` every ``step``."""
    begin, limit, strides = [0] * len(x.shape), list(x.shape), [1] * len(x.shape)
    begin[axis], limit[axis], strides[axis] = start, start + (count - 1) * step + 1, step
    return rw.emit("slice", x, start_indices=tuple(begin), limit_indices=tuple(limit), strides=tuple(strides))


def _input_rows(rw: Rewriter, x: Value, axis: int, tiles: int) -> list[Value]:
    """B^T d along ``axis``: the 4 rows of every 4-wide tile (tiles start every 2 elements)."""
    d = [_slice_axis(rw, x, axis, r, tiles, 2) for r in range(4)]
    return [
        rw.emit("subtract", d[0], d[2]),
        rw.emit("add", d[1], d[2]),
        rw.emit("subtract", d[2], d[1]),
        rw.emit("subtract", d[1], d[3]),
    ]


def _input_transform(rw: Rewriter, x: Value, axes, tiles) -> list[Value]:
    """The 16 values of B^T d B per tile, row-major over the 4x4 tile, shaped like ``x`` with
    its two spatial axes replaced by the tile counts."""
    return [
        col
        for row in _input_rows(rw, x, axes[0], tiles[0])
        for col in _input_rows(rw, row, axes[1], tiles[1])
    ]


def _cotangent_rows(rw: Rewriter, y: Value, axis: int, tiles: int) -> list[Value]:
    """A y along ``axis`` for 2-wide tiles: (y0, y0 + y1, y0 - y1, -y1)."""
    y0, y1 = (_slice_axis(rw, y, axis, r, tiles, 2) for r in range(2))
    return [y0, rw.emit("add", y0, y1), rw.emit("subtract", y0, y1), rw.emit("negate", y1)]


def _stack(rw: Rewriter, values: list[Value]) -> Value:
    """``values`` (one shape) stacked along a new leading axis, as a tree of two-operand
    concatenations (XLA CPU fuses those with their elementwise producers into one loop; a
    16-operand concatenation is left as a copy of 16 separately computed operands)."""
    shape = tuple(values[0].shape)
    parts = [rw.emit("reshape", v, shape=(1,) + shape) for v in values]
    while len(parts) > 1:
        pairs = [parts[i : i + 2] for i in range(0, len(parts), 2)]
        parts = [p[0] if len(p) == 1 else rw.emit("concatenate", *p, dimension=0) for p in pairs]
    return parts[0]


def _padded(rw: Rewriter, x: Value, axes, lows, highs) -> Value:
    if not any(lows) and not any(highs):
        return x
    low, high = [0] * len(x.shape), [0] * len(x.shape)
    for axis, lo, hi in zip(axes, lows, highs):
        low[axis], high[axis] = lo, hi
    zero = rw.constant(np.zeros((), x.dtype))
    return rw.emit("pad", x, zero, low=tuple(low), high=tuple(high), interior=(0,) * len(x.shape))


def _to_layout(rw: Rewriter, x: Value, role_axis, out_spec) -> Value:
    """``x`` (axis ``role_axis[r]`` holding role r: batch, feature, spatial...) in ``out_spec``'s layout."""
    perm = [0] * len(out_spec)
    for role, axis in enumerate(out_spec):
        perm[axis] = role_axis[role]
    if perm == list(range(len(perm))):
        return x
    return rw.emit("transpose", x, permutation=tuple(perm))


def _plain(node: Node) -> bool:
    a = node.attr_dict
    lhs, rhs = node.inputs
    return (
        len(lhs.shape) == 4
        and all(s == 1 for s in a["window_strides"])
        and all(d == 1 for d in a["lhs_dilation"])
        and all(d == 1 for d in a["rhs_dilation"])
        and a["feature_group_count"] == 1
        and a["batch_group_count"] == 1
        and all(lo >= 0 and hi >= 0 for lo, hi in a["padding"])
        and _dtype_name(lhs) in _FLOAT_DTYPES
        and lhs.type.size > 0
        and rhs.type.size > 0
        and node.outputs[0].type.size > 0
    )


def _three_by_three_kernel(node: Node, rw: Rewriter, min_features: int):
    a = node.attr_dict
    lhs, rhs = node.inputs
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    out = node.outputs[0]
    in_features, out_features = rhs.shape[rs[1]], rhs.shape[rs[0]]
    if min(in_features, out_features) < min_features:
        return None
    out_spatial = [out.shape[axis] for axis in os_[2:]]
    tiles = [(n + 1) // 2 for n in out_spatial]
    spatial = ls[2:]
    # every tile reads 4 padded inputs from 2 * tile: pad up to 2 * tiles + 2 (zeros only feed
    # the extra outputs of an odd size, which are sliced off)
    extra = [2 * t + 2 - (lhs.shape[ax] + lo + hi) for t, ax, (lo, hi) in zip(tiles, spatial, a["padding"])]
    x = _padded(
        rw, lhs, spatial, [lo for lo, _ in a["padding"]], [hi + e for (_, hi), e in zip(a["padding"], extra)]
    )
    v = _stack(rw, _input_transform(rw, x, spatial, tiles))  # [16, lhs axes with tiles]
    # the filter transform: kernel [3, 3, I, O] flattened -> [16, I * O] -> [16, I, O]
    kernel = rw.emit("transpose", rhs, permutation=(rs[2], rs[3], rs[1], rs[0]))
    kernel = rw.emit("reshape", kernel, shape=(9, in_features * out_features))
    u = rw.emit(
        "dot_general",
        rw.constant(FILTER_TRANSFORM.astype(lhs.dtype)),
        kernel,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(1,),
        rhs_contracting=(0,),
    )
    u = rw.emit("reshape", u, shape=(16, in_features, out_features))
    m = rw.emit(
        "dot_general",
        v,
        u,
        lhs_batch=(0,),
        rhs_batch=(0,),
        lhs_contracting=(1 + ls[1],),
        rhs_contracting=(1,),
    )
    # m: [16, lhs axes but the feature axis (in order), O]
    free = [axis for axis in range(4) if axis != ls[1]]
    tile_shape = tuple(m.shape[1:])
    parts = [
        rw.emit("reshape", _slice_axis(rw, m, 0, k, 1, 1), shape=tile_shape) for k in range(16)
    ]  # m_{uv}, row-major

    def a_t(m0, m1, m2, m3):  # A^T applied to four values along one tile axis
        return rw.emit("add", rw.emit("add", m0, m1), m2), rw.emit(
            "subtract", rw.emit("subtract", m1, m2), m3
        )

    rows = [a_t(*(parts[4 * r + c] for r in range(4))) for c in range(4)]  # rows[c] = (r0_c, r1_c)
    y = [a_t(*(rows[c][i] for c in range(4))) for i in range(2)]  # y[i][j]: output (i, j) of each tile
    th, tw = free.index(spatial[0]), free.index(spatial[1])
    # interleave: [.., th, .., tw, .., O] x 4 -> [.., 2 th, .., 2 tw, .., O]
    split = list(tile_shape)
    for axis in sorted((th, tw), reverse=True):  # a unit axis after each tile axis
        split.insert(axis + 1, 1)
    row_axis = th + 1 + (tw < th)  # where the unit axes are in ``split``
    col_axis = tw + 1 + (th < tw)
    grid = [[rw.emit("reshape", y[i][j], shape=tuple(split)) for j in range(2)] for i in range(2)]
    rows_joined = [rw.emit("concatenate", *grid[i], dimension=col_axis) for i in range(2)]
    joined = rw.emit("concatenate", *rows_joined, dimension=row_axis)
    full = list(tile_shape)
    full[th], full[tw] = 2 * tiles[0], 2 * tiles[1]
    result = rw.emit("reshape", joined, shape=tuple(full))
    if full[th] != out_spatial[0] or full[tw] != out_spatial[1]:
        limit = list(full)
        limit[th], limit[tw] = out_spatial
        result = rw.emit(
            "slice",
            result,
            start_indices=(0,) * len(full),
            limit_indices=tuple(limit),
            strides=(1,) * len(full),
        )
    role_axis = [free.index(ls[0]), 3, th, tw]
    statistic("convolutions rewritten (3x3 kernel)")
    return _to_layout(rw, result, role_axis, os_)


def _three_by_three_output(node: Node, rw: Rewriter, min_features: int):
    a = node.attr_dict
    lhs, rhs = node.inputs
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    batch, out_features = lhs.shape[ls[0]], rhs.shape[rs[0]]
    if min(batch, out_features) < min_features:
        return None
    kernel = [rhs.shape[axis] for axis in rs[2:]]
    tiles = [(k + 1) // 2 for k in kernel]
    odd = [2 * t - k for t, k in zip(tiles, kernel)]
    # the kernel (an output cotangent) tiled by 2x2, zeros added at the end of odd sizes; the input
    # padded to 2 * tiles + 2 to match (its extra elements only meet those zeros)
    y = _padded(rw, rhs, rs[2:], [0, 0], odd)
    x = _padded(
        rw, lhs, ls[2:], [lo for lo, _ in a["padding"]], [hi + e for (_, hi), e in zip(a["padding"], odd)]
    )
    v = _stack(rw, _input_transform(rw, x, ls[2:], tiles))  # [16, lhs axes with tiles]
    w = _stack(
        rw,
        [c for r in _cotangent_rows(rw, y, rs[2], tiles[0]) for c in _cotangent_rows(rw, r, rs[3], tiles[1])],
    )
    m = rw.emit(
        "dot_general",
        v,
        w,
        lhs_batch=(0,),
        rhs_batch=(0,),
        lhs_contracting=tuple(1 + axis for axis in ls[1:]),
        rhs_contracting=tuple(1 + axis for axis in rs[1:]),
    )  # [16, batch role, O]
    m = rw.emit("reshape", m, shape=(16, batch * out_features))
    g = rw.emit(
        "dot_general",
        rw.constant(FILTER_GRADIENT_TRANSFORM.astype(lhs.dtype)),
        m,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(1,),
        rhs_contracting=(0,),
    )
    g = rw.emit("reshape", g, shape=(3, 3, batch, out_features))
    statistic("convolutions rewritten (3x3 output)")
    return _to_layout(rw, g, [2, 3, 0, 1], os_)


def _rewrite(node: Node, rw: Rewriter, min_features: int, forward: bool, kernel_gradient: bool):
    if not _plain(node):
        return None
    a = node.attr_dict
    rhs, out = node.inputs[1], node.outputs[0]
    kernel = tuple(rhs.shape[axis] for axis in a["rhs_spec"][2:])
    out_spatial = tuple(out.shape[axis] for axis in a["out_spec"][2:])
    if forward and kernel == (3, 3):
        return _three_by_three_kernel(node, rw, min_features)
    if kernel_gradient and out_spatial == (3, 3) and min(kernel) >= 2:
        return _three_by_three_output(node, rw, min_features)
    return None


@register(
    "winograd-conv",
    options={
        "min_features": Option(
            int,
            8,
            "rewrite only when both sides of the matrix products have this many features",
            min=0,
        ),
        "forward": (bool, True, "rewrite convolutions with 3x3 kernels (forward, input gradients)"),
        "kernel_gradient": (bool, True, "rewrite convolutions with 3x3 outputs (kernel gradients)"),
    },
)
def winograd_conv(graph: Graph, min_features: int, forward: bool, kernel_gradient: bool) -> Graph:
    """3x3 stride-1 convolutions as Winograd F(2x2, 3x3): elementwise transforms + batched dot_general."""
    if not any(node.op == "convolution" for node in graph.walk()):
        return graph
    table = RuleTable()
    table.rule("winograd", "convolution")(
        lambda node, rw: _rewrite(node, rw, min_features, forward, kernel_gradient)
    )
    return apply_rules(graph, table, label="winograd-conv").graph

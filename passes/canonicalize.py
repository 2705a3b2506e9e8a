"""``canonicalize``: algebraic identities that are exact, applied to a fixpoint.

Every rule below gives bit-identical results for every input under IEEE-754 arithmetic (no
flushing of subnormals), NaNs included, so the pass never changes what a graph computes.
That excludes some familiar identities:

- ``x + 0.0 -> x`` is NOT applied: for ``x = -0.0`` the sum is ``+0.0``. ``x + (-0.0) -> x``
  is exact (``-0.0`` is the additive identity of IEEE floats) and is applied; for integers and
  bools (where ``add`` is ``or``) any zero is the identity.
- ``x - 0.0 -> x`` is exact (it is ``x + (-0.0)``); ``x - (-0.0)`` is not and is kept.
- ``x * 0 -> 0`` is not applied (NaN * 0 is NaN, -1 * 0 is -0).

Constants are recognised as a ``constant`` node whose elements are all bit-identical, or a
``broadcast_in_dim`` of one (how traced graphs spell ``zeros``/``ones``); "1" and "0" are
compared in the operand's own dtype. A broadcast of a scalar constant is left as it is here:
it is the compact form, and materialising small ones is the ``fold`` pass's job.

Conversions: ``convert(convert(x: A -> B) -> A) -> x`` when every value of A is exactly
representable in B (f32 -> f64 -> f32, i8 -> i32 -> i8, bool -> f32 -> bool, ...), and two
such widening conversions in a row become one. A narrowing middle step (f64 -> f32 -> f64)
rounds and is kept. XLA's own simplifier applies the same identities.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import Graph, Node
from kaun_ir.passes.registry import register
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules

RULES = RuleTable()


# ------------------------------------------------------------------------------ arithmetic


def _is_additive_identity(rw: Rewriter, value) -> bool:
    """-0.0 for floats (x + -0.0 == x for every x, -0.0 included); 0 / False otherwise."""
    if dtypes.is_float(value.dtype):
        return rw.splat_equals(value, 0, negative_zero=True)
    return rw.splat_equals(value, 0)


@RULES.rule("multiply-by-one", "multiply")
def _multiply_by_one(node: Node, rw: Rewriter):
    """x * 1 -> x and 1 * x -> x (bool multiply is 'and': x * True -> x)."""
    a, b = node.inputs
    if rw.splat_equals(b, 1):
        return a
    if rw.splat_equals(a, 1):
        return b
    return None


@RULES.rule("add-zero", "add")
def _add_zero(node: Node, rw: Rewriter):
    """x + (-0.0) -> x for floats (not x + 0.0: -0.0 + 0.0 is +0.0); x + 0 -> x for integers and bools."""
    a, b = node.inputs
    if _is_additive_identity(rw, b):
        return a
    if _is_additive_identity(rw, a):
        return b
    return None


@RULES.rule("subtract-zero", "subtract")
def _subtract_zero(node: Node, rw: Rewriter):
    """x - (+0.0) -> x for floats (x - (-0.0) is x + 0.0, not exact); x - 0 -> x for integers."""
    a, b = node.inputs
    negative = False if dtypes.is_float(b.dtype) else None
    return a if rw.splat_equals(b, 0, negative_zero=negative) else None


@RULES.rule("divide-by-one", "divide")
def _divide_by_one(node: Node, rw: Rewriter):
    """x / 1 -> x."""
    a, b = node.inputs
    return a if rw.splat_equals(b, 1) else None


@RULES.rule("negate-negate", "negate")
def _negate_negate(node: Node, rw: Rewriter):
    """neg(neg(x)) -> x (a sign flip twice; integer negation wraps, also an involution)."""
    inner = rw.producer(node.inputs[0], "negate")
    return inner.inputs[0] if inner is not None else None


# ------------------------------------------------------------------------------ shapes


@RULES.rule("reshape-identity", "reshape")
def _reshape_identity(node: Node, rw: Rewriter):
    """reshape(x) to x's own shape -> x."""
    x = node.inputs[0]
    return x if x.shape == node.outputs[0].shape else None


@RULES.rule("reshape-reshape", "reshape")
def _reshape_reshape(node: Node, rw: Rewriter):
    """reshape(reshape(x, s1), s2) -> reshape(x, s2) (row-major order is kept by both)."""
    inner = rw.producer(node.inputs[0], "reshape")
    if inner is None:
        return None
    x = inner.inputs[0]
    shape = node.outputs[0].shape
    return x if x.shape == shape else rw.emit("reshape", x, shape=shape)


def _is_identity(perm) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


@RULES.rule("transpose-identity", "transpose")
def _transpose_identity(node: Node, rw: Rewriter):
    """transpose(x, identity permutation) -> x."""
    return node.inputs[0] if _is_identity(node.attr("permutation")) else None


@RULES.rule("transpose-transpose", "transpose")
def _transpose_transpose(node: Node, rw: Rewriter):
    """transpose(transpose(x, p1), p2) -> transpose(x, p1[p2]) (-> x when that is the identity)."""
    inner = rw.producer(node.inputs[0], "transpose")
    if inner is None:
        return None
    p1, p2 = inner.attr("permutation"), node.attr("permutation")
    # result axis j is the inner result's axis p2[j], which is x's axis p1[p2[j]]
    composed = tuple(p1[j] for j in p2)
    x = inner.inputs[0]
    return x if _is_identity(composed) else rw.emit("transpose", x, permutation=composed)


@RULES.rule("broadcast-identity", "broadcast_in_dim")
def _broadcast_identity(node: Node, rw: Rewriter):
    """broadcast_in_dim(x) to x's own shape -> x (its dimensions are then the identity)."""
    x = node.inputs[0]
    return x if x.shape == node.outputs[0].shape else None


@RULES.rule("broadcast-broadcast", "broadcast_in_dim")
def _broadcast_broadcast(node: Node, rw: Rewriter):
    """broadcast_in_dim(broadcast_in_dim(x, s1, d1), s2, d2) -> broadcast_in_dim(x, s2, d2[d1])."""
    inner = rw.producer(node.inputs[0], "broadcast_in_dim")
    if inner is None:
        return None
    d1, d2 = inner.attr("broadcast_dimensions"), node.attr("broadcast_dimensions")
    x = inner.inputs[0]
    shape = node.outputs[0].shape
    if x.shape == shape:
        return x
    # x's axis i went to the middle axis d1[i], which went to the result axis d2[d1[i]]
    return rw.emit("broadcast_in_dim", x, shape=shape, broadcast_dimensions=tuple(d2[d] for d in d1))


@RULES.rule("slice-identity", "slice")
def _slice_identity(node: Node, rw: Rewriter):
    """A slice that keeps every element (result type == operand type) -> the operand."""
    x = node.inputs[0]
    # the same shape forces start 0, stride 1 (or size <= 1) on every axis
    return x if x.type == node.outputs[0].type else None


@RULES.rule("concatenate-single", "concatenate")
def _concatenate_single(node: Node, rw: Rewriter):
    """concatenate of one operand -> the operand."""
    return node.inputs[0] if len(node.inputs) == 1 else None


@RULES.rule("reverse-identity", "reverse")
def _reverse_identity(node: Node, rw: Rewriter):
    """reverse over no axes, or only over axes of size <= 1 -> the operand."""
    x = node.inputs[0]
    return x if all(x.shape[d] <= 1 for d in node.attr("dimensions")) else None


@RULES.rule("pad-identity", "pad")
def _pad_identity(node: Node, rw: Rewriter):
    """pad with zero low, high and interior padding -> the operand."""
    padded = any(any(node.attr(k)) for k in ("low", "high", "interior"))
    return None if padded else node.inputs[0]


# ------------------------------------------------------------------------------ sums of zero pads


def _zero_pad_span(rw: Rewriter, value):
    """``(axis, start, stop, operand, padding value)`` when ``value`` is a pad that places its
    operand at ``[start, stop)`` of one axis with a zero padding value (no interior or negative
    padding, the other axes untouched), else None."""
    node = rw.producer(value, "pad")
    if node is None or any(node.attr("interior")) or not dtypes.is_float(value.dtype):
        return None
    low, high = node.attr("low"), node.attr("high")
    axes = [d for d in range(len(low)) if low[d] or high[d]]
    if len(axes) != 1 or low[axes[0]] < 0 or high[axes[0]] < 0 or not rw.splat_equals(node.inputs[1], 0):
        return None
    operand, (axis,) = node.inputs[0], axes
    return axis, low[axis], low[axis] + operand.shape[axis], operand, node.inputs[1]


#: most zero-padded pieces one sum may gather
_MAX_PIECES = 16


def _pad_pieces(rw: Rewriter, value, out: list) -> bool:
    """Gather the zero-pad spans of a tree of adds into ``out``; False when a leaf is not one."""
    span = _zero_pad_span(rw, value)
    if span is not None:
        out.append(span)
        return len(out) <= _MAX_PIECES
    node = rw.producer(value, "add")
    return node is not None and all(_pad_pieces(rw, v, out) for v in node.inputs)


@RULES.rule("add-adjacent-zero-pads", "add")
def _add_adjacent_zero_pads(node: Node, rw: Rewriter):
    """A sum of zero pads whose pieces lie side by side along one axis -> one pad of their
    concatenation, each piece plus the other pieces' padding value: every element is the same
    sum (a reverse-mode sum of slices' cotangents becomes one concatenation instead of a sum of
    padded copies). The zeros are added, not dropped, so a ``-0.0`` turns ``+0.0`` exactly as
    the sum did; the order of the additions does not matter, as all but one term are zeros."""
    pieces: list = []
    if not all(_pad_pieces(rw, v, pieces) for v in node.inputs) or len({p[0] for p in pieces}) != 1:
        return None
    pieces.sort(key=lambda p: p[1])
    if any(a[2] != b[1] for a, b in zip(pieces, pieces[1:])):
        return None
    axis = pieces[0][0]
    zeros = [rw.splat(p[4]) for p in pieces]
    parts = []
    for k, (_, _, _, operand, _) in enumerate(pieces):
        others = zeros[:k] + zeros[k + 1 :]
        zero = others[0]
        for z in others[1:]:
            zero = zero + z
        fill = rw.emit("broadcast_in_dim", rw.constant(zero), shape=operand.shape, broadcast_dimensions=())
        parts.append(rw.emit("add", operand, fill))
    joined = rw.emit("concatenate", *parts, dimension=axis)
    total = zeros[0]
    for z in zeros[1:]:
        total = total + z
    low = [0] * joined.type.ndim
    high = [0] * joined.type.ndim
    low[axis], high[axis] = pieces[0][1], node.outputs[0].shape[axis] - pieces[-1][2]
    return rw.emit(
        "pad", joined, rw.constant(total), low=tuple(low), high=tuple(high), interior=(0,) * len(low)
    )


@RULES.rule("add-zero-twice", "add")
def _add_zero_twice(node: Node, rw: Rewriter):
    """(x + 0.0) + 0 -> x + 0.0 (the first sum already turned a -0.0 into +0.0; with -0.0 added
    first it would not have, so the inner zero must be +0.0)."""
    a, b = node.inputs
    inner = rw.producer(a, "add")
    if (
        inner is None
        or not rw.splat_equals(b, 0)
        or not rw.splat_equals(inner.inputs[1], 0, negative_zero=False)
    ):
        return None
    return a if inner.inputs[1].type == b.type else None


@RULES.rule("add-zero-of-concatenate", "add")
def _add_zero_of_concatenate(node: Node, rw: Rewriter):
    """concatenate(x, y) + 0 -> concatenate(x + 0, y + 0), so that the zeros meet the sums below."""
    a, b = node.inputs
    inner = rw.producer(a, "concatenate")
    if inner is None or not rw.splat_equals(b, 0):
        return None
    zero = rw.splat(b)
    parts = [
        rw.emit(
            "add", v, rw.emit("broadcast_in_dim", rw.constant(zero), shape=v.shape, broadcast_dimensions=())
        )
        for v in inner.inputs
    ]
    return rw.emit("concatenate", *parts, dimension=inner.attr("dimension"))


@RULES.rule("concatenate-concatenate", "concatenate")
def _concatenate_concatenate(node: Node, rw: Rewriter):
    """concatenate(..., concatenate(x, y, axis d), ..., axis d) -> concatenate(..., x, y, ..., axis d)."""
    axis = node.attr("dimension")
    flat, changed = [], False
    for v in node.inputs:
        inner = rw.producer(v, "concatenate")
        if inner is not None and inner.attr("dimension") == axis:
            flat.extend(inner.inputs)
            changed = True
        else:
            flat.append(v)
    return rw.emit("concatenate", *flat, dimension=axis) if changed else None


# ------------------------------------------------------------------------------ conversions

# significand bits (including the implicit one) of each float dtype
_SIGNIFICAND = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 53}
# float dtypes whose values all lie in a wider one (range and precision both)
_FLOAT_WIDENING = {
    (dtypes.float16, dtypes.float32),
    (dtypes.float16, dtypes.float64),
    (dtypes.bfloat16, dtypes.float32),
    (dtypes.bfloat16, dtypes.float64),
    (dtypes.float32, dtypes.float64),
}


def exactly_representable(src, dst) -> bool:
    """Every value of dtype ``src`` converts to ``dst`` exactly (and so converts back unchanged)."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst or src == dtypes.bool_:
        return True  # bool is 0 or 1, exact in every dtype
    if dst == dtypes.bool_:
        return False
    if dtypes.is_float(src):
        return (src, dst) in _FLOAT_WIDENING
    bits = 8 * src.itemsize - (0 if dtypes.is_unsigned(src) else 1)  # magnitude bits of the integer
    if dtypes.is_float(dst):
        return bits <= _SIGNIFICAND[dst]
    if dtypes.is_unsigned(dst):
        return dtypes.is_unsigned(src) and dst.itemsize >= src.itemsize
    return dst.itemsize > src.itemsize or (not dtypes.is_unsigned(src) and dst.itemsize == src.itemsize)


@RULES.rule("convert-identity", "convert")
def _convert_identity(node: Node, rw: Rewriter):
    """convert(x) to x's own dtype -> x."""
    x = node.inputs[0]
    return x if x.dtype == node.outputs[0].dtype else None


@RULES.rule("convert-convert", "convert")
def _convert_convert(node: Node, rw: Rewriter):
    """convert(convert(x: A -> B) -> C), A -> B exact: x if C == A, one convert if B -> C is exact too."""
    inner = rw.producer(node.inputs[0], "convert")
    if inner is None:
        return None
    x = inner.inputs[0]
    a, b, c = x.dtype, inner.outputs[0].dtype, node.outputs[0].dtype
    if not exactly_representable(a, b):
        return None
    if c == a:
        return x
    if exactly_representable(b, c):
        return rw.emit("convert", x, dtype=c)
    return None


# ------------------------------------------------------------------------------ select, stop_gradient


@RULES.rule("select-constant-predicate", "select")
def _select_constant_predicate(node: Node, rw: Rewriter):
    """select(true, a, b) -> a and select(false, a, b) -> b (a constant or broadcast predicate)."""
    pred, on_true, on_false = node.inputs
    value = rw.splat(pred)
    if value is None:
        return None
    return on_true if bool(value) else on_false


@RULES.rule("select-same-branches", "select")
def _select_same_branches(node: Node, rw: Rewriter):
    """select(p, x, x) -> x."""
    _, on_true, on_false = node.inputs
    return on_true if on_true is on_false else None


@RULES.rule("stop-gradient-stop-gradient", "stop_gradient")
def _stop_gradient_twice(node: Node, rw: Rewriter):
    """stop_gradient(stop_gradient(x)) -> stop_gradient(x)."""
    inner = rw.producer(node.inputs[0], "stop_gradient")
    return node.inputs[0] if inner is not None else None


# ------------------------------------------------------------------------------ the pass


@register("canonicalize")
def canonicalize(graph: Graph) -> Graph:
    """Apply exact algebraic identities (x*1, x+(-0.0), neg(neg x), chains of reshapes/transposes, ...)."""
    return apply_rules(graph, RULES, label="canonicalize").graph

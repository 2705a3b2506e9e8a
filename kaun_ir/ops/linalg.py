"""The contraction primitive dot_general (StableHLO semantics), and the helpers its neighbour
``ops/conv.py`` (convolution) shares with it."""

from __future__ import annotations

import string

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.linalg_batch import dot_general_batch
from kaun_ir.ops.rules import apply


def random_operand(rng, shape, dtype=np.float32):
    """A sample operand: small integers for integer dtypes, standard normal values otherwise."""
    dt = np.dtype(dtype)
    if dt in dtypes.INTEGERS:
        return rng.integers(-4, 5, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def check_numeric(t: TensorType, op: str) -> None:
    """TypeError for bool operands, which contractions do not take."""
    if dtypes.is_bool(t.dtype):
        raise TypeError(f"{op} needs numeric operands, got bool (convert first)")


def widened(x: np.ndarray) -> np.ndarray:
    """The operand in the dtype the references accumulate in: float64, or int64 for integers
    (integer overflow then wraps exactly like XLA's once cast back to the result dtype)."""
    return x.astype(np.int64 if x.dtype in dtypes.INTEGERS else np.float64)


def _result_dtype(operand_dtype, preferred_dtype) -> np.dtype:
    if preferred_dtype is None:
        return operand_dtype
    preferred = dtypes.canonical(preferred_dtype)
    same_kind = dtypes.is_float(preferred) == dtypes.is_float(operand_dtype)
    if not same_kind or dtypes.is_bool(preferred):
        raise TypeError(
            f"preferred_dtype {dtypes.short_name(preferred)} must be of the operands' kind "
            f"({dtypes.short_name(operand_dtype)})"
        )
    return preferred


# dot_general ----------------------------------------------------------------------------------


def _check_axes(axes, ndim: int, what: str) -> None:
    if len(set(axes)) != len(axes) or any(not 0 <= a < ndim for a in axes):
        raise ShapeError(f"{what} {list(axes)} must be distinct axes of a rank-{ndim} operand")


def _dot_infer(
    lhs: TensorType,
    rhs: TensorType,
    lhs_batch,
    rhs_batch,
    lhs_contracting,
    rhs_contracting,
    preferred_dtype=None,
) -> TensorType:
    lb, rb, lc, rc = map(tuple, (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting))
    if lhs.dtype != rhs.dtype:
        raise TypeError("operands must have the same dtype (convert explicitly first)")
    check_numeric(lhs, "dot_general")
    _check_axes(lb + lc, lhs.ndim, "lhs batch + contracting axes")
    _check_axes(rb + rc, rhs.ndim, "rhs batch + contracting axes")
    if len(lb) != len(rb):
        raise ShapeError(f"lhs has {len(lb)} batch axes but rhs has {len(rb)}")
    if len(lc) != len(rc):
        raise ShapeError(f"lhs has {len(lc)} contracting axes but rhs has {len(rc)}")
    for what, la, ra in (("batch", lb, rb), ("contracting", lc, rc)):
        for a, b in zip(la, ra):
            if lhs.shape[a] != rhs.shape[b]:
                raise ShapeError(
                    f"{what} axes differ in size: lhs axis {a} is {lhs.shape[a]}, "
                    f"rhs axis {b} is {rhs.shape[b]}"
                )
    lhs_free = [d for i, d in enumerate(lhs.shape) if i not in lb + lc]
    rhs_free = [d for i, d in enumerate(rhs.shape) if i not in rb + rc]
    shape = tuple(lhs.shape[a] for a in lb) + tuple(lhs_free) + tuple(rhs_free)
    return TensorType(_result_dtype(lhs.dtype, preferred_dtype), shape)


def _dot_reference(lhs, rhs, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, preferred_dtype=None):
    # einsum subscripts: batch letters shared, contracting letters shared, free letters distinct
    letters = iter(string.ascii_letters)
    lhs_sub = [None] * lhs.ndim
    rhs_sub = [None] * rhs.ndim
    batch = []
    for a, b in zip(lhs_batch, rhs_batch):
        lhs_sub[a] = rhs_sub[b] = c = next(letters)
        batch.append(c)
    for a, b in zip(lhs_contracting, rhs_contracting):
        lhs_sub[a] = rhs_sub[b] = next(letters)
    lhs_free = []
    for i in range(lhs.ndim):
        if lhs_sub[i] is None:
            lhs_sub[i] = c = next(letters)
            lhs_free.append(c)
    rhs_free = []
    for i in range(rhs.ndim):
        if rhs_sub[i] is None:
            rhs_sub[i] = c = next(letters)
            rhs_free.append(c)
    spec = f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(batch + lhs_free + rhs_free)}"
    out = np.einsum(spec, widened(lhs), widened(rhs))
    return np.asarray(out).astype(_result_dtype(lhs.dtype, preferred_dtype))


def _dot_emit(em, node, lhs, rhs):
    # jax's lowering leaves empty fields out of #stablehlo.dot<...>
    fields = []
    for name, attr in (
        ("lhs_batching_dimensions", "lhs_batch"),
        ("rhs_batching_dimensions", "rhs_batch"),
        ("lhs_contracting_dimensions", "lhs_contracting"),
        ("rhs_contracting_dimensions", "rhs_contracting"),
    ):
        dims = node.attr(attr)
        if dims:
            fields.append(f"{name} = [{', '.join(map(str, dims))}]")
    return em.simple(
        "stablehlo.dot_general",
        node,
        lhs,
        rhs,
        attrs={"dot_dimension_numbers": f"#stablehlo.dot<{', '.join(fields)}>"},
    )


def _dot_attrs(lb=(), rb=(), lc=(), rc=(), **extra):
    return {"lhs_batch": lb, "rhs_batch": rb, "lhs_contracting": lc, "rhs_contracting": rc, **extra}


def _dot_samples(rng):
    for dt in (np.float32, np.float64, np.int32):
        yield Sample(
            (random_operand(rng, (3, 4), dt), random_operand(rng, (4, 5), dt)), _dot_attrs(lc=(1,), rc=(0,))
        )
    # batched matmul, batch axes not leading on the rhs
    yield Sample(
        (random_operand(rng, (2, 3, 4)), random_operand(rng, (4, 2, 5))), _dot_attrs((0,), (1,), (2,), (0,))
    )
    yield Sample(
        (random_operand(rng, (7,)), random_operand(rng, (7,))), _dot_attrs(lc=(0,), rc=(0,))
    )  # vector dot
    # several contracting axes, given in a non-sorted order
    yield Sample(
        (random_operand(rng, (2, 3, 4, 5)), random_operand(rng, (5, 3, 6))), _dot_attrs(lc=(3, 1), rc=(0, 1))
    )
    yield Sample((random_operand(rng, (2, 3)), random_operand(rng, (4,))), _dot_attrs())  # outer product
    # two batch axes and free axes on both sides
    yield Sample(
        (random_operand(rng, (2, 3, 4, 5)), random_operand(rng, (3, 2, 5, 6))),
        _dot_attrs((0, 1), (1, 0), (3,), (2,)),
    )
    # size-0 axes: a free one, and a contracting one (the result is all zeros)
    yield Sample((random_operand(rng, (0, 4)), random_operand(rng, (4, 3))), _dot_attrs(lc=(1,), rc=(0,)))
    yield Sample((random_operand(rng, (3, 0)), random_operand(rng, (0, 2))), _dot_attrs(lc=(1,), rc=(0,)))
    # low precision, with and without a wider result
    yield Sample(
        (random_operand(rng, (4, 6), dtypes.bfloat16), random_operand(rng, (6, 3), dtypes.bfloat16)),
        _dot_attrs(lc=(1,), rc=(0,)),
        rtol=3e-2,
        atol=6e-2,
    )
    yield Sample(
        (random_operand(rng, (4, 6), dtypes.bfloat16), random_operand(rng, (6, 3), dtypes.bfloat16)),
        _dot_attrs(lc=(1,), rc=(0,), preferred_dtype=dtypes.float32),
        rtol=1e-5,
        atol=1e-5,
    )
    yield Sample(
        (random_operand(rng, (4, 6), np.float16), random_operand(rng, (6, 3), np.float16)),
        _dot_attrs(lc=(1,), rc=(0,)),
        rtol=5e-3,
        atol=1e-2,
    )


# VJP rules: ``vjp(ct, out, *inputs, **attrs)`` -> one cotangent per input (see autodiff.py).
# They are written with dot_general / convolution themselves, so they can be differentiated again.


def transposed(x, permutation):
    """``x`` with its axes permuted; the identity permutation emits nothing."""
    perm = tuple(int(p) for p in permutation)
    return x if perm == tuple(range(len(perm))) else apply("transpose", x, permutation=perm)


def _converted(x, dtype):
    return x if x.dtype == np.dtype(dtype) else apply("convert", x, dtype=np.dtype(dtype))


def zeros_of(t):
    """A zero tensor of type ``t`` (a broadcast 0-d constant)."""
    zero = apply("constant", value=np.zeros((), t.dtype))
    return apply("broadcast_in_dim", zero, shape=t.shape, broadcast_dimensions=()) if t.shape else zero


def _dot_operand_ct(
    ct, mine, other, mine_is_lhs, mine_batch, other_batch, mine_contracting, other_contracting
):
    """The cotangent of one dot_general operand ("mine"): ``ct`` contracted with the other operand
    over the other operand's free axes, batched over the batch axes.

    The result of a dot_general is (batch axes, the first operand's remaining axes, the second
    operand's remaining axes). Batch pairs may be listed in any order and either operand may go
    first, so both orders are tried, batch axes ordered as in ``mine``; a transpose is emitted
    only when neither order gives ``mine``'s axis order (e.g. batch axes that are not leading).
    """
    nb = len(mine_batch)
    mine_free = [a for a in range(mine.ndim) if a not in mine_batch + mine_contracting]
    other_free = [a for a in range(other.ndim) if a not in other_batch + other_contracting]
    # where each operand's free axes sit in the output (and so in ct)
    lhs_free_count = len(mine_free) if mine_is_lhs else len(other_free)
    first = nb + lhs_free_count if mine_is_lhs else nb
    ct_other_free = list(range(first, first + len(other_free)))

    order = sorted(range(nb), key=lambda k: mine_batch[k])
    ct_batch = tuple(order)
    other_batch_sorted = tuple(other_batch[k] for k in order)
    # the other operand's axes left after the contraction: its contracting axes, in its own order
    other_rest = sorted(other_contracting)
    rest_as_mine = [mine_contracting[other_contracting.index(a)] for a in other_rest]
    batch_as_mine = sorted(mine_batch)
    layout_ct_first = batch_as_mine + mine_free + rest_as_mine
    layout_other_first = batch_as_mine + rest_as_mine + mine_free
    identity = list(range(mine.ndim))

    dtype = ct.dtype  # the accumulation dtype (preferred_dtype of the forward op, if any)
    other = _converted(other, dtype)
    if layout_other_first == identity and layout_ct_first != identity:
        result = apply(
            "dot_general",
            other,
            ct,
            lhs_batch=other_batch_sorted,
            rhs_batch=ct_batch,
            lhs_contracting=tuple(other_free),
            rhs_contracting=tuple(ct_other_free),
        )
        layout = layout_other_first
    else:
        result = apply(
            "dot_general",
            ct,
            other,
            lhs_batch=ct_batch,
            rhs_batch=other_batch_sorted,
            lhs_contracting=tuple(ct_other_free),
            rhs_contracting=tuple(other_free),
        )
        layout = layout_ct_first
    result = transposed(result, np.argsort(layout))
    return _converted(result, mine.dtype)


def _dot_vjp(ct, out, lhs, rhs, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, preferred_dtype=None):
    if not dtypes.is_float(lhs.dtype):
        return None, None
    lb, rb, lc, rc = map(list, (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting))
    return (
        _dot_operand_ct(ct, lhs, rhs, True, lb, rb, lc, rc),
        _dot_operand_ct(ct, rhs, lhs, False, rb, lb, rc, lc),
    )


def _dot_general_flops(inputs, outputs, **attrs) -> int:
    """2 * output elements * contracted size: a multiply and an add per term (2*M*N*K for a matmul)."""
    contracted = 1
    for axis in attrs["lhs_contracting"]:
        contracted *= inputs[0].shape[axis]
    return 2 * outputs[0].size * contracted


OPS = [
    OpDef(
        name="dot_general",
        traits=(),
        flops=_dot_general_flops,
        arity=2,
        batch=dot_general_batch,
        attrs=("lhs_batch", "rhs_batch", "lhs_contracting", "rhs_contracting"),
        optional={"preferred_dtype": None},
        infer=_dot_infer,
        reference=_dot_reference,
        emit=_dot_emit,
        samples=_dot_samples,
        vjp=_dot_vjp,
        doc="General tensor contraction: lhs_batch/rhs_batch axes pair up and are kept, lhs_contracting/"
        "rhs_contracting axes pair up and are summed over. Result axes: batch axes, then the "
        "remaining lhs axes, then the remaining rhs axes (each in operand order). "
        "``preferred_dtype`` (same kind as the operands) sets a wider result/accumulation dtype. "
        "Derivative: one dot_general per operand, laid out in the operand's axis order (a "
        "transpose only where an operand's batch axes do not lead); with a wider result dtype "
        "the other operand is widened and the cotangent narrowed to the operand's dtype.",
    ),
]

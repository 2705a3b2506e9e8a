"""Contraction primitives: dot_general and convolution (StableHLO semantics)."""

from __future__ import annotations

import itertools
import string

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import i64_array, padding_literal
from kaun_ir.ops.linalg_batch import convolution_batch, dot_general_batch
from kaun_ir.ops.rules import apply


def _rand(rng, shape, dtype=np.float32):
    dt = np.dtype(dtype)
    if dt in dtypes.INTEGERS:
        return rng.integers(-4, 5, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def _check_numeric(t: TensorType, op: str) -> None:
    if dtypes.is_bool(t.dtype):
        raise TypeError(f"{op} needs numeric operands, got bool (convert first)")


def _wide(x: np.ndarray) -> np.ndarray:
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
    _check_numeric(lhs, "dot_general")
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
    out = np.einsum(spec, _wide(lhs), _wide(rhs))
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
        yield Sample((_rand(rng, (3, 4), dt), _rand(rng, (4, 5), dt)), _dot_attrs(lc=(1,), rc=(0,)))
    # batched matmul, batch axes not leading on the rhs
    yield Sample((_rand(rng, (2, 3, 4)), _rand(rng, (4, 2, 5))), _dot_attrs((0,), (1,), (2,), (0,)))
    yield Sample((_rand(rng, (7,)), _rand(rng, (7,))), _dot_attrs(lc=(0,), rc=(0,)))  # vector dot
    # several contracting axes, given in a non-sorted order
    yield Sample((_rand(rng, (2, 3, 4, 5)), _rand(rng, (5, 3, 6))), _dot_attrs(lc=(3, 1), rc=(0, 1)))
    yield Sample((_rand(rng, (2, 3)), _rand(rng, (4,))), _dot_attrs())  # outer product
    # two batch axes and free axes on both sides
    yield Sample((_rand(rng, (2, 3, 4, 5)), _rand(rng, (3, 2, 5, 6))), _dot_attrs((0, 1), (1, 0), (3,), (2,)))
    # size-0 axes: a free one, and a contracting one (the result is all zeros)
    yield Sample((_rand(rng, (0, 4)), _rand(rng, (4, 3))), _dot_attrs(lc=(1,), rc=(0,)))
    yield Sample((_rand(rng, (3, 0)), _rand(rng, (0, 2))), _dot_attrs(lc=(1,), rc=(0,)))
    # low precision, with and without a wider result
    yield Sample(
        (_rand(rng, (4, 6), dtypes.bfloat16), _rand(rng, (6, 3), dtypes.bfloat16)),
        _dot_attrs(lc=(1,), rc=(0,)),
        rtol=3e-2,
        atol=6e-2,
    )
    yield Sample(
        (_rand(rng, (4, 6), dtypes.bfloat16), _rand(rng, (6, 3), dtypes.bfloat16)),
        _dot_attrs(lc=(1,), rc=(0,), preferred_dtype=dtypes.float32),
        rtol=1e-5,
        atol=1e-5,
    )
    yield Sample(
        (_rand(rng, (4, 6), np.float16), _rand(rng, (6, 3), np.float16)),
        _dot_attrs(lc=(1,), rc=(0,)),
        rtol=5e-3,
        atol=1e-2,
    )


# VJP rules: ``vjp(ct, out, *inputs, **attrs)`` -> one cotangent per input (see autodiff.py).
# They are written with dot_general / convolution themselves, so they can be differentiated again.


def _transposed(x, permutation):
    """``x`` with its axes permuted; the identity permutation emits nothing."""
    perm = tuple(int(p) for p in permutation)
    return x if perm == tuple(range(len(perm))) else apply("transpose", x, permutation=perm)


def _converted(x, dtype):
    return x if x.dtype == np.dtype(dtype) else apply("convert", x, dtype=np.dtype(dtype))


def _zeros(t):
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
    result = _transposed(result, np.argsort(layout))
    return _converted(result, mine.dtype)


def _dot_vjp(ct, out, lhs, rhs, lhs_batch, rhs_batch, lhs_contracting, rhs_contracting, preferred_dtype=None):
    if not dtypes.is_float(lhs.dtype):
        return None, None
    lb, rb, lc, rc = map(list, (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting))
    return (
        _dot_operand_ct(ct, lhs, rhs, True, lb, rb, lc, rc),
        _dot_operand_ct(ct, rhs, lhs, False, rb, lb, rc, lc),
    )


# convolution ----------------------------------------------------------------------------------


def _check_spec(spec, ndim: int, what: str) -> None:
    if sorted(spec) != list(range(ndim)):
        raise ShapeError(f"{what} {list(spec)} must be a permutation of the {ndim} axes of the operand")


def _conv_out_size(size, kernel, stride, lo, hi, lhs_dil, rhs_dil) -> int:
    padded = (size - 1) * lhs_dil + 1 + lo + hi if size else lo + hi
    window = (kernel - 1) * rhs_dil + 1
    return (padded - window) // stride + 1 if padded >= window else 0


def _conv_infer(
    lhs: TensorType,
    rhs: TensorType,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count=1,
    batch_group_count=1,
) -> TensorType:
    if lhs.dtype != rhs.dtype:
        raise TypeError("operands must have the same dtype (convert explicitly first)")
    _check_numeric(lhs, "convolution")
    if lhs.ndim != rhs.ndim or lhs.ndim < 3:
        raise ShapeError(f"input and kernel must have one rank of at least 3, got {lhs.ndim} and {rhs.ndim}")
    nd = lhs.ndim - 2
    _check_spec(lhs_spec, lhs.ndim, "lhs_spec")
    _check_spec(rhs_spec, rhs.ndim, "rhs_spec")
    _check_spec(out_spec, lhs.ndim, "out_spec")
    for name, values in (
        ("window_strides", window_strides),
        ("padding", padding),
        ("lhs_dilation", lhs_dilation),
        ("rhs_dilation", rhs_dilation),
    ):
        if len(values) != nd:
            raise ShapeError(f"{name} needs one entry per spatial axis ({nd}), got {len(values)}")
    if any(len(p) != 2 for p in padding):
        raise ShapeError("padding must be (low, high) pairs")
    if min(window_strides) < 1 or min(lhs_dilation) < 1 or min(rhs_dilation) < 1:
        raise ShapeError("strides and dilations must be at least 1")
    groups, bgroups = feature_group_count, batch_group_count
    if groups < 1 or bgroups < 1 or (groups > 1 and bgroups > 1):
        raise ShapeError("feature_group_count and batch_group_count must be >= 1, and not both > 1")
    batch, features = lhs.shape[lhs_spec[0]], lhs.shape[lhs_spec[1]]
    out_features, in_features = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    if features % groups or out_features % groups:
        raise ShapeError(
            f"feature_group_count {groups} must divide the input features ({features}) and "
            f"the kernel's output features ({out_features})"
        )
    if in_features * groups != features:
        raise ShapeError(
            f"input has {features} features but the kernel expects {in_features} x "
            f"{groups} group(s) = {in_features * groups}"
        )
    if batch % bgroups or out_features % bgroups:
        raise ShapeError(
            f"batch_group_count {bgroups} must divide the batch ({batch}) and the kernel's "
            f"output features ({out_features})"
        )
    spatial = [
        _conv_out_size(
            lhs.shape[lhs_spec[2 + i]],
            rhs.shape[rhs_spec[2 + i]],
            window_strides[i],
            *padding[i],
            lhs_dilation[i],
            rhs_dilation[i],
        )
        for i in range(nd)
    ]
    shape = [0] * lhs.ndim
    shape[out_spec[0]] = batch // bgroups
    shape[out_spec[1]] = out_features
    for i in range(nd):
        shape[out_spec[2 + i]] = spatial[i]
    return TensorType(lhs.dtype, tuple(shape))


def _dilate_and_pad(x: np.ndarray, dilation, padding) -> np.ndarray:
    """Spatial axes 2.. of ``x`` spread out by ``dilation`` (zeros between) and padded with zeros;
    negative padding crops."""
    shape = list(x.shape[:2]) + [(n - 1) * d + 1 if n else 0 for n, d in zip(x.shape[2:], dilation)]
    spread = np.zeros(shape, x.dtype)
    spread[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilation)] = x
    grow = [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in padding]
    out = np.pad(spread, grow)
    crop = [slice(None), slice(None)] + [
        slice(-lo if lo < 0 else 0, n + hi if hi < 0 else None) for n, (lo, hi) in zip(out.shape[2:], padding)
    ]
    return out[tuple(crop)]


def _conv_reference(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count=1,
    batch_group_count=1,
):
    out_type = _conv_infer(
        TensorType(lhs.dtype, lhs.shape),
        TensorType(rhs.dtype, rhs.shape),
        window_strides,
        padding,
        lhs_dilation,
        rhs_dilation,
        lhs_spec,
        rhs_spec,
        out_spec,
        feature_group_count,
        batch_group_count,
    )
    # canonical layouts: x [N, C, spatial...], w [O, I, spatial...]
    x = _dilate_and_pad(_wide(np.transpose(lhs, lhs_spec)), lhs_dilation, padding)
    w = _wide(np.transpose(rhs, rhs_spec))
    n, c = x.shape[:2]
    o = w.shape[0]
    out_spatial = [out_type.shape[out_spec[2 + i]] for i in range(len(window_strides))]
    groups, bgroups = feature_group_count, batch_group_count
    out = np.zeros([n // bgroups, o] + out_spatial, x.dtype)
    if 0 in out_spatial or 0 in out.shape:
        return np.transpose(out, np.argsort(out_spec)).astype(lhs.dtype)
    for g in range(groups * bgroups):
        # feature groups split the input channels; batch groups split the batch (group-major)
        cs = slice(g * (c // groups), (g + 1) * (c // groups)) if groups > 1 else slice(None)
        bs = slice(g * (n // bgroups), (g + 1) * (n // bgroups)) if bgroups > 1 else slice(None)
        os_ = slice(g * (o // (groups * bgroups)), (g + 1) * (o // (groups * bgroups)))
        xg, wg = x[bs, cs], w[os_]
        for pos in itertools.product(*(range(k) for k in w.shape[2:])):
            # the input elements that kernel position ``pos`` meets, for every output position
            window = tuple(
                slice(p * d, p * d + s * (m - 1) + 1, s)
                for p, d, s, m in zip(pos, rhs_dilation, window_strides, out_spatial)
            )
            patch = xg[(slice(None), slice(None)) + window]
            out[:, os_] += np.einsum("nc...,oc->no...", patch, wg[(slice(None), slice(None)) + pos])
    inverse = np.argsort(out_spec)  # canonical axis j lands on result axis out_spec[j]
    return np.transpose(out, inverse).astype(lhs.dtype)


def _conv_letters(spec, first: str, second: str) -> str:
    letters = [""] * len(spec)
    letters[spec[0]], letters[spec[1]] = first, second
    for i, axis in enumerate(spec[2:]):
        letters[axis] = str(i)
    return f"[{', '.join(letters)}]"


def _conv_emit(em, node, lhs, rhs):
    a = node.attr
    numbers = (
        f"{_conv_letters(a('lhs_spec'), 'b', 'f')}x{_conv_letters(a('rhs_spec'), 'o', 'i')}"
        f"->{_conv_letters(a('out_spec'), 'b', 'f')}"
    )
    return em.simple(
        "stablehlo.convolution",
        node,
        lhs,
        rhs,
        attrs={
            "dimension_numbers": f"#stablehlo.conv<{numbers}>",
            "window_strides": i64_array(a("window_strides")),
            "padding": padding_literal(a("padding")),
            "lhs_dilation": i64_array(a("lhs_dilation")),
            "rhs_dilation": i64_array(a("rhs_dilation")),
            "feature_group_count": f"{a('feature_group_count')} : i64",
            "batch_group_count": f"{a('batch_group_count')} : i64",
        },
    )


def _dilated_size(n: int, dilation: int) -> int:
    return 0 if n == 0 else (n - 1) * dilation + 1


def _move_group(x, src: int, dst: int, groups: int):
    """Split axis ``src`` of ``x`` into (groups, rest) and fold the groups factor into axis ``dst``
    as its major part: axis sizes ``src: n -> n / groups``, ``dst: m -> groups * m``."""
    shape = list(x.shape)
    split = shape[:src] + [groups, shape[src] // groups] + shape[src + 1 :]
    y = apply("reshape", x, shape=tuple(split))
    # ``rest`` is y's axes without the new groups axis: the original layout, so ``dst`` indexes it
    rest = [a for a in range(len(split)) if a != src]
    y = _transposed(y, rest[:dst] + [src] + rest[dst:])
    shape[src] //= groups
    shape[dst] *= groups
    return apply("reshape", y, shape=tuple(shape))


def _conv_lhs_ct(
    ct,
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count,
    batch_group_count,
):
    """The input's cotangent: ``ct`` convolved with the spatially reversed kernel, its feature roles
    swapped. The forward strides become lhs dilation (holes where no window started) and the
    forward lhs dilation becomes a stride (holes of the forward input have no cotangent)."""
    nd = len(window_strides)
    groups = feature_group_count
    kernel = rhs
    if feature_group_count > 1:  # the kernel's output features hold the groups: move them to its inputs
        kernel = _move_group(rhs, rhs_spec[0], rhs_spec[1], feature_group_count)
    elif batch_group_count > 1:
        kernel = _move_group(rhs, rhs_spec[0], rhs_spec[1], batch_group_count)
        groups = batch_group_count
    pads = []
    for i in range(nd):
        n_in = _dilated_size(lhs.shape[lhs_spec[2 + i]], lhs_dilation[i])
        n_window = _dilated_size(rhs.shape[rhs_spec[2 + i]], rhs_dilation[i])
        n_out = _dilated_size(ct.shape[out_spec[2 + i]], window_strides[i])
        before = n_window - padding[i][0] - 1
        pads.append((before, n_in + n_window - 1 - n_out - before))
    kernel = apply("reverse", kernel, dimensions=tuple(rhs_spec[2:]))
    result = apply(
        "convolution",
        ct,
        kernel,
        window_strides=tuple(lhs_dilation),
        padding=tuple(pads),
        lhs_dilation=tuple(window_strides),
        rhs_dilation=tuple(rhs_dilation),
        lhs_spec=out_spec,
        rhs_spec=(rhs_spec[1], rhs_spec[0]) + tuple(rhs_spec[2:]),
        out_spec=lhs_spec,
        feature_group_count=groups,
        batch_group_count=1,
    )
    if batch_group_count > 1:  # the groups came out in the features: they belong to the batch
        result = _move_group(result, lhs_spec[1], lhs_spec[0], batch_group_count)
    return result


def _conv_rhs_ct(
    ct,
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation,
    rhs_dilation,
    lhs_spec,
    rhs_spec,
    out_spec,
    feature_group_count,
    batch_group_count,
):
    """The kernel's cotangent: the input convolved with ``ct`` as the kernel, batch and feature
    roles swapped (the batch is summed over). Forward strides become the kernel (``ct``) dilation
    and the forward kernel dilation becomes the stride. Feature groups become batch groups and
    batch groups feature groups."""
    nd = len(window_strides)
    pads = []
    for i in range(nd):
        n_in = _dilated_size(lhs.shape[lhs_spec[2 + i]], lhs_dilation[i])
        n_window = _dilated_size(rhs.shape[rhs_spec[2 + i]], rhs_dilation[i])
        n_out = _dilated_size(ct.shape[out_spec[2 + i]], window_strides[i])
        low = padding[i][0]
        pads.append((low, n_out - n_in + n_window - low - 1))

    def swapped(spec):
        return (spec[1], spec[0]) + tuple(spec[2:])

    return apply(
        "convolution",
        lhs,
        ct,
        window_strides=tuple(rhs_dilation),
        padding=tuple(pads),
        lhs_dilation=tuple(lhs_dilation),
        rhs_dilation=tuple(window_strides),
        lhs_spec=swapped(lhs_spec),
        rhs_spec=swapped(out_spec),
        out_spec=swapped(rhs_spec),
        feature_group_count=batch_group_count,
        batch_group_count=feature_group_count,
    )


def _conv_vjp(ct, out, lhs, rhs, **attrs):
    if not dtypes.is_float(lhs.dtype):
        return None, None
    if ct.size == 0 or lhs.size == 0 or rhs.size == 0:
        # nothing flows back (and the transposed convolutions would have empty windows)
        return _zeros(lhs.type), _zeros(rhs.type)
    lhs_ct = _conv_lhs_ct(ct, lhs, rhs, **attrs)
    rhs_ct = _conv_rhs_ct(ct, lhs, rhs, **attrs)
    for got, want in ((lhs_ct, lhs), (rhs_ct, rhs)):
        if got.shape != want.shape:
            raise ShapeError(f"internal: convolution cotangent {got.type} for an operand {want.type}")
    return lhs_ct, rhs_ct


NCW, NCHW, NHWC = (0, 1, 2), (0, 1, 2, 3), (0, 3, 1, 2)
OIW, OIHW, HWIO = (0, 1, 2), (0, 1, 2, 3), (3, 2, 0, 1)


def _conv_attrs(nd, strides=None, padding=None, lhs_dil=None, rhs_dil=None, specs=None, **extra):
    ones = (1,) * nd
    lhs_spec, rhs_spec, out_spec = specs or ((NCW, OIW, NCW) if nd == 1 else (NCHW, OIHW, NCHW))
    return {
        "window_strides": strides or ones,
        "padding": padding or ((0, 0),) * nd,
        "lhs_dilation": lhs_dil or ones,
        "rhs_dilation": rhs_dil or ones,
        "lhs_spec": lhs_spec,
        "rhs_spec": rhs_spec,
        "out_spec": out_spec,
        **extra,
    }


def _conv_samples(rng):
    tol = {"rtol": 1e-4, "atol": 1e-4}
    yield Sample((_rand(rng, (2, 3, 9)), _rand(rng, (4, 3, 3))), _conv_attrs(1), **tol)
    yield Sample(
        (_rand(rng, (2, 3, 10)), _rand(rng, (4, 3, 3))),
        _conv_attrs(1, strides=(2,), padding=((1, 2),), rhs_dil=(2,)),
        **tol,
    )
    yield Sample((_rand(rng, (2, 3, 7, 6)), _rand(rng, (5, 3, 3, 2))), _conv_attrs(2), **tol)
    yield Sample(
        (_rand(rng, (1, 2, 7, 8)), _rand(rng, (3, 2, 3, 3))),
        _conv_attrs(2, strides=(2, 3), padding=((1, 1), (2, 0))),
        **tol,
    )
    # NHWC input with HWIO kernel and NCHW output, like the TensorFlow layouts
    yield Sample(
        (_rand(rng, (2, 6, 5, 3)), _rand(rng, (2, 3, 3, 4))),
        _conv_attrs(2, padding=((0, 1), (1, 1)), specs=(NHWC, HWIO, NCHW)),
        **tol,
    )
    # lhs dilation (a transposed convolution) and rhs dilation, negative padding crops
    yield Sample(
        (_rand(rng, (1, 2, 4, 5)), _rand(rng, (2, 2, 2, 3))),
        _conv_attrs(2, padding=((1, -1), (2, 2)), lhs_dil=(2, 3), rhs_dil=(1, 2)),
        **tol,
    )
    # feature groups, and depthwise (one group per channel, two outputs each)
    yield Sample(
        (_rand(rng, (2, 4, 6, 6)), _rand(rng, (6, 2, 3, 3))), _conv_attrs(2, feature_group_count=2), **tol
    )
    yield Sample(
        (_rand(rng, (2, 3, 6, 5)), _rand(rng, (6, 1, 3, 2))),
        _conv_attrs(2, strides=(1, 2), padding=((1, 1), (0, 1)), feature_group_count=3),
        **tol,
    )
    # batch groups (how the kernel gradient of a grouped convolution is written)
    yield Sample(
        (_rand(rng, (4, 3, 6, 5)), _rand(rng, (6, 3, 2, 2))), _conv_attrs(2, batch_group_count=2), **tol
    )
    yield Sample((_rand(rng, (2, 3, 5), np.float64), _rand(rng, (2, 3, 2), np.float64)), _conv_attrs(1))
    yield Sample(
        (_rand(rng, (2, 3, 5), np.int32), _rand(rng, (2, 3, 2), np.int32)), _conv_attrs(1, padding=((1, 1),))
    )
    yield Sample(
        (_rand(rng, (1, 2, 6, 6), dtypes.bfloat16), _rand(rng, (2, 2, 3, 3), dtypes.bfloat16)),
        _conv_attrs(2),
        rtol=3e-2,
        atol=1e-1,
    )
    # a window larger than the input gives an empty result
    yield Sample((_rand(rng, (1, 1, 2)), _rand(rng, (1, 1, 3))), _conv_attrs(1))


def _dot_general_flops(inputs, outputs, **attrs) -> int:
    """2 * output elements * contracted size: a multiply and an add per term (2*M*N*K for a matmul)."""
    contracted = 1
    for axis in attrs["lhs_contracting"]:
        contracted *= inputs[0].shape[axis]
    return 2 * outputs[0].size * contracted


def _convolution_flops(inputs, outputs, **attrs) -> int:
    """2 * output elements * kernel window * input channels per group (the kernel's input dimension)."""
    kernel = inputs[1].shape
    spec = attrs["rhs_spec"]  # (output feature, input feature, spatial...)
    window = 1
    for axis in spec[2:]:
        window *= kernel[axis]
    return 2 * outputs[0].size * window * kernel[spec[1]]


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
    OpDef(
        name="convolution",
        traits=(),
        flops=_convolution_flops,
        arity=2,
        batch=convolution_batch,
        attrs=(
            "window_strides",
            "padding",
            "lhs_dilation",
            "rhs_dilation",
            "lhs_spec",
            "rhs_spec",
            "out_spec",
        ),
        optional={"feature_group_count": 1, "batch_group_count": 1},
        infer=_conv_infer,
        reference=_conv_reference,
        emit=_conv_emit,
        samples=_conv_samples,
        vjp=_conv_vjp,
        doc="N-d convolution (cross-correlation) of input lhs with kernel rhs. lhs_spec is (batch axis, "
        "feature axis, spatial axes...), rhs_spec (output-feature axis, input-feature axis, spatial "
        "axes...), out_spec (batch axis, feature axis, spatial axes...) like XLA's "
        "ConvDimensionNumbers. padding holds a (low, high) pair per spatial axis (negative crops); "
        "lhs_dilation spreads the input (transposed convolution), rhs_dilation the kernel. "
        "feature_group_count splits input features and kernel outputs into groups; "
        "batch_group_count splits the batch (group-major) and kernel outputs. Derivative: "
        "convolutions (the input's: ct with the reversed kernel, strides turned into lhs "
        "dilation; the kernel's: the input with ct as the kernel), like jax.",
    ),
]

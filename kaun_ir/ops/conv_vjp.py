"""The VJP of ``convolution``: the operand's cotangent is a convolution of the output
cotangent with the reversed kernel, the kernel's a convolution of the operand with the output
cotangent (operand and batch roles transposed); feature and batch groups are moved between
axes around them. Both are written with ops, so they can be differentiated again."""

from __future__ import annotations

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ops.linalg import transposed, zeros_of
from kaun_ir.ops.rules import apply


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
    y = transposed(y, rest[:dst] + [src] + rest[dst:])
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


def conv_vjp(ct, out, lhs, rhs, **attrs):
    """The cotangents of ``convolution``'s operand and kernel (None for integer operands)."""
    if not dtypes.is_float(lhs.dtype):
        return None, None
    if ct.size == 0 or lhs.size == 0 or rhs.size == 0:
        # nothing flows back (and the transposed convolutions would have empty windows)
        return zeros_of(lhs.type), zeros_of(rhs.type)
    lhs_ct = _conv_lhs_ct(ct, lhs, rhs, **attrs)
    rhs_ct = _conv_rhs_ct(ct, lhs, rhs, **attrs)
    for got, want in ((lhs_ct, lhs), (rhs_ct, rhs)):
        if got.shape != want.shape:
            raise ShapeError(f"internal: convolution cotangent {got.type} for an operand {want.type}")
    return lhs_ct, rhs_ct

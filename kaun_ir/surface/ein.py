"""``kn.ein``: OCANNL's generalized einsum — multi-character axis names, row variables, axis
kinds ``batch | input -> output``, unary reductions and convolution/pooling through affine indices
— lowered to ``dot_general``, ``reduce``, ``convolution``, ``reduce_window``, ``transpose``,
``reshape`` and ``broadcast_in_dim``, so autodiff, passes and viewers see ordinary ops.

It is a separate name from ``kn.einsum`` on purpose: the same string means different things in
the two notations (NumPy's ``"ij,jk->ik"`` is three operands' worth of nonsense in OCANNL's,
where ``,`` separates axis names and ``->`` separates input from output axes), so one function
guessing the notation from the string could silently compute the wrong thing.
"""

from __future__ import annotations

import math

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.einbind import Window, bind, check_sizes, path_prefix, result_size
from kaun_ir.surface.einspec import Affine, Spec, parse, pointer, spec_error
from kaun_ir.surface.elementwise import divide
from kaun_ir.surface.function import op_function
from kaun_ir.surface.linalg import _same_dtype
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.reductions import max as reduce_max
from kaun_ir.surface.reductions import min as reduce_min
from kaun_ir.surface.reductions import sum as reduce_sum
from kaun_ir.surface.shapes import reshape, transpose
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["ein"]

_REDUCTIONS = ("sum", "max", "min", "mean")


@op_function
def ein(spec: str, *operands, reduce: str = "sum", sizes: dict | None = None, **constants):
    """Generalized einsum in OCANNL's notation: ``kn.ein(spec, x)`` or ``kn.ein(spec, a, b)``.

    ``spec`` is ``"<operand> => <result>"`` or ``"<operand>; <operand> => <result>"``; each part
    is ``batch | input -> output`` (any part may be left out). Axes are laid out batch, then
    output, then input: ``"b | q, k -> h"`` is an array ``[b, h, q, k]``. Without a comma (or an
    affine ``+``/``*``) in the spec every letter is an axis (``"ij; jk => ik"``); otherwise axes
    are comma-separated names (``"i, j; j, k => i, k"``). ``...`` matches any number of axes of
    its part (the batch ``...`` and the output ``...`` are different variables), ``..name..``
    any number of axes wherever it is written. A result axis ``0`` is a size-1 axis (a reduced
    axis kept, like ``keepdims``).

    Two operands: the sum over every axis missing from the result of the product (one
    ``dot_general``). One operand: the axes missing from the result are combined with
    ``reduce`` (``"sum"``, ``"max"``, ``"min"``, ``"mean"``). An operand axis written
    ``stride*o + dilation*k`` (``stride``/``dilation`` int literals or names bound as keyword
    arguments, e.g. ``stride=2``) is a window: with two operands, ``k`` an axis of the other
    operand, it is a valid (unpadded) convolution; with one operand, ``sizes={"k": n}`` gives the
    window size and ``reduce`` combines each window (pooling). ``sizes`` also gives the sizes of
    result axes that no operand has (broadcast).

    Shapes: every axis name has one size (no size-1 broadcasting between operands); a window's
    ``o`` has size ``(n - dilation*(k-1) - 1) // stride + 1``. Two operands are promoted to one
    dtype like ``kn.einsum``; a sum keeps the dtype (like ``np.einsum``), ``mean`` gives floats.
    Errors (:class:`kaun_ir.errors.EinSpecError`, ``kn.ShapeError``) show the spec with a caret at
    the offending position.
    """
    parsed = parse(spec)
    if len(parsed.operands) != len(operands):
        raise spec_error(
            f"the spec has {len(parsed.operands)} operand(s) but {len(operands)} array(s) were given",
            spec,
            spec.index("=>"),
        )
    if len(operands) not in (1, 2):
        raise spec_error("ein takes one or two operands", spec, parsed.operands[-1].pos)
    if reduce not in _REDUCTIONS:
        raise ValueError(f"ein: reduce must be one of {', '.join(_REDUCTIONS)}, got {reduce!r}")
    if len(operands) == 2 and reduce != "sum":
        raise ValueError(
            f"ein: with two operands the result is a sum of products; reduce={reduce!r} is only "
            "for one operand"
        )
    sizes = check_sizes(sizes)
    for name, value in constants.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"ein: the constant {name}={value!r} must be a positive int")
    if len(operands) == 2:
        operands = _same_dtype("ein", *operands)
    else:
        if dtypes.is_bool(type_of(operands[0]).dtype):
            raise TypeError("ein of a bool array is not supported (convert to a number type first)")
    shapes = [type_of(x).shape for x in operands]
    axes, known, windows, result = bind(parsed, shapes, sizes, constants)
    if len(operands) == 1:
        x, entries = operands[0], axes[0]
        if any(windows[0]):
            return _pool(parsed, x, entries, windows[0], result, known, reduce)
        return _unary(parsed, x, [name for name, _ in entries], result, known, reduce)
    if any(windows[1]):
        if any(windows[0]):
            raise spec_error(
                "only one operand of a convolution may have affine indices",
                spec,
                next(w.pos for w in windows[1] if w),
            )
        operands, axes, windows = operands[::-1], axes[::-1], windows[::-1]
    if any(windows[0]):
        return _convolve(parsed, operands, axes, windows[0], result, known)
    return _contract(parsed, operands, [[n for n, _ in a] for a in axes], result, known)


# ---------------------------------------------------------------------------------- lowering


def _arrange(spec: Spec, y, names: list, result: list, known: dict):
    """Transpose ``y`` (axes ``names``, all in ``result``) into the result's order, then insert
    the result's size-1 and broadcast axes."""
    order = sorted(range(len(names)), key=lambda k: result.index(names[k]))
    y = transpose(y, tuple(order))
    names = [names[k] for k in order]
    if len(names) == len(result):
        return y
    shape = tuple(1 if name is None else result_size(spec, name, known) for name in result)
    return apply(
        "broadcast_in_dim", y, shape=shape, broadcast_dimensions=tuple(result.index(name) for name in names)
    )


def _reduce(x, names: list, drop: set, kind: str):
    """Combine the axes of ``x`` named in ``drop`` with ``kind``; the dtype stays (like
    np.einsum) except for ``mean``, which gives floats like ``kn.mean``."""
    axis = tuple(k for k, name in enumerate(names) if name in drop)
    kept = [name for name in names if name not in drop]
    if not axis:
        return x, kept
    dtype = type_of(x).dtype
    if kind == "sum":
        return astype(reduce_sum(x, axis=axis), dtype), kept
    if kind == "max":
        return reduce_max(x, axis=axis), kept
    if kind == "min":
        return reduce_min(x, axis=axis), kept
    total = reduce_sum(astype(x, dtype if dtypes.is_float(dtype) else dtypes.float32), axis=axis)
    return divide(total, float(math.prod(type_of(x).shape[a] for a in axis))), kept


def _unary(spec: Spec, x, names: list, result: list, known: dict, kind: str):
    y, kept = _reduce(x, names, set(names) - set(result), kind)
    return _arrange(spec, y, kept, result, known)


def _contract(spec: Spec, operands, names: list, result: list, known: dict):
    """One ``dot_general``: shared axes kept in the result are batch axes, the other shared axes
    are contracted; an axis of one operand only and not in the result is summed first."""
    a, b = operands
    a, an = _reduce(a, names[0], {n for n in names[0] if n not in result and n not in names[1]}, "sum")
    b, bn = _reduce(b, names[1], {n for n in names[1] if n not in result and n not in names[0]}, "sum")
    shared = [n for n in an if n in bn]
    batch = [n for n in shared if n in result]
    contract = [n for n in shared if n not in result]
    y = apply(
        "dot_general",
        a,
        b,
        lhs_batch=tuple(an.index(n) for n in batch),
        rhs_batch=tuple(bn.index(n) for n in batch),
        lhs_contracting=tuple(an.index(n) for n in contract),
        rhs_contracting=tuple(bn.index(n) for n in contract),
    )
    out = batch + [n for n in an if n not in shared] + [n for n in bn if n not in shared]
    return _arrange(spec, y, out, result, known)


def _out_size(spec: Spec, window: Window, size: int, known: dict) -> int:
    kernel = known[window.kernel][0]
    span = window.dilation * (kernel - 1) + 1
    if size < span:
        raise ShapeError(
            pointer(
                f"{path_prefix()}ein: the window of {kernel} (dilation {window.dilation}) spans "
                f"{span} but the axis has only {size}",
                spec.text,
                window.pos,
            )
        )
    out = (size - span) // window.stride + 1
    if window.out in known and known[window.out][0] != out:
        raise ShapeError(
            pointer(
                f"{path_prefix()}ein: output axis {window.out!r} would be {out} but is given as "
                f"{known[window.out][0]}",
                spec.text,
                window.pos,
            )
        )
    known[window.out] = (out, window.pos)
    return out


def _convolve(spec: Spec, operands, axes: list, windows: list, result: list, known: dict):
    """A valid convolution: the operand with windows is the input, the other the kernel. Input
    axes kept in the result merge into one batch axis, axes shared with the kernel into one
    feature axis; the kernel's result axes merge into one output-feature axis."""
    x, w = operands
    xn = [window.out if window else name for (name, _), window in zip(axes[0], windows)]
    wn = [name for name, _ in axes[1]]
    kernels = [window.kernel for window in windows if window]
    for window in windows:
        if window and window.kernel not in wn:
            raise spec_error(
                f"kernel axis {window.kernel!r} must be an axis of the other operand", spec.text, window.pos
            )
    for name, item in axes[0]:
        if not isinstance(item, Affine) and name in wn and name in result:
            raise spec_error(
                f"axis {name!r} is in both operands and in the result: grouped convolutions are "
                "not supported",
                spec.text,
                item.pos,
            )
        if name in kernels:
            raise spec_error(f"kernel axis {name!r} must not index the input directly", spec.text, item.pos)
    spatial = [k for k, window in enumerate(windows) if window]
    outs = [_out_size(spec, windows[k], type_of(x).shape[k], known) for k in spatial]
    lone = {n for k, n in enumerate(xn) if k not in spatial and n not in result and n not in wn}
    x, xn = _reduce(x, xn, lone, "sum")
    w, wn = _reduce(w, wn, {n for n in wn if n not in result and n not in xn and n not in kernels}, "sum")
    out_names = [windows[k].out for k in spatial]
    batch = [n for n in xn if n in result and n not in out_names]
    feature = [n for n in xn if n in wn]
    out_features = [n for n in wn if n in result]
    x = transpose(x, tuple(xn.index(n) for n in batch + feature + out_names))
    w = transpose(w, tuple(wn.index(n) for n in out_features + feature + kernels))
    size = lambda names: math.prod(known[n][0] for n in names)  # noqa: E731
    nd = len(spatial)
    x = reshape(x, (size(batch), size(feature)) + tuple(type_of(x).shape[-nd:]))
    w = reshape(w, (size(out_features), size(feature)) + tuple(known[k][0] for k in kernels))
    layout = tuple(range(nd + 2))
    y = apply(
        "convolution",
        x,
        w,
        window_strides=tuple(windows[k].stride for k in spatial),
        padding=((0, 0),) * nd,
        lhs_dilation=(1,) * nd,
        rhs_dilation=tuple(windows[k].dilation for k in spatial),
        lhs_spec=layout,
        rhs_spec=layout,
        out_spec=layout,
    )
    y = reshape(y, tuple(known[n][0] for n in batch + out_features) + tuple(outs))
    return _arrange(spec, y, batch + out_features + out_names, result, known)


def _pool(spec: Spec, x, axes: list, windows: list, result: list, known: dict, kind: str):
    """One ``reduce_window``: a window per affine axis (size from ``sizes``), 1 elsewhere; the
    axes missing from the result are then reduced with the same ``kind``."""
    t = type_of(x)
    dims, strides, dilations = [], [], []
    names = []
    for k, ((name, _), window) in enumerate(zip(axes, windows)):
        if window:
            _out_size(spec, window, t.shape[k], known)
            dims.append(known[window.kernel][0])
            strides.append(window.stride)
            dilations.append(window.dilation)
            names.append(window.out)
        else:
            dims.append(1)
            strides.append(1)
            dilations.append(1)
            names.append(name)
    dtype = t.dtype
    combine = "sum" if kind == "mean" else kind
    if kind == "mean" and not dtypes.is_float(dtype):
        dtype = dtypes.float32
        x = astype(x, dtype)
    if combine == "sum":
        init = 0
    elif dtypes.is_float(dtype):
        init = -np.inf if combine == "max" else np.inf
    else:
        info = np.iinfo(dtype)
        init = info.min if combine == "max" else info.max
    y = apply(
        "reduce_window",
        x,
        np.asarray(init, dtype),
        kind=combine,
        window_dimensions=tuple(dims),
        window_strides=tuple(strides),
        base_dilations=(1,) * t.ndim,
        window_dilations=tuple(dilations),
        padding=((0, 0),) * t.ndim,
    )
    if kind == "mean":
        y = divide(y, float(math.prod(dims)))
    y, kept = _reduce(y, names, set(names) - set(result), kind)
    return _arrange(spec, y, kept, result, known)

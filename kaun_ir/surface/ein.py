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
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.einspec import Affine, Axis, Fixed, RowVar, Spec, parse, pointer, spec_error
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


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


class _Window:
    """An affine operand axis ``stride*out + dilation*kernel`` once its names are resolved."""

    def __init__(self, out: str, kernel: str, stride: int, dilation: int, pos: int):
        self.out, self.kernel, self.stride, self.dilation, self.pos = out, kernel, stride, dilation, pos


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
    sizes = _check_sizes(sizes)
    for name, value in constants.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"ein: the constant {name}={value!r} must be a positive int")
    if len(operands) == 2:
        operands = _same_dtype("ein", *operands)
    else:
        if dtypes.is_bool(type_of(operands[0]).dtype):
            raise TypeError("ein of a bool array is not supported (convert to a number type first)")
    shapes = [type_of(x).shape for x in operands]
    lengths = _row_lengths(parsed, shapes)
    axes = [_expand(parsed, row.items, lengths) for row in parsed.operands]
    known = _bind_sizes(parsed, axes, shapes, sizes)
    windows = [
        [
            _window(parsed, entry, axes, constants, known) if isinstance(entry[1], Affine) else None
            for entry in operand
        ]
        for operand in axes
    ]
    result = _result_axes(parsed, lengths, known)
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


# ---------------------------------------------------------------------------------- binding


def _check_sizes(sizes: Any) -> dict:
    if sizes is None:
        return {}
    if not isinstance(sizes, dict):
        raise TypeError(f"ein: sizes must be a dict of axis name -> int, got {type(sizes).__name__}")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"ein: sizes[{name!r}] must be a positive int, got {value!r}")
    return {str(k): int(v) for k, v in sizes.items()}


def _label(name: str) -> str:
    return f"'...' of the {name[3:]} part" if name.startswith("...") else f"row variable {name}"


def _row_lengths(spec: Spec, shapes: list) -> dict:
    """The number of axes each row variable stands for, from the operands' ranks."""
    lengths: dict[str, int] = {}
    while True:
        progress, stuck = False, None
        for i, row in enumerate(spec.operands):
            items, rank = row.items, len(shapes[i])
            rows = [it for it in items if isinstance(it, RowVar)]
            fixed = len(items) - len(rows)
            known = sum(lengths[r.name] for r in rows if r.name in lengths)
            free = rank - fixed - known
            unknown = list(dict.fromkeys(r.name for r in rows if r.name not in lengths))
            if free < 0 or (not unknown and free != 0):
                least = "at least " if rows else ""
                raise ShapeError(
                    pointer(
                        f"{_where()}ein: operand {i + 1} has {rank} axes {list(shapes[i])} "
                        f"but the spec gives it {least}{fixed + known}",
                        spec.text,
                        row.pos,
                    )
                )
            if len(unknown) == 1:
                count = sum(r.name == unknown[0] for r in rows)
                if free % count:
                    raise ShapeError(
                        pointer(
                            f"{_where()}ein: {_label(unknown[0])} occurs {count} times in "
                            f"operand {i + 1} and cannot split its {free} remaining axes "
                            "evenly",
                            spec.text,
                            rows[0].pos,
                        )
                    )
                lengths[unknown[0]] = free // count
                progress = True
            elif len(unknown) > 1 and stuck is None:
                stuck = (i, unknown, free)
        if progress:
            continue
        if stuck is None:
            break
        i, unknown, free = stuck
        if not _fusable(spec, unknown):
            second = next(r for r in spec.operands[i].items if isinstance(r, RowVar) and r.name == unknown[1])
            raise spec_error(
                f"{_label(unknown[0])} and {_label(unknown[1])} both stretch over the {free} "
                f"axes left in operand {i + 1}: which belong to which is ambiguous (fix one of "
                "them through another operand, or name the axes)",
                spec.text,
                second.pos,
            )
        # they sit side by side in the same order everywhere, so every split gives the same result
        lengths[unknown[0]] = free
        for name in unknown[1:]:
            lengths[name] = 0
    for item in spec.result.items:
        if isinstance(item, RowVar) and item.name not in lengths:
            raise spec_error(f"{_label(item.name)} of the result appears in no operand", spec.text, item.pos)
    return lengths


def _fusable(spec: Spec, group: list) -> bool:
    """Whether the row variables ``group`` are adjacent, in this order, in every row-spec that
    mentions any of them (then they act as one variable and any split is equivalent)."""
    for row in (*spec.operands, spec.result):
        names = [it.name if isinstance(it, RowVar) else None for it in row.items]
        hits = [k for k, name in enumerate(names) if name in group]
        if not hits:
            continue
        if [names[k] for k in hits] != group or hits != list(range(hits[0], hits[0] + len(group))):
            return False
    return True


def _expand(spec: Spec, items: list, lengths: dict) -> list:
    """``(name, item)`` per array axis: row variables expanded to ``"<row>#j"``; an affine axis
    keeps its item as the name slot's owner (its name is ``"@<position>"``)."""
    out = []
    for item in items:
        if isinstance(item, RowVar):
            out.extend((f"{item.name}#{j}", item) for j in range(lengths[item.name]))
        elif isinstance(item, Affine):
            out.append((f"@{item.pos}", item))
        else:
            out.append((item.name, item))
    return out


def _bind_sizes(spec: Spec, axes: list, shapes: list, sizes: dict) -> dict:
    known: dict[str, tuple[int, int]] = {}  # name -> (size, position of the first binding)
    for i, (entries, shape) in enumerate(zip(axes, shapes)):
        seen = set()
        for (name, item), size in zip(entries, shape):
            if isinstance(item, Affine):
                continue
            if name in seen:
                raise spec_error(
                    f"axis {_axis_label(name)} occurs twice in operand {i + 1} (diagonals are not supported)",
                    spec.text,
                    item.pos,
                )
            seen.add(name)
            if name in known and known[name][0] != size:
                raise ShapeError(
                    pointer(
                        f"{_where()}ein: axis {_axis_label(name)} is {size} in operand "
                        f"{i + 1} but {known[name][0]} where first bound",
                        spec.text,
                        item.pos,
                    )
                )
            known.setdefault(name, (size, item.pos))
    for name, size in sizes.items():
        if name in known and known[name][0] != size:
            raise ShapeError(
                pointer(
                    f"{_where()}ein: sizes[{name!r}] = {size} but the operands give {known[name][0]}",
                    spec.text,
                    known[name][1],
                )
            )
        known.setdefault(name, (size, -1))
    return known


def _axis_label(name: str) -> str:
    if "#" in name:
        row, index = name.split("#")
        return f"{index} of {_label(row)}"
    return repr(name)


def _window(spec: Spec, entry: tuple, axes: list, constants: dict, known: dict) -> _Window:
    """Resolve ``c1*a + c2*b``: the axis found in the result is the output position, the other the
    kernel offset; their coefficients are the stride and the dilation."""
    _, item = entry
    result_names = {it.name for it in spec.result.items if isinstance(it, Axis)}
    operand_names = {name for operand in axes for name, it in operand if not isinstance(it, Affine)}
    terms = []
    for coef, name, pos in item.terms:
        if isinstance(coef, str):
            if coef in constants and name not in constants:
                coef = constants[coef]
            elif name in constants and coef not in constants:
                coef, name = constants[name], coef
            elif coef in constants:
                raise spec_error(
                    f"both {coef!r} and {name!r} are constants; a term is coefficient*axis", spec.text, pos
                )
            elif {coef, name} <= result_names | operand_names:
                raise spec_error(
                    f"{coef}*{name} multiplies two axes: the index is not affine", spec.text, pos
                )
            else:
                unknown = coef if coef not in result_names | operand_names else name
                raise spec_error(f"unknown constant {unknown!r}: pass {unknown}=<int> to ein", spec.text, pos)
        terms.append((int(coef), name, pos))
    if len(terms) != 2 or terms[0][1] == terms[1][1]:
        raise spec_error(
            "a convolution index is 'stride*output + dilation*kernel': two terms over two different axes",
            spec.text,
            item.pos,
        )
    outs = [t for t in terms if t[1] in result_names]
    if len(outs) != 1:
        raise spec_error(
            "exactly one axis of a convolution index must be in the result (the output position)",
            spec.text,
            item.pos,
        )
    ((stride, out, out_pos),) = outs
    dilation, kernel, kernel_pos = next(t for t in terms if t[1] != out)
    if out in operand_names:
        raise spec_error(f"the output position {out!r} must not be an axis of an operand", spec.text, out_pos)
    if kernel not in known:
        raise spec_error(
            f"the size of kernel axis {kernel!r} is unknown: it must be an axis of the other "
            f"operand (or, with one operand, given as sizes={{{kernel!r}: n}})",
            spec.text,
            kernel_pos,
        )
    return _Window(out, kernel, stride, dilation, item.pos)


def _result_axes(spec: Spec, lengths: dict, known: dict) -> list:
    """The result's axis names in layout order (``None`` for a fixed ``0``)."""
    names, seen = [], set()
    for item in spec.result.items:
        if isinstance(item, Fixed):
            names.append(None)
            continue
        expanded = (
            [f"{item.name}#{j}" for j in range(lengths[item.name])]
            if isinstance(item, RowVar)
            else [item.name]
        )
        for name in expanded:
            if name in seen:
                raise spec_error(f"axis {name!r} occurs twice in the result", spec.text, item.pos)
            seen.add(name)
            names.append(name)
    return names


def _result_size(spec: Spec, name: str, known: dict) -> int:
    if name not in known:
        pos = next(
            it.pos
            for it in spec.result.items
            if isinstance(it, (Axis, RowVar)) and (it.name == name or name.startswith(it.name + "#"))
        )
        raise spec_error(
            f"the size of result axis {name!r} is unknown: it is in no operand (give it with "
            f"sizes={{{name!r}: n}})",
            spec.text,
            pos,
        )
    return known[name][0]


# ---------------------------------------------------------------------------------- lowering


def _arrange(spec: Spec, y, names: list, result: list, known: dict):
    """Transpose ``y`` (axes ``names``, all in ``result``) into the result's order, then insert
    the result's size-1 and broadcast axes."""
    order = sorted(range(len(names)), key=lambda k: result.index(names[k]))
    y = transpose(y, tuple(order))
    names = [names[k] for k in order]
    if len(names) == len(result):
        return y
    shape = tuple(1 if name is None else _result_size(spec, name, known) for name in result)
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


def _out_size(spec: Spec, window: _Window, size: int, known: dict) -> int:
    kernel = known[window.kernel][0]
    span = window.dilation * (kernel - 1) + 1
    if size < span:
        raise ShapeError(
            pointer(
                f"{_where()}ein: the window of {kernel} (dilation {window.dilation}) spans "
                f"{span} but the axis has only {size}",
                spec.text,
                window.pos,
            )
        )
    out = (size - span) // window.stride + 1
    if window.out in known and known[window.out][0] != out:
        raise ShapeError(
            pointer(
                f"{_where()}ein: output axis {window.out!r} would be {out} but is given as "
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

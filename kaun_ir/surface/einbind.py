"""The binding step of :func:`kaun_ir.surface.ein.ein`: a parsed spec matched against the
operands' shapes — how many axes each row variable stands for, one size per axis name, the
affine (window) axes resolved to stride and dilation, and the result's axes in layout order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.einspec import Affine, Axis, Fixed, RowVar, Spec, pointer, spec_error


def path_prefix() -> str:
    """The layer path of the trace as an error-message prefix (``"1.attn: "``), or nothing."""
    path = current_path()
    return f"{path}: " if path else ""


class Window:
    """An affine operand axis ``stride*out + dilation*kernel`` once its names are resolved."""

    def __init__(self, out: str, kernel: str, stride: int, dilation: int, pos: int):
        self.out, self.kernel, self.stride, self.dilation, self.pos = out, kernel, stride, dilation, pos


class Binding(NamedTuple):
    """A spec bound to its operands' shapes."""

    axes: list  # per operand, (name, item) per array axis
    known: dict  # axis name -> (size, position in the spec of its first binding)
    windows: list  # per operand, a Window per affine axis and None per plain axis
    result: list  # the result's axis names in layout order (None for a fixed 0)


def bind(spec: Spec, shapes: list, sizes: dict, constants: dict) -> Binding:
    """Match ``spec`` against operands of ``shapes``; ``sizes`` gives axes no operand has and
    ``constants`` the named strides and dilations of affine axes."""
    lengths = _row_lengths(spec, shapes)
    axes = [_expand(spec, row.items, lengths) for row in spec.operands]
    known = _bind_sizes(spec, axes, shapes, sizes)
    windows = [
        [
            _window(spec, entry, axes, constants, known) if isinstance(entry[1], Affine) else None
            for entry in operand
        ]
        for operand in axes
    ]
    return Binding(axes, known, windows, _result_axes(spec, lengths, known))


def check_sizes(sizes: Any) -> dict:
    """``ein``'s ``sizes=`` argument checked (axis name -> positive int), as a plain dict."""
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
                        f"{path_prefix()}ein: operand {i + 1} has {rank} axes {list(shapes[i])} "
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
                            f"{path_prefix()}ein: {_label(unknown[0])} occurs {count} times in "
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
    """Each axis name's size from the operands' shapes and ``sizes``: one size per name."""
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
                        f"{path_prefix()}ein: axis {_axis_label(name)} is {size} in operand "
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
                    f"{path_prefix()}ein: sizes[{name!r}] = {size} but the operands give {known[name][0]}",
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


def _window(spec: Spec, entry: tuple, axes: list, constants: dict, known: dict) -> Window:
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
    return Window(out, kernel, stride, dilation, item.pos)


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


def result_size(spec: Spec, name: str, known: dict) -> int:
    """The size of result axis ``name``; an error at the spec when no operand or ``sizes`` gives it."""
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

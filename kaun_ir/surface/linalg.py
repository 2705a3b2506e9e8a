"""Products of arrays with NumPy semantics: ``matmul``, ``dot``, ``tensordot``, ``einsum``, ``outer``.

Every function lowers to the ``dot_general`` primitive (batch axes, contracting axes, then the
free axes of each operand).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.surface.elementwise import multiply
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, broadcast_shapes, broadcast_to
from kaun_ir.surface.reductions import sum as reduce_sum
from kaun_ir.surface.shapes import reshape, transpose
from kaun_ir.surface.tensor import apply, type_of

__all__ = ["matmul", "dot", "tensordot", "einsum", "outer"]


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


def _same_dtype(name: str, *xs: Any) -> list:
    """Operands converted to their promoted dtype; bool products are refused."""
    types = [type_of(x) for x in xs]
    dtype = dtypes.result_type(*[t.dtype for t in types])
    if dtypes.is_bool(dtype):
        raise TypeError(f"{_where()}{name} of bool arrays is not supported (convert to a number type first)")
    return [astype(x, dtype) for x in xs]


def _dot_general(a, b, lhs_contracting=(), rhs_contracting=(), lhs_batch=(), rhs_batch=()):
    return apply(
        "dot_general",
        a,
        b,
        lhs_batch=tuple(lhs_batch),
        rhs_batch=tuple(rhs_batch),
        lhs_contracting=tuple(lhs_contracting),
        rhs_contracting=tuple(rhs_contracting),
    )


# ---------------------------------------------------------------------------------- matmul


@op_function
def matmul(a, b):
    """Matrix product with NumPy's ``@`` semantics.

    Shapes: ``[..., m, k] @ [..., k, n] -> [..., m, n]`` where the leading (batch) axes broadcast;
    a 1-d ``a`` of shape ``[k]`` acts as ``[1, k]`` and a 1-d ``b`` of shape ``[k]`` as ``[k, 1]``,
    and the added axis is removed from the result (``[k] @ [k] -> []``). Dtypes promote; scalars
    are refused (use ``multiply``).
    """
    a, b = _same_dtype("matmul", a, b)
    ta, tb = type_of(a), type_of(b)
    if ta.ndim == 0 or tb.ndim == 0:
        raise ShapeError(
            f"{_where()}matmul of {ta} and {tb}: operands must have at least one axis "
            "(use multiply for scalars)"
        )
    k_a = ta.shape[-1]
    k_b = tb.shape[-2] if tb.ndim >= 2 else tb.shape[0]
    if k_a != k_b:
        raise ShapeError(f"{_where()}matmul of {ta} and {tb}: contracting dimensions differ ({k_a} vs {k_b})")
    if ta.ndim == 1 or tb.ndim == 1:
        # a vector contracts its only axis; the other operand keeps all of its axes, like np.matmul
        if ta.ndim == 1 and tb.ndim <= 2:
            return _dot_general(a, b, (0,), (0,))
        if tb.ndim == 1:
            return _dot_general(a, b, (ta.ndim - 1,), (0,))
        # [k] @ [..., k, n]: contract, giving [..., n]
        return _dot_general(a, b, (0,), (tb.ndim - 2,))
    if tb.ndim == 2:
        # [..., m, k] @ [k, n]: the free axes come out as [..., m, n] with no broadcasting of b
        return _dot_general(a, b, (ta.ndim - 1,), (0,))
    try:
        batch = broadcast_shapes(ta.shape[:-2], tb.shape[:-2], op="matmul")
    except ShapeError:
        raise ShapeError(
            f"{_where()}matmul of {ta} and {tb}: batch dimensions "
            f"{list(ta.shape[:-2])} and {list(tb.shape[:-2])} do not broadcast"
        ) from None
    a = broadcast_to(a, batch + ta.shape[-2:])
    b = broadcast_to(b, batch + tb.shape[-2:])
    nb = len(batch)
    axes = tuple(range(nb))
    return _dot_general(a, b, (nb + 1,), (nb,), axes, axes)


# ------------------------------------------------------------------------- dot, tensordot, outer


@op_function
def dot(a, b):
    """``np.dot``: a scalar operand multiplies; otherwise the last axis of ``a`` contracts with
    the second-to-last axis of ``b`` (its only axis when 1-d).

    Shapes: ``[..., k] . [k] -> [...]``; ``[..., k] . [j..., k, n] -> [..., j..., n]``.
    """
    a, b = _same_dtype("dot", a, b)
    ta, tb = type_of(a), type_of(b)
    if ta.ndim == 0 or tb.ndim == 0:
        return multiply(a, b)
    rhs_axis = max(tb.ndim - 2, 0)
    if ta.shape[-1] != tb.shape[rhs_axis]:
        raise ShapeError(
            f"{_where()}dot of {ta} and {tb}: contracting dimensions differ "
            f"({ta.shape[-1]} vs {tb.shape[rhs_axis]})"
        )
    return _dot_general(a, b, (ta.ndim - 1,), (rhs_axis,))


@op_function
def tensordot(a, b, axes=2):
    """``np.tensordot``: sum products over ``axes`` and keep the other axes, ``a``'s then ``b``'s.

    ``axes`` is an int N (the last N axes of ``a`` with the first N of ``b``) or a pair of
    axis sequences ``(a_axes, b_axes)``. Shapes: ``[i..., k...] x [k..., j...] -> [i..., j...]``.
    """
    a, b = _same_dtype("tensordot", a, b)
    ta, tb = type_of(a), type_of(b)
    if isinstance(axes, int):
        if not 0 <= axes <= min(ta.ndim, tb.ndim):
            raise ShapeError(f"{_where()}tensordot of {ta} and {tb}: cannot contract {axes} axes")
        a_axes, b_axes = tuple(range(ta.ndim - axes, ta.ndim)), tuple(range(axes))
    else:
        a_axes, b_axes = axes
        a_axes = (a_axes,) if isinstance(a_axes, int) else tuple(a_axes)
        b_axes = (b_axes,) if isinstance(b_axes, int) else tuple(b_axes)
        if len(a_axes) != len(b_axes):
            raise ShapeError(f"{_where()}tensordot: {len(a_axes)} axes of a but {len(b_axes)} axes of b")
        a_axes = tuple(_axis(x, ta.ndim, "tensordot") for x in a_axes)
        b_axes = tuple(_axis(x, tb.ndim, "tensordot") for x in b_axes)
    for i, j in zip(a_axes, b_axes):
        if ta.shape[i] != tb.shape[j]:
            raise ShapeError(
                f"{_where()}tensordot of {ta} and {tb}: axis {i} of a ({ta.shape[i]}) and "
                f"axis {j} of b ({tb.shape[j]}) differ"
            )
    return _dot_general(a, b, a_axes, b_axes)


def _axis(axis: int, ndim: int, name: str) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{_where()}{name}: axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{_where()}{name}: axis {axis} out of range for rank {ndim}")
    return axis % ndim


@op_function
def outer(a, b):
    """``np.outer``: both operands are flattened; shapes ``[m...] x [n...] -> [m, n]``."""
    a, b = _same_dtype("outer", a, b)
    return _dot_general(reshape(a, (-1,)), reshape(b, (-1,)))


# ---------------------------------------------------------------------------------- einsum


def _parse_einsum(subscripts: str, shapes: Sequence[tuple[int, ...]]):
    """Per-operand letter lists and the output letters; ``...`` becomes fresh upper-case letters
    (right-aligned across operands, as NumPy broadcasts them)."""
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"einsum: {subscripts!r} names {len(terms)} operand(s) but {len(shapes)} were given")
    for ch in spec:
        if not (ch.isalpha() or ch in ",.->"):
            raise ValueError(f"einsum: invalid character {ch!r} in {subscripts!r}")
    explicit = set(inputs) - set(",.")
    pool = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in explicit]
    max_ellipsis = max([0] + [_ellipsis_axes(term, shape) for term, shape in zip(terms, shapes)])
    ellipsis = pool[:max_ellipsis]
    letters = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            head, tail = term.split("...")
            count = len(shape) - len(head) - len(tail)
            letters.append(list(head) + ellipsis[max_ellipsis - count :] + list(tail))
        else:
            letters.append(list(term))
    out = _output_letters(output if arrow else None, letters, ellipsis)
    _check_letters(subscripts, output, letters, out)
    return letters, out, set(ellipsis)


def _ellipsis_axes(term: str, shape: tuple[int, ...]) -> int:
    """How many axes of ``shape`` the ``...`` of ``term`` stands for (0 without one); errors for
    a malformed term or one whose letters do not fit the operand's axes."""
    if term.count("...") > 1 or term.replace("...", "").count(".") > 0:
        raise ValueError(f"einsum: malformed term {term!r}")
    named = len(term.replace("...", ""))
    if "..." not in term:
        if named != len(shape):
            raise ShapeError(f"einsum: term {term!r} names {named} axes but its operand has {len(shape)}")
        return 0
    if len(shape) < named:
        raise ShapeError(f"einsum: term {term!r} has more letters than its operand's {len(shape)} axes")
    return len(shape) - named


def _output_letters(output: str | None, letters: list[list[str]], ellipsis: list[str]) -> list[str]:
    """The output's letters: as written after ``->`` (``output``), else NumPy's implicit form
    (the broadcast axes, then the letters that appear once, sorted)."""
    if output is None:
        counts: dict[str, int] = {}
        for term in letters:
            for c in term:
                if c not in ellipsis:
                    counts[c] = counts.get(c, 0) + 1
        return ellipsis + sorted(c for c, n in counts.items() if n == 1)
    if output.count("...") > 1 or output.replace("...", "").count(".") > 0:
        raise ValueError(f"einsum: malformed output {output!r}")
    if "..." not in output and ellipsis:
        raise ValueError("einsum: the output must keep '...' when the inputs have it")
    head, _, tail = output.partition("...")
    return list(head) + (ellipsis if "..." in output else []) + list(tail)


def _check_letters(subscripts: str, output: str, letters: list[list[str]], out: list[str]) -> None:
    """Errors for an output that repeats a letter or names one no operand has, and for a letter
    repeated within one operand (a diagonal or trace)."""
    if len(set(out)) != len(out):
        raise ValueError(f"einsum: output {output!r} repeats a letter")
    every = {c for term in letters for c in term}
    missing = [c for c in out if c not in every]
    if missing:
        raise ValueError(f"einsum: output letter(s) {', '.join(missing)} appear in no operand")
    for term in letters:
        if len(set(term)) != len(term):
            raise NotImplementedError(
                f"einsum: a letter repeated within one operand ({subscripts!r}) takes a diagonal or "
                "trace, which kaun_ir's einsum does not support"
            )


def _sum_out(x, letters: list[str], keep: set[str]):
    """Sum the axes of ``x`` whose letters are not in ``keep`` (the dtype stays, as in np.einsum);
    returns the new tensor and its letters."""
    drop = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not drop:
        return x, letters
    kept = [c for i, c in enumerate(letters) if i not in drop]
    return astype(reduce_sum(x, axis=drop), type_of(x).dtype), kept


@op_function
def einsum(subscripts: str, *operands):
    """Einstein summation like ``np.einsum`` (``"bij,bjk->bik"``, implicit output, ``...``).

    Operands are combined pairwise from left to right, each step one ``dot_general``: letters
    shared by the pair and still needed later are batch axes, shared letters needed nowhere else
    are summed over. A letter occurring in one operand only, and not in the output, is summed
    first. Letters repeated within one operand (diagonals, traces) raise NotImplementedError.
    Shapes: every letter has one size across operands; ``...`` axes broadcast (size 1 stretches).
    """
    if not operands:
        raise ValueError("einsum needs at least one operand")
    operands = _same_dtype("einsum", *operands)
    shapes = [type_of(x).shape for x in operands]
    letters, out, ellipsis = _parse_einsum(subscripts, shapes)
    sizes: dict[str, int] = {}
    for term, shape in zip(letters, shapes):
        for c, n in zip(term, shape):
            known = sizes.setdefault(c, n)
            if known == n:
                continue
            if c in ellipsis and 1 in (known, n):  # '...' axes broadcast
                sizes[c] = n if known == 1 else known
            else:
                raise ShapeError(f"{_where()}einsum {subscripts!r}: letter {c!r} has sizes {known} and {n}")
    # stretch size-1 '...' axes so that every letter has one size in every operand
    xs = []
    for x, term, shape in zip(operands, letters, shapes):
        target = tuple(sizes[c] for c in term)
        xs.append(broadcast_to(x, target) if target != shape else x)

    def needed(rest: int) -> set[str]:
        later = {c for term in letters[rest:] for c in term}
        return later | set(out)

    acc, acc_letters = _sum_out(xs[0], letters[0], needed(1))
    for k in range(1, len(xs)):
        x, x_letters = _sum_out(xs[k], letters[k], needed(k + 1) | set(acc_letters))
        later = needed(k + 1)
        shared = [c for c in acc_letters if c in x_letters]
        batch = [c for c in shared if c in later]
        contract = [c for c in shared if c not in later]
        acc = _dot_general(
            acc,
            x,
            [acc_letters.index(c) for c in contract],
            [x_letters.index(c) for c in contract],
            [acc_letters.index(c) for c in batch],
            [x_letters.index(c) for c in batch],
        )
        acc_letters = (
            batch + [c for c in acc_letters if c not in shared] + [c for c in x_letters if c not in shared]
        )
        acc, acc_letters = _sum_out(acc, acc_letters, later)
    return transpose(acc, tuple(acc_letters.index(c) for c in out))

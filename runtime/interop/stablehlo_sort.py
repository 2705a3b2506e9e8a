"""Importing ``stablehlo.sort``: the comparator region is recognised by what it computes, and the
sort becomes the op table's ``sort`` (stable, one key) plus gathers.

A comparator is imported as a graph of scalars and run, batched, on probe pairs of the operands'
edge values (infinities, NaN, zero, the integer extremes). It is recognised when it agrees on
every probe with a lexicographic order on its first ``k`` operands, each ascending or descending:
JAX's ``jnp.sort`` / ``argsort`` (``LT`` in total order on canonicalised floats), ``lax.sort``
with ``num_keys``, a plain ``LT`` / ``GT``. A comparator whose only disagreement is on NaN (a plain
``LT``, under which NaN is unordered) is recognised too: kaun_ir then puts NaN last ascending and
first descending. Any other comparator raises :class:`StableHLOImportError`.

Several keys sort as successive stable sorts, the last key first; every operand is then gathered
with the permutation found.
"""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import StableHLOImportError
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.ops.indexing_common import gather_along_axis
from kaun_ir.runtime.interop.stablehlo_attrs import integer, region_block
from kaun_ir.runtime.interop.stablehlo_control import free_values
from kaun_ir.transforms.vmap import batch_graph


def _probes(dtype, few: bool) -> np.ndarray:
    """Edge values of ``dtype`` to probe a comparator with (fewer where many operands multiply)."""
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return np.array([False, True])
    if dtypes.is_float(dt):
        values = [-1.0, 0.0, 2.0, np.nan] if few else [-np.inf, -2.5, -1.0, 0.0, 1.0, 3.0, np.inf, np.nan]
        return np.array(values).astype(dt)
    info = np.iinfo(dt)
    values = [info.min, 0, 1, info.max] if few else [info.min, -3, -1, 0, 1, 2, info.max]
    # built in ``dt`` itself: uint64's maximum does not fit an int64
    return np.array([v for v in values if info.min <= v <= info.max], dtype=dt)


def _less(a: np.ndarray, b: np.ndarray, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    """(a before b, a equivalent to b) under one key, in the order kaun_ir's sort uses: NaN after
    every number ascending, before every number descending."""
    if not dtypes.is_float(a.dtype):
        return (a > b if descending else a < b), a == b
    a, b = a.astype(np.float64), b.astype(np.float64)
    na, nb = np.isnan(a), np.isnan(b)
    if descending:
        less = (na & ~nb) | (~na & ~nb & (a > b))
    else:
        less = (~na & nb) | (~na & ~nb & (a < b))
    return less, (na & nb) | (a == b)


def _expected(lhs, rhs, directions) -> np.ndarray:
    """The lexicographic comparator on the first ``len(directions)`` operands."""
    result = np.zeros(lhs[0].shape, bool)
    tied = np.ones(lhs[0].shape, bool)
    for a, b, descending in zip(lhs, rhs, directions):
        less, equal = _less(a, b, descending)
        result |= tied & less
        tied &= equal
    return result


def _has_nan(arrays) -> np.ndarray:
    mask = np.zeros(arrays[0].shape, bool)
    for a in arrays:
        if dtypes.is_float(a.dtype):
            mask |= np.isnan(a.astype(np.float64))
    return mask


#: how many leading operands are probed as possible keys (every combination of their probe values)
MAX_KEYS = 3


def _run(comparator, lhs, rhs) -> np.ndarray:
    """The comparator applied to each pair ``(lhs[i][j], rhs[i][j])`` of operand values."""
    size = len(lhs[0])
    batched, _ = batch_graph(comparator, [True] * (2 * len(lhs)), size, force=True)
    (actual,) = interpret(batched, *[x for a, b in zip(lhs, rhs) for x in (a, b)])
    return np.asarray(actual, bool)


def recognise(comparator, types: list[TensorType]) -> list[bool]:
    """The keys of a comparator graph (of ``2n`` scalars): a direction per key, first key first
    (True: descending). StableHLOImportError when no lexicographic order on at most
    :data:`MAX_KEYS` leading operands matches."""
    n = len(types)
    probed = min(n, MAX_KEYS)
    per_operand = [_probes(t.dtype, few=n > 1) for t in types]
    # the leading operands take every combination of their probe values, the others their first
    tuples = list(itertools.product(*[range(len(p)) for p in per_operand[:probed]]))
    pairs = list(itertools.product(tuples, tuples))
    lhs = [per_operand[i][[p[0][i] for p in pairs]] for i in range(probed)]
    rhs = [per_operand[i][[p[1][i] for p in pairs]] for i in range(probed)]
    rest = [np.repeat(per_operand[i][:1], len(pairs)) for i in range(probed, n)]
    actual = _run(comparator, lhs + rest, rhs + rest)
    # an operand past the probed ones must not decide anything: differing in it alone orders nothing
    for j in range(probed, n):
        if len(per_operand[j]) < 2:
            continue
        fixed = [np.repeat(p[:1], 2) for p in per_operand]
        a, b = list(fixed), list(fixed)
        a[j], b[j] = per_operand[j][:2], per_operand[j][1::-1][:2]
        if _run(comparator, a, b).any():
            raise StableHLOImportError(
                f"sort with a comparator that orders by operand {j}: at most the first {MAX_KEYS} "
                "operands can be keys"
            )
    nan_free = ~(_has_nan(lhs) | _has_nan(rhs))
    for k in range(1, probed + 1):
        for directions in itertools.product((False, True), repeat=k):
            expected = _expected(lhs[:k], rhs[:k], directions)
            if np.array_equal(expected, actual) or np.array_equal(expected[nan_free], actual[nan_free]):
                return list(directions)
    raise StableHLOImportError(
        "sort with a comparator that is not a lexicographic order on its leading operands "
        "(each ascending or descending); kaun_ir's sort cannot express it"
    )


def _comparator_graph(imp, op, types):
    if free_values(op):
        raise StableHLOImportError("sort with a comparator that reads values from outside it")
    block = region_block(op, 0)
    saved = imp.builder
    builder = Builder(record_source=False)
    imp.builder = builder
    try:
        scalars = [TensorType(t.dtype, ()) for t in types for _ in (0, 1)]
        args = [builder.add_input(t) for t in scalars]
        outputs = imp.block(block, args, {})
    finally:
        imp.builder = saved
    graph = builder.finish(outputs, name="comparator")
    if tuple(graph.output_types) != (TensorType(dtypes.bool_, ()),):
        raise StableHLOImportError("sort comparator must return one i1 scalar")
    return graph


def take_along(imp, x, permutation, axis: int):
    """``x`` reordered along ``axis`` by ``permutation`` (an index array of ``x``'s shape)."""
    return gather_along_axis(x, permutation, axis, emit=imp.add1)


def sort(imp, op, xs, env):
    """``stablehlo.sort``: successive stable ``sort``s on the recognised keys, then gathers."""
    axis = integer(op, "dimension", -1)
    rank = xs[0].type.ndim
    axis = axis + rank if axis < 0 else axis
    # is_stable: kaun_ir's sort is always stable, which a non-stable sort allows too
    types = [x.type for x in xs]
    try:
        directions = recognise(_comparator_graph(imp, op, types), types)
    except StableHLOImportError as err:
        if str(err).startswith(op.name):
            raise
        raise imp.error(op, str(err)) from None
    if 0 in xs[0].type.shape:
        return list(xs)
    index = dtypes.int32 if xs[0].type.shape[axis] < 2**31 else dtypes.int64
    permutation = None
    for k in reversed(range(len(directions))):
        key = xs[k] if permutation is None else take_along(imp, xs[k], permutation, axis)
        _, order = imp.add("sort", key, axis=axis, descending=directions[k], index_dtype=index)
        permutation = order if permutation is None else take_along(imp, permutation, order, axis)
    return [take_along(imp, x, permutation, axis) for x in xs]

"""``kn.data`` transformers that compute new elements: :func:`map` of one element and
:func:`batch` / :func:`map_batch` of groups of consecutive ones (with :func:`stack`, the default
collation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import tree as _tree
from kaun_ir.data.core import Data, check_count, check_data


class _Map(Data):
    def __init__(self, f: Callable, source: Data):
        self._f = f
        self._source = source
        self._length = source._length
        self.random_access = source.random_access

    def _next(self) -> Any:
        return self._f(self._source._next())

    def _rewind(self) -> None:
        self._source._rewind()

    def _item(self, i: int) -> Any:
        return self._f(self._source._item(i))

    def _skip(self, count: int) -> None:
        self._source._skip(count)  # f is not run on the skipped elements


def map(f: Callable[[Any], Any], d: Data) -> Data:  # noqa: A001 - the API name
    """The elements ``f(e)`` for each element ``e`` of ``d`` (``f`` runs when an element is read)."""
    check_data(d, "map")
    if not callable(f):
        raise TypeError(f"map: f must be callable, got {type(f).__name__}")
    return _Map(f, d)


def stack(elements: list) -> Any:
    """Stack a list of elements along a new first axis, the default of :func:`batch`.

    Elements may be arrays, numbers or trees (tuples, lists, dicts) of them with one structure:
    ``[(x0, y0), (x1, y1)]`` becomes ``(stack([x0, x1]), stack([y0, y1]))``. Raises
    ``TypeError`` for leaves that are not numeric (use :func:`map_batch` with your own
    function for those) and ``ValueError`` when elements differ in structure or shape.
    """
    flat = [_tree.flatten(e) for e in elements]
    treedef = flat[0][1]
    for _, other in flat[1:]:
        if other != treedef:
            raise ValueError("data.batch: the elements of a batch have different structures")
    paths = [p for p, _ in _tree.paths(elements[0])]
    columns = []
    for j, path in enumerate(paths):
        column = [np.asarray(leaves[j]) for leaves, _ in flat]
        if column[0].dtype == object or column[0].dtype.kind in "USV":
            where = f" (at {path!r})" if path else ""
            raise TypeError(
                f"data.batch can only stack numbers and arrays, got "
                f"{type(flat[0][0][j]).__name__}{where}; use data.map_batch(n, f, d) "
                "to combine elements of other kinds"
            )
        shapes = {c.shape for c in column}
        if len(shapes) > 1:
            where = f" at {path!r}" if path else ""
            raise ValueError(f"data.batch: elements{where} have different shapes {sorted(shapes)}")
        columns.append(np.stack(column))
    return _tree.unflatten(treedef, columns)


class _Batch(Data):
    def __init__(self, n: int, source: Data, collate: Callable[[list], Any], drop_last: bool):
        self._n = n
        self._source = source
        self._collate = collate
        self._drop_last = drop_last
        self.random_access = source.random_access
        if source._length is not None:
            whole, rest = divmod(source._length, n)
            self._length = whole + (1 if rest and not drop_last else 0)

    def _next(self) -> Any:
        items = []
        for _ in range(self._n):
            try:
                items.append(self._source._next())
            except StopIteration:
                break
        if not items or (len(items) < self._n and self._drop_last):
            raise StopIteration
        return self._collate(items)

    def _rewind(self) -> None:
        self._source._rewind()

    def _item(self, i: int) -> Any:
        start = i * self._n
        stop = min(start + self._n, self._source._length)
        return self._collate([self._source._item(j) for j in range(start, stop)])

    def _skip(self, count: int) -> None:
        self._source._skip(count * self._n)


def batch(n: int, d: Data, drop_last: bool = False) -> Data:
    """Groups of ``n`` consecutive elements of ``d``, stacked along a new first axis.

    Elements ``[*s]`` (or trees of them) become batches ``[n, *s]`` (NumPy). The last batch is
    smaller when the length is not a multiple of ``n``, unless ``drop_last=True`` drops it.
    Length ``ceil(len(d) / n)`` (``floor`` with ``drop_last``). Raises ``ValueError`` if
    ``n <= 0``. To combine elements some other way, use :func:`map_batch`.
    """
    n = check_count(n, "batch: n", 1)
    check_data(d, "batch")
    return _Batch(n, d, stack, drop_last)


def map_batch(n: int, f: Callable[[list], Any], d: Data, drop_last: bool = False) -> Data:
    """``f(items)`` for each group ``items`` (a Python list) of ``n`` consecutive elements of
    ``d`` — :func:`batch` with your own function in place of stacking. Same length and
    ``drop_last`` rule as :func:`batch`.
    """
    n = check_count(n, "map_batch: n", 1)
    check_data(d, "map_batch")
    return _Batch(n, d, f, drop_last)

"""Where ``kn.data`` pipelines start: arrays, functions, iterables, and :func:`prepare`'s
mini-batches of ``(x, y)`` arrays.

Array inputs are copied to the host once, when the pipeline is built; every source built from
arrays or a function can be read out of order (``_item``), which :func:`~kaun_ir.data.shuffle`
uses to permute without copying.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import tree as _tree
from kaun_ir.data.core import Data, check_count
from kaun_ir.data.order import permutation
from kaun_ir.surface.tensor import Tensor


class _Indexed(Data):
    """Elements ``get(0) .. get(n-1)`` read in order; ``get`` may depend on the pass number."""

    random_access = True

    def __init__(self, n: int, get: Callable[[int], Any]):
        self._length = n
        self._get = get
        self._pos = 0

    def _next(self) -> Any:
        if self._pos >= self._length:
            raise StopIteration
        value = self._get(self._pos)
        self._pos += 1
        return value

    def _rewind(self) -> None:
        self._pos = 0

    def _item(self, i: int) -> Any:
        return self._get(i)

    def _skip(self, count: int) -> None:
        self._pos = min(self._pos + count, self._length)


class _Iterable(Data):
    """Elements of a re-iterable object; each pass calls ``iter(obj)`` afresh."""

    def __init__(self, obj: Iterable):
        self._obj = obj
        self._it = None
        self._length = len(obj) if hasattr(obj, "__len__") else None

    def _next(self) -> Any:
        if self._it is None:
            self._it = iter(self._obj)
        return next(self._it)

    def _rewind(self) -> None:
        self._it = None


def _host_array(x: Any, what: str) -> np.ndarray:
    """``x`` as a host NumPy array (copying a jax.Array once); symbolic tensors are refused."""
    if isinstance(x, Tensor):
        raise TypeError(
            f"data.{what}: a symbolic Tensor (inside a trace) cannot feed a data "
            "pipeline; pass concrete arrays"
        )
    return np.asarray(x)


def of_array(items: Any) -> Data:
    """The elements ``items[0], items[1], ...`` of a sequence (list, tuple or array), in order.

    ``items`` is kept by reference, not copied; length ``len(items)``.
    """
    if isinstance(items, dict) or not hasattr(items, "__len__") or not hasattr(items, "__getitem__"):
        raise TypeError(
            f"data.of_array needs a sequence (list, tuple, array), got "
            f"{type(items).__name__}; use data.of_iterable for other iterables"
        )
    return _Indexed(len(items), items.__getitem__)


def of_tensor(x: Any) -> Data:
    """The slices ``x[0], x[1], ...`` of an array along its first axis.

    ``x``: ``[N, *rest]`` (NumPy, ``jax.Array`` or anything ``np.asarray`` accepts) ->
    ``N`` elements of shape ``rest`` (NumPy arrays; 0-d arrays when ``x`` is 1-D).
    """
    arr = _host_array(x, "of_tensor")
    if arr.ndim == 0:
        raise ValueError("data.of_tensor needs an array with a first axis, got a 0-d array")
    return _Indexed(arr.shape[0], lambda i: arr[i, ...])


def _leading_dim(arrays: list[tuple[str, np.ndarray]], what: str) -> int:
    """The common first dimension of ``[(path, array)]``; ``ValueError`` if they differ."""
    if not arrays:
        raise ValueError(f"data.{what} needs at least one array")
    sizes = {}
    for path, arr in arrays:
        if arr.ndim == 0:
            raise ValueError(
                f"data.{what}: array {path or '<root>'} is 0-d; every array needs a first (example) axis"
            )
        sizes[path or "<root>"] = arr.shape[0]
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{p}: {n}" for p, n in sizes.items())
        raise ValueError(f"data.{what}: the arrays have different first dimensions ({listing})")
    return next(iter(sizes.values()))


def _host_tree(arrays: Any, what: str) -> tuple[list[np.ndarray], Any, int]:
    """Flatten a tree of arrays to host arrays; check the common first dimension."""
    leaves, treedef = _tree.flatten(arrays)
    host = [_host_array(leaf, what) for leaf in leaves]
    paths = [p for p, _ in _tree.paths(arrays)]
    n = _leading_dim(list(zip(paths, host)), what)
    return host, treedef, n


def of_tensors(arrays: Any) -> Data:
    """Matching slices of several arrays: ``of_tensors((x, y))`` yields ``(x[i], y[i])``.

    ``arrays`` is a tuple (or list, or dict — any tree) of arrays ``[N, ...]`` that share the
    first dimension ``N``; each element has the same structure with one slice per array.
    Raises ``ValueError`` if the first dimensions differ.
    """
    host, treedef, n = _host_tree(arrays, "of_tensors")
    return _Indexed(n, lambda i: _tree.unflatten(treedef, [a[i, ...] for a in host]))


def of_fn(n: int, f: Callable[[int], Any]) -> Data:
    """The elements ``f(0), f(1), ..., f(n - 1)``, each computed when it is read."""
    n = check_count(n, "of_fn: n", 0)
    return _Indexed(n, f)


def repeat(n: int, value: Any) -> Data:
    """``value`` ``n`` times (for example a fixed ``(x, loss_fn)`` pair for ``train.fit``)."""
    n = check_count(n, "repeat: n", 0)
    return _Indexed(n, lambda i: value)


def of_iterable(obj: Iterable) -> Data:
    """The elements of any iterable; each pass (after :meth:`Data.reset`) calls ``iter(obj)``
    again, so ``obj`` should be re-iterable (a list, a ``range``, an object with ``__iter__``).

    The length is ``len(obj)`` when ``obj`` has one and unknown otherwise.
    """
    if not hasattr(obj, "__iter__"):
        raise TypeError(f"data.of_iterable needs an iterable, got {type(obj).__name__}")
    return _Iterable(obj)


class _Prepared(Data):
    """Batches of a tree of arrays sliced directly (no per-example stacking)."""

    random_access = True

    def __init__(
        self,
        host: list[np.ndarray],
        treedef: Any,
        n: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
    ):
        self._host = host
        self._treedef = treedef
        self._n = n
        self._batch_size = batch_size
        self._shuffle = shuffle
        self._seed = seed
        whole, rest = divmod(n, batch_size)
        self._length = whole + (1 if rest and not drop_last else 0)
        self._epoch = 0
        self._started = False
        self._order: np.ndarray | None = None
        self._pos = 0

    def _item(self, i: int) -> Any:
        start = i * self._batch_size
        stop = min(start + self._batch_size, self._n)
        if self._shuffle:
            if self._order is None:
                self._order = permutation(self._seed, self._epoch, self._n)
            index = self._order[start:stop]
            parts = [a[index] for a in self._host]
        else:
            parts = [a[start:stop] for a in self._host]
        return _tree.unflatten(self._treedef, parts)

    def _next(self) -> Any:
        self._started = True
        if self._pos >= self._length:
            raise StopIteration
        value = self._item(self._pos)
        self._pos += 1
        return value

    def _rewind(self) -> None:
        if self._started:
            self._epoch += 1
        self._started = False
        self._order = None
        self._pos = 0

    def _set_pass(self, passes: int) -> None:
        self._epoch, self._started, self._order = passes, False, None

    def _skip(self, count: int) -> None:
        self._started = True
        self._pos = min(self._pos + count, self._length)


def prepare(
    arrays: Any, batch_size: int, shuffle: bool = False, drop_last: bool = True, seed: int = 0
) -> Data:
    """Mini-batches of ``(x, y)``: ``prepare((x, y), 64)`` yields ``(x[b], y[b])`` for
    consecutive blocks ``b`` of 64 examples.

    ``arrays``: a tuple ``(x, y)`` of arrays ``[N, ...]`` (or any tree of arrays sharing the
    first dimension, or a single array). Batches: the same structure with arrays
    ``[batch_size, ...]`` (NumPy, host). With ``shuffle=True`` the examples are visited in a new
    random order each pass (reproducible from ``seed``, as in :func:`shuffle`). ``drop_last``
    defaults to ``True``: a final batch smaller than ``batch_size`` is dropped, so every batch
    has the same shape and a compiled training step is not recompiled for the last one.
    Length ``N // batch_size`` (``ceil`` with ``drop_last=False``). Raises ``ValueError`` if
    ``batch_size <= 0`` or the first dimensions differ.
    """
    batch_size = check_count(batch_size, "prepare: batch_size", 1)
    host, treedef, n = _host_tree(arrays, "prepare")
    return _Prepared(host, treedef, n, batch_size, bool(shuffle), bool(drop_last), int(seed))

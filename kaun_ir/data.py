"""``kn.data``: lazy, single-pass data pipelines.

A :class:`Data` yields elements one at a time, computing each only when it is asked for. Like a
Python iterator (or an open file) it is consumed by reading: ``for b in d``, :func:`iter`,
:func:`fold` and :func:`to_array` continue from where the last read stopped, and a pipeline that
has been read to the end yields nothing more until :meth:`Data.reset` rewinds it — call it
between epochs::

    d = data.prepare((x, y), batch_size=64, shuffle=True, seed=0)
    for epoch in range(10):
        for xb, yb in d:            # xb: [64, ...], yb: [64] NumPy arrays
            ...
        d.reset()                   # rewind; a shuffled pipeline draws a new order

Pipelines are built from constructors (:func:`of_array`, :func:`of_tensor`, :func:`of_tensors`,
:func:`of_fn`, :func:`repeat`, :func:`of_iterable`) and transformers (:func:`map`,
:func:`batch`, :func:`map_batch`, :func:`shuffle`, :func:`prefetch`); :func:`prepare` is the
usual shortcut for ``(x, y)`` arrays. A transformer reads from the pipeline it wraps, so the
two share one position: resetting either rewinds both.

Elements and batches live on the host as NumPy arrays (``jax.Array`` inputs are copied to the
host once, when the pipeline is built). :func:`prefetch` moves batches to the device in a
background thread so that the transfer overlaps with the computation on the previous batch.

``len(d)`` is the number of elements of one full pass when it is known (it does not shrink as
the pipeline is read); it raises ``TypeError`` when it is not (:func:`of_iterable` of an
iterable without a length). :func:`length` returns ``None`` instead.
"""

from __future__ import annotations

import builtins
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import tree as _tree

__all__ = [
    "Data",
    "of_array",
    "of_tensor",
    "of_tensors",
    "of_fn",
    "of_iterable",
    "repeat",
    "map",
    "batch",
    "map_batch",
    "shuffle",
    "prepare",
    "prefetch",
    "iter",
    "fold",
    "to_array",
    "length",
    "stack",
    "shard",
]


class Data:
    """A lazy, resettable stream of elements (see the module docstring).

    Subclasses implement ``_next()`` (the next element, or raise ``StopIteration``),
    ``_rewind()``, and, when the elements can be read in any order, ``_item(i)``.
    """

    _length: int | None = None
    random_access = False  # whether _item(i) is available (shuffle uses it instead of buffering)

    def __iter__(self) -> Data:
        return self

    def __next__(self) -> Any:
        return self._next()

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"this {type(self).__name__} pipeline has no known length")
        return self._length

    def reset(self) -> None:
        """Rewind to the first element (and rewind every pipeline this one reads from)."""
        self._rewind()

    def __repr__(self) -> str:
        size = "unknown length" if self._length is None else f"length {self._length}"
        return f"<kn.data.{type(self).__name__}, {size}>"

    # subclasses override these
    def _next(self) -> Any:
        raise NotImplementedError

    def _rewind(self) -> None:
        raise NotImplementedError

    def _item(self, i: int) -> Any:
        raise TypeError(f"{type(self).__name__} does not support reading elements out of order")


# -- sources --------------------------------------------------------------------------------------


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


class _Iterable(Data):
    """Elements of a re-iterable object; each pass calls ``iter(obj)`` afresh."""

    def __init__(self, obj: Iterable):
        self._obj = obj
        self._it = None
        self._length = len(obj) if hasattr(obj, "__len__") else None

    def _next(self) -> Any:
        if self._it is None:
            self._it = builtins.iter(self._obj)
        return next(self._it)

    def _rewind(self) -> None:
        self._it = None


def _check_count(n: Any, what: str, minimum: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"data.{what} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"data.{what} must be >= {minimum}, got {n}")
    return int(n)


def _host_array(x: Any, what: str) -> np.ndarray:
    """``x`` as a host NumPy array (copying a jax.Array once); symbolic tensors are refused."""
    from kaun_ir.surface.tensor import Tensor

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
    return next(builtins.iter(sizes.values()))


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
    n = _check_count(n, "of_fn: n", 0)
    return _Indexed(n, f)


def repeat(n: int, value: Any) -> Data:
    """``value`` ``n`` times (for example a fixed ``(x, loss_fn)`` pair for ``train.fit``)."""
    n = _check_count(n, "repeat: n", 0)
    return _Indexed(n, lambda i: value)


def of_iterable(obj: Iterable) -> Data:
    """The elements of any iterable; each pass (after :meth:`Data.reset`) calls ``iter(obj)``
    again, so ``obj`` should be re-iterable (a list, a ``range``, an object with ``__iter__``).

    The length is ``len(obj)`` when ``obj`` has one and unknown otherwise.
    """
    if not hasattr(obj, "__iter__"):
        raise TypeError(f"data.of_iterable needs an iterable, got {type(obj).__name__}")
    return _Iterable(obj)


# -- transformers ---------------------------------------------------------------------------------


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


def map(f: Callable[[Any], Any], d: Data) -> Data:  # noqa: A001 - the API name
    """The elements ``f(e)`` for each element ``e`` of ``d`` (``f`` runs when an element is read)."""
    _check_data(d, "map")
    if not callable(f):
        raise TypeError(f"map: f must be callable, got {type(f).__name__}")
    return _Map(f, d)


class _Shard(Data):
    """Elements ``index, index + count, index + 2 count, ...`` of the source."""

    def __init__(self, index: int, count: int, source: Data):
        self._index, self._count, self._source = index, count, source
        self._length = None if source._length is None else source._length // count
        self.random_access = source.random_access
        self._read = 0

    def _next(self) -> Any:
        if self._length is not None and self._read >= self._length:
            raise StopIteration
        # read this shard's element and skip the other shards' ones; a source of unknown length
        # ends where a round of ``count`` elements is incomplete, as in every other shard
        round_ = [self._source._next() for _ in range(self._count)]
        self._read += 1
        return round_[self._index]

    def _rewind(self) -> None:
        self._source._rewind()
        self._read = 0

    def _item(self, i: int) -> Any:
        return self._source._item(i * self._count + self._index)


def shard(index: int, count: int, d: Data) -> Data:
    """This process's part of ``d`` in a run of ``count`` processes: elements ``index``,
    ``index + count``, ... (``index`` is ``kn.distributed.process_index()``). Every shard has
    ``len(d) // count`` elements, so the processes take the same number of steps; the last
    ``len(d) % count`` elements are dropped. Shard after shuffling with the same seed
    everywhere, and batch before sharding to give each process whole batches. Raises
    ``ValueError`` unless ``0 <= index < count``."""
    _check_data(d, "shard")
    count = _check_count(count, "shard: count", 1)
    index = _check_count(index, "shard: index", 0)
    if index >= count:
        raise ValueError(f"shard: index {index} is not in [0, {count})")
    return _Shard(index, count, d)


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
        stop = builtins.min(start + self._n, self._source._length)
        return self._collate([self._source._item(j) for j in range(start, stop)])


def batch(n: int, d: Data, drop_last: bool = False) -> Data:
    """Groups of ``n`` consecutive elements of ``d``, stacked along a new first axis.

    Elements ``[*s]`` (or trees of them) become batches ``[n, *s]`` (NumPy). The last batch is
    smaller when the length is not a multiple of ``n``, unless ``drop_last=True`` drops it.
    Length ``ceil(len(d) / n)`` (``floor`` with ``drop_last``). Raises ``ValueError`` if
    ``n <= 0``. To combine elements some other way, use :func:`map_batch`.
    """
    n = _check_count(n, "batch: n", 1)
    _check_data(d, "batch")
    return _Batch(n, d, stack, drop_last)


def map_batch(n: int, f: Callable[[list], Any], d: Data, drop_last: bool = False) -> Data:
    """``f(items)`` for each group ``items`` (a Python list) of ``n`` consecutive elements of
    ``d`` — :func:`batch` with your own function in place of stacking. Same length and
    ``drop_last`` rule as :func:`batch`.
    """
    n = _check_count(n, "map_batch: n", 1)
    _check_data(d, "map_batch")
    return _Batch(n, d, f, drop_last)


def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    # one independent stream per (seed, epoch): reproducible, and different every epoch
    return np.random.default_rng([seed, epoch]).permutation(n)


class _Shuffle(Data):
    """A permutation of the source, drawn afresh (from ``seed`` and the pass number) each pass.

    A source with random access is read out of order; any other is read to the end into a
    buffer at the start of each pass.
    """

    def __init__(self, source: Data, seed: int):
        self._source = source
        self._seed = seed
        self._length = source._length
        self.random_access = source.random_access
        self._epoch = 0
        self._started = False  # a reset before the first read keeps epoch 0
        self._order: np.ndarray | None = None
        self._buffer: list | None = None
        self._pos = 0

    def _prepare_pass(self) -> None:
        if self._order is None:
            if not self._source.random_access:
                self._buffer = list(_drain(self._source))
                self._length = len(self._buffer)
            self._order = _permutation(self._seed, self._epoch, self._length)

    def _read(self, j: int) -> Any:
        return self._buffer[j] if self._buffer is not None else self._source._item(j)

    def _next(self) -> Any:
        self._prepare_pass()
        self._started = True
        if self._pos >= len(self._order):
            raise StopIteration
        value = self._read(int(self._order[self._pos]))
        self._pos += 1
        return value

    def _rewind(self) -> None:
        self._source._rewind()
        if self._started:
            self._epoch += 1
        self._started = False
        self._order = None
        self._buffer = None
        self._pos = 0

    def _item(self, i: int) -> Any:
        self._prepare_pass()
        return self._read(int(self._order[i]))


def shuffle(d: Data, seed: int = 0) -> Data:
    """The elements of ``d`` in a random order.

    The order is a function of ``seed`` and of the pass: every :meth:`Data.reset` (after the
    pipeline has been read) draws a new permutation, and the sequence of permutations is the same
    every time the same pipeline is built with the same seed. Sources that can be read out of
    order (everything built from arrays, :func:`of_fn`, and :func:`map`/:func:`batch` of those) are
    permuted by index, without copying; others (:func:`of_iterable`) are read into memory at the
    start of each pass (so they must be finite).
    """
    _check_data(d, "shuffle")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"shuffle: seed must be an integer, got {type(seed).__name__} {seed!r}")
    return _Shuffle(d, int(seed))


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
        stop = builtins.min(start + self._batch_size, self._n)
        if self._shuffle:
            if self._order is None:
                self._order = _permutation(self._seed, self._epoch, self._n)
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
    batch_size = _check_count(batch_size, "prepare: batch_size", 1)
    host, treedef, n = _host_tree(arrays, "prepare")
    return _Prepared(host, treedef, n, batch_size, bool(shuffle), bool(drop_last), int(seed))


# -- prefetching to the device -------------------------------------------------------------------

_END = object()


class _Failure:
    """An exception raised by the source, delivered in order to the reader."""

    def __init__(self, error: BaseException):
        self.error = error


class _Prefetch(Data):
    """Reads ``source`` in a background thread and puts each element's arrays on the device."""

    def __init__(self, source: Data, size: int, device: Any):
        self._source = source
        self._size = size
        self._device = device
        self._length = source._length
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._done = False

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self._size)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(self._queue, self._stop), name="kaun_ir-data-prefetch", daemon=True
        )
        self._thread.start()

    def _work(self, out: queue.Queue, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                item = _to_device(self._source._next(), self._device)
            except StopIteration:
                item = _END
            except BaseException as error:  # noqa: BLE001 - handed to the reader, in order
                item = _Failure(error)
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.05)
                    break
                except queue.Full:
                    continue
            if item is _END or isinstance(item, _Failure):
                return

    def _next(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._start()
        item = self._queue.get()
        if item is _END:
            self._done = True
            self._halt()
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            self._halt()
            raise item.error
        return item

    def _halt(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self._thread = self._queue = self._stop = None

    def _rewind(self) -> None:
        # elements already read ahead belong to the old pass: stop the reader, drop them
        self._halt()
        self._done = False
        self._source._rewind()

    def close(self) -> None:
        """Stop the background thread now (it also stops at the end of a pass and on reset)."""
        self._halt()


def _to_device(element: Any, device: Any) -> Any:
    from kaun_ir.runtime import compilation

    leaves, treedef = _tree.flatten(element)
    moved = [  # device None: the runtime's default device
        compilation.put(leaf, leaf.dtype, device) if isinstance(leaf, (np.ndarray, np.generic)) else leaf
        for leaf in leaves
    ]
    return _tree.unflatten(treedef, moved)


def prefetch(d: Data, size: int = 2, device: Any = None) -> Data:
    """The elements of ``d``, with their NumPy arrays already copied to the device.

    A background thread reads up to ``size`` elements ahead of the consumer and transfers their
    NumPy array leaves (``jax.device_put``, through the runtime) to ``device`` (default: the
    default device of the backend in use); other leaves — functions, Python numbers — pass
    through unchanged. Order is kept and no element is lost or repeated; an exception raised
    while reading ``d`` is raised to the consumer at its place in the sequence. :meth:`Data.reset`
    stops the thread and drops what was read ahead.
    """
    size = _check_count(size, "prefetch: size", 1)
    _check_data(d, "prefetch")
    return _Prefetch(d, size, device)


# -- consumers ------------------------------------------------------------------------------------


def _check_data(d: Any, what: str) -> None:
    if not isinstance(d, Data):
        raise TypeError(
            f"data.{what} expects a kn.data pipeline, got {type(d).__name__} "
            "(build one with data.of_array, of_tensor, of_tensors, ...)"
        )


def _drain(d: Data):
    while True:
        try:
            yield d._next()
        except StopIteration:
            return


def iter(f: Callable[[Any], Any], d: Data) -> None:  # noqa: A001 - the API name
    """Call ``f(e)`` on each remaining element of ``d``."""
    _check_data(d, "iter")
    for element in _drain(d):
        f(element)


def fold(f: Callable[[Any, Any], Any], acc: Any, d: Data) -> Any:
    """``f(...f(f(acc, e0), e1)..., eN)`` over the remaining elements of ``d``."""
    _check_data(d, "fold")
    for element in _drain(d):
        acc = f(acc, element)
    return acc


def to_array(d: Data) -> list:
    """The remaining elements of ``d`` as a Python list (in order)."""
    _check_data(d, "to_array")
    return list(_drain(d))


def length(d: Data) -> int | None:
    """The number of elements in one pass of ``d``, or ``None`` when unknown."""
    _check_data(d, "length")
    return d._length

"""``kn.data`` transformers that choose which elements are read, and in which order:
:func:`shuffle` (a new permutation every pass) and :func:`shard` (one process's part)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir.data.core import Data, check_count, check_data, drain


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of pass ``epoch`` of ``n`` elements shuffled with ``seed`` (indices ``[n]``)."""
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
                self._buffer = list(drain(self._source))
                self._length = len(self._buffer)
            self._order = permutation(self._seed, self._epoch, self._length)

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

    def _set_pass(self, passes: int) -> None:
        self._source._set_pass(passes)
        self._epoch, self._started, self._order, self._buffer = passes, False, None, None

    def _skip(self, count: int) -> None:
        self._prepare_pass()
        self._started = True
        self._pos = min(self._pos + count, len(self._order))


def shuffle(d: Data, seed: int = 0) -> Data:
    """The elements of ``d`` in a random order.

    The order is a function of ``seed`` and of the pass: every :meth:`Data.reset` (after the
    pipeline has been read) draws a new permutation, and the sequence of permutations is the same
    every time the same pipeline is built with the same seed. Sources that can be read out of
    order (everything built from arrays, :func:`of_fn`, and :func:`map`/:func:`batch` of those) are
    permuted by index, without copying; others (:func:`of_iterable`) are read into memory at the
    start of each pass (so they must be finite).
    """
    check_data(d, "shuffle")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"shuffle: seed must be an integer, got {type(seed).__name__} {seed!r}")
    return _Shuffle(d, int(seed))


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
    check_data(d, "shard")
    count = check_count(count, "shard: count", 1)
    index = check_count(index, "shard: index", 0)
    if index >= count:
        raise ValueError(f"shard: index {index} is not in [0, {count})")
    return _Shard(index, count, d)

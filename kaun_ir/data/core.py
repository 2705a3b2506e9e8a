"""The pipeline protocol of ``kn.data``: the :class:`Data` base class and the argument checks
every constructor, transformer and consumer shares.

A pipeline stage subclasses :class:`Data` and implements ``_next`` and ``_rewind`` (and ``_item``
when its elements can be read out of order); stages read each other through these methods, not
through Python's iterator protocol, so a wrapped pipeline and its wrapper share one position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


class Data:
    """A lazy, resettable stream of elements (see the ``kn.data`` docstring).

    Subclasses implement ``_next()`` (the next element, or raise ``StopIteration``),
    ``_rewind()``, and, when the elements can be read in any order, ``_item(i)``.
    """

    _length: int | None = None
    random_access = False  # whether _item(i) is available (shuffle uses it instead of buffering)
    # the position of a pipeline read as a whole (by ``for``/``next``): passes begun before the
    # current one, elements read in the current one, and whether :meth:`seek` placed it there
    _pass_count = 0
    _taken = 0
    _sought = False

    def __iter__(self) -> Data:
        return self

    def __next__(self) -> Any:
        value = self._next()
        self._taken += 1
        return value

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"this {type(self).__name__} pipeline has no known length")
        return self._length

    def reset(self) -> None:
        """Rewind to the first element (and rewind every pipeline this one reads from)."""
        if self._taken:
            self._pass_count += 1
        self._taken = 0
        self._sought = False
        self._rewind()

    def position(self) -> dict:
        """Where reading stands: ``{"pass": p, "index": i}``, ``i`` elements read (by ``for`` or
        ``next``) in pass ``p`` (0-based; a :meth:`reset` after reading begins the next pass).
        ``train.fit`` saves it with each checkpoint; :meth:`seek` goes back to it."""
        return {"pass": int(self._pass_count), "index": int(self._taken)}

    def seek(self, position: dict) -> None:
        """Continue from ``position`` (from :meth:`position`) on a pipeline built the same way:
        the next element read is the one that followed there, shuffled orders included (pass
        ``p`` of a shuffled pipeline is drawn from its seed and ``p``). The elements before it
        are skipped without being computed where the pipeline can be read out of order, else
        read and dropped. ``train.fit`` does not reset a pipeline placed by ``seek``."""
        try:
            passes, index = int(position["pass"]), int(position["index"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"data.seek: expected {{'pass': p, 'index': i}}, got {position!r}") from None
        if passes < 0 or index < 0:
            raise ValueError(f"data.seek: pass and index must be >= 0, got {position!r}")
        self._rewind()
        self._set_pass(passes)
        self._skip(index)
        self._pass_count, self._taken, self._sought = passes, index, True

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

    def _set_pass(self, passes: int) -> None:
        """Make the current pass number ``passes`` (stages whose order depends on it override)."""
        source = getattr(self, "_source", None)
        if isinstance(source, Data):
            source._set_pass(passes)

    def _skip(self, count: int) -> None:
        """Read past ``count`` elements (stages that can jump override this)."""
        for _ in range(count):
            try:
                self._next()
            except StopIteration:
                return


def check_count(n: Any, what: str, minimum: int) -> int:
    """``n`` as an ``int`` when it is an integer ``>= minimum``; ``TypeError`` / ``ValueError``
    naming the argument (``what``, e.g. ``"batch: n"``) otherwise."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"data.{what} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"data.{what} must be >= {minimum}, got {n}")
    return int(n)


def check_data(d: Any, what: str) -> None:
    """``TypeError`` unless ``d`` is a pipeline; ``what`` names the function it was passed to."""
    if not isinstance(d, Data):
        raise TypeError(
            f"data.{what} expects a kn.data pipeline, got {type(d).__name__} "
            "(build one with data.of_array, of_tensor, of_tensors, ...)"
        )


def drain(d: Data) -> Iterator[Any]:
    """The remaining elements of ``d``, read one at a time (a generator over ``d._next()``)."""
    while True:
        try:
            yield d._next()
        except StopIteration:
            return

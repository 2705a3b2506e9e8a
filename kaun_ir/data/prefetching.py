"""``kn.data.prefetch``: a background thread that reads ahead and moves each element's arrays to
the device, so the transfer overlaps with the computation on the previous element."""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from kaun_ir import tree as _tree
from kaun_ir.data.core import Data, check_count, check_data
from kaun_ir.runtime import compilation

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

    def _skip(self, count: int) -> None:
        if self._thread is None:  # nothing read ahead yet: jump in the source
            self._source._skip(count)
        else:
            super()._skip(count)

    def close(self) -> None:
        """Stop the background thread now (it also stops at the end of a pass and on reset)."""
        self._halt()


def _to_device(element: Any, device: Any) -> Any:
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
    size = check_count(size, "prefetch: size", 1)
    check_data(d, "prefetch")
    return _Prefetch(d, size, device)

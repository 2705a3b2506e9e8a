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

The modules: :mod:`.core` (the :class:`Data` protocol and the shared argument checks),
:mod:`.sources` (the constructors and :func:`prepare`), :mod:`.transform` (:func:`map`,
:func:`batch`, :func:`map_batch`, :func:`stack`), :mod:`.order` (:func:`shuffle`, :func:`shard`),
:mod:`.prefetching` (:func:`prefetch`) and :mod:`.consumers` (:func:`iter`, :func:`fold`,
:func:`to_array`, :func:`length`).
"""

from kaun_ir.data.consumers import fold, iter, length, to_array  # noqa: A004 - the API names
from kaun_ir.data.core import Data
from kaun_ir.data.order import shard, shuffle
from kaun_ir.data.prefetching import prefetch
from kaun_ir.data.sources import of_array, of_fn, of_iterable, of_tensor, of_tensors, prepare, repeat
from kaun_ir.data.transform import batch, map, map_batch, stack  # noqa: A004 - the API names
from kaun_ir.names import public_dir

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

__dir__ = public_dir(__all__)

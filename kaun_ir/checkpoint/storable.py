"""Which dtypes a SafeTensors file can hold: a save checks every leaf first, so an unsupported
one (complex128, strings, datetimes, ...) is reported with its tree path, not as the library's
error naming no leaf."""

from __future__ import annotations

import numpy as np

__all__ = ["check_storable"]

_STORABLE: dict[np.dtype, bool] = {}


def check_storable(who: str, path: str, dtype) -> None:
    """``TypeError`` naming the leaf ``path`` when SafeTensors cannot store ``dtype``
    (complex128, strings, datetimes, ...), instead of the library's error naming no leaf."""
    # imported here: safetensors loads only when a file is read or written
    from safetensors.numpy import save as st_save  # noqa: PLC0415

    dtype = np.dtype(dtype)
    if dtype not in _STORABLE:
        try:  # the set of dtypes grows with the library's releases: ask it, once per dtype
            st_save({"probe": np.zeros((0,), dtype)})
            _STORABLE[dtype] = True
        except Exception:  # noqa: BLE001 - its error class varies by release
            _STORABLE[dtype] = False
    if not _STORABLE[dtype]:
        name = repr(path) if path else "the root"
        raise TypeError(
            f"{who}: leaf {name} has dtype {dtype}, which a SafeTensors file cannot hold "
            "(cast it, e.g. complex128 to complex64, or store the parts as separate real arrays)"
        )

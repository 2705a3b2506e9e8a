"""Reading a SafeTensors file for ``kn.checkpoint.load``: open it once, read tensors on demand,
and when the file cannot be read say in words why (missing, a directory, empty, truncated, not
SafeTensors) instead of passing on the reader library's own message.
"""

from __future__ import annotations

import json
import os

import numpy as np

from kaun_ir.errors import CheckpointError

__all__ = ["Reader"]


class Reader:
    """A SafeTensors file opened once; tensors are read on demand."""

    def __init__(self, path: str):
        # imported here: safetensors loads only when a file is read or written
        from safetensors import safe_open  # noqa: PLC0415

        self.path = path
        _check_readable(path)
        try:
            self._file = safe_open(path, framework="np")
            self.keys = set(self._file.keys())
            self.metadata = self._file.metadata() or {}
        except Exception as err:  # the library's own error types vary by release
            raise CheckpointError(f"checkpoint.load: {path}: {_diagnose(path, err)}") from err

    def get(self, key: str) -> np.ndarray:
        """The tensor stored under ``key``."""
        if key not in self.keys:
            raise ValueError(
                f"checkpoint.load: {self.path} has no tensor {key!r} ({_close_keys(key, self.keys)})"
            )
        try:
            return self._file.get_tensor(key)
        except Exception as err:  # noqa: BLE001 - data past the end of a truncated file, ...
            raise CheckpointError(
                f"checkpoint.load: {self.path}: cannot read tensor {key!r}: {_diagnose(self.path, err)}"
            ) from err

    def close(self) -> None:
        """Let go of the file."""
        # safe_open objects release the file when dropped; no explicit close in every release
        self._file = None


def _check_readable(path: str) -> None:
    """Errors that name the file for paths that are not a readable regular file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint.load: no such file: {path}")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint.load: {path} is a directory, not a checkpoint file")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint.load: {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise PermissionError(f"checkpoint.load: {path}: permission denied")


def _diagnose(path: str, err: Exception) -> str:
    """What is wrong with a file the SafeTensors reader refused, in words: a SafeTensors file
    is an 8-byte little-endian header length, a JSON header of that length, then the data."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else None
            header = handle.read(min(length, 1 << 20)) if length is not None and length <= size else b""
    except OSError as os_err:
        return f"cannot read the file ({os_err.strerror or os_err})"
    if size == 0:
        return "the file is empty (an interrupted copy?)"
    if length is None:
        return f"the file is {size} bytes, too short to be SafeTensors"
    if length > size - 8:
        return (
            f"not a SafeTensors file, or truncated: its header claims {length} bytes but the file "
            f"has {size - 8} after the length field"
        )
    if not header.lstrip().startswith(b"{"):
        return "not a SafeTensors file (no JSON header)"
    try:
        entries = json.loads(header.decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in entries.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"not a SafeTensors file or a damaged header ({_reason(err)})"
    if 8 + length + end > size:
        return f"truncated: the header describes {8 + length + end} bytes, the file has {size}"
    return f"damaged SafeTensors file ({_reason(err)})"


def _reason(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:200]


def _close_keys(key: str, keys: set[str]) -> str:
    if not keys:
        return "the file has no tensors"
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    near = sorted(k for k in keys if parent and k.startswith(parent + "."))
    shown = near[:8] or sorted(keys)[:8]
    more = "" if len(shown) == len(keys) else ", ..."
    return "keys in the file: " + ", ".join(repr(k) for k in shown) + more

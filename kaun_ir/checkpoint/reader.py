"""Reading checkpoint files: a SafeTensors file for ``kn.checkpoint.load`` (opened once, tensors
read on demand) and the JSON index of a checkpoint directory (a sharded checkpoint's
``index.json``, Hugging Face's ``model.safetensors.index.json``). When a file cannot be read the
error says in words why (missing, a directory, empty, truncated, not SafeTensors, not JSON, an
entry missing or of the wrong type, a file named outside the directory) and names the file,
instead of passing on the decoding library's own exception.

:func:`decoding` is the one place where third-party decode failures (``json``'s, Unicode's,
SafeTensors', and the ``KeyError`` / ``TypeError`` ... of walking a damaged document) become
:class:`~kaun_ir.errors.CheckpointError`; every loader reads its files inside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from kaun_ir.errors import CheckpointError, KaunError

__all__ = ["Reader", "IndexFile", "decoding", "read_json"]

# what decoding a damaged file raises, besides the SafeTensors library's own classes
_DECODE_ERRORS = (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError)


def _is_decode_error(err: BaseException) -> bool:
    if isinstance(err, KaunError):
        return False
    return isinstance(err, _DECODE_ERRORS) or type(err).__module__.startswith("safetensors")


@contextlib.contextmanager
def decoding(path: str, who: str, what: str = "", everything: bool = False) -> Iterator[None]:
    """Turn a failure to decode ``path`` inside the block into a :class:`CheckpointError`
    ``"<who>: <path>: <what><why>"``. ``everything``: any exception but kaun_ir's own (the
    SafeTensors reader raises classes that vary by release); otherwise decode errors only, so
    an ``OSError`` or a ``KeyboardInterrupt`` passes through."""
    try:
        yield
    except Exception as err:
        if isinstance(err, KaunError) or not (everything or _is_decode_error(err)):
            raise
        raise CheckpointError(f"{who}: {path}: {what}{_explain(path, err)}") from err


def _explain(path: str, err: Exception) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})"
    if isinstance(err, RecursionError):
        return "nested too deeply to read"
    if isinstance(err, KeyError):
        return f"missing entry {err.args[0]!r}" if err.args else "a missing entry"
    if type(err).__module__.startswith("safetensors") or not isinstance(err, _DECODE_ERRORS):
        return _diagnose(path, err)
    return f"malformed ({type(err).__name__}: {_reason(err)})"


def read_json(path: str, who: str) -> Any:
    """The JSON document in file ``path``; :class:`CheckpointError` naming the file when it is
    not UTF-8 JSON, ``FileNotFoundError`` naming it when it is missing."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{who}: no such file: {path}")
    if not os.path.isfile(path):
        raise CheckpointError(f"{who}: {path} is not a regular file")
    with open(path, "rb") as handle:
        data = handle.read()
    with decoding(path, who):
        return json.loads(data.decode("utf-8"))


class IndexFile:
    """The JSON index of a checkpoint directory, validated as it is read: :meth:`field` checks
    an entry's type, :meth:`file` that a file it names is a plain file inside the directory
    (no absolute path, no ``..``, no link leading out, except into ``links_into``). Every failure is a
    :class:`CheckpointError` naming the index file and the entry."""

    def __init__(self, path: str, who: str, directory: str | None = None, links_into: tuple = ()):
        self.path, self.who = path, who
        self.directory = directory if directory is not None else os.path.dirname(path)
        # folders outside the directory that a link in it may lead into (a download cache's)
        self.links_into = tuple(os.path.realpath(p) for p in links_into)
        self.data = read_json(path, who)
        self._files: dict[str, str] = {}

    def check_object(self) -> dict:
        """The document, which must be a JSON object."""
        if not isinstance(self.data, dict):
            raise self.error(f"the document is {_json_type(self.data)}, expected an object")
        return self.data

    def error(self, message: str) -> CheckpointError:
        """A :class:`CheckpointError` ``"<who>: <index file>: <message>"``."""
        return CheckpointError(f"{self.who}: {self.path}: {message}")

    def field(self, node: Any, key: str, kind: type | tuple, where: str = "") -> Any:
        """``node[key]``, which must exist and be of ``kind``; ``where`` names ``node`` in errors."""
        place = f"{where}[{key!r}]" if where else repr(key)
        if not isinstance(node, dict):
            raise self.error(f"{where or 'the document'} is {_json_type(node)}, expected an object")
        if key not in node:
            raise self.error(f"missing entry {place}")
        value = node[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(_json_name(k) for k in kinds)
            raise self.error(f"entry {place} is {_json_type(value)}, expected {names}")
        return value

    def file(self, name: Any, where: str) -> str:
        """The path of the file ``name`` that entry ``where`` names: a relative name that stays
        inside the directory and is a regular file there."""
        if isinstance(name, str) and name in self._files:
            return self._files[name]
        if not isinstance(name, str) or not name:
            raise self.error(f"entry {where} names a file by {name!r}, expected a file name")
        parts = re.split(r"[\\/]", name)
        if os.path.isabs(name) or "\x00" in name or ".." in parts or re.match(r"^[A-Za-z]:", name):
            raise self.error(f"entry {where} names {name!r}, outside the directory {self.directory}")
        full = os.path.join(self.directory, name)
        real = os.path.realpath(full)
        roots = (os.path.realpath(self.directory), *self.links_into)
        if not any(os.path.commonpath([root, real]) == root for root in roots):
            raise self.error(
                f"entry {where} names {name!r}, a link leading outside the directory {self.directory}"
            )
        if not os.path.isfile(real):
            missing = "does not exist" if not os.path.exists(real) else "is not a regular file"
            raise self.error(f"entry {where} names {name!r}, which {missing}")
        self._files[name] = full
        return full


def _json_name(kind: type) -> str:
    return {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}.get(
        kind, kind.__name__
    )


def _json_type(value: Any) -> str:
    """What a JSON value is, with its article: ``"an array"``, ``"null"``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), f"a {type(value).__name__}"
    )


class Reader:
    """A SafeTensors file opened once; tensors are read on demand."""

    def __init__(self, path: str):
        # imported here: safetensors loads only when a file is read or written
        from safetensors import safe_open  # noqa: PLC0415

        self.path = path
        _check_readable(path)
        with decoding(path, "checkpoint.load", everything=True):  # its error types vary by release
            self._file = safe_open(path, framework="np")
            self.keys = set(self._file.keys())
            self.metadata = self._file.metadata() or {}

    def get(self, key: str) -> np.ndarray:
        """The tensor stored under ``key``."""
        if key not in self.keys:
            raise ValueError(
                f"checkpoint.load: {self.path} has no tensor {key!r} ({_close_keys(key, self.keys)})"
            )
        # data past the end of a truncated file, ...
        with decoding(self.path, "checkpoint.load", f"cannot read tensor {key!r}: ", everything=True):
            return self._file.get_tensor(key)

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

"""``kn.checkpoint``: save and load trees of arrays as SafeTensors files.

A file holds one tensor per leaf, named by the leaf's dotted path (``"layers.0.weight"``, see
:func:`kaun_ir.ptree.flatten_with_paths`; a bare-array tree is stored under ``""``), so files
written here are ordinary SafeTensors files that other tools (the ``safetensors`` package,
PyTorch, Hugging Face) can read, and their files load here when the names match.

Besides the tensors, :func:`save` records the tree's shape in the file's metadata (under
``"kaun_ir.tree"``, as JSON): which nodes are dicts, lists or tuples, empty containers, ``None``
subtrees, and which leaves were Python ``int`` / ``float`` / ``bool`` (a training step counter)
rather than arrays. :func:`load` without a template uses it to give back the tree that was saved.

Writes are atomic: the file is written to a temporary file in the same directory, flushed and
``fsync``-ed, then renamed over ``path``; if anything fails midway the previous file at ``path``
(if any) is left untouched and the temporary file is removed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from kaun_ir import hooks, ptree
from kaun_ir.checkpoint.mapping import MappedSource, state_dict_arrays
from kaun_ir.checkpoint.reader import Reader, decoding
from kaun_ir.checkpoint.storable import check_storable
from kaun_ir.errors import CheckpointError
from kaun_ir.fileio import atomic_write
from kaun_ir.runtime.xla import transfer
from kaun_ir.surface.tensor import Tensor

__all__ = [
    "save",
    "load",
    "load_raw",
    "metadata",
    "from_state_dict",
    "save_sharded",
    "load_sharded",
    "STRUCTURE_KEY",
    "CheckpointError",
]

STRUCTURE_KEY = "kaun_ir.tree"
OPTIMIZER_KEY = "kaun_ir.optimizer"  # which optimiser wrote a training state (kn.train.save)
POSITION_KEY = "kaun_ir.data_position"  # a kn.data pipeline's position (train.fit's checkpoints)
EPOCH_KEY = "kaun_ir.fit_epoch"  # the passes over the data train.fit had finished
_PASSED_THROUGH = (OPTIMIZER_KEY, POSITION_KEY, EPOCH_KEY)
_FORMAT_KEY = "kaun_ir.format"
_FORMAT = "1"
_CHUNK = 1 << 24  # bytes per write call


# -- structure metadata ---------------------------------------------------------------------------
# A node is encoded as a JSON value: "array" / "int" / "float" / "bool" for leaves, "none" for
# None, ["dict", {key: node}] (insertion order kept), ["list", [node]], ["tuple", [node]].


def _encode(node: Any, path: str) -> Any:
    if isinstance(node, dict):
        return ["dict", {k: _encode(v, f"{path}.{k}" if path else k) for k, v in node.items()}]
    if isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
        kind = "list" if isinstance(node, list) else "tuple"
        return [kind, [_encode(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node)]]
    if node is None:
        return "none"
    if isinstance(node, bool):
        return "bool"
    if isinstance(node, int):
        return "int"
    if isinstance(node, float):
        return "float"
    return "array"


def _decode(spec: Any, path: str, read) -> Any:
    """Rebuild the tree described by ``spec``; ``read(path, kind)`` supplies each leaf."""
    if isinstance(spec, str):
        return None if spec == "none" else read(path, spec)
    kind, children = spec
    if kind == "dict":
        return {k: _decode(v, f"{path}.{k}" if path else k, read) for k, v in children.items()}
    items = [_decode(v, f"{path}.{i}" if path else str(i), read) for i, v in enumerate(children)]
    return items if kind == "list" else tuple(items)


# -- saving ---------------------------------------------------------------------------------------


def _leaf_to_host(path: str, leaf: Any) -> np.ndarray:
    name = repr(path) if path else "the root"
    if isinstance(leaf, Tensor):
        raise TypeError(
            f"checkpoint.save: leaf {name} is a symbolic Tensor (inside a trace); save concrete arrays"
        )
    if isinstance(leaf, bool):
        return np.asarray(leaf, dtype=np.bool_)
    if isinstance(leaf, int):
        return np.asarray(leaf, dtype=np.int64)
    if isinstance(leaf, float):
        return np.asarray(leaf, dtype=np.float64)
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
        raise TypeError(f"checkpoint.save: leaf {name} is a {type(leaf).__name__}, not an array or a number")
    arr = np.asarray(leaf)  # copies a jax.Array to the host
    if arr.dtype == object:
        raise TypeError(f"checkpoint.save: leaf {name} has dtype object")
    check_storable("checkpoint.save", path, arr.dtype)
    # not np.ascontiguousarray: it would turn a 0-d array into shape [1]
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _write_bytes(handle, data: bytes) -> None:
    """Write ``data`` in chunks (one place for tests to simulate a crash mid-write)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        handle.write(view[start : start + _CHUNK])


class WholeStateIO(NamedTuple):
    """How a whole training state (``kn.train.State``) is saved and read back: ``save(path,
    state, metadata)`` and ``load_like(path, like)``, which check its optimiser."""

    kind: type
    save: Callable
    load_like: Callable


# The training state's saver, filled by the composition root: kn.train builds on this package, so
# the checkpoint never imports it.
_WHOLE_STATE: list[WholeStateIO] = []


def install_whole_state_io(io: WholeStateIO) -> None:
    """Called by the composition root: the saver and loader of ``kn.train.State``."""
    _WHOLE_STATE[:] = [io]


def _whole_state_io(tree: Any) -> WholeStateIO | None:
    if not _WHOLE_STATE:
        hooks.ensure_installed()
    return next((io for io in _WHOLE_STATE if isinstance(tree, io.kind)), None)


def save(path: str | os.PathLike, tree: Any, metadata: dict[str, str] | None = None) -> str:
    """Write ``tree`` (arrays, Python numbers, nested dicts/lists/tuples) to ``path`` as
    SafeTensors, atomically. Returns ``path`` as a string.

    A whole training state (``kn.train.State``) is saved as ``kn.train.save`` does (parameters,
    layer state, optimiser state and which optimiser made it, step, key); load it back with
    ``checkpoint.load(path, like=state)`` or ``kn.train.load``. ``metadata``: extra string
    entries for the file's header (read back with :func:`metadata`); keys starting with
    ``"kaun_ir."`` are reserved.

    Each leaf becomes a tensor named by its dotted path with its own shape and dtype
    (``bfloat16`` included); a Python ``int`` / ``float`` / ``bool`` is stored as a 0-d
    ``int64`` / ``float64`` / ``bool`` tensor and comes back as a Python number. Device arrays
    are copied to the host. Raises ``ValueError`` for dict keys containing ``"."`` and
    ``TypeError`` for leaves that are neither arrays nor numbers (or are symbolic tensors).
    """
    # imported here: safetensors loads only when a file is read or written
    from safetensors.numpy import save as st_save  # noqa: PLC0415

    whole = _whole_state_io(tree)
    if whole is not None:
        return whole.save(path, tree, metadata)
    path = os.fspath(path)
    extra = dict(metadata or {})
    for key, value in extra.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"checkpoint.save: metadata must map strings to strings, got {key!r}: {value!r}")
        if key.startswith("kaun_ir.") and key not in _PASSED_THROUGH:
            raise ValueError(f"checkpoint.save: metadata key {key!r} is reserved")
    entries = ptree.flatten_with_paths(tree)  # validates the dict keys
    tensors = {}
    for key, leaf in entries:
        if key == "__metadata__":
            raise ValueError("checkpoint.save: '__metadata__' is reserved by SafeTensors and cannot be a key")
        tensors[key] = _leaf_to_host(key, leaf)
    header = {
        **extra,
        STRUCTURE_KEY: json.dumps(_encode(tree, ""), separators=(",", ":")),
        _FORMAT_KEY: _FORMAT,
    }
    atomic_write(
        path, st_save(tensors, metadata=header), writer=lambda handle, data: _write_bytes(handle, data)
    )
    return path


# -- loading --------------------------------------------------------------------------------------


def metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string entries of a SafeTensors file's header (``{}`` if it has none): what
    :func:`save` was given as ``metadata`` plus kaun_ir's own ``"kaun_ir.*"`` entries."""
    reader = Reader(os.fspath(path))
    try:
        return dict(reader.metadata)
    finally:
        reader.close()


def load_raw(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a SafeTensors file as ``{name: np.ndarray}`` (host arrays, the file's
    dtypes, bfloat16 included); no tree structure is applied."""
    reader = Reader(os.fspath(path))
    try:
        return {key: reader.get(key) for key in sorted(reader.keys)}
    finally:
        reader.close()


def load(path: str | os.PathLike, like: Any = None, rename=None, transpose=None) -> Any:
    """Read a checkpoint back as a tree.

    With ``like`` (a template tree, e.g. freshly initialised parameters or a training state):
    the result has ``like``'s exact structure; each leaf is read from the tensor at its dotted
    path, checked against the template leaf's shape and cast to its dtype. Template leaves that
    are ``jax.Array``s give device arrays on the same device; NumPy arrays and
    ``kn.ShapeDtype`` specs give NumPy arrays; Python numbers give Python numbers of the same
    type. Tensors in the file that ``like`` does not name are ignored. Raises ``ValueError``
    naming the key when a tensor is missing or its shape differs.

    Without ``like``: the structure stored by :func:`save` is rebuilt, with NumPy arrays at the
    leaves in their saved dtypes. A file from elsewhere (no stored structure) is rebuilt from
    its key names with :func:`kaun_ir.ptree.unflatten_from_paths` (nested dicts; a node whose
    keys are ``0..n-1`` becomes a list).

    ``rename`` / ``transpose`` read files written under other conventions (a PyTorch
    ``state_dict`` saved with ``safetensors``): ``rename`` maps the file's keys to dotted paths
    (``[(regex, replacement), ...]`` or a function), ``transpose`` names the paths whose tensors
    are stored with reversed axes (``[out, in]`` linear weights); see
    :mod:`kaun_ir.checkpoint.mapping` and docs/interop.md for the convention table.
    """
    whole = _whole_state_io(like)
    if whole is not None:  # a whole training state: kn.train's loader checks the optimiser
        return whole.load_like(os.fspath(path), like)
    if rename is not None or transpose is not None:
        reader = Reader(os.fspath(path))
        mapped = MappedSource(reader.keys, reader.get, rename, transpose, where=os.fspath(path))
        try:
            if like is not None:
                return _load_like(mapped, like)
            return ptree.unflatten_from_paths({k: mapped.get(k) for k in sorted(mapped.keys)})
        finally:
            reader.close()
    reader = Reader(os.fspath(path))
    try:
        if like is not None:
            return _load_like(reader, like)
        spec = reader.metadata.get(STRUCTURE_KEY)
        if spec is None:
            return ptree.unflatten_from_paths({k: reader.get(k) for k in sorted(reader.keys)})
        with decoding(
            reader.path, "checkpoint.load", f"damaged tree structure in the metadata ({STRUCTURE_KEY}): "
        ):
            structure = json.loads(spec)
            return _decode(structure, "", lambda key, kind: _as_kind(reader.get(key), kind))
    finally:
        reader.close()


def from_state_dict(state_dict, like: Any = None, rename=None, transpose=None) -> Any:
    """A tree from an in-memory ``{name: tensor}`` mapping — a PyTorch ``model.state_dict()``
    (tensors taken through DLPack), or NumPy / jax arrays — with the same ``like`` / ``rename`` /
    ``transpose`` rules as :func:`load`; no converter script, no file.

    Example, a PyTorch ``nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))`` into
    ``layer.sequential([linear(4, 8), relu(), linear(8, 2)])``: the names already agree
    (``"0.weight"``), only the weights are transposed:
    ``from_state_dict(torch_model.state_dict(), like=params, transpose=[r"\\d+\\.weight"])``.
    """
    arrays = state_dict_arrays(state_dict)
    mapped = MappedSource(arrays, arrays.__getitem__, rename, transpose, where="state_dict")
    if like is not None:
        return _load_like(mapped, like)
    return ptree.unflatten_from_paths({k: mapped.get(k) for k in sorted(mapped.keys)})


def _as_kind(arr: np.ndarray, kind: str) -> Any:
    if kind == "int":
        return int(arr.reshape(()))
    if kind == "float":
        return float(arr.reshape(()))
    if kind == "bool":
        return bool(arr.reshape(()))
    return arr


def _load_like(reader: Reader, like: Any) -> Any:
    _, rebuild = ptree.flatten(like)
    out = []
    for key, template in ptree.flatten_with_paths(like):  # the same order as flatten's leaves
        name = repr(key) if key else "'' (the root)"
        if isinstance(template, Tensor):
            raise TypeError(
                f"checkpoint.load: template leaf {name} is a symbolic Tensor; "
                "use concrete arrays or kn.ShapeDtype specs as the template"
            )
        if not isinstance(template, (bool, int, float)) and not (
            hasattr(template, "shape") and hasattr(template, "dtype")
        ):
            raise TypeError(
                f"checkpoint.load: template leaf {name} is a "
                f"{type(template).__name__}, not an array, a ShapeDtype or a number"
            )
        arr = reader.get(key)
        if isinstance(template, (bool, int, float)):
            if arr.size != 1:
                raise ValueError(
                    f"checkpoint.load: {name} holds shape {arr.shape} but the "
                    f"template has a Python {type(template).__name__}"
                )
            out.append(type(template)(arr.reshape(())))
            continue
        shape = tuple(template.shape)
        if arr.shape != shape:
            raise ValueError(
                f"checkpoint.load: {name} has shape {arr.shape} in {reader.path} but {shape} in the template"
            )
        dtype = np.dtype(template.dtype)
        if transfer.is_device_array(template) and len(template.devices()) > 1:  # keep its layout
            out.append(transfer.put_sharded(arr, dtype, template.sharding))
        elif transfer.is_device_array(template):
            device = next(iter(template.devices()))
            out.append(transfer.to_device(arr, dtype, device))
        elif isinstance(template, np.generic):
            out.append(arr.astype(dtype)[()])
        else:
            out.append(arr.astype(dtype, copy=False))
    return rebuild(out)


from kaun_ir.checkpoint.sharded import load_sharded, save_sharded  # noqa: E402 - builds on the above

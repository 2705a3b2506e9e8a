"""Checkpoints of sharded trees (``kn.checkpoint.save_sharded`` / ``load_sharded``).

A sharded checkpoint is a directory::

    path/index.json                       # every array: dotted path, global shape, dtype, pieces
    path/shards-00000-of-00002.safetensors  # the pieces process 0 held
    path/shards-00001-of-00002.safetensors

Each process writes only the pieces its devices hold (one copy of each distinct piece: a
replicated array is written once, by the process of its first device), so no process ever
gathers a whole sharded array. Every piece is named ``"<dotted path>|<start>:<stop>,..."``
inside the SafeTensors files. Loading assembles, for every device of the *target* layout,
exactly the region it needs from the pieces that overlap it, so a checkpoint written on one mesh
loads onto a mesh of another shape (or onto one device).

Atomicity (:class:`kaun_ir.fileio.AtomicDirectory`): ``path`` is a symbolic link to a hidden
sibling directory ``.<name>.<pid>.<token>.dir``. A save writes a new sibling (each file written
atomically), the processes meet at a barrier, process 0 writes ``index.json`` last and renames a
link to the new sibling over ``path`` -- one atomic step -- then removes the old sibling. A death
at any moment leaves ``path`` naming the old complete checkpoint or the new one; siblings left by
killed saves are removed by the next save. Several hosts need ``path`` on a file system that all
of them see. Saving over a regular file, or over a directory that is not a sharded checkpoint,
raises ``FileExistsError`` instead of replacing it.

Loading validates ``index.json`` before reading any piece: its entries have the documented types,
every file it names is inside the directory, and the pieces of every array cover each element
exactly once (no overlap, no gap). A damaged index or piece raises ``CheckpointError`` naming the
file.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from kaun_ir import ptree
from kaun_ir.checkpoint.reader import IndexFile, decoding
from kaun_ir.checkpoint.storable import check_storable
from kaun_ir.errors import CheckpointError
from kaun_ir.fileio import AtomicDirectory, atomic_write, resolve_directory
from kaun_ir.runtime.xla import backend, transfer

INDEX = "index.json"
FORMAT = "kaun_ir-sharded-1"

__all__ = ["save_sharded", "load_sharded"]


def _shard_file(process: int, count: int) -> str:
    return f"shards-{process:05d}-of-{count:05d}.safetensors"


def _key(path: str, index: tuple) -> str:
    return f"{path}|" + ",".join(f"{a}:{b}" for a, b in index)


def _bounds(index: tuple, shape: tuple) -> tuple:
    """``((start, stop), ...)`` of a tuple of slices over ``shape``."""
    return tuple(tuple(int(v) for v in s.indices(n)[:2]) for s, n in zip(index, shape))


def _pieces(array) -> list[tuple[tuple, Any]]:
    """``[(bounds, device)]``: each distinct piece of a global array and the first device holding it."""
    shape = tuple(array.shape)
    seen: dict[tuple, Any] = {}
    for device, index in sorted(array.sharding.devices_indices_map(shape).items(), key=lambda kv: kv[0].id):
        seen.setdefault(_bounds(index, shape), device)
    return list(seen.items())


#: how long a process of a multi-process save waits for the others at each of its steps
SYNC_TIMEOUT_S = 3600.0


def _barrier_token(token: int) -> int:
    """Process 0's ``token``, returned in every process once all processes have reached this
    point (the coordination service's key and barrier)."""
    return backend.sync_from_zero(token, SYNC_TIMEOUT_S, "checkpoint.save_sharded")


def save_sharded(path: str | os.PathLike, tree: Any) -> str:
    """Write ``tree`` (global ``jax.Array``s, possibly sharded over devices of several processes,
    host arrays and Python numbers) as a sharded checkpoint directory at ``path``; every process
    of a distributed run must call it with the same tree structure. Returns ``path``."""
    # imported here: safetensors loads only when a file is read or written
    from safetensors.numpy import save as st_save  # noqa: PLC0415

    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"checkpoint.save_sharded: path must be a str or os.PathLike, got {type(path).__name__}"
        )
    path = os.fspath(path).rstrip(os.sep) or os.sep
    me, count = backend.process_index(), backend.process_count()
    # process 0 names the staging directory: its pid (for the stale check) and a random token
    owner = _barrier_token(os.getpid())
    token = _barrier_token(int(np.random.default_rng().integers(1, 1 << 30)))
    target = AtomicDirectory(path, INDEX, owner=owner, token=f"{token:x}")
    # create first: this save's staging directory (named with process 0's pid, made by whichever
    # process comes first) is then listed as under way here, so the stale sweep keeps it
    staging = target.create()
    if me == 0:
        target.remove_stale()
    try:
        mine, entries = {}, {}
        for key, leaf in ptree.flatten_with_paths(tree):
            if isinstance(leaf, (bool, int, float)):
                entries[key] = {"number": type(leaf).__name__, "value": leaf}
                continue
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                kind = type(leaf).__name__
                raise TypeError(f"checkpoint.save_sharded: leaf {key!r} is a {kind}, not an array")
            check_storable("checkpoint.save_sharded", key, leaf.dtype)
            shape = tuple(int(n) for n in leaf.shape)
            pieces = []
            if transfer.is_device_array(leaf):
                local = {s.device: s for s in leaf.addressable_shards}
                for bounds, device in _pieces(leaf):
                    owner_process = device.process_index
                    pieces.append({"file": _shard_file(owner_process, count), "bounds": bounds})
                    if owner_process == me:
                        mine[_key(key, bounds)] = _contiguous(np.asarray(local[device].data))
            else:
                bounds = tuple((0, n) for n in shape)
                pieces.append({"file": _shard_file(0, count), "bounds": bounds})
                if me == 0:
                    mine[_key(key, bounds)] = _contiguous(np.asarray(leaf))
            entries[key] = {"shape": list(shape), "dtype": np.dtype(leaf.dtype).name, "pieces": pieces}
        atomic_write(os.path.join(staging, _shard_file(me, count)), st_save(mine))
    except BaseException:
        target.abort()
        raise
    _barrier_token(token)  # every process's file is complete
    if me == 0:
        index = {"format": FORMAT, "processes": count, "arrays": entries}
        atomic_write(os.path.join(staging, INDEX), json.dumps(index, indent=1))
        target.commit()
    else:
        target.release()
    _barrier_token(token)  # nobody reads before the directory is in place
    return path


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns a 0-d array into shape [1]
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


class _Pieces:
    """The SafeTensors files of a checkpoint, opened on demand; ``index`` validated the names."""

    def __init__(self, index: IndexFile):
        # imported here: safetensors loads only when a file is read or written
        from safetensors import safe_open  # noqa: PLC0415

        self.index, self._open, self._files = index, safe_open, {}

    def read(self, name: str, key: str, region: tuple) -> np.ndarray:
        path = self.index.file(name, "")
        with decoding(path, "checkpoint.load_sharded", f"piece {key!r}: ", everything=True):
            handle = self._files.get(name)
            if handle is None:
                handle = self._files[name] = self._open(path, framework="np")
            if not region:  # a 0-d array
                data = handle.get_tensor(key)
            else:
                data = handle.get_slice(key)[tuple(slice(a, b) for a, b in region)]
        expected = tuple(b - a for a, b in region)
        if tuple(data.shape) != expected:
            raise CheckpointError(
                f"checkpoint.load_sharded: {path}: piece {key!r} gives shape {tuple(data.shape)} "
                f"for its region {list(region)}, expected {expected}"
            )
        return data


def _read_index(root: str) -> tuple[IndexFile, dict]:
    """The validated index of the checkpoint at ``root``: ``(index file, {key: entry})``, every
    array entry with integer ``shape``, a dtype, and ``pieces`` that name files inside ``root``
    and cover each element of the array exactly once."""
    where = resolve_directory(root, INDEX)  # the directory set aside by a save in progress, if any
    if not os.path.exists(where):
        raise FileNotFoundError(f"checkpoint.load_sharded: no such checkpoint directory {root!r}")
    path = os.path.join(where, INDEX)
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint.load_sharded: {root} is not a sharded checkpoint (no {INDEX})")
    index = IndexFile(path, "checkpoint.load_sharded")
    document = index.check_object()
    if document.get("format") != FORMAT:
        raise index.error(f"format {document.get('format')!r}, expected {FORMAT!r}")
    arrays = index.field(document, "arrays", dict)
    for key, entry in arrays.items():
        _check_entry(index, key, entry)
    return index, arrays


def _check_entry(index: IndexFile, key: str, entry: Any) -> None:
    where = f"arrays[{key!r}]"
    if not isinstance(entry, dict):
        raise index.error(f"entry {where} is not an object")
    if "number" in entry:
        kind = index.field(entry, "number", str, where)
        types = {"bool": (bool,), "int": (int,), "float": (int, float)}.get(kind)
        if types is None:
            raise index.error(f"entry {where}['number'] is {kind!r}, expected 'bool', 'int' or 'float'")
        index.field(entry, "value", types, where)
        return
    shape = index.field(entry, "shape", list, where)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise index.error(f"entry {where}['shape'] is {shape!r}, expected non-negative integers")
    name = index.field(entry, "dtype", str, where)
    try:
        np.dtype(name)
    except TypeError:
        raise index.error(f"entry {where}['dtype'] is {name!r}, not a dtype") from None
    pieces = index.field(entry, "pieces", list, where)
    boxes = []
    for i, piece in enumerate(pieces):
        place = f"{where}['pieces'][{i}]"
        index.file(index.field(piece, "file", str, place), f"{place}['file']")
        bounds = index.field(piece, "bounds", list, place)
        ok = len(bounds) == len(shape) and all(
            isinstance(b, list)
            and len(b) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in b)
            and 0 <= b[0] <= b[1] <= n
            for b, n in zip(bounds, shape)
        )
        if not ok:
            raise index.error(f"entry {place}['bounds'] is {bounds!r}, not a region of shape {shape}")
        boxes.append(tuple(tuple(b) for b in bounds))
    _check_coverage(index, where, tuple(shape), boxes)


def _check_coverage(index: IndexFile, where: str, shape: tuple, boxes: list[tuple]) -> None:
    """The pieces ``boxes`` cover every element of ``shape`` exactly once: no two overlap and
    their sizes add up to the array's (each lies inside it)."""
    volume = [int(np.prod([b - a for a, b in box])) for box in boxes]
    for i, first in enumerate(boxes):
        if volume[i] == 0:
            continue
        for j in range(i + 1, len(boxes)):
            second = boxes[j]
            if volume[j] and all(max(a[0], b[0]) < min(a[1], b[1]) for a, b in zip(first, second)):
                raise index.error(
                    f"entry {where}: pieces {i} {list(map(list, first))} and {j} "
                    f"{list(map(list, second))} overlap"
                )
    if sum(volume) != int(np.prod(shape)):
        raise index.error(
            f"entry {where}: the pieces cover {sum(volume)} of the {int(np.prod(shape))} elements "
            f"of shape {list(shape)} (a gap)"
        )


def _assemble(files: _Pieces, key: str, entry: dict, index: tuple) -> np.ndarray:
    """The region ``index`` (slices) of array ``key``, from every stored piece overlapping it
    (the validated index guarantees that together they cover it exactly once)."""
    shape = tuple(entry["shape"])
    want = _bounds(index, shape)
    out = np.zeros(tuple(b - a for a, b in want), dtype=np.dtype(entry["dtype"]))
    filled = 0
    for piece in entry["pieces"]:
        have = [tuple(b) for b in piece["bounds"]]
        lo = [max(w[0], h[0]) for w, h in zip(want, have)]
        hi = [min(w[1], h[1]) for w, h in zip(want, have)]
        if any(a >= b for a, b in zip(lo, hi)) and shape:
            continue
        region = tuple((a - h[0], b - h[0]) for a, b, h in zip(lo, hi, have))
        target = tuple(slice(a - w[0], b - w[0]) for a, b, w in zip(lo, hi, want))
        out[target] = files.read(piece["file"], _key(key, tuple(have)), region)
        filled += int(np.prod([b - a for a, b in zip(lo, hi)]))
    if filled != out.size:
        raise CheckpointError(f"checkpoint.load_sharded: the pieces of {key!r} do not cover {want}")
    return out


def load_sharded(path: str | os.PathLike, like: Any) -> Any:
    """Read a sharded checkpoint into ``like``'s structure and layouts.

    ``like``: a template tree; a ``jax.Array`` leaf (e.g. of a freshly initialised state on the
    new mesh) gives the shape, dtype and sharding of the result, so the checkpoint may have been
    written on a mesh of another shape; NumPy / ``kn.ShapeDtype`` leaves give host arrays;
    numbers give numbers. Raises ``ValueError`` naming the key when an array is missing or its
    shape differs, and ``CheckpointError`` (a ``ValueError``) naming the file when the index or
    a piece is damaged: not JSON, entries missing or of the wrong type, a file named outside the
    directory, pieces that overlap or leave a gap."""
    root = os.fspath(path)
    index, arrays = _read_index(root)
    files = _Pieces(index)
    _, rebuild = ptree.flatten(like)
    out = []
    for key, template in ptree.flatten_with_paths(like):
        entry = arrays.get(key)
        if entry is None:
            near = ", ".join(sorted(arrays)[:8])
            raise ValueError(f"checkpoint.load_sharded: {root} has no array {key!r} (it has {near}, ...)")
        if "number" in entry:
            out.append(
                type(template)(entry["value"])
                if isinstance(template, (bool, int, float))
                else np.asarray(entry["value"])
            )
            continue
        shape = tuple(entry["shape"])
        if not hasattr(template, "shape") or tuple(template.shape) != shape:
            raise ValueError(
                f"checkpoint.load_sharded: {key!r} has shape {shape} in {root} but "
                f"{tuple(getattr(template, 'shape', ()))} in the template"
            )
        dtype = np.dtype(template.dtype)
        if transfer.is_device_array(template):
            # the defaults bind this entry's values: a callback must not see a later iteration's
            def piece(idx, key=key, entry=entry, dtype=dtype):
                return _assemble(files, key, entry, idx).astype(dtype)

            out.append(transfer.array_from_callback(shape, template.sharding, piece))
        else:
            whole = tuple(slice(0, n) for n in shape)
            out.append(_assemble(files, key, entry, whole).astype(dtype))
    return rebuild(out)

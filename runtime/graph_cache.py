"""The pass pipeline's output kept on disk: a second process skips the passes for a graph it traced.

With the persistent cache on (the default; the directory of :mod:`kaun_ir.runtime.disk_cache`), every
compilation that runs a pass pipeline over a traced graph first looks for the optimised graph
under ``graphs/`` in that directory, and stores it there after running the passes. The XLA cache
then answers the compilation of the (unchanged) StableHLO lowered from it, so a second process
pays only for tracing, a load of each and lowering.

The key is a SHA-256 of everything the passes' result depends on:

- the traced graph itself, in a canonical form (every op, attribute, type, layer path, source
  line and provenance, the values wired by position, regions included; see
  :mod:`kaun_ir.ir.serialize`): a graph that differs in anything misses;
- the pipeline with every option resolved (defaults included);
- the source code of kaun_ir (every ``.py`` file of the ``kaun_ir`` package, ``passes`` and
  ``runtime`` included, and so its version), so an edited or upgraded pass never serves an old
  result;
- the runtime's backend (``layout{target=auto}`` asks for it), the NumPy, jaxlib and Python
  versions (constant folding runs NumPy), the host CPU
  (:func:`kaun_ir.runtime.disk_cache.host_identity`), the parts registered with
  :func:`kaun_ir.runtime.disk_cache.register_key_part` and the format version of this cache.

Entries count towards the cache's size bound (:func:`kaun_ir.runtime.disk_cache.after_store`
runs after each store) and a hit marks its entry as used.

Only pipelines made of kaun_ir's own passes are cached: the code of a pass registered by the user
is not part of the key, so such a pipeline always runs. Entries hold plain data (strings,
numbers, bytes, tuples) read back by an unpickler that refuses every class, so an entry cannot run
code; like the XLA cache's, each entry carries the key it was stored under and a checksum, and the
directory must pass the same trust check (see :mod:`kaun_ir.runtime.disk_cache`). An entry that
cannot be read (truncated, damaged, swapped with another, another format) is removed and the
passes run, with one warning. Writes are atomic (:func:`kaun_ir.fileio.atomic_write`).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import warnings

import numpy as np

from kaun_ir import errors, passes
from kaun_ir.fileio import atomic_write
from kaun_ir.ir.core import Graph
from kaun_ir.ir.serialize import encode, from_bytes, to_bytes
from kaun_ir.passes import Pipeline
from kaun_ir.passes.registry import REGISTRY
from kaun_ir.runtime import disk_cache, stages
from kaun_ir.runtime.xla import backend

#: bumped whenever the entries' layout changes (2: nodes record their provenance; 3: a header
#: with the key and a checksum, :func:`disk_cache.seal`)
_FORMAT = "kaun_ir-graph-cache-3"
SUFFIX = disk_cache.GRAPH_SUFFIX  # so disk_cache.clear() removes these too
_FOLDER = "graphs"


class Counters:
    """How the graph cache answered in this process: ``hits`` (the passes were skipped),
    ``misses`` (the passes ran and their result was stored), ``errors`` (unreadable entries
    removed, or stores that failed), ``bypassed`` (pipelines with passes from outside kaun_ir)."""

    hits = 0
    misses = 0
    errors = 0
    bypassed = 0


counters = Counters()


def run_pipeline(graph: Graph, pipeline, instrumentations=()) -> Graph:
    """``passes.run(graph, pipeline, instrumentations)``, answered from the cache when it is on.

    On a hit the passes do not run, so ``instrumentations`` see nothing; the time of the lookup is
    recorded as the stage ``pass-cache`` (:mod:`kaun_ir.runtime.stages`), and so is the time of
    computing the key and storing the result on a miss."""
    root = disk_cache.trusted_directory()
    if root is None or not _cacheable(pipeline):
        if root is not None:
            counters.bypassed += 1
        return passes.run(graph, pipeline, instrumentations)
    start = time.perf_counter()
    cache_key = key(graph, pipeline)
    path = _entry(root, cache_key)
    loaded = _load(path, cache_key, graph)
    if loaded is not None:
        counters.hits += 1
        stages.add("pass-cache", time.perf_counter() - start, len(loaded.nodes))
        return loaded
    overhead = time.perf_counter() - start
    result = passes.run(graph, pipeline, instrumentations)
    start = time.perf_counter()
    counters.misses += 1
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        data = disk_cache.seal(cache_key, to_bytes(result, _FORMAT))
        atomic_write(path, data)
    except Exception as err:  # a full disk or a read-only directory must not fail a compilation
        counters.errors += 1
        _warn_once(
            "store", f"kaun_ir: could not store an optimised graph in {root} ({type(err).__name__}: {err})"
        )
    else:
        disk_cache.after_store(root, len(data))
    stages.add("pass-cache", overhead + time.perf_counter() - start, None)
    return result


def _cacheable(pipeline) -> bool:
    """Whether every pass of ``pipeline`` is kaun_ir's own (its code is part of the key)."""
    for step in Pipeline.parse(pipeline).steps:
        module = getattr(REGISTRY[step.name].fn, "__module__", "") or ""
        if not module.startswith("kaun_ir."):
            return False
    return True


def key(graph: Graph, pipeline) -> str:
    """The hex key of running ``pipeline`` over ``graph`` with this kaun_ir, backend and NumPy."""
    steps = [(step.name, sorted(step.resolved_options().items())) for step in Pipeline.parse(pipeline).steps]
    digest = hashlib.sha256()
    for part in (
        _FORMAT,
        code_fingerprint(),
        backend.backend_name(),
        np.__version__,
        backend.jaxlib_version(),
        sys.version,
        platform.machine(),
        sys.byteorder,
        disk_cache.host_identity(),
        *disk_cache.key_parts(),
        repr(steps),
    ):
        digest.update(str(part).encode())
        digest.update(b"\0")
    digest.update(repr(encode(graph)).encode())
    return digest.hexdigest()


_CODE: list[str] = []


def code_fingerprint() -> str:
    """A SHA-256 of every ``.py`` file of the installed kaun_ir (computed once per process)."""
    if not _CODE:
        digest = hashlib.sha256()
        # the package folders of kaun_ir (subpackages included), its passes and this runtime
        modules = (errors, passes, sys.modules[__name__])
        roots = sorted({os.path.dirname(os.path.abspath(m.__file__)) for m in modules})
        for root in roots:
            for folder, subfolders, names in os.walk(root):
                subfolders.sort()
                for name in sorted(names):
                    if name.endswith(".py"):
                        path = os.path.join(folder, name)
                        digest.update(os.path.relpath(path, root).encode() + b"\0")
                        with open(path, "rb") as handle:
                            digest.update(handle.read())
                        digest.update(b"\0")
        _CODE.append(digest.hexdigest())
    return _CODE[0]


if disk_cache.directory() is not None:
    # fingerprint the code as it is imported, not as it may be on disk later (edited meanwhile)
    code_fingerprint()


# ----------------------------------------------------------------------- entries on disk


def _entry(root: str, cache_key: str) -> str:
    return os.path.join(root, _FOLDER, cache_key[:2], cache_key + SUFFIX)


def _load(path: str, cache_key: str, traced: Graph) -> Graph | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        counters.errors += 1
        _warn_once("read", f"kaun_ir: cannot read the graph cache entry {path} ({err}); running the passes")
        return None
    try:
        graph = from_bytes(disk_cache.unseal(cache_key, data), _FORMAT)
        # the passes keep the signature; an entry that does not is not the result of this graph
        if graph.input_types != traced.input_types or len(graph.outputs) != len(traced.outputs):
            raise ValueError("signature differs from the traced graph's")
        disk_cache.touch(path)
        return graph
    except Exception as err:
        counters.errors += 1
        _warn_once(
            "corrupt",
            f"kaun_ir: removed an unreadable graph cache entry {path} ({type(err).__name__}); "
            "running the passes",
        )
        try:
            os.unlink(path)
        except OSError:
            pass
        return None


_warned: set[str] = set()


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

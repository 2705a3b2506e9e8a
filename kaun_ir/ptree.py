"""``kn.ptree``: parameter trees — nested dicts and lists with array leaves.

A tree is one of

* a **leaf**: anything that is not a container — a NumPy array, a ``jax.Array``, a symbolic
  :class:`kaun_ir.Tensor` while tracing, a :class:`kaun_ir.ShapeDtype`, or a Python number
  (an optimiser's step counter, say);
* a ``dict`` whose keys are non-empty strings without ``"."`` (the dot separates path segments);
* a ``list`` (a ``tuple`` is accepted too and stays a tuple when rebuilt);
* ``None``, an empty subtree with no leaves.

Every function here only restructures: none of them looks at array values, so they all work
on concrete arrays and inside ``kn.trace`` / ``kn.jit`` / ``kn.grad`` alike. Leaves are visited
depth first, dict entries in sorted key order, list items by position — the same order as
:func:`flatten` and :func:`flatten_with_paths`, and as the inputs of a compiled function.

Paths name a leaf by its dict keys and list indices joined with dots, e.g.
``{"layers": [{"weight": w}]}`` has the single path ``"layers.0.weight"``; a tree that is a
single leaf has the path ``""``.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir import tree as _tree
from kaun_ir.ir.builder import current_builder
from kaun_ir.names import public_dir
from kaun_ir.runtime import compilation
from kaun_ir.surface.creation import zeros_like as traced_zeros_like
from kaun_ir.surface.tensor import Tensor, type_of
from kaun_ir.surface.trace import ShapeDtype

__all__ = [
    "map",
    "map2",
    "fold",
    "iter",
    "flatten",
    "flatten_with_paths",
    "unflatten_from_paths",
    "zeros_like",
    "count_parameters",
    "leaves",
    "structure_equal",
]


# -- validation ----------------------------------------------------------------------------------


def _join(prefix: str, segment: str) -> str:
    return f"{prefix}.{segment}" if prefix else segment


def _where(path: str) -> str:
    return f"at {path!r}" if path else "at the root"


def _check_key(key: Any, prefix: str) -> None:
    if not isinstance(key, str):
        raise TypeError(
            f"ptree: dict keys must be strings, got {key!r} ({type(key).__name__}) {_where(prefix)}"
        )
    if not key:
        raise ValueError(f"ptree: empty dict key {_where(prefix)}")
    if "." in key:
        raise ValueError(
            f"ptree: dict key {key!r} {_where(prefix)} contains '.', which separates "
            "path segments; rename it (for example with '_')"
        )


def _check_treedef(treedef: Any, prefix: str = "") -> None:
    """Validate the dict keys recorded in a tree definition (see ``kaun_ir.tree``)."""
    if treedef == _tree.LEAF:
        return
    kind = treedef[0]
    if kind == "dict":
        for key, child in zip(treedef[1], treedef[2]):
            _check_key(key, prefix)
            _check_treedef(child, _join(prefix, key))
    elif kind in ("list", "tuple"):
        for i, child in enumerate(treedef[1]):
            _check_treedef(child, _join(prefix, str(i)))


def _check_tree(t: Any, prefix: str = "") -> None:
    """Walk a tree (not a treedef) to find a bad key; used when sorting the keys failed."""
    if isinstance(t, dict):
        for key, child in t.items():
            _check_key(key, prefix)
            _check_tree(child, _join(prefix, key))
    elif isinstance(t, (list, tuple)) and not hasattr(t, "_fields"):
        for i, child in enumerate(t):
            _check_tree(child, _join(prefix, str(i)))


def _flatten(t: Any) -> tuple[list, Any]:
    try:
        leaves_, treedef = _tree.flatten(t)
    except TypeError:
        _check_tree(t)  # keys of mixed types cannot be sorted: report the offending key
        raise
    _check_treedef(treedef)
    return leaves_, treedef


# -- structure ---------------------------------------------------------------------------------


def flatten(t: Any) -> tuple[list, Callable[[list], Any]]:
    """``(leaves, rebuild)``: the leaves of ``t`` in order and a function that rebuilds the tree.

    ``rebuild(new_leaves)`` returns a tree of ``t``'s structure with ``new_leaves`` in place of
    the old ones (same order); it raises ``ValueError`` if the number of leaves differs.
    """
    leaves_, treedef = _flatten(t)
    count = len(leaves_)

    def rebuild(new_leaves: Iterable) -> Any:
        new_leaves = list(new_leaves)
        if len(new_leaves) != count:
            raise ValueError(f"ptree.flatten: rebuild expects {count} leaves, got {len(new_leaves)}")
        return _tree.unflatten(treedef, new_leaves)

    return leaves_, rebuild


def leaves(t: Any) -> list:
    """The leaves of ``t`` in flatten order."""
    return _flatten(t)[0]


def flatten_with_paths(t: Any) -> list[tuple[str, Any]]:
    """``[(path, leaf)]`` in flatten order, e.g. ``[("layers.0.bias", b), ("layers.0.weight", w)]``.

    Dict keys and list indices (decimal) are joined with ``"."``; a tree that is a single leaf
    gives ``[("", leaf)]``; ``None`` and empty containers contribute nothing.
    """
    _flatten(t)  # validates the keys
    return _tree.paths(t)


def unflatten_from_paths(items: dict | Iterable[tuple[str, Any]]) -> Any:
    """Rebuild a tree from ``{path: leaf}`` (or ``[(path, leaf)]``) — the inverse of
    :func:`flatten_with_paths` as far as paths allow.

    Paths alone cannot tell a list from a dict or record empty containers, so the rule is: a
    node whose keys are exactly ``"0" .. "n-1"`` becomes a list, any other node a dict. The
    single path ``""`` gives a bare leaf. (``kn.checkpoint`` stores the exact structure in the
    file and does not depend on this rule.) Raises ``ValueError`` if a path is both a leaf and
    a prefix of another path, or appears twice.
    """
    pairs = list(items.items()) if isinstance(items, dict) else list(items)
    if any(path == "" for path, _ in pairs):
        if len(pairs) != 1:
            raise ValueError("ptree.unflatten_from_paths: the root path '' must be the only path")
        return pairs[0][1]
    root: dict = {}
    for path, leaf in pairs:
        segments = path.split(".")
        if not builtins.all(segments):
            raise ValueError(f"ptree.unflatten_from_paths: path {path!r} has an empty segment")
        node = root
        for depth, segment in enumerate(segments[:-1]):
            child = node.setdefault(segment, {})
            if isinstance(child, _Leaf):
                raise ValueError(
                    f"ptree.unflatten_from_paths: {'.'.join(segments[: depth + 1])!r} "
                    f"is a leaf and also a prefix of {path!r}"
                )
            node = child
        last = segments[-1]
        if last in node:
            what = "appears twice" if isinstance(node[last], _Leaf) else "is a leaf and also a prefix"
            raise ValueError(f"ptree.unflatten_from_paths: path {path!r} {what}")
        node[last] = _Leaf(leaf)
    return _lists_and_leaves(root)


class _Leaf:
    """Marks a leaf while the nested dicts are built (a leaf may itself be a dict-like)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _lists_and_leaves(node: Any) -> Any:
    if isinstance(node, _Leaf):
        return node.value
    keys = list(node)
    if keys and sorted(keys, key=lambda k: (len(k), k)) == [str(i) for i in range(len(keys))]:
        return [_lists_and_leaves(node[str(i)]) for i in range(len(keys))]
    return {k: _lists_and_leaves(v) for k, v in node.items()}


def _same_kind(a: Any, b: Any) -> bool:
    """Do two tree definitions have the same structure (lists and tuples count as the same)?"""
    if a == _tree.LEAF or b == _tree.LEAF:
        return a == b
    ka = "list" if a[0] == "tuple" else a[0]
    kb = "list" if b[0] == "tuple" else b[0]
    if ka != kb:
        return False
    if ka == "dict":
        return a[1] == b[1] and all(_same_kind(x, y) for x, y in zip(a[2], b[2]))
    if ka == "list":
        return len(a[1]) == len(b[1]) and all(_same_kind(x, y) for x, y in zip(a[1], b[1]))
    return True


def _describe(treedef: Any) -> str:
    if treedef == _tree.LEAF:
        return "a leaf"
    kind = treedef[0]
    if kind == "dict":
        return f"a dict with keys {list(treedef[1])}"
    if kind in ("list", "tuple"):
        return f"a {kind} of length {len(treedef[1])}"
    return "None"


def _first_difference(a: Any, b: Any, prefix: str = "") -> str:
    """A message naming the first path where two tree definitions differ."""
    if _same_kind(a, b):
        return ""
    if a != _tree.LEAF and b != _tree.LEAF:
        ka = "list" if a[0] == "tuple" else a[0]
        kb = "list" if b[0] == "tuple" else b[0]
        if ka == kb == "dict" and a[1] == b[1]:
            for key, x, y in zip(a[1], a[2], b[2]):
                found = _first_difference(x, y, _join(prefix, key))
                if found:
                    return found
        if ka == kb == "dict":
            only_a = sorted(set(a[1]) - set(b[1]))
            only_b = sorted(set(b[1]) - set(a[1]))
            return f"{_where(prefix)}: keys only in the first tree {only_a}, only in the second {only_b}"
        if ka == kb == "list" and len(a[1]) == len(b[1]):
            for i, (x, y) in enumerate(zip(a[1], b[1])):
                found = _first_difference(x, y, _join(prefix, str(i)))
                if found:
                    return found
    return f"{_where(prefix)}: {_describe(a)} vs {_describe(b)}"


def structure_equal(a: Any, b: Any) -> bool:
    """Whether two trees have the same containers and keys (leaf values are not compared;
    a list and a tuple of the same length count as equal)."""
    return _same_kind(_flatten(a)[1], _flatten(b)[1])


# -- traversals ----------------------------------------------------------------------------------


def map(f: Callable[[Any], Any], t: Any) -> Any:  # noqa: A001 - the API name
    """A tree of ``t``'s structure with ``f(leaf)`` in place of every leaf."""
    leaves_, treedef = _flatten(t)
    return _tree.unflatten(treedef, [f(leaf) for leaf in leaves_])


def map2(f: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """A tree of ``a``'s structure with ``f(leaf_a, leaf_b)`` for each pair of matching leaves.

    ``a`` and ``b`` must have the same structure (dicts with the same keys, lists of the same
    length; a list may pair with a tuple); otherwise ``ValueError`` names the first path where
    they differ.
    """
    leaves_a, def_a = _flatten(a)
    leaves_b, def_b = _flatten(b)
    if def_a != def_b:
        problem = _first_difference(def_a, def_b)
        if problem:
            raise ValueError(f"ptree.map2: the trees have different structures {problem}")
    return _tree.unflatten(def_a, [f(x, y) for x, y in zip(leaves_a, leaves_b)])


def fold(f: Callable[[Any, Any], Any], acc: Any, t: Any) -> Any:
    """``f(...f(f(acc, leaf0), leaf1)..., leafN)`` over the leaves in flatten order."""
    for leaf in _flatten(t)[0]:
        acc = f(acc, leaf)
    return acc


def iter(f: Callable[[Any], Any], t: Any) -> None:  # noqa: A001 - the API name
    """Call ``f(leaf)`` on every leaf in flatten order (for side effects)."""
    for leaf in _flatten(t)[0]:
        f(leaf)


# -- utilities -----------------------------------------------------------------------------------


def _shape(leaf: Any) -> tuple[int, ...]:
    if hasattr(leaf, "shape"):
        return tuple(leaf.shape)
    if isinstance(leaf, (bool, int, float, complex, np.generic)):
        return ()
    raise TypeError(f"ptree: a leaf of type {type(leaf).__name__} has no shape")


def count_parameters(t: Any) -> int:
    """The total number of elements over all leaves (a Python number counts as one)."""
    return builtins.sum(math.prod(_shape(leaf)) for leaf in _flatten(t)[0])


def zeros_like(t: Any) -> Any:
    """A tree of ``t``'s structure with zeros of each leaf's shape and dtype.

    While tracing the zeros are symbolic tensors (constants of the graph). Outside a trace they
    are device arrays (``jax.Array``): on the leaf's own device for a ``jax.Array`` leaf, on the
    default device otherwise; no XLA program is compiled for them.
    """
    if current_builder() is not None:
        return map(traced_zeros_like, t)
    return map(_concrete_zeros, t)


def _concrete_zeros(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        raise TypeError("ptree.zeros_like: a symbolic Tensor outside its trace")
    if isinstance(leaf, ShapeDtype):
        shape, dtype = leaf.shape, leaf.dtype
    else:
        ty = type_of(leaf)
        shape, dtype = ty.shape, ty.dtype
    device = None  # the runtime's default device, unless the leaf lives on one already
    if compilation.is_device_array(leaf):
        device = next(builtins.iter(leaf.devices()))
    return compilation.put(np.zeros(shape, dtype), np.dtype(dtype), device)


__dir__ = public_dir(__all__)

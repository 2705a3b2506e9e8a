"""Flattening of nested dict / list / tuple containers (the internal half of ``kn.ptree``).

A tree definition is a hashable nested tuple, so it can be part of a compile-cache key. Dict
keys are visited in sorted order; ``None`` is an empty subtree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEAF = "*"


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list, Any]:
    """``(leaves, treedef)``: leaves in a fixed order and a hashable description of the structure."""
    leaves: list = []
    treedef = _flatten(tree, leaves, is_leaf)
    return leaves, treedef


def _flatten(tree, leaves, is_leaf):
    if is_leaf is not None and is_leaf(tree):
        leaves.append(tree)
        return LEAF
    if isinstance(tree, dict):
        keys = sorted(tree)
        return ("dict", tuple(keys), tuple(_flatten(tree[k], leaves, is_leaf) for k in keys))
    if isinstance(tree, list):
        return ("list", tuple(_flatten(v, leaves, is_leaf) for v in tree))
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return ("tuple", tuple(_flatten(v, leaves, is_leaf) for v in tree))
    if tree is None:
        return ("none",)
    leaves.append(tree)
    return LEAF


def unflatten(treedef: Any, leaves) -> Any:
    """Inverse of :func:`flatten`."""
    it = iter(leaves)
    result = _build(treedef, it)
    for _ in it:
        raise ValueError("more leaves than the tree definition holds")
    return result


def _build(treedef, it):
    if treedef == LEAF:
        return next(it)
    kind = treedef[0]
    if kind == "dict":
        return {k: _build(d, it) for k, d in zip(treedef[1], treedef[2])}
    if kind == "list":
        return [_build(d, it) for d in treedef[1]]
    if kind == "tuple":
        return tuple(_build(d, it) for d in treedef[1])
    return None


def unflattener(treedef: Any) -> Callable[[Any], Any]:
    """A fast :func:`unflatten` for one fixed ``treedef``: ``f(leaves) -> tree`` where ``leaves`` is
    an indexable sequence. The structure is walked once, here, and turned into one Python
    expression (``{K[0]: o[0], K[1]: (o[1], o[2])}``), so a call costs no recursion and no
    per-node function calls: used on the per-step dispatch path of ``train.step``."""
    keys: list = []
    count = 0

    def expr(d) -> str:
        nonlocal count
        if d == LEAF:
            count += 1
            return f"o[{count - 1}]"
        kind = d[0]
        if kind == "dict":
            items = []
            for key, sub in zip(d[1], d[2]):
                keys.append(key)
                items.append(f"K[{len(keys) - 1}]: {expr(sub)}")
            return "{" + ", ".join(items) + "}"
        if kind == "list":
            return "[" + ", ".join(expr(sub) for sub in d[1]) + "]"
        if kind == "tuple":
            return "(" + "".join(expr(sub) + ", " for sub in d[1]) + ")"
        return "None"

    try:
        body = expr(treedef)
        return eval(f"lambda o: {body}", {"K": tuple(keys)})  # noqa: S307 - built from our own treedef
    except (SyntaxError, RecursionError, MemoryError):  # nesting deeper than Python's parser allows
        return lambda o: unflatten(treedef, o)


def paths(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[str, Any]]:
    """``[(dotted_path, leaf)]`` in flatten order; list indices in decimal, root leaf ``""``."""
    out: list[tuple[str, Any]] = []

    def walk(node, prefix):
        if is_leaf is not None and is_leaf(node):
            out.append((prefix, node))
        elif isinstance(node, dict):
            for k in sorted(node):
                walk(node[k], f"{prefix}.{k}" if prefix else str(k))
        elif isinstance(node, (list, tuple)) and not hasattr(node, "_fields"):
            for i, v in enumerate(node):
                walk(v, f"{prefix}.{i}" if prefix else str(i))
        elif node is not None:
            out.append((prefix, node))

    walk(tree, "")
    return out


def nested(pairs) -> dict:
    """The inverse of :func:`paths` into dicts only: nested dicts from ``(dotted_path, leaf)``
    pairs (or a ``{dotted_path: leaf}`` dict); list positions become the keys ``"0"``, ``"1"``, ...,
    so every leaf keeps its path."""
    root: dict = {}
    for path, leaf in pairs.items() if isinstance(pairs, dict) else pairs:
        node = root
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = leaf
    return root

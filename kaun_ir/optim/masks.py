"""Which parameters a transformation applies to (``adamw(..., mask=)``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from kaun_ir import ptree

__all__ = ["decay_mask"]


def _arity(fn: Callable) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: called with the path only
        return 1
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    return 2 if len(positional) >= 2 else 1


def decay_mask(opt: str, mask: Any) -> Callable[[Any], list]:
    """``leaves(params) -> [bool per leaf, in flatten order]`` for a mask given as None (every
    leaf), a predicate ``mask(path)`` / ``mask(path, param)`` on dotted parameter paths, or a
    tree of bools shaped like the parameters."""
    if mask is None:
        return lambda params: [True] * len(ptree.leaves(params))
    if callable(mask):
        two = _arity(mask) == 2

        def by_predicate(params):
            out = []
            for path, leaf in ptree.flatten_with_paths(params):
                keep = mask(path, leaf) if two else mask(path)
                if not isinstance(keep, bool):
                    raise TypeError(f"optim.{opt}: mask({path!r}) must return a bool, got {keep!r}")
                out.append(keep)
            return out

        return by_predicate

    if not isinstance(mask, dict | list | tuple):
        raise TypeError(
            f"optim.{opt}: mask must be a predicate mask(path) on dotted parameter paths or a tree of "
            f"bools shaped like the parameters, got {type(mask).__name__}"
        )

    def by_tree(params):
        try:
            pairs = ptree.map2(lambda p, m: m, params, mask)
        except ValueError as err:
            raise ValueError(f"optim.{opt}: the mask tree does not match the parameters: {err}") from None
        flags = ptree.leaves(pairs)
        bad = [flag for flag in flags if not isinstance(flag, bool)]
        if bad:
            raise TypeError(f"optim.{opt}: a mask tree holds Python bools, got {bad[0]!r}")
        return flags

    return by_tree

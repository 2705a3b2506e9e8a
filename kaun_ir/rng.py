"""``kn.rng``: the implicit random-key scope (Kaun's ``Rng.run``).

Functions that need randomness but are not handed a key — parameter initialisation above all —
draw keys from the innermost active scope::

    with kn.rng.scope(0):
        vars = kn.layer.init(model)          # every parameter gets its own key

    vars = kn.rng.run(0, lambda: kn.layer.init(model))   # the same, as a function

A scope holds a root key and a counter. :func:`next_key` returns ``fold_in(root, i)`` for
``i = 0, 1, 2, ...`` (``kn.random.fold_in``), so the sequence of keys depends only on the seed:
the same seed gives bit-identical initialisation, shuffling and dropout masks. Scopes nest; the
innermost one is used, and leaving a scope does not disturb the counter of the outer one.

The scope is thread-local and meant for eager code (initialisation, data shuffling). Inside a
compiled function, randomness should come from a key *argument* so that every call gets fresh
numbers without recompiling; a scope may therefore also be opened on a key array, including a
traced one (``with rng.scope(key): ...`` inside ``kn.jit``), in which case the derived keys are
traced values too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kaun_ir.errors import NoScopeError
from kaun_ir.names import public_dir
from kaun_ir.surface import random
from kaun_ir.surface.tensor import type_of

__all__ = ["run", "scope", "next_key", "in_scope", "NoScopeError"]


class _Scope:
    __slots__ = ("root", "count")

    def __init__(self, root):
        self.root = root
        self.count = 0


class _Stack(threading.local):
    def __init__(self):
        self.scopes: list[_Scope] = []


_STACK = _Stack()


def _root_key(seed: Any):
    """The root key of a scope: from an integer seed, or a ``uint32[2]`` key used as it is."""
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"rng.scope: the seed must be an integer or a uint32[2] key, got {seed!r}")
    if isinstance(seed, (int, np.integer)):
        return random.key(int(seed))
    try:
        t = type_of(seed)
    except TypeError:
        t = None
    if t is None or t.shape != (2,) or t.dtype != np.uint32:
        what = t if t is not None else type(seed).__name__
        raise TypeError(f"rng.scope: the seed must be an integer or a uint32[2] key, got {what}")
    return seed


@contextlib.contextmanager
def scope(seed: Any) -> Iterator[None]:
    """A context in which :func:`next_key` draws keys derived from ``seed``.

    ``seed`` is a Python / NumPy integer (the root key is ``kn.random.key(seed)``) or a
    ``uint32[2]`` key (concrete or traced), used as the root directly.
    """
    entry = _Scope(_root_key(seed))
    _STACK.scopes.append(entry)
    try:
        yield
    finally:
        popped = _STACK.scopes.pop()
        assert popped is entry, "rng scopes were exited out of order"


def run(seed: Any, f: Callable[[], Any]) -> Any:
    """``f()`` evaluated inside ``scope(seed)``; returns its result."""
    with scope(seed):
        return f()


def in_scope() -> bool:
    """Whether an rng scope is active in this thread."""
    return bool(_STACK.scopes)


def next_key():
    """The next key of the innermost scope: ``fold_in(root, i)`` for the scope's ``i``-th draw.

    Returns a ``uint32[2]`` array (a ``jax.Array``; a traced Tensor when the scope's root is
    traced). Raises :class:`NoScopeError` outside every scope.
    """
    if not _STACK.scopes:
        raise NoScopeError(
            "no random key available: wrap the call in `with kn.rng.scope(seed):` or "
            "`kn.rng.run(seed, lambda: ...)` (for example around kn.layer.init), or pass a key "
            "explicitly"
        )
    entry = _STACK.scopes[-1]
    index = entry.count
    entry.count += 1
    return random.fold_in(entry.root, index)


__dir__ = public_dir(__all__)

"""Hooks that see each concrete operand before it becomes a ``constant`` node of a trace.

``kn.train`` installs one to find the arrays a loss closure reads (and lift them to inputs),
whatever path the closure reaches them by; ``surface/tensor.py``'s ``to_value`` asks
:func:`replacement` before it embeds a concrete operand.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any


class _ConstantHooks(threading.local):
    def __init__(self):
        self.stack: list = []


_HOOKS = _ConstantHooks()


@contextlib.contextmanager
def constant_hook(hook: Callable[[Any], Any]):
    """While active, every concrete operand about to become a ``constant`` node of a trace is
    first shown to ``hook(x)``; a non-None result (a Tensor) is used in its place. Innermost
    hook wins. ``kn.train`` uses this to find (and lift to inputs) the arrays a loss closure
    reads, whatever path it reaches them by."""
    _HOOKS.stack.append(hook)
    try:
        yield
    finally:
        _HOOKS.stack.pop()


def replacement(x: Any) -> Any:
    """What the innermost active hook puts in place of the concrete operand ``x``; None when no
    hook is active or the hook leaves ``x`` as it is."""
    return _HOOKS.stack[-1](x) if _HOOKS.stack else None

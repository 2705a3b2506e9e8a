"""The op table as the IR core sees it: a mapping from op name to its declaration.

The IR knows ops only by name; their rules (type inference, NumPy reference, VJP, emission) are
declared a layer up, in ``kaun_ir.ops``, which is built on this package. So the parser, the
verifier and the interpreter do not import the table: the composition root (``kaun_ir.wiring``)
installs it here, on first need through :mod:`kaun_ir.hooks` (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kaun_ir import hooks

_TABLE: Mapping[str, Any] | None = None


def install(table: Mapping[str, Any]) -> None:
    """Called by the composition root: the table the IR core looks ops up in."""
    global _TABLE
    _TABLE = table


def table() -> Mapping[str, Any]:
    """The installed op table (``kaun_ir.ops.TABLE``)."""
    if _TABLE is None:
        hooks.ensure_installed()
    return _TABLE

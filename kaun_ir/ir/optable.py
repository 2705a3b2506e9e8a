"""The op table as the IR core sees it: a mapping from op name to its declaration.

The IR knows ops only by name; their rules (type inference, NumPy reference, VJP, emission) are
declared a layer up, in ``kaun_ir.ops``, which is built on this package. So the parser, the
verifier and the interpreter do not import the table: ``kaun_ir.ops`` installs it here when it is
imported, which ``import kaun_ir`` always does (see docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TABLE: Mapping[str, Any] | None = None


def install(table: Mapping[str, Any]) -> None:
    """Called by ``kaun_ir.ops`` on import: the table the IR core looks ops up in."""
    global _TABLE
    _TABLE = table


def table() -> Mapping[str, Any]:
    """The installed op table (``kaun_ir.ops.TABLE``)."""
    if _TABLE is None:
        from kaun_ir import wiring  # noqa: PLC0415 - the composition root, on first need

        wiring.install()
    return _TABLE

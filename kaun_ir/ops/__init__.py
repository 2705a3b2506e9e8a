"""The op table: every primitive of the IR, declared once (see ``base.OpDef``).

``TABLE`` maps op name -> ``OpDef``. It is assembled here, explicitly, from the lists that the
family modules export; nothing registers itself as an import side effect.
"""

from __future__ import annotations

from kaun_ir.ops import (
    control,
    custom,
    elementwise,
    indexing,
    linalg,
    misc,
    reduce,
    scan,
    shape,
    sharding,
    sort,
    window,
)
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import Emitter

_FAMILIES = (
    elementwise,
    misc,
    shape,
    indexing,
    linalg,
    reduce,
    sort,
    window,
    control,
    sharding,
    scan,
    custom,
)

TABLE: dict[str, OpDef] = {}
for _family in _FAMILIES:
    for _op in _family.OPS:
        if _op.name in TABLE:
            raise RuntimeError(f"op {_op.name!r} is declared twice")
        TABLE[_op.name] = _op


def get(name: str) -> OpDef:
    """The declaration of op ``name``; KeyError naming the known ops otherwise."""
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(TABLE))}") from None


__all__ = ["TABLE", "OpDef", "Sample", "Emitter", "get"]

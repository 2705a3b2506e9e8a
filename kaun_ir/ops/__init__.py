"""The op table: every primitive of the IR, declared once (see ``base.OpDef``).

``TABLE`` maps op name -> ``OpDef``. It is assembled here, explicitly, from the lists that the
family modules export; nothing registers itself as an import side effect.
"""

from __future__ import annotations

from kaun_ir.names import public_dir
from kaun_ir.ops import (
    binary,
    bits,
    compare_select,
    control,
    conv,
    convert,
    custom,
    dynamic_slice,
    gather,
    linalg,
    misc,
    reduce,
    reduce_window,
    scan,
    scatter,
    scatter_add,
    select_and_scatter_add,
    shape,
    sharding,
    slicing,
    sort,
    triangular,
    unary,
)
from kaun_ir.ops.base import TRAITS, OpDef, Sample
from kaun_ir.ops.emit import Emitter

_FAMILIES = (
    unary,
    bits,
    binary,
    compare_select,
    convert,
    misc,
    shape,
    slicing,
    dynamic_slice,
    gather,
    scatter_add,
    scatter,
    linalg,
    triangular,
    conv,
    reduce,
    sort,
    reduce_window,
    select_and_scatter_add,
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

#: the ops declared here (``kn.primitives.register`` adds user primitives to ``TABLE`` later)
BUILTIN = frozenset(TABLE)


def get(name: str) -> OpDef:
    """The declaration of op ``name``; KeyError naming the known ops otherwise."""
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(TABLE))}") from None


def with_trait(trait: str) -> frozenset[str]:
    """The names of the ops in the table that declare ``trait`` (a name from ``TRAITS``), for
    passes that act on a kind of op rather than on a list of names."""
    if trait not in TRAITS:
        raise ValueError(f"unknown trait {trait!r} (known: {', '.join(TRAITS)})")
    return frozenset(name for name, op in TABLE.items() if op.has(trait))


__all__ = ["BUILTIN", "TABLE", "TRAITS", "OpDef", "Sample", "Emitter", "get", "with_trait"]

__dir__ = public_dir(__all__)

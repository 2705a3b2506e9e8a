"""Why a ``kn.jit`` function traced again: ``KAUN_IR_EXPLAIN_RECOMPILES=1`` logs it.

A new signature means a new trace and an XLA compilation. When the switch is on, each trace
after the first logs (logger ``kaun_ir.jit``, level WARNING) which argument changed against the
closest earlier signature: its tree structure, its shape, its dtype or its static value.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kaun_ir import tree

LOGGER = logging.getLogger("kaun_ir.jit")
ENV = "KAUN_IR_EXPLAIN_RECOMPILES"


def enabled() -> bool:
    """True when ``$KAUN_IR_EXPLAIN_RECOMPILES`` is set to something other than ``""``/``0``."""
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def leaf_names(args: tuple, kwargs: dict) -> list[str]:
    """A readable name per flat leaf of ``(args, kwargs)``: ``args[1].w``, ``lr``."""
    names = []
    for path, _ in tree.paths((args, kwargs)):
        head, _, rest = path.partition(".")
        index, _, sub = rest.partition(".")
        base = f"args[{index}]" if head == "0" else index
        names.append(f"{base}.{sub}" if sub else base)
    return names


def _is_static(item: Any) -> bool:
    """A static argument's key: ``("static", type, value, sign of a float or None)`` (runtime/jit.py)."""
    return isinstance(item, tuple) and len(item) == 4 and item[0] == "static"


def _describe(item: Any) -> str:
    if _is_static(item):
        return f"static {item[1].__name__} {item[2]!r}"
    if isinstance(item, tuple) and len(item) == 2:
        shape, dtype = item
        return f"{getattr(dtype, 'name', dtype)}[{','.join(map(str, shape))}]"
    return str(item)


def _difference(old: tuple, new: tuple, names: list[str]) -> list[str]:
    changes = []
    for name, a, b in zip(names, old[1:], new[1:]):
        if a == b:
            continue
        if _is_static(a) or _is_static(b):
            what = "static value"
        elif isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2:
            what = {(True, False): "shape", (False, True): "dtype"}.get(
                (a[0] != b[0], a[1] != b[1]), "shape and dtype"
            )
        else:
            what = "type"
        changes.append(f"{name}: {what} {_describe(a)} -> {_describe(b)}")
    return changes


def explain(fn_name: str, trace_number: int, previous: list[tuple], key: tuple, args, kwargs) -> str:
    """The log line for the ``trace_number``-th trace of ``fn_name`` under signature ``key``."""
    head = f"kn.jit({fn_name}): trace #{trace_number}"
    if not previous:
        return f"{head}: first call"
    names = leaf_names(args, kwargs)
    same_tree = [old for old in previous if old[0] == key[0]]
    if not same_tree:
        return (
            f"{head}: the argument tree changed (was {_tree_text(previous[-1][0])}, now {_tree_text(key[0])})"
        )
    # the closest earlier signature; the most recent one among equals
    best = min((_difference(old, key, names) for old in reversed(same_tree)), key=len)
    return f"{head}: " + "; ".join(best)


def _structure(treedef: Any) -> str:
    if treedef == tree.LEAF:
        return "*"
    kind = treedef[0]
    if kind == "dict":
        return "{" + ", ".join(f"{k}: {_structure(d)}" for k, d in zip(treedef[1], treedef[2])) + "}"
    if kind == "list":
        return "[" + ", ".join(_structure(d) for d in treedef[1]) + "]"
    if kind == "tuple":
        return "(" + ", ".join(_structure(d) for d in treedef[1]) + ")"
    return "None"


def _tree_text(treedef: Any) -> str:
    try:
        args, kwargs = treedef[1]
        text = f"args {_structure(args)}, kwargs {_structure(kwargs)}"
    except (TypeError, ValueError, IndexError, RecursionError):
        text = str(treedef)
    return text if len(text) <= 200 else text[:197] + "..."


def log(fn_name: str, trace_number: int, previous: list[tuple], key: tuple, args, kwargs) -> None:
    """Log why this trace happened, when ``$KAUN_IR_EXPLAIN_RECOMPILES`` asks for it."""
    if enabled():
        LOGGER.warning("%s", explain(fn_name, trace_number, previous, key, args, kwargs))

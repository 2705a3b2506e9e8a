"""The backend the passes choose for when an option says ``auto`` (``layout{target=auto}``).

A pass is ``Graph -> Graph`` and does not know where its result will run; the runtime does. So
the runtime installs the function that answers (:func:`set_backend_query`, done when
``kaun_ir.runtime`` is imported, which ``import kaun_ir`` does), and the passes never import the
runtime (the layer order of docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir import hooks

_query: Callable[[], str] | None = None


def set_backend_query(query: Callable[[], str]) -> None:
    """Install ``query``: called with no arguments, it names the backend in use (cpu/gpu/tpu)."""
    global _query
    _query = query


def backend() -> str:
    """The backend a pass with ``target=auto`` optimises for (asked at each call)."""
    if _query is None:
        hooks.ensure_installed()
    return _query()

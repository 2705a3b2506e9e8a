"""The pass registry: passes are functions ``Graph -> Graph`` registered by kebab-case name.

A pass may declare options::

    @register("unroll", options={"factor": (int, 4, "how many iterations to unroll")})
    def unroll(graph, factor):
        ...

``options`` maps an option name (a snake_case Python identifier, spelled the same way in pipeline
strings: ``unroll{factor=8}``) to ``(type, default, help)`` with type one of bool, int, float,
str. The pass is always called as ``fn(graph, **options)`` with every declared option filled in
(defaults for those the pipeline does not set). Passes without options are called as ``fn(graph)``.

A pass may report counters (``"rewrites applied"``, ...) with :func:`statistic`; they show up in
``kaun-ir opt --stats`` and in :class:`kaun_ir.passes.instrumentation.Statistics`. Outside a pass
manager run with statistics enabled, :func:`statistic` does nothing.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.ir.core import Graph

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
OPTION_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class PassOption:
    """One declared option of a pass: its name, type (bool/int/float/str), default and help."""

    name: str
    type: type
    default: Any
    help: str = ""

    def convert(self, text: str, pass_name: str) -> Any:
        """Parse the pipeline spelling ``text`` into a value of this option's type."""
        problem = f"option {self.name!r} of pass {pass_name!r} expects {self.type.__name__}, got {text!r}"
        if self.type is bool:
            if text in ("true", "1"):
                return True
            if text in ("false", "0"):
                return False
            raise ValueError(problem + " (use true or false)")
        if self.type is int:
            for base in (10, 0):  # decimal (leading zeros allowed), then 0x / 0o / 0b prefixes
                try:
                    return int(text, base)
                except ValueError:
                    pass
            raise ValueError(problem)
        if self.type is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(problem) from None
        return text

    def spell(self, value: Any) -> str:
        """The pipeline spelling of ``value`` (inverse of :meth:`convert`)."""
        if self.type is bool:
            return "true" if value else "false"
        return repr(value) if self.type is float else str(value)


@dataclass(frozen=True)
class PassInfo:
    """A registered pass: its name, the function, a one-line description and declared options."""

    name: str
    fn: Callable[..., Graph]
    description: str
    options: dict[str, PassOption] = field(default_factory=dict)

    def call(self, graph: Graph, options: dict[str, Any] | None = None) -> Graph:
        """Run the pass with ``options`` (validated values) and defaults for the rest."""
        values = {name: opt.default for name, opt in self.options.items()}
        values.update(options or {})
        return self.fn(graph, **values)


REGISTRY: dict[str, PassInfo] = {}


def _check_options(name: str, options: dict | None) -> dict[str, PassOption]:
    declared: dict[str, PassOption] = {}
    for opt_name, spec in (options or {}).items():
        where = f"option {opt_name!r} of pass {name!r}"
        if not isinstance(opt_name, str) or not _OPTION_NAME.match(opt_name):
            raise ValueError(f"{where}: option names must be snake_case identifiers")
        if not (isinstance(spec, tuple) and len(spec) == 3):
            raise ValueError(f"{where}: expected (type, default, help), got {spec!r}")
        kind, default, help_text = spec
        if kind not in OPTION_TYPES:
            raise ValueError(f"{where}: type must be one of bool, int, float, str, got {kind!r}")
        if kind is float and type(default) is int:
            default = float(default)
        if type(default) is not kind:
            raise ValueError(f"{where}: default {default!r} is not a {kind.__name__}")
        declared[opt_name] = PassOption(opt_name, kind, default, help_text)
    return declared


def register(name: str, description: str | None = None, options: dict | None = None):
    """Decorator: ``@register("my-pass")`` on a function ``Graph -> Graph``.

    ``options``: ``{option_name: (type, default, help)}`` with type in bool/int/float/str; the
    function is then called as ``fn(graph, **options)`` with every option filled in. The
    description defaults to the first line of the function's docstring. Re-registering a name
    replaces the earlier pass (handy in notebooks).
    """
    if not _NAME.match(name):
        raise ValueError(f"pass name {name!r} must be kebab-case (lowercase words joined by '-')")
    declared = _check_options(name, options)

    def wrap(fn: Callable[..., Graph]) -> Callable[..., Graph]:
        doc = description or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        REGISTRY[name] = PassInfo(name, fn, doc, declared)
        return fn

    return wrap


def available() -> dict[str, str]:
    """Registered pass names mapped to their one-line descriptions."""
    return {name: info.description for name, info in sorted(REGISTRY.items())}


# --- statistics reported by passes ----------------------------------------------------------------

# The counters of the pass now running, or None when nobody collects them.
_COUNTERS: contextvars.ContextVar[dict[str, int | float] | None] = contextvars.ContextVar(
    "kaun_ir_pass_counters", default=None
)


def statistic(name: str, amount: int | float = 1) -> None:
    """Add ``amount`` to the counter ``name`` of the pass now running (e.g. "rewrites applied").

    Collected per pass by the pass manager when statistics are on (``kaun-ir opt --stats``);
    a no-op otherwise, so passes may call it unconditionally.
    """
    counters = _COUNTERS.get()
    if counters is not None:
        counters[name] = counters.get(name, 0) + amount


def collecting(counters: dict | None):
    """Make ``statistic`` add into ``counters`` (None: drop them); returns the token to reset."""
    return _COUNTERS.set(counters)


def stop_collecting(token) -> None:
    """Stop collecting the pass counters started with the ``token`` that ``start_collecting`` returned."""
    _COUNTERS.reset(token)

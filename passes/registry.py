"""The pass registry: passes are functions ``Graph -> Graph`` registered by kebab-case name.

A pass may declare typed options::

    @register("unroll", options={"factor": Option(int, 4, "how many iterations to unroll", min=1)})
    def unroll(graph, factor):
        ...

``options`` maps an option name (a snake_case Python identifier, spelled the same way in pipeline
strings: ``unroll{factor=8}``) to an :class:`Option`: a type (bool, int, float or str), a default,
a one-line help and, where they apply, bounds (``min`` / ``max``, inclusive) or the allowed
``choices``. A plain ``(type, default, help)`` tuple declares an option without bounds. Every
value is checked when the pipeline is parsed, so ``unroll{factor=0}`` is an option error naming
the pass, the option, the value and what is allowed, never a crash inside the pass. The pass is
always called as ``fn(graph, **options)`` with every declared option filled in (defaults for
those the pipeline does not set). Passes without options are called as ``fn(graph)``.

A pass may report counters (``"rewrites applied"``, ...) with :func:`statistic`; they show up in
``kaun-ir opt --stats`` and in :class:`kaun_ir.passes.instrumentation.Statistics`. Outside a pass
manager run with statistics enabled, :func:`statistic` does nothing.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.errors import PassOptionError
from kaun_ir.ir.core import Graph

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
OPTION_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class PassOption:
    """One declared option of a pass: its name, type (bool/int/float/str), default, help and the
    values it allows (``min`` / ``max`` inclusive, or ``choices``)."""

    name: str
    type: type
    default: Any
    help: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple[str, ...] | None = None

    def allowed(self) -> str:
        """What the option accepts, in words: ``"int >= 0"``, ``"one of auto, nchw"``, ``"bool"``."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        if self.min is not None and self.max is not None:
            return f"{self.type.__name__} in [{self.spell(self.min)}, {self.spell(self.max)}]"
        if self.min is not None:
            return f"{self.type.__name__} >= {self.spell(self.min)}"
        if self.max is not None:
            return f"{self.type.__name__} <= {self.spell(self.max)}"
        return self.type.__name__

    def check(self, value: Any, pass_name: str) -> Any:
        """``value`` when it is of the option's type and within what it allows, else ValueError
        naming the pass, the option, the value and what is allowed."""
        kind = self.type
        if not (type(value) is kind or (kind is float and type(value) is int)):
            raise PassOptionError(
                f"option {self.name!r} of pass {pass_name!r} expects {self.type.__name__}, got {value!r}"
            )
        if (
            (self.choices is not None and value not in self.choices)
            or (self.min is not None and value < self.min)
            or (self.max is not None and value > self.max)
            or (kind is float and value != value)
        ):
            allowed, got = self.allowed(), self.spell(value)
            raise PassOptionError(f"option {self.name!r} of pass {pass_name!r} must be {allowed}, got {got}")
        return float(value) if kind is float else value

    def convert(self, text: str, pass_name: str) -> Any:
        """Parse the pipeline spelling ``text`` into a value of this option's type."""
        problem = f"option {self.name!r} of pass {pass_name!r} expects {self.type.__name__}, got {text!r}"
        fail = PassOptionError
        if self.type is bool:
            if text in ("true", "1"):
                return True
            if text in ("false", "0"):
                return False
            raise fail(problem + " (use true or false)")
        if self.type is int:
            for base in (10, 0):  # decimal (leading zeros allowed), then 0x / 0o / 0b prefixes
                try:
                    value = int(text, base)
                except ValueError:
                    continue
                return self.check(value, pass_name)
            raise fail(problem)
        if self.type is float:
            try:
                value = float(text)
            except ValueError:
                raise fail(problem) from None
            return self.check(value, pass_name)
        return self.check(text, pass_name)

    def spell(self, value: Any) -> str:
        """The pipeline spelling of ``value`` (inverse of :meth:`convert`)."""
        if self.type is bool:
            return "true" if value else "false"
        return repr(value) if self.type is float else str(value)


def Option(
    type: type,
    default: Any,
    help: str = "",
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> PassOption:
    """The declaration of one pass option, ``Option(int, 4, "help", min=1)``: a
    :class:`PassOption` whose name :func:`register` fills in from its key.

    ``type``: bool, int, float or str; ``default``: a value of that type within the bounds;
    ``min`` / ``max``: inclusive bounds of an int or float option (None: unbounded);
    ``choices``: the values a str option may take (None: any string).
    """
    return PassOption("", type, default, help, min, max, None if choices is None else tuple(choices))


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
        for name, value in (options or {}).items():
            if name not in self.options:
                raise PassOptionError(f"pass {self.name!r} has no option {name!r}")
            values[name] = self.options[name].check(value, self.name)
        return self.fn(graph, **values)


REGISTRY: dict[str, PassInfo] = {}


def _check_options(name: str, options: dict | None) -> dict[str, PassOption]:
    declared: dict[str, PassOption] = {}
    for opt_name, spec in (options or {}).items():
        where = f"option {opt_name!r} of pass {name!r}"
        if not isinstance(opt_name, str) or not _OPTION_NAME.match(opt_name):
            raise ValueError(f"{where}: option names must be snake_case identifiers")
        if not isinstance(spec, PassOption):
            if not (isinstance(spec, tuple) and len(spec) == 3):
                raise ValueError(f"{where}: expected Option(type, default, help, ...), got {spec!r}")
            spec = Option(*spec)
        if spec.type not in OPTION_TYPES:
            raise ValueError(f"{where}: type must be one of bool, int, float, str, got {spec.type!r}")
        if (spec.min is not None or spec.max is not None) and spec.type not in (int, float):
            raise ValueError(f"{where}: min= / max= bound int and float options only")
        if spec.choices is not None and spec.type is not str:
            raise ValueError(f"{where}: choices= lists the values of a str option")
        if not (type(spec.default) is spec.type or (spec.type is float and type(spec.default) is int)):
            raise ValueError(f"{where}: default {spec.default!r} is not a {spec.type.__name__}")
        option = dataclasses.replace(spec, name=opt_name)
        try:
            option = dataclasses.replace(option, default=option.check(spec.default, name))
        except ValueError as err:
            raise ValueError(f"{where}: default {spec.default!r} is not allowed: {err}") from None
        declared[opt_name] = option
    return declared


def register(name: str, description: str | None = None, options: dict | None = None):
    """Decorator: ``@register("my-pass")`` on a function ``Graph -> Graph``.

    ``options``: ``{option_name: Option(type, default, help, min=, max=, choices=)}`` (or a
    ``(type, default, help)`` tuple) with type in bool/int/float/str; the function is then called
    as ``fn(graph, **options)`` with every option filled in, each value checked first. The
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

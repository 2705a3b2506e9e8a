"""The pass registry: passes are functions ``Graph -> Graph`` registered by kebab-case name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from kaun_ir.ir.core import Graph

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class PassInfo:
    """A registered pass: its name, the function and a one-line description."""

    name: str
    fn: Callable[[Graph], Graph]
    description: str


REGISTRY: dict[str, PassInfo] = {}


def register(name: str, description: str | None = None):
    """Decorator: ``@register("my-pass")`` on a function ``Graph -> Graph``.

    The description defaults to the first line of the function's docstring. Re-registering a
    name replaces the earlier pass (handy in notebooks).
    """
    if not _NAME.match(name):
        raise ValueError(f"pass name {name!r} must be kebab-case (lowercase words joined by '-')")

    def wrap(fn: Callable[[Graph], Graph]) -> Callable[[Graph], Graph]:
        doc = description or (fn.__doc__ or "").strip().splitlines()[0] if (description or fn.__doc__) else ""
        REGISTRY[name] = PassInfo(name, fn, doc)
        return fn

    return wrap


def available() -> dict[str, str]:
    """Registered pass names mapped to their one-line descriptions."""
    return {name: info.description for name, info in sorted(REGISTRY.items())}


def parse_pipeline(pipeline: str) -> list[str]:
    """``"cse, dce"`` -> ``["cse", "dce"]``; unknown names raise ValueError listing the known ones."""
    names = [part.strip() for part in pipeline.split(",") if part.strip()]
    for name in names:
        if name not in REGISTRY:
            raise ValueError(f"unknown pass {name!r}; available: {', '.join(sorted(REGISTRY))}")
    return names


def run(graph: Graph, pipeline: str) -> Graph:
    """Run the comma-separated pipeline of registered passes; the input graph is not modified."""
    for name in parse_pipeline(pipeline):
        graph = REGISTRY[name].fn(graph)
    return graph

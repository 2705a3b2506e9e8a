"""docs/ocannl.md ("Coming from OCANNL") and the README's section of the same name run as
written: every python block, in order, in one namespace (the blocks assert against NumPy/JAX)."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ocannl.md")
README = os.path.join(ROOT, "README.md")
HEADING = "## Coming from OCANNL"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(path: str, start: int = 0, stop: int | None = None) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return BLOCK.findall(text[start:stop])


def _readme_section() -> list[str]:
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(HEADING)
    following = text.find("\n## ", start + len(HEADING))
    return _blocks(README, start, following if following >= 0 else None)


def _run(blocks: list[str], origin: str) -> dict:
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{origin} block {i + 1}", "exec"), namespace)
    return namespace


def test_every_block_of_the_ocannl_page_runs():
    blocks = _blocks(DOC)
    assert len(blocks) >= 8
    _run(blocks, DOC)


def test_the_readme_section_runs():
    blocks = _readme_section()
    assert blocks, f"no python block under {HEADING!r}"
    _run(blocks, README)

"""The ```python examples of the feature pages in docs/ run as written, in order, one namespace per page."""

from __future__ import annotations

import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
PAGES = [
    "loops.md",
    "debugging.md",
    "interop.md",
    "memory.md",
    "passes.md",
    "errors.md",
    "performance.md",
]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples(page: str) -> list[str]:
    with open(os.path.join(DOCS, page), encoding="utf-8") as handle:
        return _BLOCK.findall(handle.read())


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = examples(page)
    assert blocks, f"docs/{page} has no python examples"
    namespace: dict = {"__name__": f"__docs_{page}__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"docs/{page} example {k + 1}", "exec"), namespace)

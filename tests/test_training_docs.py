"""Every ```python block of docs/training.md runs, in order, in one namespace."""

from __future__ import annotations

import os
import re

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "training.md")


def _blocks() -> list[str]:
    with open(DOC, encoding="utf-8") as handle:
        return re.findall(r"^```python\n(.*?)^```", handle.read(), re.S | re.M)


def test_docs_examples_run(capsys):
    blocks = _blocks()
    assert len(blocks) >= 12
    namespace: dict = {"__name__": "__training_docs__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"{DOC}:block{k}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "sequential(" in out and "total" in out  # the repr and the summary were printed

"""Every public spelling keeps working: ``kn.NAME``, ``kn.checkpoint.save``, ``kn.sharding.mesh`` ...

``tests/public_names.txt`` lists the spellings that existed before the package's folders became
its layers (and the ones the docs use); each must still resolve, in a fresh process (``kn.*``
loads lazily, so a name that only resolves after another import would pass unnoticed here).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

NAMES = pathlib.Path(__file__).with_name("public_names.txt")

_CHECK = """
import functools, sys
import kaun_ir as kn
missing = []
for line in sys.stdin.read().split():
    try:
        functools.reduce(getattr, line.split(".")[1:], kn)
    except AttributeError as err:
        missing.append(f"{line}: {err}")
print("\\n".join(missing))
"""


def _spellings() -> list[str]:
    lines = NAMES.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_the_list_is_large_and_unique():
    names = _spellings()
    assert len(names) > 500 and len(names) == len(set(names))
    assert all(name.startswith("kn.") for name in names)


def test_every_public_spelling_resolves_in_a_fresh_process():
    result = subprocess.run(
        [sys.executable, "-c", _CHECK],
        input="\n".join(_spellings()),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", "spellings that no longer resolve:\n" + result.stdout

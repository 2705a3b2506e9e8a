"""Files of at most 400 lines and functions of at most 80 lines in the package's source
(``kaun_ir/``, ``passes/``, ``runtime/``, ``tools/``), with a short list of exceptions.

The exceptions are ``tests/size_exceptions.txt``: one line per file or function,
``path[:qualified.function]  allowed-lines  reason``. A file or function over the limit and not
listed fails, so does one that grew past its allowed size, and so does a stale entry (its code
is gone or back within the limit), so the list only shrinks. A function's size runs from its
``def`` line to its last line (decorators not counted); a nested function counts towards its
parent as well as on its own.
"""

from __future__ import annotations

import ast
import pathlib
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("kaun_ir", "passes", "runtime", "tools")
EXCEPTIONS = pathlib.Path(__file__).resolve().parent / "size_exceptions.txt"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80

HOW_TO_FIX = (
    "Split a long file by concern into modules whose names say what they hold (see how "
    "runtime/interop/torch_ops.py is assembled from torch_elementwise.py, torch_shapes.py ...), "
    "and a long function into named steps. Only where a split would read worse (one dispatch "
    "table, one state machine) add a line 'path[:function]  allowed-lines  reason' to "
    f"tests/{EXCEPTIONS.name}."
)


class Entry(NamedTuple):
    target: str  # "path" or "path:qualified.function"
    allowed: int
    reason: str
    line: int


def source_files() -> list[pathlib.Path]:
    """Every Python file of the package's source folders."""
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def function_sizes(tree: ast.AST) -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in a module's tree."""
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                sizes[name] = max(sizes.get(name, 0), child.end_lineno - child.lineno + 1)
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return sizes


def measure() -> dict[str, int]:
    """``{target: lines}`` of every file and every function of the package's source."""
    sizes: dict[str, int] = {}
    for path in source_files():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        sizes[rel] = len(text.splitlines())
        for name, lines in function_sizes(ast.parse(text, filename=rel)).items():
            sizes[f"{rel}:{name}"] = lines
    return sizes


def limit(target: str) -> int:
    return MAX_FUNCTION_LINES if ":" in target else MAX_FILE_LINES


def read_exceptions(text: str) -> tuple[dict[str, Entry], list[str]]:
    """The entries of an exceptions file, and the problems of its malformed lines."""
    entries: dict[str, Entry] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        where = f"{EXCEPTIONS.name}:{number}"
        if len(parts) < 3 or not parts[1].isdigit():
            problems.append(f"{where}: expected 'path[:function]  allowed-lines  reason', got {raw!r}")
            continue
        target, allowed, reason = parts
        if target in entries:
            problems.append(f"{where}: {target} is listed twice")
            continue
        entries[target] = Entry(target, int(allowed), reason, number)
    return entries, problems


def check(sizes: dict[str, int], entries: dict[str, Entry]) -> list[str]:
    """Every way ``sizes`` and the exceptions disagree with the limits, one message each."""
    problems = []
    for target, lines in sorted(sizes.items()):
        entry = entries.get(target)
        kind = "function" if ":" in target else "file"
        if entry is None and lines > limit(target):
            problems.append(f"{target}: the {kind} has {lines} lines, over the limit of {limit(target)}")
        elif entry is not None and lines > entry.allowed:
            problems.append(
                f"{target}: the {kind} has {lines} lines, more than the {entry.allowed} its exception "
                f"allows ({EXCEPTIONS.name}:{entry.line}, {entry.reason!r})"
            )
    for target, entry in sorted(entries.items()):
        where = f"{EXCEPTIONS.name}:{entry.line}"
        if target not in sizes:
            problems.append(f"{where}: stale entry: {target} does not exist any more; remove the line")
        elif sizes[target] <= limit(target):
            problems.append(
                f"{where}: stale entry: {target} has {sizes[target]} lines, within the limit of "
                f"{limit(target)}; remove the line"
            )
    return problems


def test_files_and_functions_are_within_the_limits():
    entries, problems = read_exceptions(EXCEPTIONS.read_text(encoding="utf-8"))
    problems += check(measure(), entries)
    assert not problems, "\n".join(problems) + "\n\n" + HOW_TO_FIX


def test_the_check_catches_each_kind_of_problem():
    """The gate itself on made-up sizes: it must be able to fail."""
    text = (
        "# comment\n"
        "a.py  500  one table\n"
        "b.py:f  90  a state machine\n"
        "c.py  450  split since\n"
        "gone.py  450  deleted\n"
        "bad line\n"
        "a.py  600  twice\n"
    )
    entries, malformed = read_exceptions(text)
    assert len(malformed) == 2 and "bad line" in malformed[0] and "twice" in malformed[1]
    sizes = {"a.py": 520, "b.py": 100, "b.py:f": 85, "c.py": 300, "d.py": 401, "d.py:g": 81, "e.py:h": 80}
    problems = check(sizes, entries)
    assert len(problems) == 5, problems
    joined = "\n".join(problems)
    assert "a.py: the file has 520 lines, more than the 500" in joined  # grew past its allowance
    assert "d.py: the file has 401 lines, over the limit of 400" in joined
    assert "d.py:g: the function has 81 lines, over the limit of 80" in joined
    assert "stale entry: c.py has 300 lines" in joined
    assert "stale entry: gone.py does not exist" in joined
    assert "b.py:f" not in joined and "e.py:h" not in joined  # within its allowance / the limit


def test_function_sizes_name_methods_and_nested_functions():
    tree = ast.parse("class A:\n    def m(self):\n        def inner():\n            pass\n        return 1\n")
    assert function_sizes(tree) == {"A.m": 4, "A.m.inner": 2}

"""FileCheck-style pass tests: every ``tests/kir/*.kir`` file runs through the real CLI.

A ``.kir`` file holds one run line, the input graph and ``// CHECK...`` directives
(see tests/filecheck.py):

    // RUN: kaun-ir opt %s -p autodiff,cse,dce      stdout is checked; exit status must be 0
    // RUN-FAIL: kaun-ir opt %s -p dce              stderr is checked; exit status must be non-zero

``%s`` stands for the file itself. As in LLVM's lit, the line may end in
``| FileCheck %s --implicit-check-not=PATTERN ...``: each such pattern must not occur anywhere
in the output outside what the positive checks matched.

The CLI runs in-process (``kaun_ir.tools.cli.main``); one test also runs it as
``python -m kaun_ir.tools.cli`` in a subprocess to check that entry point. The second half of
this file tests the checker itself: each directive must reject output that breaks it.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import shlex
import subprocess
import sys

import pytest
from filecheck import CheckFailure, check, compile_pattern, parse_checks

KIR_DIR = pathlib.Path(__file__).parent / "kir"
KIR_FILES = sorted(KIR_DIR.glob("*.kir"))


# ------------------------------------------------------------------------------- the runner


def run_line(path: pathlib.Path) -> tuple[bool, list[str], list[str]]:
    """``(expect_failure, argv, implicit_check_not)`` from the file's single RUN / RUN-FAIL line."""
    runs = []
    for line in path.read_text().splitlines():
        stripped = line.strip()
        for prefix, fails in (("// RUN:", False), ("// RUN-FAIL:", True)):
            if stripped.startswith(prefix):
                runs.append((fails, stripped[len(prefix) :]))
    if len(runs) != 1:
        raise ValueError(f"{path.name}: expected exactly one RUN or RUN-FAIL line, found {len(runs)}")
    fails, command = runs[0]
    tool, _, checker = command.partition("|")
    words = shlex.split(tool)
    if not words or words[0] != "kaun-ir":
        raise ValueError(f"{path.name}: the RUN line must start with 'kaun-ir', got {command!r}")
    implicit = []
    if checker.strip():
        options = shlex.split(checker)
        if options[:2] != ["FileCheck", "%s"]:
            raise ValueError(f"{path.name}: expected '| FileCheck %s [options]', got {checker.strip()!r}")
        for option in options[2:]:
            name, _, value = option.partition("=")
            if name != "--implicit-check-not" or not value:
                raise ValueError(f"{path.name}: unsupported FileCheck option {option!r}")
            implicit.append(value)
    return fails, [str(path) if w == "%s" else w for w in words[1:]], implicit


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """Run ``kaun-ir ARGV`` in-process: (exit status, stdout, stderr)."""
    from kaun_ir.tools import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as exit_:  # argparse errors
            status = exit_.code if isinstance(exit_.code, int) else 1
    return status, out.getvalue(), err.getvalue()


def test_there_are_kir_tests():
    names = {p.stem for p in KIR_FILES}
    assert {"dce", "cse", "autodiff_elementwise", "autodiff_matmul", "autodiff_mlp", "parse_error"} <= names


@pytest.mark.parametrize("path", KIR_FILES, ids=[p.stem for p in KIR_FILES])
def test_kir_file(path):
    expect_failure, argv, implicit = run_line(path)
    status, stdout, stderr = run_cli(argv)
    if expect_failure:
        assert status != 0, f"expected kaun-ir {' '.join(argv)} to fail; it printed:\n{stdout}"
        assert stdout == "", "a failing run must not print a graph"
        check(stderr, path.read_text(), implicit)
    else:
        assert status == 0, f"kaun-ir {' '.join(argv)} failed ({status}):\n{stderr}"
        check(stdout, path.read_text(), implicit)
        if "--emit=stablehlo" not in argv:
            # what opt prints is valid IR again: it parses, verifies and prints identically
            from kaun_ir.ir import parse

            assert parse(stdout).verify().text() == stdout


def test_cli_as_subprocess_matches_in_process():
    path = KIR_DIR / "autodiff_matmul.kir"
    _, argv, implicit = run_line(path)
    result = subprocess.run(
        [sys.executable, "-m", "kaun_ir.tools.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_cli(argv)[1]
    check(result.stdout, path.read_text(), implicit)


def test_checks_of_one_pass_reject_the_output_of_another():
    # the cse file's checks must fail on output where duplicates were not merged
    path = KIR_DIR / "cse.kir"
    status, stdout, _ = run_cli(["opt", str(path), "-p", "dce"])
    assert status == 0
    with pytest.raises(CheckFailure, match="check file line"):
        check(stdout, path.read_text())


def test_run_line_errors(tmp_path):
    bad = tmp_path / "bad.kir"
    bad.write_text("// RUN: opt %s\n// CHECK: x\n")
    with pytest.raises(ValueError, match="must start with 'kaun-ir'"):
        run_line(bad)
    bad.write_text("// CHECK: x\n")
    with pytest.raises(ValueError, match="exactly one RUN"):
        run_line(bad)
    bad.write_text("// RUN: kaun-ir opt %s | FileCheck %s --strict-whitespace\n")
    with pytest.raises(ValueError, match="unsupported FileCheck option"):
        run_line(bad)
    bad.write_text("// RUN: kaun-ir opt %s -p dce | FileCheck %s --implicit-check-not='a b'\n")
    assert run_line(bad) == (False, ["opt", str(bad), "-p", "dce"], ["a b"])


def test_unknown_pass_fails_with_the_list_of_passes():
    status, stdout, stderr = run_cli(["opt", str(KIR_DIR / "dce.kir"), "-p", "dce,no-such-pass"])
    assert status == 1 and stdout == ""
    check(stderr, "// CHECK: error: unknown pass 'no-such-pass'; available: {{.*}}autodiff{{.*}}cse{{.*}}dce")


# ------------------------------------------------------------------------ the checker itself

OUTPUT = """\
graph @f(%0: f32[2] "x") -> (f32[2]) {
  %1 = exponential %0 : f32[2]
  %2 = add %1, %1 : f32[2]
  return %2
}
graph @g(%0: f32[] "y") -> (f32[]) {
  %1 = negate %0 : f32[]
  %2 = negate %1 : f32[]
  return %2
}
"""


def lines(*directives: str) -> str:
    return "\n".join(f"// {d}" for d in directives)


@pytest.mark.parametrize(
    "directives",
    [
        ["CHECK: exponential", "CHECK: add", "CHECK: return"],
        ["CHECK: %1 = exponential %0", "CHECK-NEXT: %2 = add", "CHECK-SAME: %1, %1"],
        ["CHECK: exponential", "CHECK-NOT: negate", "CHECK: return %2"],
        ["CHECK-COUNT-2: negate", "CHECK-NOT: negate"],
        ["CHECK-COUNT-4: f32[2]"],  # counts occurrences, several on one line
        ["CHECK-LABEL: graph @f(", "CHECK: add", "CHECK-LABEL: graph @g(", "CHECK: negate"],
        ["CHECK: %[[E:[0-9]+]] = exponential", "CHECK-NEXT: add %[[E]], %[[E]]"],
        ["CHECK: {{%[0-9]+}} = add {{(%1, ){1}}}%1"],
        ["CHECK: add  %1,\t%1"],  # whitespace runs match any whitespace
        ["CHECK: {{^}}}", "CHECK-NEXT: {{^}}graph @g"],
        ["CHECK: %1 = {{[a-z]+}} %0 : f32[{{2?}}]"],
    ],
)
def test_checker_accepts(directives):
    check(OUTPUT, lines(*directives))


@pytest.mark.parametrize(
    "directives, message",
    [
        (["CHECK: multiply"], r"CHECK: multiply \(check file line 1\): not found"),
        (["CHECK: add", "CHECK: exponential"], r"line 2\): not found; searched from output line 3"),
        (["CHECK: exponential", "CHECK-NEXT: return"], r"CHECK-NEXT: return .*not found on the next line"),
        (["CHECK: add", "CHECK-SAME: %0"], r"not found on the same line"),
        (["CHECK: graph @f", "CHECK-NOT: add", "CHECK: return"], r"CHECK-NOT: add .*found on output line 3"),
        (["CHECK-LABEL: graph @g", "CHECK-NOT: return"], r"excluded pattern found on output line 9"),
        (["CHECK-COUNT-3: negate"], r"CHECK-COUNT-3: negate \(check file line 1\).*occurrence 3 of 3"),
        (["CHECK-LABEL: graph @h"], r"label not found"),
        (["CHECK-LABEL: graph"], r"label matches 2 output lines \(1, 6\)"),
        # a label block ends at the next label: exponential is not in @g's block
        (["CHECK-LABEL: graph @g", "CHECK: exponential"], r"not found"),
        (["CHECK-LABEL: graph @f", "CHECK: negate", "CHECK-LABEL: graph @g"], r"CHECK: negate .*not found"),
        (["CHECK: %[[E:[0-9]+]] = exponential", "CHECK-NEXT: %2 = add %[[E]], %0"], r"with E = '1'"),
        (["CHECK-COUNT-2: exponential"], r"occurrence 2 of 2"),
    ],
)
def test_checker_rejects(directives, message):
    with pytest.raises(CheckFailure, match=message):
        check(OUTPUT, lines(*directives))


def test_implicit_check_not():
    # allowed inside positive matches, rejected anywhere else
    check(OUTPUT, lines("CHECK: %1 = exponential"), implicit_check_not=["exponential"])
    with pytest.raises(CheckFailure, match=r"implicit CHECK-NOT: negate: .*output line 7"):
        check(OUTPUT, lines("CHECK: exponential"), implicit_check_not=["negate"])
    with pytest.raises(CheckFailure, match=r"implicit CHECK-NOT: add: .*output line 3"):
        check(OUTPUT, lines("CHECK-LABEL: graph @g", "CHECK: return"), implicit_check_not=["add"])
    with pytest.raises(CheckFailure, match=r"output line 1"):
        check(OUTPUT, lines("CHECK: return"), implicit_check_not=["{{f32\\[2\\]}}"])


def test_failure_message_shows_the_output_where_matching_stopped():
    with pytest.raises(CheckFailure) as info:
        check(OUTPUT, lines("CHECK: graph @g", "CHECK: exponential"))
    assert '   6 | graph @g(%0: f32[] "y") -> (f32[]) {' in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("// CHECK-NEXT: x", "cannot be the first directive"),
        ("// CHEK: x", "no CHECK directives"),  # not a directive at all: nothing to check
        ("// CHECK-NXT: x", "unknown directive"),
        ("// CHECK:", "empty check pattern"),
        ("// CHECK: {{[}}", "bad regex"),
        ("// CHECK: {{abc", "unterminated"),
        ("// CHECK: [[X]]", "used before it is defined"),
        ("// CHECK-COUNT-0: x", "positive count"),
        ("// CHECK-LABEL: [[X:.]]", "cannot use variables"),
        ("plain text", "no CHECK directives"),
    ],
)
def test_bad_check_files(text, message):
    with pytest.raises(ValueError, match=message):
        check(OUTPUT, text)


def test_compile_pattern_escapes_literal_text():
    assert compile_pattern("a.b[1]").search("a.b[1]")
    assert not compile_pattern("a.b").search("axb")
    assert compile_pattern("{{{.*}}}").fullmatch("{x = 1}")
    assert compile_pattern("shape = [[2, 3]]").search("shape = [[2, 3]]")  # not a variable
    assert compile_pattern("%[[N:[0-9]]]").fullmatch("%7")  # the definition's own ']' is kept


def test_parse_checks_reads_comment_lines_only():
    checks = parse_checks("graph @f() {\n  // CHECK: a\n}\n// CHECK-COUNT-3: b\n")
    assert [(c.kind, c.pattern.strip(), c.line, c.count) for c in checks] == [
        ("CHECK", "a", 2, 1),
        ("CHECK-COUNT", "b", 4, 3),
    ]

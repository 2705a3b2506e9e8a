"""How the ``kaun-ir`` command starts: ``--help`` imports none of the framework (kaun_ir defers
its imports while the command starts), a command that runs sees the whole framework, and
jaxlib's C++ INFO lines stay off the terminal."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from kaun_ir.tools import cli

# absl/TSL's line prefix: I (INFO), month and day, time, e.g. "I1123 21:36:28.503971  5473 pjrt_client.cc"
INFO_LINE = re.compile(r"^I\d{4} \d\d:\d\d:\d\d", re.M)
HEAVY = ("numpy", "jax", "jaxlib", "kaun_ir.surface.elementwise", "kaun_ir.passes", "kaun_ir.runtime")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # conftest sets it
    env.update(extra)
    return env


def _as_the_command(*argv: str) -> tuple[list[str], str]:
    """Run ``kaun-ir ARGV`` in a fresh process the way its console script does (sys.argv[0] is
    the command); returns (the HEAVY modules imported by the end, its stdout)."""
    code = (
        "import sys\n"
        f"sys.argv = ['kaun-ir', *{list(argv)!r}]\n"
        "from kaun_ir.tools.cli import main\n"
        "try:\n"
        "    status = main(sys.argv[1:])\n"
        "except SystemExit as exit_:\n"
        "    status = exit_.code\n"
        f"print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules), status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert result.returncode == 0, result.stderr
    out, _, last = result.stdout.rstrip("\n").rpartition("\n")
    loaded, status = re.fullmatch(r"LOADED (\[.*\]) (\d+)", last).groups()
    assert int(status) == 0, result.stderr
    return eval(loaded), out


def test_the_summaries_of_the_command_table_are_the_commands_own():
    parser = cli.build_parser()  # every command's real sub-parser
    subparsers = next(a for a in parser._actions if a.dest == "command")
    helps = {a.dest: a.help for a in subparsers._choices_actions}
    assert list(helps) == list(cli.COMMANDS)
    assert helps == {name: cli.plain(summary) for name, (_, summary) in cli.COMMANDS.items()}


def test_the_readme_names_every_command():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| tools |"))
    assert [name for name in cli.COMMANDS if f"`{name}`" not in row] == []


def test_help_imports_none_of_the_framework():
    loaded, out = _as_the_command("--help")
    assert loaded == [], loaded
    assert all(name in out for name in cli.COMMANDS)
    loaded, out = _as_the_command("opt", "--help")
    assert loaded == [] and "--pipeline" in out, loaded


def test_a_command_runs_with_the_whole_framework_loaded():
    # every registered pass is there although the command imported only what it needed
    loaded, out = _as_the_command("opt", "--list-passes")
    assert set(loaded) >= {"numpy", "kaun_ir.passes"}
    eager = subprocess.run(  # `python -m` imports kaun_ir before the command line is known
        [sys.executable, "-m", "kaun_ir.tools.cli", "opt", "--list-passes"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert eager.returncode == 0, eager.stderr
    assert out.strip() == eager.stdout.strip() and "remat " in out


# jaxlib loaded through its MLIR bindings before jax, then a PJRT client: the order of an export
# followed by a compilation, which printed "PjRt-IFRT device count" INFO lines
_MLIR_THEN_CLIENT = """
from kaun_ir.runtime.xla import backend, mlir
text = "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> { return %a : tensor<2xf32> }"
mlir.serialize_portable(mlir.parse_mlir(text))
backend.client()
"""


@pytest.mark.parametrize("level, shown", [(None, False), ("0", True)], ids=["default", "user-asks-for-info"])
def test_jaxlib_info_lines_stay_off_stderr_unless_asked_for(level, shown):
    env = _env() if level is None else _env(TF_CPP_MIN_LOG_LEVEL=level)
    result = subprocess.run(
        [sys.executable, "-c", _MLIR_THEN_CLIENT], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert bool(INFO_LINE.search(result.stderr)) == shown, result.stderr


def test_export_prints_only_its_own_line(tmp_path):
    target = tmp_path / "mlp.mlirbc"
    argv = ["export", "kaun_ir.tools.examples:mlp", "-o", str(target)]
    code = (
        f"import sys; sys.argv = ['kaun-ir', *{argv!r}]; from kaun_ir.tools.cli import main; sys.exit(main())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"wrote {target}: @main(5 inputs) -> 1 outputs"], result.stderr
    assert target.stat().st_size > 0

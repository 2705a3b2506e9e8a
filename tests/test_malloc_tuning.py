"""``kaun-ir``'s training commands restart once with glibc's huge-page malloc tunable set."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys
import textwrap

import pytest

from kaun_ir.runtime import malloc_tuning
from kaun_ir.tools import cli

GLIBC_LINUX = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def test_tuned_environment_adds_the_tunable_once():
    env = malloc_tuning.tuned_environment({"PATH": "/bin"}, "linux", "glibc")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": malloc_tuning.TUNABLE, malloc_tuning.RESTARTED: "1"}
    # a user's own tunables are kept, ours appended
    env = malloc_tuning.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux", "glibc")
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + malloc_tuning.TUNABLE
    # nothing to do: already set (our restart, or the user's choice), switched off, not glibc Linux
    assert malloc_tuning.tuned_environment(env, "linux", "glibc") is None
    assert (
        malloc_tuning.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "linux", "glibc")
        is None
    )
    assert malloc_tuning.tuned_environment({malloc_tuning.SWITCH: "0"}, "linux", "glibc") is None
    assert malloc_tuning.tuned_environment({}, "darwin", "") is None
    assert malloc_tuning.tuned_environment({}, "linux", "musl") is None
    assert set(cli.TUNED_COMMANDS) <= set(cli.COMMANDS)


def test_memory_children_run_without_the_heap_keeping_tunables():
    tuned = malloc_tuning.tuned_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux", "glibc")
    env = malloc_tuning.without_heap_keeping(tuned)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + malloc_tuning.HUGE_PAGES
    only_ours = malloc_tuning.tuned_environment({}, "linux", "glibc")
    assert malloc_tuning.without_heap_keeping(only_ours)["GLIBC_TUNABLES"] == malloc_tuning.HUGE_PAGES
    assert "GLIBC_TUNABLES" not in malloc_tuning.without_heap_keeping(
        {"GLIBC_TUNABLES": malloc_tuning.KEEP_HEAP}
    )


_CHILD = (
    "import os\n"
    "from kaun_ir.runtime import malloc_tuning\n"
    "malloc_tuning.restart_with_tunables()\n"
    "print(os.environ.get('GLIBC_TUNABLES'))\n"
)


@pytest.mark.skipif(not GLIBC_LINUX, reason="glibc Linux only")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_process_restarts_with_the_tunable(switch):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", malloc_tuning.RESTARTED)}
    env[malloc_tuning.SWITCH] = switch
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ([malloc_tuning.TUNABLE] if switch == "1" else ["None"])


def test_hint_names_the_tunables_only_where_they_would_change_something():
    big, small = malloc_tuning.HINT_TEMP_BYTES, malloc_tuning.HINT_TEMP_BYTES - 1
    message = malloc_tuning.hint(big + (3 << 20), {}, "linux", "glibc", interactive=False)
    assert "35 MiB" in message and "kn.runtime.tune_malloc()" in message and malloc_tuning.TUNABLE in message
    assert malloc_tuning.hint(small, {}, "linux", "glibc") is None
    assert malloc_tuning.hint(big, {"GLIBC_TUNABLES": malloc_tuning.TUNABLE}, "linux", "glibc") is None
    assert malloc_tuning.hint(big, {malloc_tuning.SWITCH: "0"}, "linux", "glibc") is None
    assert malloc_tuning.hint(big, {}, "darwin", "") is None


_BIG_TEMP = (
    "import os, warnings\n"
    "import numpy as np\n"
    "import kaun_ir as kn\n"
    "f = kn.jit(lambda a, b, c: kn.tanh(a @ b) @ c)  # a [4096, 4096] float32 in between: 64 MiB\n"
    "shapes = [(4096, 8), (8, 4096), (4096, 1)]\n"
    "args = [np.ones(shape, np.float32) for shape in shapes]\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    f(*args)\n"
    "    kn.jit(lambda a, b, c: kn.tanh(a @ b) @ c * 2.0)(*args)  # a second program: no second warning\n"
    "print(sum('malloc tunables' in str(w.message) for w in caught))\n"
)


@pytest.mark.skipif(not GLIBC_LINUX, reason="glibc Linux only")
@pytest.mark.parametrize("tuned", [False, True])
def test_one_warning_for_a_large_cpu_program_in_a_plain_process(tuned):
    unset = ("GLIBC_TUNABLES", malloc_tuning.SWITCH, malloc_tuning.RESTARTED)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if tuned:
        env["GLIBC_TUNABLES"] = malloc_tuning.TUNABLE
    command = [sys.executable, "-c", _BIG_TEMP]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == ("0" if tuned else "1")


def _docs_example() -> str:
    """The head of a training script in docs/performance.md (knob 9), as written there."""
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text()
    block = page.split("$ head -3 train.py\n", 1)[1].split("```", 1)[0]
    return textwrap.dedent(block)


# the docs' example verbatim, between a line that shows each start and lines that show the result
_TUNE = (
    "import os\n"
    "print('start', os.environ.get('GLIBC_TUNABLES'))\n"
    + _docs_example()
    + "print('returned', kn.runtime.tune_malloc())\n"
)


@pytest.mark.skipif(not GLIBC_LINUX, reason="glibc Linux only")
def test_tune_malloc_restarts_the_script_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TUNE)
    unset = ("GLIBC_TUNABLES", malloc_tuning.SWITCH, malloc_tuning.RESTARTED)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # the script ran twice: first without the tunables (the call restarted it), then with them
    assert out.stdout.split("\n")[:3] == ["start None", f"start {malloc_tuning.TUNABLE}", "returned True"]
    # switched off, or a program read from standard input (consumed: it could not start again)
    for command, extra, stdin in (
        ([sys.executable, str(script)], {malloc_tuning.SWITCH: "0"}, None),
        ([sys.executable, "-"], {}, _TUNE),
    ):
        out = subprocess.run(
            command, env={**env, **extra}, input=stdin, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:2] == ["start None", "returned False"]


def test_only_a_program_that_can_start_again_is_restarted(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    py = sys.executable
    assert malloc_tuning.restartable([py, str(script), "--epochs", "3"])
    assert malloc_tuning.restartable([py, "-u", "-W", "ignore", "-X", "dev", str(script)])
    assert malloc_tuning.restartable([py, "-m", "pkg.train"])
    assert malloc_tuning.restartable([py, "-c", "print(1)"])
    assert not malloc_tuning.restartable([py])  # the REPL
    assert not malloc_tuning.restartable([py, "-"])  # standard input, already read
    assert not malloc_tuning.restartable([py, str(tmp_path / "missing.py")])
    assert not malloc_tuning.restartable([py, "-c", "x", "--multiprocessing-fork"])
    # the restarted process never restarts again, whatever became of GLIBC_TUNABLES
    assert malloc_tuning.tuned_environment({malloc_tuning.RESTARTED: "1"}, "linux", "glibc") is None


def test_the_warning_advises_what_works_in_the_session():
    size = malloc_tuning.HINT_TEMP_BYTES
    script = malloc_tuning.hint(size, {}, "linux", "glibc", interactive=False)
    session = malloc_tuning.hint(size, {}, "linux", "glibc", interactive=True)
    assert "kn.runtime.tune_malloc()" in script
    assert "kn.runtime.tune_malloc()" not in session and "start the session with GLIBC_TUNABLES" in session

"""``kaun-ir``'s training commands restart once with glibc's huge-page malloc tunable set."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from kaun_ir.tools import cli, malloc_tuning

GLIBC_LINUX = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def test_tuned_environment_adds_the_tunable_once():
    env = malloc_tuning.tuned_environment({"PATH": "/bin"}, "linux", "glibc")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": malloc_tuning.TUNABLE}
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
    "from kaun_ir.tools import malloc_tuning\n"
    "malloc_tuning.restart_with_tunables()\n"
    "print(os.environ.get('GLIBC_TUNABLES'))\n"
)


@pytest.mark.skipif(not GLIBC_LINUX, reason="glibc Linux only")
@pytest.mark.parametrize("switch", ["1", "0"])
def test_the_process_restarts_with_the_tunable(switch):
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env[malloc_tuning.SWITCH] = switch
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ([malloc_tuning.TUNABLE] if switch == "1" else ["None"])

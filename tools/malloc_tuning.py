"""Transparent huge pages for the C heap of the ``kaun-ir`` commands that train.

XLA on the CPU allocates a step's temporary buffers from the C heap on every call. With glibc's
default, a large allocation is a fresh memory mapping, touched page by page: the bench
transformer took ~16,800 minor page faults per step, ~30 ms of system time in a ~140 ms step.
glibc's ``glibc.malloc.hugetlb=1`` tunable makes malloc ask for transparent huge pages
(``madvise``) for its heap and its mappings, so the same buffers fault in 2 MiB at a time (~440
faults per step, docs/performance-results.md). A tunable is read once, when the process starts:
:func:`restart_with_tunables` re-executes the command with it set in ``GLIBC_TUNABLES`` (once:
the new process finds it set). ``KAUN_IR_MALLOC_TUNING=0`` turns it off; other systems than
glibc Linux are left alone. Programs that import kaun_ir set it themselves at their start
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python train.py``).
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
#: the environment variable that turns the restart off when ``0``
SWITCH = "KAUN_IR_MALLOC_TUNING"


def tuned_environment(environ: dict, system: str | None = None, libc: str | None = None) -> dict | None:
    """The environment to restart with (``GLIBC_TUNABLES`` with :data:`TUNABLE` added), or None
    when there is nothing to do: turned off, already set (by us or the user), or not glibc
    Linux. ``system`` / ``libc`` default to this process's."""
    if environ.get(SWITCH, "1") == "0":
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current:
        return None
    if (system if system is not None else sys.platform) != "linux":
        return None
    if (libc if libc is not None else platform.libc_ver()[0]) != "glibc":
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}" if current else TUNABLE
    return env


def restart_with_tunables() -> None:
    """Re-execute this process with :func:`tuned_environment` when it gives one; returns only
    when it does not (or when the interpreter cannot be named)."""
    env = tuned_environment(dict(os.environ))
    if env is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

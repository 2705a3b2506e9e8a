"""Transparent huge pages and a heap that keeps its memory, for processes that train on the CPU.

XLA on the CPU allocates a step's temporary buffers from the C heap on every call. With glibc's
default, a large allocation is a fresh memory mapping, touched page by page: the bench
transformer took ~16,800 minor page faults per step, ~30 ms of system time in a ~140 ms step.
glibc's ``glibc.malloc.hugetlb=1`` tunable makes malloc ask for transparent huge pages
(``madvise``) for its heap and its mappings, so the same buffers fault in 2 MiB at a time (~440
faults per step, docs/performance-results.md). ``glibc.malloc.mmap_max=0`` (no mappings: every
allocation from the heap) with a ``glibc.malloc.trim_threshold`` of 16 GiB (freed memory is not
handed back) then lets the next step reuse the same, already touched pages: the bench lstm step
went from ~12 to ~4 ms of system time and 0.69x to 0.82x PyTorch's speed (docs/performance.md,
round 6). The price is a resident size that stays at its high-water mark, which a training
process reaches every step anyway. A tunable is read once, when the process starts:
:func:`restart_with_tunables` re-executes the command with them set in ``GLIBC_TUNABLES`` (once:
the new process finds them set). ``KAUN_IR_MALLOC_TUNING=0`` turns it off; other systems than
glibc Linux are left alone. The ``kaun-ir`` commands that train restart so; a program of one's
own calls :func:`tune_malloc` first thing (``kn.runtime.tune_malloc()``), or is started with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184``.
A process without them gets one warning (:func:`note_compiled`) when it first compiles a CPU
program whose temporaries reach :data:`HINT_TEMP_BYTES`, glibc's largest threshold for serving an
allocation as a memory mapping of its own: from there on, each call's temporaries are mapped and
faulted in afresh, page by page, and the tunables measured 1.1-1.5x faster steps than a plain
process (docs/performance.md, knob 9).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import warnings

#: huge pages for the heap and its mappings
HUGE_PAGES = "glibc.malloc.hugetlb=1"
#: every allocation from the heap, and freed memory kept for the next step
KEEP_HEAP = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
#: what :func:`restart_with_tunables` adds to ``GLIBC_TUNABLES``
TUNABLE = f"{HUGE_PAGES}:{KEEP_HEAP}"
#: the environment variable that turns the restart (and the warning) off when ``0``
SWITCH = "KAUN_IR_MALLOC_TUNING"
#: set in the restarted process: a second restart never happens, even where ``GLIBC_TUNABLES``
#: does not survive ``exec`` (a secure-mode binary, a wrapper that cleans the environment)
RESTARTED = "KAUN_IR_MALLOC_TUNING_RESTARTED"
#: the temporaries of one call from which a process without the tunables is warned
HINT_TEMP_BYTES = 32 << 20

_noted = False


def tuned_environment(environ: dict, system: str | None = None, libc: str | None = None) -> dict | None:
    """The environment to restart with (``GLIBC_TUNABLES`` with :data:`TUNABLE` added), or None
    when there is nothing to do: turned off, already set (by us or the user), or not glibc
    Linux. ``system`` / ``libc`` default to this process's."""
    if environ.get(SWITCH, "1") == "0" or environ.get(RESTARTED):
        return None
    if tuned(environ):
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if (system if system is not None else sys.platform) != "linux":
        return None
    if (libc if libc is not None else _libc()) != "glibc":
        return None
    env = dict(environ)
    env["GLIBC_TUNABLES"] = f"{current}:{TUNABLE}" if current else TUNABLE
    env[RESTARTED] = "1"
    return env


@functools.lru_cache(maxsize=1)
def _libc() -> str:
    """This process's C library (``platform.libc_ver`` reads the interpreter's binary: once)."""
    return platform.libc_ver()[0]


def restart_with_tunables() -> None:
    """Re-execute this process with :func:`tuned_environment` when it gives one; returns only
    when it does not (or when the interpreter cannot be named)."""
    env = tuned_environment(dict(os.environ))
    if env is None or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def without_heap_keeping(environ: dict) -> dict:
    """``environ`` with :data:`KEEP_HEAP` taken out of ``GLIBC_TUNABLES`` (huge pages stay): for a
    process whose resident size is the measurement (``kaun-ir bench``'s memory children), where
    memory a heap keeps after freeing it would count as held."""
    env = dict(environ)
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t not in KEEP_HEAP.split(":")]
    if kept:
        env["GLIBC_TUNABLES"] = ":".join(kept)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


def _interactive() -> bool:
    """A session that a restart would lose: the REPL, IPython or a Jupyter kernel."""
    return bool(getattr(sys, "ps1", None) or sys.flags.interactive) or any(
        name in sys.modules for name in ("IPython", "ipykernel")
    )


def restartable(argv: list[str]) -> bool:
    """Whether a process started as ``argv`` (``sys.orig_argv``) can start again from its
    beginning: a script file, ``-m module`` or ``-c code``; not a program read from standard input
    (``python -`` or a pipe: already consumed) nor a ``multiprocessing`` child (its parent's
    pipe is read), nor an interpreter without a program."""
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-", "-m", "-c"):
        args = args[1:] if args[0] not in ("-W", "-X") else args[2:]  # options (and their values)
    if not args or args[0] == "-" or any(a.startswith("--multiprocessing-fork") for a in argv):
        return False
    return args[0] in ("-m", "-c") or os.path.isfile(args[0])


def tuned(environ: dict | None = None) -> bool:
    """Whether a process with ``environ`` (default this one's) runs with glibc's huge-page malloc
    tunable set (ours or the user's)."""
    return "glibc.malloc.hugetlb" in (os.environ if environ is None else environ).get("GLIBC_TUNABLES", "")


def tune_malloc() -> bool:
    """Restart this Python program with glibc's malloc tunables (:data:`TUNABLE`: transparent
    huge pages, and a heap that keeps freed memory for the next step) unless they are set;
    returns whether this process runs with them.

    Call it first thing in a training script: the program starts again from its beginning with
    ``GLIBC_TUNABLES`` set, and there the call returns True at once. Nothing is restarted with
    ``KAUN_IR_MALLOC_TUNING=0``, where the tunables are set already (or
    ``glibc.malloc.hugetlb`` is, by the user), off glibc Linux, in an interactive session (the
    REPL, IPython, Jupyter: start the kernel with ``GLIBC_TUNABLES`` instead), in a program read
    from standard input and in a ``multiprocessing`` child, none of which can start again. Steps
    of the bench's transformer, LSTM and GPT-2 124M ran 1.5x, 1.25x and 1.1x faster with them
    (docs/performance.md, knob 9); the resident size then stays at its high-water mark."""
    import multiprocessing  # noqa: PLC0415 - only to tell a child process, on this rare call

    argv = list(getattr(sys, "orig_argv", None) or [])
    if _interactive() or multiprocessing.parent_process() is not None or not restartable(argv):
        return tuned()
    restart_with_tunables()
    return tuned()  # nothing to restart for, or the interpreter could not be named


def hint(
    temp_bytes: int,
    environ: dict | None = None,
    system: str | None = None,
    libc: str | None = None,
    interactive: bool | None = None,
):
    """The warning for a compiled CPU program with ``temp_bytes`` of temporaries per call in a
    process with ``environ`` (default this one's), or None: below :data:`HINT_TEMP_BYTES`, or
    nothing to tune (see :func:`tuned_environment`). ``interactive`` (default: this session's)
    advises starting the kernel with the tunables instead of calling :func:`tune_malloc`."""
    if temp_bytes < HINT_TEMP_BYTES:
        return None
    if tuned_environment(dict(os.environ if environ is None else environ), system, libc) is None:
        return None
    ask = (
        f"start the session with GLIBC_TUNABLES={TUNABLE}"
        if (_interactive() if interactive is None else interactive)
        else f"call kn.runtime.tune_malloc() first thing in the script, or set GLIBC_TUNABLES={TUNABLE}"
    )
    return (
        f"kaun_ir: this CPU program allocates {temp_bytes / 2**20:.0f} MiB of temporaries per call, "
        "which glibc maps and faults in afresh on every call; with glibc's malloc tunables such "
        f"steps ran 1.1-1.5x faster ({ask}; docs/performance.md, knob 9); {SWITCH}=0 silences this"
    )


def note_compiled(memory_analysis) -> None:
    """Warn once per process (``RuntimeWarning``, attributed to the first caller outside
    kaun_ir) when a CPU program just compiled has a :func:`hint`; ``memory_analysis()`` gives
    its XLA memory analysis (asked only while there is something to say: not after the warning,
    nor in a process that has the tunables)."""
    global _noted
    if _noted or tuned_environment(dict(os.environ)) is None:
        return
    memory = memory_analysis()
    message = hint(int(memory.get("temp", 0))) if memory else None
    if message is not None:
        _noted = True
        warnings.warn(message, RuntimeWarning, stacklevel=_outside_caller())


def _outside_caller() -> int:
    """The ``stacklevel`` of the first frame whose module is not kaun_ir's, seen from a
    ``warnings.warn`` in the caller of this function."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("kaun_ir"):
        frame, level = frame.f_back, level + 1
    return level

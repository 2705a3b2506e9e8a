"""jaxlib's profiler: start and stop a trace (``jax.profiler``), and find the files it wrote.

A trace is written under ``LOGDIR/plugins/profile/<run>/``: ``<host>.xplane.pb`` (TensorBoard's
profiler plugin reads it) and ``<host>.trace.json.gz``, a Chrome trace-event file that Perfetto
(ui.perfetto.dev) and ``chrome://tracing`` open.
"""

from __future__ import annotations

import glob
import os


def start(logdir: str) -> None:
    """Start recording a trace into ``logdir`` (one trace at a time per process)."""
    import jax.profiler  # noqa: PLC0415 - jax loads when a profile starts

    jax.profiler.start_trace(logdir)


def stop() -> None:
    """Stop the trace and write its files."""
    import jax.profiler  # noqa: PLC0415 - jax loads when a profile starts

    jax.profiler.stop_trace()


def wait_for_device() -> None:
    """Wait until every array alive in this process is computed: the device has no queued work
    left that a trace started or stopped now would cut in half."""
    import jax  # noqa: PLC0415 - jax loads when a profile starts

    for array in jax.live_arrays():
        try:
            array.block_until_ready()
        except Exception:  # noqa: BLE001, S112 - a donated or deleted array has nothing to wait for
            continue


def trace_files(logdir: str) -> list[str]:
    """The Chrome trace-event files under ``logdir``, oldest first."""
    # escaped: a logdir such as "runs/[exp]" is a name, not a pattern
    found = glob.glob(os.path.join(glob.escape(logdir), "plugins", "profile", "*", "*.trace.json.gz"))
    return sorted(found, key=os.path.getmtime)

"""The helper process that reads untrusted MLIR: MLIR's readers can end the process on damaged
input, so a module from outside is read by a long-lived child process first, under a CPU and a
wall-clock budget; a read that kills or stalls the child is an error here, not a crash.

The child runs :func:`kaun_ir.runtime.xla.mlir.helper_main`; this module is the parent's side.
"""

from __future__ import annotations

__all__ = ["HELPER_CPU_S", "HELPER_CPU_S_PER_MIB", "HELPER_TIMEOUT_S", "read_in_helper", "stop_helper"]

# What the helper runs: read (kind, length, payload) requests from stdin, parse each payload in a
# fresh context, answer (status, length, message). A parse that kills it is the parent's answer.
_HELPER = "from kaun_ir.runtime.xla.mlir import helper_main; helper_main()"

# Bounds on reading one module in the helper (beyond them it is an error): CPU seconds, the base
# plus so many per MiB of input (the measure that holds on a loaded machine), and wall-clock seconds.
# A module of a few KiB reads in milliseconds and a fresh helper imports jaxlib in about 0.3 s, so
# the base is ample; it bounds the inputs on which MLIR's bytecode reader never finishes (an
# attribute or type that refers to itself, a count of billions), which cost the whole base.
HELPER_CPU_S = 2.0
HELPER_CPU_S_PER_MIB = 20.0
HELPER_TIMEOUT_S = 600.0


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) of process ``pid`` so far; None where ``/proc`` cannot say."""
    import os  # noqa: PLC0415 - only imports read modules

    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class _Helper:
    """One long-lived helper process (started on first use, restarted after it dies)."""

    def __init__(self):
        import threading  # noqa: PLC0415 - only imports read modules

        self.lock = threading.Lock()
        self.proc = None

    def start(self):
        import os  # noqa: PLC0415 - only imports read modules
        import subprocess  # noqa: PLC0415 - only imports read modules
        import sys  # noqa: PLC0415 - only imports read modules

        env = dict(os.environ)
        env.setdefault("KAUN_IR_BACKEND", "cpu")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # MLIR's own printing of diagnostics stays out of the user's stderr
            env=env,
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a helper that does not stop is killed
                proc.kill()
                proc.wait()

    def parse(self, data: str | bytes) -> tuple[str, str]:
        """``("ok", the module as MLIR text)``, ``("error", MLIR's message)`` or ``("died", how)``."""
        import struct  # noqa: PLC0415 - only imports read modules

        payload = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        kind = b"t" if isinstance(data, str) else b"b"
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.start()
            proc = self.proc
            budget = HELPER_CPU_S + HELPER_CPU_S_PER_MIB * len(payload) / (1 << 20)
            try:
                proc.stdin.write(kind + struct.pack("<Q", len(payload)) + payload)
                proc.stdin.flush()
                head = self._read(proc, 9, budget)
                status, size = head[:1], struct.unpack("<Q", head[1:])[0]
                message = self._read(proc, size, budget).decode("utf-8", "replace")
            except (OSError, EOFError, TimeoutError) as err:
                self.stop()
                code = proc.returncode
                if isinstance(err, TimeoutError):
                    return "died", f"reading it took longer than {err}"
                how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
                return "died", f"the MLIR parser crashed on it ({how})"
            return ("ok" if status == b"0" else "error"), message

    def _read(self, proc, size: int, cpu_budget: float) -> bytes:
        """``size`` bytes of the helper's answer; ``TimeoutError`` (the helper killed) once it has
        used ``cpu_budget`` CPU seconds on it or ``HELPER_TIMEOUT_S`` have passed."""
        import os  # noqa: PLC0415 - only imports read modules
        import select  # noqa: PLC0415 - only imports read modules
        import time  # noqa: PLC0415 - only imports read modules

        fd = proc.stdout.fileno()
        chunks, left = [], size
        deadline = time.monotonic() + HELPER_TIMEOUT_S
        cpu_start = _cpu_seconds(proc.pid)
        while left:
            ready, _, _ = select.select([fd], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
            if not ready:
                cpu = _cpu_seconds(proc.pid)
                if time.monotonic() >= deadline:
                    proc.kill()
                    raise TimeoutError(f"{HELPER_TIMEOUT_S:.0f} s")
                if cpu is not None and cpu_start is not None and cpu - cpu_start > cpu_budget:
                    proc.kill()
                    raise TimeoutError(f"{cpu_budget:.0f} s of CPU time")
                continue
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                proc.wait()
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


_HELPER_PROCESS = _Helper()


def read_in_helper(data: str | bytes, source: str = "the module") -> str:
    """The module in ``data`` (text, bytecode or a portable artifact) read by the helper process
    and printed there as MLIR text, which is what this process then parses. ``ValueError`` naming
    ``source`` if it does not parse or verify there, or the reader dies on it."""
    outcome, message = _HELPER_PROCESS.parse(data)
    if outcome == "died":
        raise ValueError(f"{source} cannot be read as StableHLO: {message}")
    if outcome == "error":
        raise ValueError(
            source + message[2:] if message.startswith(("it ", "it:")) else f"{source}: {message}"
        )
    return message


def stop_helper() -> None:
    """Stop the helper process (it is started again when next needed)."""
    with _HELPER_PROCESS.lock:
        _HELPER_PROCESS.stop()

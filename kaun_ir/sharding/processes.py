"""``kn.distributed``: one training run over several processes (hosts), through PJRT's
distributed runtime.

Every process runs the same program. ``initialize`` connects them through the coordination
service that jaxlib ships (process 0 hosts it); afterwards ``kn.runtime.devices()`` lists the
devices of all processes, a mesh over them spans the processes, and XLA's collectives cross
process boundaries (gloo over TCP on the CPU, NCCL on GPUs). Each process feeds its own part of
the data (``kn.data.shard``) and holds only its devices' shards of sharded arrays.

    kn.distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=rank)
    mesh = kn.sharding.mesh((len(kn.runtime.devices()),), ("data",))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kaun_ir.names import public_dir
from kaun_ir.runtime.xla import backend

__all__ = ["initialize", "shutdown", "is_initialized", "process_index", "process_count", "local_devices"]


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    local_device_ids: Sequence[int] | None = None,
    timeout_s: float = 300,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Join a run of ``num_processes`` processes; this one is ``process_id`` (0-based).

    ``coordinator_address``: ``"host:port"`` (``"[::1]:port"`` for an IPv6 literal) reachable by
    every process; process 0 listens there. ``local_device_ids``: the local devices this process
    drives (default: all). Must be called before anything runs on a device in this process.

    Every wait is bounded:

    - ``timeout_s`` (default 300): how long to wait for the coordinator to accept a connection
      (processes other than 0) and for every process to join. A coordinator that cannot be
      reached in that time raises :class:`~kaun_ir.errors.DistributedError` naming the address;
      processes started with different ``num_processes`` raise it naming the process that
      disagrees (process 0's count is the run's).
    - ``heartbeat_timeout_s`` (default 100): a process that stops sending heartbeats for that
      long (killed, or its host lost) is declared dead by the coordination service, and every
      other process of the run then ends (see docs/distributed.md: XLA's coordination agent
      terminates it, naming the dead process; it cannot raise a Python exception there).

    Bad arguments (a malformed address, a non-numeric port or one out of 1..65535,
    ``process_id`` not in ``[0, num_processes)``, non-positive timeouts) raise ``ValueError`` or
    ``TypeError`` at once, before anything connects."""
    host, port = _parse_address(coordinator_address)
    num_processes = _int_arg("num_processes", num_processes, 1)
    process_id = _int_arg("process_id", process_id, 0)
    if process_id >= num_processes:
        raise ValueError(
            f"kn.distributed.initialize: process_id {process_id} is not in [0, {num_processes}) "
            f"(num_processes={num_processes})"
        )
    if local_device_ids is not None:
        if isinstance(local_device_ids, (str, bytes)) or not isinstance(local_device_ids, Sequence):
            raise TypeError(
                "kn.distributed.initialize: local_device_ids must be a sequence of ints, "
                f"got {local_device_ids!r}"
            )
        local_device_ids = [_int_arg("local_device_ids[]", i, 0) for i in local_device_ids]
    for name, value in (("timeout_s", timeout_s), ("heartbeat_timeout_s", heartbeat_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(
                f"kn.distributed.initialize: {name} must be a positive number of seconds, got {value!r}"
            )

    backend.initialize_distributed(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        num_processes,
        process_id,
        local_device_ids=local_device_ids,
        timeout_s=float(timeout_s),
        heartbeat_timeout_s=max(1, int(round(heartbeat_timeout_s))),
    )


def _parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a ``"host:port"`` or ``"[ipv6]:port"`` coordinator address; a
    ``ValueError`` naming the address when it is malformed or the port is not in 1..65535."""
    if not isinstance(address, str):
        raise TypeError(
            f"kn.distributed.initialize: coordinator_address must be a 'host:port' string, got {address!r}"
        )
    text = address.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port = rest[1:] if sep and rest.startswith(":") else None
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            port = None
    if port is None or not host or any(c.isspace() for c in host):
        raise ValueError(
            f"kn.distributed.initialize: coordinator_address {address!r} is not 'host:port' "
            "(an IPv6 address is written '[::1]:1234')"
        )
    # isdecimal, not isdigit: a superscript digit ('\u00b2') is a digit that int() refuses
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"kn.distributed.initialize: coordinator_address {address!r}: the port must be a number "
            f"in 1..65535, got {port!r}"
        )
    return host, int(port)


def _int_arg(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"kn.distributed.initialize: {name} must be an int, got {value!r}")
    if int(value) < low:
        raise ValueError(f"kn.distributed.initialize: {name} must be >= {low}, got {value}")
    return int(value)


def shutdown() -> None:
    """Leave the run (the coordination service stops when process 0 leaves)."""
    backend.shutdown_distributed()


def is_initialized() -> bool:
    """Whether :func:`initialize` has run in this process."""
    return backend.distributed_initialized()


def process_index() -> int:
    """This process's index (0 when not distributed)."""
    return backend.process_index()


def process_count() -> int:
    """The number of processes in the run (1 when not distributed)."""
    return backend.process_count()


def local_devices() -> list:
    """The devices this process drives (``kn.runtime.devices()`` lists those of every process)."""
    return backend.local_devices()


__dir__ = public_dir(__all__)

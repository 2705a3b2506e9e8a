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

from kaun_ir.runtime.xla import backend

__all__ = ["initialize", "shutdown", "is_initialized", "process_index", "process_count", "local_devices"]


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    local_device_ids: Sequence[int] | None = None,
    timeout_s: int = 300,
) -> None:
    """Join a run of ``num_processes`` processes; this one is ``process_id`` (0-based).

    ``coordinator_address``: ``"host:port"`` reachable by every process; process 0 listens
    there. ``local_device_ids``: the local devices this process drives (default: all).
    Must be called before anything runs on a device in this process; waits up to ``timeout_s``
    seconds for the others. Raises ``ValueError`` for inconsistent arguments."""
    if not isinstance(coordinator_address, str) or ":" not in coordinator_address:
        raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
    if int(num_processes) < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not 0 <= int(process_id) < int(num_processes):
        raise ValueError(f"process_id {process_id} is not in [0, {num_processes})")

    backend.initialize_distributed(
        coordinator_address,
        int(num_processes),
        int(process_id),
        local_device_ids=local_device_ids,
        timeout_s=int(timeout_s),
    )


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

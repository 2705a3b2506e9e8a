"""The PJRT client and its devices: which platform runs (``KAUN_IR_BACKEND``), the devices of
this process and of a multi-process run, and the library versions a cache key records."""

from __future__ import annotations

import functools
import math
import os
import socket
import sys
import threading
import time

from kaun_ir.errors import DistributedError

_BACKEND_ENV = "KAUN_IR_BACKEND"
_PREFERENCE = ("gpu", "tpu", "cpu")


@functools.cache
def jax_module():
    """The ``jax`` module, imported on first use: ``import kaun_ir`` stays cheap and jax-free
    until a computation needs it (cached, since the hot paths ask for it on every call)."""
    import jax  # noqa: PLC0415 - jax loads only when a program compiles or compares

    return jax


def backend_name() -> str:
    """The platform in use: ``KAUN_IR_BACKEND`` if set (cpu/gpu/tpu), else the best available
    (also when it names an IREE backend, ``iree-cpu``...: eager ops and arrays stay on XLA)."""
    wanted = os.environ.get(_BACKEND_ENV, "").strip().lower()
    if wanted and not wanted.startswith("iree"):
        if wanted not in _PREFERENCE:
            raise ValueError(
                f"{_BACKEND_ENV}={wanted!r}: expected one of cpu, gpu, tpu, iree-cpu, iree-vulkan, iree-cuda"
            )
        return wanted
    return _best_available()


@functools.cache
def _best_available() -> str:
    # imported here: jax loads only when a program compiles or compares
    from jax.extend import backend as jex_backend  # noqa: PLC0415

    for name in _PREFERENCE:
        try:
            jex_backend.get_backend(name)
            return name
        except RuntimeError:
            continue
    return "cpu"


@functools.cache
def client(name: str | None = None):
    """The PJRT client of a platform (default: :func:`backend_name`)."""
    # imported here: jax loads only when a program compiles or compares
    from jax.extend import backend as jex_backend  # noqa: PLC0415

    name = name or backend_name()
    try:
        return jex_backend.get_backend(name)
    except RuntimeError as err:
        raise RuntimeError(
            f"XLA backend {name!r} is not available here ({err}); set {_BACKEND_ENV}=cpu to run on the CPU"
        ) from None


def devices(name: str | None = None) -> list:
    """The devices of a platform (default: the one in use)."""
    return list(client(name).devices())


def default_device():
    """The first device this process drives (in a multi-process run, ``devices()[0]`` may
    belong to another process)."""
    return client().local_devices()[0]


def global_devices(name: str | None = None) -> list:
    """Every device of the platform, across all processes (equal to :func:`devices` in one process)."""
    return list(client(name).devices())


def local_devices(name: str | None = None) -> list:
    """The devices this process drives."""
    return list(client(name).local_devices())


def jaxlib_version() -> str:
    """The installed jaxlib's version string ("" where it keeps none), for cache keys."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    return str(getattr(xc, "_version", ""))


def xla_extension_version() -> str:
    """The version of XLA's C API that jaxlib was built with ("" where it keeps none), for cache keys."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    return str(getattr(xc, "_xla_extension_version", ""))


# ----------------------------------------------------------------------- processes (distributed)


def process_index() -> int:
    """This process's index among the processes of a distributed run (0 in a single process)."""
    return int(client().process_index())


def process_count() -> int:
    """How many processes drive the devices (1 unless :func:`initialize_distributed` joined more)."""
    return len({d.process_index for d in global_devices()})


def initialize_distributed(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    local_device_ids=None,
    timeout_s: float = 300,
    heartbeat_timeout_s: int = 100,
) -> None:
    """Join a multi-process run through PJRT's distributed runtime: process 0 also hosts the
    coordination service at ``coordinator_address``; every process's client then sees all
    devices, and collectives between processes go over the platform's transport (gloo/TCP on
    CPU, NCCL on GPU). Must run before the backend is first used in this process.

    XLA's coordination agent terminates the process on a failed connection (``abort``), so the
    failures that can be seen beforehand are turned into :class:`DistributedError` first: a
    coordinator that does not accept connections within ``timeout_s`` (processes other than 0),
    a coordinator port that process 0 cannot listen on, and, right after connecting, processes
    that disagree on ``num_processes`` (a bounded wait on the coordination service's key-value
    store)."""
    if client.cache_info().currsize:
        raise DistributedError(
            "kn.distributed.initialize must be called before any computation: this "
            "process already started its XLA backend"
        )
    jax = jax_module()
    if jax.distributed.is_initialized():
        raise DistributedError("kn.distributed.initialize was already called in this process")
    host, _, port = coordinator_address.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    if process_id == 0:
        _check_listenable(host, int(port), coordinator_address)
    else:
        _wait_reachable(host, int(port), coordinator_address, process_id, timeout_s, deadline)
    remaining = max(1, math.ceil(deadline - time.monotonic()))
    # where the wait for the other processes runs out, XLA's agent ends the process from inside
    # connect(), before Python can raise: say beforehand what it is waiting for
    notice = threading.Timer(
        max(0.1, remaining - 0.5),
        _last_words,
        (coordinator_address, num_processes, process_id, timeout_s),
    )
    notice.daemon = True
    notice.start()
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            local_device_ids=local_device_ids,
            initialization_timeout=remaining,
            heartbeat_timeout_seconds=int(heartbeat_timeout_s),
            shutdown_timeout_seconds=max(1, math.ceil(timeout_s)),
        )
    except Exception as err:  # jaxlib's own runtime errors
        notice.cancel()
        _forget_distributed()
        raise DistributedError(
            f"kn.distributed.initialize: process {process_id} could not join the run at "
            f"{coordinator_address} ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    notice.cancel()
    try:
        _agree_on_count(num_processes, process_id, max(1.0, deadline - time.monotonic()))
    except DistributedError:
        _forget_distributed()
        raise


def _last_words(address: str, num_processes: int, process_id: int, timeout_s: float) -> None:
    """Printed when joining is about to time out inside XLA (which then ends the process)."""
    print(
        f"kaun_ir: kn.distributed.initialize: process {process_id} has waited timeout_s={timeout_s:g} s "
        f"for the {num_processes} processes of the run to join at {address}; XLA's coordination "
        "agent ends this process when the wait runs out. Check that every process was started, "
        f"with the same num_processes (this one: {num_processes}; process 0's count is the run's).",
        file=sys.stderr,
        flush=True,
    )


def _check_listenable(host: str, port: int, address: str) -> None:
    """Process 0 hosts the coordination service on every interface at ``port``: a port another
    program holds would make the service fail inside XLA, so it is tried here first."""
    try:
        socket.getaddrinfo(host, port)  # process 0's own client connects through this name
    except OSError as err:
        raise DistributedError(
            f"kn.distributed.initialize: the coordinator host {host!r} of {address} does not "
            f"resolve ({err.strerror or err})"
        ) from None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as err:
            raise DistributedError(
                f"kn.distributed.initialize: process 0 cannot listen on port {port} of {address} "
                f"for the coordination service ({err.strerror or err}): is another run using it?"
            ) from None


def _wait_reachable(host: str, port: int, address: str, process_id: int, timeout_s: float, deadline) -> None:
    """Wait until the coordinator at ``host:port`` accepts a TCP connection, at most until
    ``deadline``; XLA's agent would abort the process where this raises."""
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistributedError(
                f"kn.distributed.initialize: process {process_id} could not reach the coordinator at "
                f"{address} within timeout_s={timeout_s:g} s ({last}); is process 0 running and "
                "listening there?"
            )
        try:
            with socket.create_connection((host, port), timeout=min(1.0, max(left, 0.05))):
                return
        except OSError as err:
            last = err.strerror or str(err) or type(err).__name__
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))


_COUNT_KEY = "kaun_ir/num_processes/"


def _agree_on_count(num_processes: int, process_id: int, timeout_s: float) -> None:
    """Every process publishes its ``num_processes``; process 0 (whose count the coordination
    service was started with) checks every other's, the others check process 0's, each wait
    bounded by ``timeout_s``."""
    from jax._src import distributed  # noqa: PLC0415 - the client jax.distributed connected

    kv = distributed.global_state.client
    kv.key_value_set(_COUNT_KEY + str(process_id), str(num_processes))
    peers = range(1, num_processes) if process_id == 0 else (0,)
    deadline = time.monotonic() + timeout_s
    for peer in peers:
        left = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            theirs = int(kv.blocking_key_value_get(_COUNT_KEY + str(peer), left))
        except Exception:  # DEADLINE_EXCEEDED from jaxlib: the peer never joined
            raise DistributedError(
                f"kn.distributed.initialize: process {peer} did not join the run of {num_processes} "
                "processes within timeout_s (started with another num_processes, or not started)"
            ) from None
        if theirs != num_processes:
            raise DistributedError(
                f"kn.distributed.initialize: process {peer} was started with num_processes={theirs}, "
                f"this process (process {process_id}) with num_processes={num_processes}: every "
                "process of a run must pass the same count"
            )


_SYNC_KEY = "kaun_ir/sync/"
_SYNCS = [0]  # calls of sync_from_zero in this process: every process makes the same sequence


def sync_from_zero(value: int, timeout_s: float, what: str) -> int:
    """Process 0's ``value``, returned in every process once every process has called this (the
    n-th call of each process meets the n-th of the others). Runs on the coordination service
    (a key and a barrier), not on a collective over the devices: a process leaving right after it
    cannot strand a peer still waiting on its part of a device collective. A peer that does not
    arrive within ``timeout_s`` is a ``DistributedError`` naming ``what``."""
    from jax._src import distributed  # noqa: PLC0415 - the client jax.distributed connected

    if process_count() == 1:
        return value
    kv = distributed.global_state.client
    if kv is None:
        raise DistributedError(f"{what}: {process_count()} processes but no connection to the coordinator")
    key = f"{_SYNC_KEY}{_SYNCS[0]}"
    _SYNCS[0] += 1
    timeout_ms = max(1, int(timeout_s * 1000))
    try:
        if process_index() == 0:
            kv.key_value_set(key, str(int(value)))
        else:
            value = int(kv.blocking_key_value_get(key, timeout_ms))
        kv.wait_at_barrier(key, timeout_ms)
    except Exception as err:  # DEADLINE_EXCEEDED and other runtime errors of jaxlib
        raise DistributedError(
            f"{what}: process {process_index()} waited {timeout_s:g} s for the other processes "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    return int(value)


def _forget_distributed() -> None:
    """Leave a half-made run: shut the connection down (a barrier that the other processes,
    failing the same check, reach too), then drop it so that exiting does not wait on it."""
    from jax._src import distributed  # noqa: PLC0415 - the state jax.distributed keeps

    state = distributed.global_state
    try:
        state.shutdown()
    except Exception:  # noqa: S110 - a peer that is gone already: nothing left to leave
        pass
    state.preemption_sync_manager = None
    state.client = None
    state.service = None


def distributed_initialized() -> bool:
    """Whether this process has joined a multi-process run (:func:`initialize_distributed`)."""
    return bool(jax_module().distributed.is_initialized())


def shutdown_distributed() -> None:
    """Leave the multi-process run (and stop the coordination service in process 0)."""
    jax_module().distributed.shutdown()

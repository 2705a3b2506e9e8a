"""The PJRT client and its devices: which platform runs (``KAUN_IR_BACKEND``), the devices of
this process and of a multi-process run, and the library versions a cache key records."""

from __future__ import annotations

import functools
import os

_BACKEND_ENV = "KAUN_IR_BACKEND"
_PREFERENCE = ("gpu", "tpu", "cpu")


@functools.cache
def jax_module():
    """The ``jax`` module, imported on first use: ``import kaun_ir`` stays cheap and jax-free
    until a computation needs it (cached, since the hot paths ask for it on every call)."""
    import jax  # noqa: PLC0415 - jax loads only when a program compiles or compares

    return jax


def backend_name() -> str:
    """The platform in use: ``KAUN_IR_BACKEND`` if set (cpu/gpu/tpu), else the best available."""
    wanted = os.environ.get(_BACKEND_ENV, "").strip().lower()
    if wanted:
        if wanted not in _PREFERENCE:
            raise ValueError(f"{_BACKEND_ENV}={wanted!r}: expected one of cpu, gpu, tpu")
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
    coordinator_address: str, num_processes: int, process_id: int, local_device_ids=None, timeout_s: int = 300
) -> None:
    """Join a multi-process run through PJRT's distributed runtime: process 0 also hosts the
    coordination service at ``coordinator_address``; every process's client then sees all
    devices, and collectives between processes go over the platform's transport (gloo/TCP on
    CPU, NCCL on GPU). Must run before the backend is first used in this process."""
    if client.cache_info().currsize:
        raise RuntimeError(
            "kn.distributed.initialize must be called before any computation: this "
            "process already started its XLA backend"
        )
    jax_module().distributed.initialize(
        coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=timeout_s,
    )


def distributed_initialized() -> bool:
    """Whether this process has joined a multi-process run (:func:`initialize_distributed`)."""
    return bool(jax_module().distributed.is_initialized())


def shutdown_distributed() -> None:
    """Leave the multi-process run (and stop the coordination service in process 0)."""
    jax_module().distributed.shutdown()

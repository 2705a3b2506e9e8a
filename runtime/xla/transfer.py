"""Arrays between the host and the devices: NumPy (or a DLPack tensor) to a ``jax.Array`` on one
device, global arrays laid out over a mesh, and back to NumPy."""

from __future__ import annotations

import functools

import numpy as np

from kaun_ir.runtime.xla import backend


@functools.cache
def array_types() -> tuple[type, ...]:
    """Concrete array classes that may be passed straight through: (np.ndarray, jax's Array)."""
    jax = backend.jax_module()
    return (np.ndarray, type(jax.device_put(np.zeros((), np.float32), backend.default_device())))


def is_device_array(x) -> bool:
    """Whether ``x`` is a ``jax.Array`` (an array held by an XLA device)."""
    return isinstance(x, backend.jax_module().Array)


def _x64():
    """A context in which jax keeps 64-bit data 64-bit (it narrows it to 32 bits otherwise)."""
    jax = backend.jax_module()
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # noqa: PLC0415 - older releases

    return enable_x64()


def to_device(x, dtype: np.dtype, device) -> object:
    """``x`` (NumPy, scalar, jax.Array or a DLPack array such as a PyTorch tensor) as a device
    array of ``dtype`` on ``device``."""
    jax = backend.jax_module()
    if not isinstance(x, (np.ndarray, np.generic, jax.Array)) and hasattr(x, "__dlpack__"):
        x = from_dlpack(x)
    if isinstance(x, jax.Array):
        held = x.devices()
        if len(held) == 1 and device in held and x.dtype == dtype:
            return x
        if not x.is_fully_addressable:
            raise TypeError(
                f"an array spread over devices of other processes ({x.sharding}) cannot be "
                f"moved to {device}; compile for its mesh instead (kn.jit(..., mesh=))"
            )
        if x.dtype == dtype:  # another device, or sharded over several: the runtime moves it
            return _device_put(jax, x, device)
    host = np.asarray(x, dtype=dtype)
    put = _host_put(device)
    if put is not None:
        return put(host)
    return _device_put(jax, host, device)


def _device_put(jax, x, device) -> object:
    """``jax.device_put(x, device)`` keeping 64-bit data 64-bit (jax narrows it to 32 bits
    without x64 enabled, also when moving a 64-bit ``jax.Array`` to another device)."""
    if np.dtype(x.dtype).itemsize == 8:
        with _x64():
            return jax.device_put(x, device)
    return jax.device_put(x, device)


@functools.cache
def _host_put(device):
    """``put(host_array) -> jax.Array`` on ``device``, or None where this jaxlib lacks it.

    ``jax.device_put`` of a NumPy array spends ~30 µs in Python (tree handling, sharding
    checks) around one call to jaxlib's ``batched_device_put``, which copies the host data;
    calling that directly costs ~3 µs, which matters for a ~50 µs training step."""
    try:
        from jax.core import ShapedArray  # noqa: PLC0415 - jax loads only when a program compiles or compares

        # imported here: jax loads only when a program compiles or compares
        from jax.sharding import SingleDeviceSharding  # noqa: PLC0415
        from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

        sharding = SingleDeviceSharding(device)
        batched_device_put = xc.batched_device_put
    except (ImportError, AttributeError):
        return None
    targets = [device]

    def put(host: np.ndarray):
        return batched_device_put(
            ShapedArray(host.shape, host.dtype),
            sharding,
            [host],
            targets,
            True,
            enable_x64=host.dtype.itemsize == 8,
        )

    try:  # a jaxlib whose signature differs falls back to jax.device_put
        put(np.zeros((1,), np.float32))
    except TypeError:
        return None
    return put


def to_host(x) -> np.ndarray:
    """A device array's data as a NumPy array (copied to the host)."""
    return np.asarray(x)


# ----------------------------------------------------------------------- DLPack


def from_dlpack(x) -> object:
    """A ``jax.Array`` of a foreign array (a PyTorch tensor, ...) through DLPack: the memory is
    shared, not copied, where the device and layout allow. A tensor that records gradients is
    taken detached (kaun_ir differentiates its own graphs); a non-contiguous one is copied into a
    contiguous one first."""
    jax = backend.jax_module()
    if getattr(x, "requires_grad", False) and hasattr(x, "detach"):
        x = x.detach()
    # jaxlib reads a strided (e.g. transposed) tensor as if it were row-major — silently wrong
    # values — so anything not known to be contiguous is made contiguous first.
    contiguous = getattr(x, "is_contiguous", None)
    if callable(contiguous) and not contiguous():
        x = x.contiguous()
    elif contiguous is None and not _c_contiguous_flag(x):
        raise TypeError(
            f"cannot take a {type(x).__module__}.{type(x).__name__} through DLPack: it does not "
            "say whether it is contiguous (convert it to a NumPy array or a contiguous tensor)"
        )
    try:
        with _x64():  # without it jax narrows 64-bit data to 32 bits
            return jax.dlpack.from_dlpack(x)
    except Exception as err:  # noqa: BLE001 - each library raises its own types
        raise TypeError(
            f"cannot take a {type(x).__module__}.{type(x).__name__} through DLPack: {err}"
        ) from None


def _c_contiguous_flag(x) -> bool:
    """Whether an array without ``is_contiguous`` says it is C-contiguous (NumPy-style ``flags``)."""
    flags = getattr(x, "flags", None)
    try:
        return bool(flags["C_CONTIGUOUS"]) if flags is not None else bool(x.flags.c_contiguous)
    except (AttributeError, KeyError, TypeError):
        return False


# ----------------------------------------------------------------------- global arrays (meshes)


def put_sharded(x, dtype: np.dtype, sharding) -> object:
    """``x`` as a global ``jax.Array`` of ``dtype`` laid out as ``sharding``: passed through when it
    already is, re-laid out by the runtime when it is a device array laid out otherwise, and
    built piece by piece from host data (every process holding the same global value)."""
    jax = backend.jax_module()
    if isinstance(x, jax.Array):
        if x.dtype == dtype:
            if x.sharding == sharding:
                return x
            if x.is_fully_addressable == sharding.is_fully_addressable:
                return jax.device_put(x, sharding)
            if not x.is_fully_addressable:
                raise TypeError(
                    f"an array spread over several processes ({x.sharding}) cannot be laid "
                    f"out as {sharding} here; pass it laid out as the function expects"
                )
            # a process-local array (e.g. freshly initialised parameters, the same in every
            # process) becomes a global one through the host: the runtime moves no data
            # between processes
        elif not x.is_fully_addressable:
            raise TypeError(
                f"a {x.dtype} array spread over several processes cannot be converted to "
                f"{dtype} here; pass it as {dtype}"
            )
    host = np.asarray(x, dtype=dtype)
    if dtype.itemsize == 8:  # jax would silently narrow 64-bit data without x64 enabled
        with _x64():
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def array_from_callback(shape: tuple, sharding, piece) -> object:
    """A global array of ``shape`` laid out as ``sharding``, built from ``piece(index)`` (the
    host data of the region ``index``, a tuple of slices) for each device of this process."""
    return backend.jax_module().make_array_from_callback(tuple(shape), sharding, piece)


def from_process_local(local, dtype: np.dtype, sharding, global_shape: tuple | None = None) -> object:
    """A global array from this process's part of it (the data-parallel batch of a multi-process
    run: every process passes its own rows of dimension 0, in process order); ``global_shape``
    defaults to what ``sharding`` implies."""
    jax = backend.jax_module()
    return jax.make_array_from_process_local_data(sharding, np.asarray(local, dtype=dtype), global_shape)


# ----------------------------------------------------------------------- arrays of many processes


def local_copy(x) -> np.ndarray | None:
    """The whole value of a device array as a NumPy array when this process can read it without
    communicating (every piece is on its devices, or the array is replicated), else None."""
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    sharding = getattr(x, "sharding", None)
    if sharding is not None and sharding.is_fully_replicated:
        return np.asarray(x.addressable_shards[0].data)
    return None


def array_mesh(x) -> tuple | None:
    """``(device grid, axis names)`` of the mesh a device array is laid out on (a
    ``NamedSharding``), or None for any other layout."""
    from jax.sharding import NamedSharding  # noqa: PLC0415 - jax loads only when a program compiles

    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    return sharding.mesh.devices, tuple(sharding.mesh.axis_names)

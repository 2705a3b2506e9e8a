"""Compiling StableHLO into XLA executables and running them: compile options for one device or
a partitioned mesh, the persistent cache around the compiler, fast executors, and what XLA
reports about a compiled program (optimised HLO, memory and cost statistics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kaun_ir.runtime import disk_cache


def compile(mlir_text: str, device) -> object:
    """Compile StableHLO text for one device; returns a loaded executable (raises on failure).

    The device assignment names ``device``: without it XLA assigns the single replica to the
    client's first device and refuses buffers that live anywhere else. With the persistent
    cache on (the default), the executable comes from it when an
    identical compilation was stored there (see :mod:`kaun_ir.runtime.disk_cache`)."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    options = xc.CompileOptions()
    options.device_assignment = xc.DeviceAssignment.create(np.array([[device.id]]))
    return _compile_cached(mlir_text, (device,), options)


def compile_partitioned(mlir_text: str, devices: Sequence, shardy: bool = True) -> object:
    """Compile a module carrying Shardy shardings for ``devices`` (one SPMD program, one
    partition per device, in mesh order); XLA's partitioner splits it and inserts collectives.
    Result shardings the module leaves open are chosen by XLA's propagation."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    count = len(devices)
    options = xc.CompileOptions()
    options.num_replicas, options.num_partitions = 1, count
    options.device_assignment = xc.DeviceAssignment.create(np.array([[d.id for d in devices]]))
    build = options.executable_build_options
    build.num_replicas, build.num_partitions = 1, count
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = shardy
    build.allow_spmd_sharding_propagation_to_output = [True]
    return _compile_cached(mlir_text, tuple(devices), options)


def _compile_cached(mlir_text: str, devices: tuple, options) -> object:
    """Compile through the persistent cache, which stores executables as bytes and loads them
    back for the same devices and options."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    pjrt = devices[0].client
    device_list = xc.DeviceList(devices)
    return disk_cache.compile_cached(
        mlir_text,
        devices,
        options.SerializeAsString(),
        compile_fn=lambda: pjrt.compile_and_load(mlir_text, device_list, options),
        save=pjrt.serialize_executable,
        load=lambda data: pjrt.deserialize_executable(data, device_list, options),
    )


# ----------------------------------------------------------------------- running executables


def execute(executable, arrays: Sequence) -> list:
    """Run a loaded executable on device arrays; returns device arrays (``jax.Array``)."""
    return executable.execute(list(arrays))


def executor(executable, out_types: Sequence[tuple], device):
    """A fast ``run(arrays: list) -> list of jax.Array`` for one loaded executable whose outputs
    have the types ``out_types`` (``(shape, numpy dtype)`` pairs) on ``device``.

    jaxlib's generic ``execute`` builds each output array in Python (a sharding object per
    output, about 2 µs each); here the outputs are made by jaxlib's C++ result handlers, built
    once per executable, as jax's own C++ dispatch does. Falls back to
    :func:`execute` where this jaxlib lacks those handlers."""
    make_handler = _result_handler_factory()
    if make_handler is None:
        return executable.execute
    # imported here: jax loads only when a program compiles or compares
    from jax.sharding import SingleDeviceSharding  # noqa: PLC0415

    sharding = SingleDeviceSharding(device)
    return _consuming(executable, make_handler, out_types, [sharding] * len(out_types))


def partitioned_executor(executable, out_types: Sequence[tuple], shardings: Sequence):
    """``run(global arrays) -> list of global jax.Array`` for a partitioned executable whose
    outputs have the types ``out_types`` laid out as ``shardings``."""
    make_handler = _result_handler_factory()
    if make_handler is None:
        raise RuntimeError("this jaxlib has no array_result_handler; sharded execution needs it")
    return _consuming(executable, make_handler, out_types, shardings)


def _consuming(executable, make_handler, out_types: Sequence[tuple], shardings: Sequence):
    """``run(arrays)`` turning the executable's results into arrays with one C++ result handler
    per output (built here, once)."""
    from jax.core import ShapedArray  # noqa: PLC0415 - jax loads only when a program compiles or compares

    handlers = [
        _handler(make_handler, ShapedArray(tuple(shape), np.dtype(dtype)), sharding)
        for (shape, dtype), sharding in zip(out_types, shardings)
    ]
    run_sharded = executable.execute_sharded

    def run(arrays: list) -> list:
        return run_sharded(arrays).consume_with_handlers(handlers)

    return run


#: Whether this jaxlib's ``array_result_handler`` takes ``_skip_checks`` (jaxlib <= 0.10; from
#: 0.11 on it has no such argument and skips the checks itself); None until first asked.
_SKIP_CHECKS_ARG: list = [None]


def _handler(make_handler, aval, sharding):
    """One C++ result handler: ``_skip_checks=True`` where this jaxlib takes the argument (its
    checks are redundant, the types are ours), the three-argument form where it does not."""
    if _SKIP_CHECKS_ARG[0] is not False:
        try:
            handler = make_handler(aval, sharding, committed=True, _skip_checks=True)
        except TypeError:  # jaxlib >= 0.11: (aval, sharding, committed) only
            _SKIP_CHECKS_ARG[0] = False
        else:
            _SKIP_CHECKS_ARG[0] = True
            return handler
    return make_handler(aval, sharding, committed=True)


def _result_handler_factory():
    """jaxlib's ``array_result_handler`` (C++), or None where this jaxlib has none."""
    try:
        from jax.core import ShapedArray  # noqa: PLC0415, F401 - the handlers are built with it
        from jax.sharding import SingleDeviceSharding  # noqa: PLC0415, F401
        from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles
    except ImportError:
        return None
    return getattr(xc, "array_result_handler", None)


# ----------------------------------------------------------------------- what XLA reports


def hlo_text(executable) -> str:
    """XLA's optimised HLO of a compiled executable."""
    return "\n".join(m.to_string() for m in executable.hlo_modules())


def memory_analysis(executable) -> dict | None:
    """XLA's compiled memory analysis of a loaded executable in bytes: ``argument``, ``output``,
    ``temp``, ``alias`` and ``total_bytes = argument + output + temp - alias``; None where the
    platform keeps no such statistics."""
    try:
        stats = executable.get_compiled_memory_stats()
    except Exception:  # jaxlib raises its own runtime error types where this is unsupported
        return None
    return memory_stats_dict(stats)


def memory_stats_dict(stats) -> dict:
    """XLA's ``CompiledMemoryStats`` (ours or jax's) as a dict; see :func:`memory_analysis`."""
    out = {
        key: int(getattr(stats, f"{key}_size_in_bytes")) for key in ("argument", "output", "temp", "alias")
    }
    out["total_bytes"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


def cost_analysis(executable) -> dict:
    """XLA's cost estimate (flops, bytes accessed, ...) of a compiled executable."""
    result = executable.cost_analysis()
    if isinstance(result, list):
        result = result[0] if result else {}
    return dict(result)

"""The one adapter between kaun_ir and jaxlib: PJRT client, compile, execute, MLIR bindings.

Everything that touches jaxlib's API lives here, so a jaxlib upgrade touches one file. The
public modules do most of it: ``jax.extend.backend`` for the PJRT client (whose
``compile_and_load`` / ``execute`` / ``hlo_modules`` we call), ``jaxlib.xla_client`` for
compile options, device assignments and ``HloSharding``, ``jax.device_put`` /
``jax.make_array_from_callback`` / ``jax.sharding`` for arrays, ``jax.distributed`` for
multi-process runs, and the MLIR Python bindings shipped in jaxlib (``jaxlib.mlir.ir``,
``.passmanager``, ``.dialects.stablehlo``) for parsing and serialising StableHLO.

Four entry points are private to jaxlib (a leading underscore, or undocumented internals of
jax's own dispatch). Each sits in one function; where a jaxlib lacks the last two, the code
falls back to the generic ``execute`` and to ``jax.device_put``:

- ``jaxlib.mlir._mlir_libs._jax_mlir_ext.register_dialects`` (:func:`mlir_context`): registers
  the upstream MLIR dialects jaxlib was built with (``func`` above all: every module's
  ``func.func @main``) in a context; the public bindings register StableHLO, CHLO and Shardy
  but offer no registration for ``func`` (without it no module parses). jax builds its own
  contexts the same way.
- ``jaxlib.mlir._mlir_libs._stablehlo.register_stablehlo_passes`` (:func:`legalize_chlo`):
  registers the StableHLO passes so that ``chlo-legalize-to-stablehlo`` can run before a
  portable artifact is written (CHLO ops such as ``chlo.erf`` have no portable form); the
  public bindings expose no other way to register them.
- ``xla_client.array_result_handler`` with ``_skip_checks=True``, used through an executable's
  ``execute_sharded(...).consume_with_handlers`` (:func:`executor`,
  :func:`partitioned_executor`): jaxlib's C++ result handlers, which jax's own dispatch uses
  to turn results into ``jax.Array`` s without Python work per output (about 2 µs each with the
  generic ``execute``); the types are ours and already checked.
- ``xla_client.batched_device_put`` (:func:`to_device` via ``_host_put``): the C++ host-to-
  device copy under ``jax.device_put``; calling it directly costs about 3 µs instead of about
  30 µs of tree and sharding handling, which matters for a step of about 50 µs.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence

import numpy as np

# jaxlib's C++ logging reads TF_CPP_MIN_LOG_LEVEL when it first logs. ``import jax`` sets it to
# 1 (warnings and errors, no INFO), but the MLIR bindings and xla_client load jaxlib without jax,
# after which creating a PJRT client printed INFO lines ("PjRt-IFRT device count ..."). The same
# default as jax's, set before anything here loads jaxlib; a level the user set wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

_BACKEND_ENV = "KAUN_IR_BACKEND"
_PREFERENCE = ("gpu", "tpu", "cpu")


@functools.cache
def _jax():
    import jax  # imported lazily: `import kaun_ir` stays cheap and jax-free until needed

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
    from jax.extend import backend as jex_backend

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
    from jax.extend import backend as jex_backend

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


def compile(mlir_text: str, device) -> object:
    """Compile StableHLO text for one device; returns a loaded executable (raises on failure).

    The device assignment names ``device``: without it XLA assigns the single replica to the
    client's first device and refuses buffers that live anywhere else. With
    ``KAUN_IR_CACHE_DIR`` set, the executable comes from the persistent cache when an
    identical compilation was stored there (see :mod:`kaun_ir.runtime.disk_cache`)."""
    from jaxlib import xla_client as xc

    from kaun_ir.runtime import disk_cache

    options = xc.CompileOptions()
    options.device_assignment = xc.DeviceAssignment.create(np.array([[device.id]]))
    pjrt = device.client
    device_list = xc.DeviceList((device,))
    return disk_cache.compile_cached(
        pjrt, mlir_text, device_list, options, lambda: pjrt.compile_and_load(mlir_text, device_list, options)
    )


def compile_partitioned(mlir_text: str, devices: Sequence, shardy: bool = True) -> object:
    """Compile a module carrying Shardy shardings for ``devices`` (one SPMD program, one
    partition per device, in mesh order); XLA's partitioner splits it and inserts collectives.
    Result shardings the module leaves open are chosen by XLA's propagation."""
    from jaxlib import xla_client as xc

    from kaun_ir.runtime import disk_cache

    count = len(devices)
    options = xc.CompileOptions()
    options.num_replicas, options.num_partitions = 1, count
    options.device_assignment = xc.DeviceAssignment.create(np.array([[d.id for d in devices]]))
    build = options.executable_build_options
    build.num_replicas, build.num_partitions = 1, count
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = shardy
    build.allow_spmd_sharding_propagation_to_output = [True]
    pjrt = devices[0].client
    device_list = xc.DeviceList(tuple(devices))
    return disk_cache.compile_cached(
        pjrt, mlir_text, device_list, options, lambda: pjrt.compile_and_load(mlir_text, device_list, options)
    )


# ----------------------------------------------------------------------- shardings (jax.Array)


def single_device_sharding(device):
    """jax's sharding of an array held whole by ``device``."""
    from jax.sharding import SingleDeviceSharding

    return SingleDeviceSharding(device)


def named_sharding(mesh, spec):
    """jax's ``NamedSharding`` of a kaun_ir ``Mesh`` and ``Spec`` (the container of results)."""
    from jax.sharding import Mesh as JaxMesh
    from jax.sharding import NamedSharding, PartitionSpec

    jax_mesh = mesh.__dict__.get("_jax_mesh")
    if jax_mesh is None:
        jax_mesh = JaxMesh(mesh.devices, mesh.axis_names)
        mesh.__dict__["_jax_mesh"] = jax_mesh
    entries = [None if not d else d[0] if len(d) == 1 else d for d in spec.dims]
    return NamedSharding(jax_mesh, PartitionSpec(*entries))


def spec_on_mesh(array, mesh):
    """The partition spec of a ``jax.Array`` laid out over ``mesh`` (same devices in the same
    order and the same axis names), or None when it lives elsewhere or is laid out otherwise."""
    from jax.sharding import NamedSharding

    from kaun_ir.runtime.mesh import Spec

    sharding = getattr(array, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    if tuple(sharding.mesh.axis_names) != mesh.axis_names or sharding.mesh.devices.shape != mesh.shape:
        return None
    if any(a is not b for a, b in zip(sharding.mesh.devices.flat, mesh.devices.flat)):
        return None
    return Spec(*list(sharding.spec))


def put_sharded(x, dtype: np.dtype, sharding) -> object:
    """``x`` as a global ``jax.Array`` of ``dtype`` laid out as ``sharding``: passed through when it
    already is, re-laid out by the runtime when it is a device array laid out otherwise, and
    built piece by piece from host data (every process holding the same global value)."""
    jax = _jax()
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
    return _jax().make_array_from_callback(tuple(shape), sharding, piece)


def from_process_local(local, dtype: np.dtype, sharding, global_shape: tuple | None = None) -> object:
    """A global array from this process's part of it (the data-parallel batch of a multi-process
    run: every process passes its own rows of dimension 0, in process order); ``global_shape``
    defaults to what ``sharding`` implies."""
    jax = _jax()
    return jax.make_array_from_process_local_data(sharding, np.asarray(local, dtype=dtype), global_shape)


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
    import jax

    if client.cache_info().currsize:
        raise RuntimeError(
            "kn.distributed.initialize must be called before any computation: this "
            "process already started its XLA backend"
        )
    jax.distributed.initialize(
        coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=timeout_s,
    )


def distributed_initialized() -> bool:
    """Whether this process has joined a multi-process run (:func:`initialize_distributed`)."""
    import jax

    return bool(jax.distributed.is_initialized())


def shutdown_distributed() -> None:
    """Leave the multi-process run (and stop the coordination service in process 0)."""
    import jax

    jax.distributed.shutdown()


def _hlo_sharding_of(mesh, spec, rank: int):
    """The ``HloSharding`` that ``spec`` on ``mesh`` means, with device positions in mesh order."""
    from jaxlib import xla_client as xc

    names = list(mesh.axis_names)
    dims = spec.padded(rank)
    used = [names.index(a) for axes in dims for a in axes]
    if not used:
        return xc.HloSharding.replicate()
    rest = [i for i in range(len(names)) if i not in used]
    sizes = dict(mesh.axes)
    tile = [int(np.prod([sizes[a] for a in axes])) for axes in dims]
    replicas = int(np.prod([mesh.shape[i] for i in rest]))
    order = np.arange(mesh.size).reshape(mesh.shape).transpose(used + rest).reshape(-1)
    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = tile + ([replicas] if replicas > 1 else [])
    proto.replicate_on_last_tile_dim = replicas > 1
    proto.tile_assignment_devices = [int(i) for i in order]
    return xc.HloSharding.from_proto(proto)


def _candidate_specs(mesh, rank: int):
    """Every spec of a rank-``rank`` array on ``mesh`` (each axis on one dimension or none, the
    axes of one dimension in every order), simplest first."""
    import itertools

    from kaun_ir.runtime.mesh import Spec

    names = mesh.axis_names
    seen = set()
    for placement in itertools.product(range(rank + 1), repeat=len(names)):
        groups = [[n for n, p in zip(names, placement) if p == d] for d in range(rank)]
        for orders in itertools.product(*[list(itertools.permutations(g)) for g in groups]):
            spec = Spec(*[tuple(o) if o else None for o in orders])
            if spec not in seen:
                seen.add(spec)
                yield spec


def output_specs(executable, mesh, ranks: Sequence[int]) -> list:
    """The spec XLA chose for each output of a partitioned executable, as a ``Spec`` on
    ``mesh``; None for an output whose layout no spec on ``mesh`` describes."""
    from jaxlib import xla_client as xc

    from kaun_ir.runtime.mesh import REPLICATED

    protos = executable.get_output_shardings()
    if protos is None:  # XLA keeps none for a one-device program: everything is whole there
        return [REPLICATED if mesh.size == 1 else None for _ in ranks]
    chosen = [xc.HloSharding.from_proto(p) for p in protos]
    specs = []
    for hlo, rank in zip(chosen, ranks):
        found = None
        if hlo.is_replicated():
            found = REPLICATED
        else:
            for spec in _candidate_specs(mesh, rank):
                if _hlo_sharding_of(mesh, spec, rank) == hlo:
                    found = spec
                    break
        specs.append(found)
    return specs


def partitioned_executor(executable, out_types: Sequence[tuple], shardings: Sequence):
    """``run(global arrays) -> list of global jax.Array`` for a partitioned executable whose
    outputs have the types ``out_types`` laid out as ``shardings``."""
    make_handler = _result_handler_factory()
    if make_handler is None:
        raise RuntimeError("this jaxlib has no array_result_handler; sharded execution needs it")
    from jax.core import ShapedArray

    handlers = [
        make_handler(ShapedArray(tuple(shape), np.dtype(dtype)), sharding, committed=True, _skip_checks=True)
        for (shape, dtype), sharding in zip(out_types, shardings)
    ]
    run_sharded = executable.execute_sharded

    def run(arrays: list) -> list:
        return run_sharded(arrays).consume_with_handlers(handlers)

    return run


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
    from jax.core import ShapedArray
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    handlers = [
        make_handler(ShapedArray(tuple(shape), np.dtype(dtype)), sharding, committed=True, _skip_checks=True)
        for shape, dtype in out_types
    ]
    run_sharded = executable.execute_sharded

    def run(arrays: list) -> list:
        return run_sharded(arrays).consume_with_handlers(handlers)

    return run


def _result_handler_factory():
    """jaxlib's ``array_result_handler`` (C++), or None where this jaxlib has none."""
    try:
        from jax.core import ShapedArray  # noqa: F401 - needed by the caller too
        from jax.sharding import SingleDeviceSharding  # noqa: F401
        from jaxlib import xla_client as xc
    except ImportError:
        return None
    return getattr(xc, "array_result_handler", None)


@functools.cache
def array_types() -> tuple[type, ...]:
    """Concrete array classes that may be passed straight through: (np.ndarray, jax's Array)."""
    jax = _jax()
    return (np.ndarray, type(jax.device_put(np.zeros((), np.float32), default_device())))


def is_device_array(x) -> bool:
    """Whether ``x`` is a ``jax.Array`` (an array held by an XLA device)."""
    return isinstance(x, _jax().Array)


def _x64():
    jax = _jax()
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # older releases

    return enable_x64()


def from_dlpack(x) -> object:
    """A ``jax.Array`` of a foreign array (a PyTorch tensor, ...) through DLPack: the memory is
    shared, not copied, where the device and layout allow. A tensor that records gradients is
    taken detached (kaun_ir differentiates its own graphs); a non-contiguous one is copied into a
    contiguous one first."""
    jax = _jax()
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


def to_device(x, dtype: np.dtype, device) -> object:
    """``x`` (NumPy, scalar, jax.Array or a DLPack array such as a PyTorch tensor) as a device
    array of ``dtype`` on ``device``."""
    jax = _jax()
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
            return jax.device_put(x, device)
    host = np.asarray(x, dtype=dtype)
    put = _host_put(device)
    if put is not None:
        return put(host)
    if dtype.itemsize == 8:  # jax would silently narrow 64-bit data without x64 enabled
        with _x64():
            return jax.device_put(host, device)
    return jax.device_put(host, device)


@functools.cache
def _host_put(device):
    """``put(host_array) -> jax.Array`` on ``device``, or None where this jaxlib lacks it.

    ``jax.device_put`` of a NumPy array spends ~30 µs in Python (tree handling, sharding
    checks) around one call to jaxlib's ``batched_device_put``, which copies the host data;
    calling that directly costs ~3 µs, which matters for a ~50 µs training step."""
    try:
        from jax.core import ShapedArray
        from jax.sharding import SingleDeviceSharding
        from jaxlib import xla_client as xc

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


# ----------------------------------------------------------------------- MLIR bindings (jaxlib)


@contextlib.contextmanager
def mlir_context():
    """An MLIR context with the func, StableHLO, CHLO and Shardy dialects loaded."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import chlo, stablehlo

    registry = ir.DialectRegistry()
    try:
        from jaxlib.mlir._mlir_libs import _jax_mlir_ext

        _jax_mlir_ext.register_dialects(registry)
    except ImportError:  # older jaxlib layouts
        pass
    with ir.Context() as ctx:
        ctx.append_dialect_registry(registry)
        ctx.load_all_available_dialects()
        stablehlo.register_dialect(ctx)
        chlo.register_dialect(ctx)
        _register_optional_dialects(ctx)
        yield ctx


def _register_optional_dialects(ctx) -> None:
    """Shardy (``sdy``) and MHLO, which modules written by JAX mention; absent from some jaxlibs."""
    try:
        from jaxlib.mlir.dialects import sdy

        sdy.register_dialect(ctx)
    except (ImportError, AttributeError):
        pass
    try:
        from jaxlib.mlir.dialects import mhlo

        mhlo.register_mhlo_dialect(ctx)
    except (ImportError, AttributeError):
        pass


@contextlib.contextmanager
def open_module(data: str | bytes):
    """Parse a StableHLO module — text, MLIR bytecode or a portable (versioned) artifact — and
    yield the ``ir.Module`` while its context is live. Raises ``ValueError`` with MLIR's diagnostic."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with mlir_context() as ctx, ir.Location.unknown():
        module = None
        if isinstance(data, (bytes, bytearray)):
            try:
                module = stablehlo.deserialize_portable_artifact(ctx, bytes(data))
            except Exception:  # not a portable artifact: plain MLIR bytecode or text
                module = None
        if module is None:
            try:
                module = ir.Module.parse(data)
            except Exception as err:  # MLIRError: diagnostics in the message
                raise ValueError(f"StableHLO does not parse: {err}") from None
        yield module


def legalize_chlo(module) -> None:
    """Rewrite every CHLO op of ``module`` (in place) into StableHLO ops."""
    from jaxlib.mlir import passmanager

    _register_stablehlo_passes()
    pm = passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))")
    pm.run(module.operation)


@functools.cache
def _register_stablehlo_passes() -> None:
    from jaxlib.mlir._mlir_libs import _stablehlo

    _stablehlo.register_stablehlo_passes()


def parse_mlir(text: str) -> str:
    """Parse and verify StableHLO text with jaxlib's MLIR bindings; returns the pretty form.

    Raises ``ValueError`` with MLIR's diagnostic if the text does not parse or verify.
    """
    from jaxlib.mlir import ir

    with mlir_context():
        try:
            module = ir.Module.parse(text)
        except Exception as err:  # MLIRError: diagnostics in the message
            raise ValueError(f"StableHLO does not parse: {err}") from None
        if not module.operation.verify():
            raise ValueError("StableHLO does not verify")
        return str(module)


def serialize_portable(text: str) -> bytes:
    """A portable StableHLO artifact (versioned bytecode) of the module, for other consumers.

    CHLO ops (``chlo.erf``) have no portable form, so they are first rewritten into StableHLO.
    The artifact targets the oldest StableHLO version that can express the module (the minimum
    version the installed jaxlib supports, else its current one); sharding annotations (Shardy
    ``sdy`` ops) are kept as non-StableHLO ops, as ``jax.export`` does. Raises ``ValueError``
    naming every attempt when none succeeds.
    """
    from jaxlib.mlir.dialects import stablehlo

    with open_module(text) as module:
        legalize_chlo(module)
        errors = []
        targets = dict.fromkeys([stablehlo.get_minimum_version(), stablehlo.get_current_version()])
        # pure StableHLO first; sharding annotations (Shardy ops) only travel with other dialects allowed
        for other_dialects in (True,) if "sdy." in text else (False, True):
            for target in targets:
                try:
                    # the module object itself: locations (layer paths) stay, no text round trip
                    return stablehlo.serialize_portable_artifact(module, target, other_dialects)
                except Exception as err:
                    errors.append(
                        f"version {target}{' with other dialects' if other_dialects else ''}: {err}"
                    )
        raise ValueError(
            "the module cannot be written as a portable StableHLO artifact: " + "; ".join(errors)
        )


def deserialize_portable(data: bytes) -> bytes:
    """The module in a portable artifact, as MLIR bytecode that :func:`compile` accepts."""
    import io

    from jaxlib.mlir.dialects import stablehlo

    with mlir_context() as ctx:  # the context knows Shardy, which artifacts with shardings hold
        module = stablehlo.deserialize_portable_artifact(ctx, bytes(data))
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()

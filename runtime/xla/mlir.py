"""jaxlib's MLIR bindings: contexts with the dialects kaun_ir reads and writes, parsing and
verifying StableHLO, portable (versioned) artifacts, and the attribute and type readers the
StableHLO importer (:mod:`kaun_ir.runtime.interop.stablehlo_import`) walks a module with.

Untrusted input passes two guards first: a check of the bytecode's frame
(:mod:`~kaun_ir.runtime.xla.mlir_bytecode`) and a read in a helper process
(:mod:`~kaun_ir.runtime.xla.mlir_helper`, which runs :func:`helper_main` here). Shardy's
sharding propagation is in :mod:`~kaun_ir.runtime.xla.shardings`."""

from __future__ import annotations

import contextlib
import functools
import io

from kaun_ir.runtime.xla.mlir_bytecode import BYTECODE_MAGIC, bytecode_producer
from kaun_ir.runtime.xla.mlir_helper import read_in_helper, stop_helper

# the guards' entry points, used through this module by the importers and tests
__all__ = [
    "BYTECODE_MAGIC",
    "bytecode_producer",
    "bool_value",
    "deserialize_portable",
    "dimension_numbers",
    "helper_main",
    "integer_value",
    "is_splat",
    "legalize_chlo",
    "mlir_context",
    "open_module",
    "parse_mlir",
    "ranked_tensor",
    "read_in_helper",
    "serialize_portable",
    "stop_helper",
]


@contextlib.contextmanager
def mlir_context():
    """An MLIR context with the func, StableHLO, CHLO and Shardy dialects loaded."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    # imported here: jaxlib loads only when a program compiles
    from jaxlib.mlir.dialects import chlo, stablehlo  # noqa: PLC0415

    registry = ir.DialectRegistry()
    try:
        # imported here: jaxlib loads only when a program compiles
        from jaxlib.mlir._mlir_libs import _jax_mlir_ext  # noqa: PLC0415

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
        from jaxlib.mlir.dialects import sdy  # noqa: PLC0415 - jaxlib loads only when a program compiles

        sdy.register_dialect(ctx)
    except (ImportError, AttributeError):
        pass
    try:
        from jaxlib.mlir.dialects import mhlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

        mhlo.register_mhlo_dialect(ctx)
    except (ImportError, AttributeError):
        pass


@contextlib.contextmanager
def open_module(data: str | bytes, source: str = "the module", trusted: bool = False):
    """Parse a StableHLO module — text, MLIR bytecode or a portable (versioned) artifact — and
    yield the ``ir.Module`` while its context is live. Raises ``ValueError`` with MLIR's diagnostic
    (``source`` names the input in it).

    The input is untrusted. MLIR's readers can end the process on damaged input: they abort
    (``std::terminate``) when a diagnostic is not UTF-8, and the bytecode reader can crash on
    flipped bytes. So after a check of the bytecode's frame (:func:`bytecode_producer`) the input
    is read by a helper process (:func:`read_in_helper`), which answers with MLIR's own printing
    of the module; only that text is parsed here. ``trusted`` (text kaun_ir lowered itself) and
    artifacts this process serialised skip the helper."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    if isinstance(data, (bytes, bytearray)):
        data = bytes(data)
        if not data.startswith(BYTECODE_MAGIC):
            try:
                data = data.decode()
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{source} is neither MLIR bytecode nor UTF-8 text ({err.reason} at byte {err.start})"
                ) from None
    portable = isinstance(data, bytes) and bytecode_producer(data, source).startswith("StableHLO_v")
    if not trusted and _digest(data) not in _TRUSTED:
        data, portable = read_in_helper(data, source), False
    with mlir_context() as ctx, ir.Location.unknown():
        if portable:
            module = _deserialize_quietly(ctx, data, source)
        else:
            try:
                module = ir.Module.parse(data)
            except Exception as err:  # MLIRError: diagnostics in the message
                raise ValueError(f"{source} does not parse as StableHLO: {err}") from None
        yield module


def _read(ctx, data: str | bytes, source: str):
    """The module in ``data`` (in the helper process: any input)."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    if isinstance(data, bytes) and bytecode_producer(data, source).startswith("StableHLO_v"):
        return _deserialize_quietly(ctx, data, source)
    try:
        return ir.Module.parse(data)
    except Exception as err:  # MLIRError: diagnostics in the message
        raise ValueError(f"{source} does not parse as StableHLO: {err}") from None


# Digests of the portable artifacts this process serialised itself: read in-process directly (a
# set of at most _TRUSTED_MAX entries, cleared when full).
_TRUSTED: set[bytes] = set()
_TRUSTED_MAX = 4096


def _digest(data: str | bytes) -> bytes:
    import hashlib  # noqa: PLC0415 - only imports read modules

    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.blake2b(raw, digest_size=16).digest()


def _trust(data: str | bytes) -> None:
    if len(_TRUSTED) >= _TRUSTED_MAX:
        _TRUSTED.clear()
    _TRUSTED.add(_digest(data))


def _deserialize_quietly(ctx, data: bytes, source: str):
    """``stablehlo.deserialize_portable_artifact`` with a diagnostic handler that keeps the
    messages (those that are UTF-8) instead of letting the bindings convert them."""
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

    messages: list[str] = []

    def keep(diagnostic) -> bool:
        try:
            messages.append(str(diagnostic.message))
        except Exception:  # noqa: BLE001 - a message that is not UTF-8 (what aborts the bindings)
            messages.append("(a diagnostic that is not UTF-8)")
        return True

    handler = ctx.attach_diagnostic_handler(keep)
    try:
        return stablehlo.deserialize_portable_artifact(ctx, data)
    except Exception:  # noqa: BLE001 - the bindings' ValueError; the diagnostics say why
        detail = "; ".join(dict.fromkeys(messages)) or "it does not deserialise"
        raise ValueError(f"{source} is not a valid portable StableHLO artifact: {detail}") from None
    finally:
        handler.detach()


# ----------------------------------------------------------------------- the helper process


def helper_main() -> None:
    """The helper process: read ``(kind, length, payload)`` requests from stdin, read each module
    in a fresh context and answer ``(status, length, text)``: MLIR's printing of the module (with
    its locations), or the error. A read that kills the helper is the parent's answer."""
    import struct  # noqa: PLC0415 - only the helper process needs it
    import sys  # noqa: PLC0415 - only the helper process needs it

    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    if sys.platform.startswith("linux"):  # end with the parent, also while busy with a long read
        import ctypes  # noqa: PLC0415 - only the helper process needs it
        import signal  # noqa: PLC0415 - only the helper process needs it

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    src, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = src.read(9)
        if len(head) < 9:
            return
        kind, size = head[:1], struct.unpack("<Q", head[1:])[0]
        payload = src.read(size)
        try:
            data = payload.decode() if kind == b"t" else payload
            with mlir_context() as ctx, ir.Location.unknown():
                module = _read(ctx, data, "it")
                if not module.operation.verify():
                    raise ValueError("it does not verify")
                answer = b"0" + module.operation.get_asm(enable_debug_info=True).encode()
        except Exception as err:  # noqa: BLE001 - every failure is the answer
            message = str(err).encode("utf-8", "replace")
            answer = b"1" + message
        out.write(answer[:1] + struct.pack("<Q", len(answer) - 1) + answer[1:])
        out.flush()


def legalize_chlo(module) -> None:
    """Rewrite every CHLO op of ``module`` (in place) into StableHLO ops."""
    from jaxlib.mlir import passmanager  # noqa: PLC0415 - jaxlib loads only when a program compiles

    _register_stablehlo_passes()
    pm = passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))")
    pm.run(module.operation)


@functools.cache
def _register_stablehlo_passes() -> None:
    from jaxlib.mlir._mlir_libs import _stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

    _stablehlo.register_stablehlo_passes()


def parse_mlir(text: str) -> str:
    """Parse and verify StableHLO text with jaxlib's MLIR bindings; returns the pretty form.

    Raises ``ValueError`` with MLIR's diagnostic if the text does not parse or verify.
    """
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    with mlir_context():
        try:
            module = ir.Module.parse(text)
        except Exception as err:  # MLIRError: diagnostics in the message
            raise ValueError(f"StableHLO does not parse: {err}") from None
        if not module.operation.verify():
            raise ValueError("StableHLO does not verify")
        return str(module)


# ----------------------------------------------------------------------- portable artifacts


def serialize_portable(text: str) -> bytes:
    """A portable StableHLO artifact (versioned bytecode) of the module, for other consumers.

    CHLO ops (``chlo.erf``) have no portable form, so they are first rewritten into StableHLO.
    The artifact targets the oldest StableHLO version that can express the module (the minimum
    version the installed jaxlib supports, else its current one); sharding annotations (Shardy
    ``sdy`` ops) are kept as non-StableHLO ops, as ``jax.export`` does. Raises ``ValueError``
    naming every attempt when none succeeds.
    """
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

    with open_module(text, trusted=True) as module:
        legalize_chlo(module)
        errors = []
        targets = dict.fromkeys([stablehlo.get_minimum_version(), stablehlo.get_current_version()])
        # pure StableHLO first; sharding annotations (Shardy ops) only travel with other dialects allowed
        for other_dialects in (True,) if "sdy." in text else (False, True):
            for target in targets:
                try:
                    # the module object itself: locations (layer paths) stay, no text round trip
                    data = stablehlo.serialize_portable_artifact(module, target, other_dialects)
                    _trust(data)  # read back in this process without the helper
                    return data
                except Exception as err:
                    errors.append(
                        f"version {target}{' with other dialects' if other_dialects else ''}: {err}"
                    )
        raise ValueError(
            "the module cannot be written as a portable StableHLO artifact: " + "; ".join(errors)
        )


def deserialize_portable(data: bytes) -> bytes:
    """The module in a portable artifact, as MLIR bytecode that ``compiler.compile`` accepts
    (``ValueError`` if it is not a valid one)."""

    with open_module(bytes(data), "the artifact") as module:
        if module.operation.name != "builtin.module" or any(
            op.operation.name.startswith("vhlo.") for op in module.body.operations
        ):
            raise ValueError("the artifact is MLIR bytecode, not a portable StableHLO artifact")
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()


# ----------------------------------------------------------------------- reading a parsed module


def ranked_tensor(mlir_type) -> tuple[str, tuple[int, ...]]:
    """``(element type, shape)`` of a ranked, static MLIR tensor type, e.g. ``("f32", (2, 3))``;
    ``ValueError`` for any other type."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    try:
        ranked = ir.RankedTensorType(mlir_type)
    except (ValueError, TypeError):
        raise ValueError(f"type {mlir_type} is not a ranked tensor") from None
    if not ranked.has_static_shape:
        raise ValueError(f"type {mlir_type} has a dynamic shape")
    return str(ranked.element_type), tuple(ranked.shape)


def is_splat(attr) -> bool:
    """Whether a dense elements attribute holds one value for every element (False for any other
    attribute)."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    try:
        return bool(ir.DenseElementsAttr(attr).is_splat)
    except (ValueError, TypeError):
        return False


def integer_value(attr) -> int:
    """The value of an MLIR integer attribute."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    return int(ir.IntegerAttr(attr).value)


def bool_value(attr) -> bool:
    """The value of an MLIR boolean attribute."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    return bool(ir.BoolAttr(attr).value)


def dimension_numbers(kind: str, attr):
    """The StableHLO dimension numbers ``attr`` holds, read as the bindings' record of ``kind``
    (``"dot"``, ``"conv"``, ``"gather"`` or ``"scatter"``), whose fields are lists of ints."""
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

    records = {
        "dot": stablehlo.DotDimensionNumbers,
        "conv": stablehlo.ConvDimensionNumbers,
        "gather": stablehlo.GatherDimensionNumbers,
        "scatter": stablehlo.ScatterDimensionNumbers,
    }
    return records[kind](attr)

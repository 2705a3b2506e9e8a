"""jaxlib's MLIR bindings: contexts with the dialects kaun_ir reads and writes, parsing and
verifying StableHLO, portable (versioned) artifacts, and the attribute and type readers the
StableHLO importer (:mod:`kaun_ir.runtime.interop.stablehlo_import`) walks a module with."""

from __future__ import annotations

import contextlib
import functools
import io


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


BYTECODE_MAGIC = b"ML\xefR"
_BYTECODE_VERSIONS = range(0, 32)  # MLIR's bytecode format is at version 6 (MLIR rejects newer ones)
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


def _varint(data: bytes, pos: int, source: str) -> tuple[int, int]:
    """MLIR bytecode's prefix varint at ``pos``: ``(value, next position)``."""
    if pos >= len(data):
        raise ValueError(f"{source}: truncated MLIR bytecode (byte {pos} of {len(data)})")
    first = data[pos]
    extra = 8 if first == 0 else (first & -first).bit_length() - 1  # trailing zero bits
    if pos + 1 + extra > len(data):
        raise ValueError(f"{source}: truncated MLIR bytecode (byte {pos} of {len(data)})")
    if first == 0:
        return int.from_bytes(data[pos + 1 : pos + 9], "little"), pos + 9
    value = int.from_bytes(data[pos : pos + 1 + extra], "little") >> (extra + 1)
    return value, pos + 1 + extra


def bytecode_producer(data: bytes, source: str = "the module") -> str:
    """Check the frame of MLIR bytecode — magic, format version, producer, the sections' lengths
    and that the string section is UTF-8 — and return the producer (``"StableHLO_v1.0.0"`` for a
    portable artifact). Raises ``ValueError`` naming ``source`` and what is wrong."""
    if not data.startswith(BYTECODE_MAGIC):
        raise ValueError(f"{source} is not MLIR bytecode (no 'ML\\xefR' magic)")
    version, pos = _varint(data, len(BYTECODE_MAGIC), source)
    if version not in _BYTECODE_VERSIONS:
        raise ValueError(f"{source}: MLIR bytecode version {version} is not supported")
    end = data.find(b"\0", pos)
    if end < 0:
        raise ValueError(f"{source}: truncated MLIR bytecode (no producer string)")
    try:
        producer = data[pos:end].decode()
    except UnicodeDecodeError:
        raise ValueError(f"{source}: the MLIR bytecode's producer string is not UTF-8") from None
    pos = end + 1
    while pos < len(data):
        section = data[pos]
        section_id, aligned = section & 0x7F, section & 0x80
        length, pos = _varint(data, pos + 1, source)
        if aligned:
            alignment, pos = _varint(data, pos, source)
            if alignment == 0 or alignment & (alignment - 1) or alignment > 256:
                raise ValueError(f"{source}: MLIR bytecode section {section_id} has alignment {alignment}")
            while pos % alignment:  # padding up to the alignment, 0xCB bytes
                if pos >= len(data) or data[pos] != 0xCB:
                    raise ValueError(f"{source}: MLIR bytecode section {section_id} is badly padded")
                pos += 1
        if length > len(data) - pos:
            raise ValueError(
                f"{source}: truncated MLIR bytecode (section {section_id} needs {length} bytes, "
                f"{len(data) - pos} left)"
            )
        if section_id == 0:  # the string section: every string must be UTF-8
            _check_strings(data[pos : pos + length], source)
        pos += length
    return producer


def _check_strings(section: bytes, source: str) -> None:
    """The string section: a count, the strings' sizes (last string first), then the strings,
    each ending in a NUL, packed at the end of the section."""
    count, pos = _varint(section, 0, source)
    if count > len(section):
        raise ValueError(f"{source}: MLIR bytecode string section claims {count} strings")
    end = len(section)
    for index in range(count):
        size, pos = _varint(section, pos, source)
        if size < 1 or size > end - pos:
            raise ValueError(f"{source}: MLIR bytecode string section is inconsistent")
        try:
            section[end - size : end - 1].decode()
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{source}: MLIR bytecode string {count - 1 - index} is not UTF-8 ({err.reason})"
            ) from None
        end -= size


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

# What the helper runs: read (kind, length, payload) requests from stdin, parse each payload in a
# fresh context, answer (status, length, message). A parse that kills it is the parent's answer.
_HELPER = "from kaun_ir.runtime.xla.mlir import helper_main; helper_main()"


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


# Bounds on reading one module in the helper (beyond them it is an error): CPU seconds, the base
# plus so many per MiB of input (the measure that holds on a loaded machine), and wall-clock seconds.
HELPER_CPU_S = 10.0
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


# ----------------------------------------------------------------------- sharding propagation


def propagated_shardings(text: str, tag: str) -> dict:
    """Run Shardy's sharding propagation (the pipeline XLA's partitioner starts with) on a
    partitioned module and read back the layout of every value of its main function.

    Returns ``{"inputs": [...], "outputs": [...], "ops": {location: [...]}}``: one layout per
    argument, per result and, for every op of the main function's body whose location starts
    with ``tag``, per op result (the last op of a location wins). A layout is a tuple of mesh-axis
    tuples, one per dimension, or None where Shardy left it open or it is not one the textual
    IR writes (a sub-axis). Raises ``ValueError`` when the module does not parse or propagation
    fails."""
    from jaxlib.mlir import ir, passmanager  # noqa: PLC0415 - jaxlib loads only when a program compiles

    with open_module(text) as module:
        try:
            passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)").run(module.operation)
        except Exception as err:  # MLIRError: diagnostics in the message
            raise ValueError(f"Shardy's sharding propagation failed: {err}") from None
        main = next(
            op
            for op in module.body.operations
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main"
        )
        out = {
            "inputs": _attr_layouts(main, "arg_attrs"),
            "outputs": _attr_layouts(main, "res_attrs"),
            "ops": {},
        }
        for op in main.regions[0].blocks[0].operations:
            location = str(op.location)
            start = location.find(tag)
            if start < 0:
                continue
            end = start + len(tag)
            while end < len(location) and location[end].isdigit():
                end += 1
            layouts = [None] * len(op.results)
            if "sdy.sharding" in op.attributes:
                layouts = _layouts(str(op.attributes["sdy.sharding"]))
            elif op.operation.name in ("sdy.sharding_constraint", "sdy.reshard"):  # layout: the attribute
                layouts = _layouts(str(op.attributes["sharding"]))
            out["ops"][location[start:end]] = layouts
        return out


def _attr_layouts(func, name: str) -> list:
    """The ``sdy.sharding`` layout of each argument / result of ``func`` (None: none)."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    if name not in func.attributes:
        return []
    found = []
    for entry in ir.ArrayAttr(func.attributes[name]):
        entry = ir.DictAttr(entry)
        found.append(_layouts(str(entry["sdy.sharding"]))[0] if "sdy.sharding" in entry else None)
    return found


def _layouts(text: str) -> list:
    """The layouts in the text of a ``#sdy.sharding`` or ``#sdy.sharding_per_value`` attribute."""
    import re  # noqa: PLC0415 - only the partitioned stage reads Shardy attributes

    layouts = []
    # each layout follows its mesh: a symbol (@mesh) or an inline mesh<["data"=2, ...]>
    for head in re.finditer(r"(?:@[\w.$-]+|mesh<\[[^\]]*\]>)\s*,\s*\[", text):
        open_ = head.end() - 1
        close = text.index("]", open_)
        dims = []
        for body in text[open_ + 1 : close].split("}")[:-1]:
            body = body[body.index("{") + 1 :]
            names = [n.strip() for n in body.split(",") if n.strip() and n.strip() != "?"]
            if any(not (n.startswith('"') and n.endswith('"')) for n in names):
                dims = None  # a sub-axis ("x":(1)2): no textual-IR form
                break
            dims.append(tuple(n.strip('"') for n in names))
        layouts.append(None if dims is None else tuple(dims))
    return layouts

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
def open_module(data: str | bytes):
    """Parse a StableHLO module — text, MLIR bytecode or a portable (versioned) artifact — and
    yield the ``ir.Module`` while its context is live. Raises ``ValueError`` with MLIR's diagnostic."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

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
    """The module in a portable artifact, as MLIR bytecode that ``compiler.compile`` accepts."""
    from jaxlib.mlir.dialects import stablehlo  # noqa: PLC0415 - jaxlib loads only when a program compiles

    with mlir_context() as ctx:  # the context knows Shardy, which artifacts with shardings hold
        module = stablehlo.deserialize_portable_artifact(ctx, bytes(data))
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

"""StableHLO import: a module written by JAX (or any StableHLO producer) becomes a kaun_ir graph.

    graph = kn.ir.from_stablehlo(jax.jit(f).lower(x).as_text())

The module is parsed with the MLIR bindings shipped in jaxlib (text, MLIR bytecode or a portable
artifact). The public ``main`` function (else the only public function) becomes the graph;
``func.call`` and ``stablehlo.composite`` are inlined, CHLO ops other than ``chlo.erf`` are first
rewritten into StableHLO by the CHLO legalisation pass, and every op is mapped onto the op table
(``stablehlo_ops.HANDLERS``). Each imported node's type is checked against the type MLIR states,
so a mapping mistake is an error, never a silently different program. An op with no mapping
raises :class:`StableHLOImportError` naming the op and its location.

A node's layer path comes from the op's ``loc`` name: JAX writes ``"jit(step)/jvp(mlp)/dot_general"``,
whose scopes (all but the last component) become the path, so locations survive a round trip.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from kaun_ir.errors import KaunError, StableHLOImportError
from kaun_ir.ir.builder import Builder, infer_or_raise
from kaun_ir.ir.core import Graph, Node, TensorType, Value
from kaun_ir.ops import TABLE
from kaun_ir.runtime.interop.stablehlo_attrs import OUT_OF_SCOPE, tensor_type
from kaun_ir.runtime.interop.stablehlo_ops import HANDLERS
from kaun_ir.runtime.xla import mlir

# A quoted location name not followed by ":line" (that form is a file location).
_LOC_NAME = re.compile(r'"((?:[^"\\]|\\.)*)"(?!:\d)')
# How deeply func.call may nest (each level is inlined recursively).
MAX_CALL_DEPTH = 100
# CHLO ops with a native op in the table; any other CHLO op triggers the legalisation pass.
_NATIVE_CHLO = {"chlo.erf"}


def from_stablehlo(module: str | bytes, name: str | None = None, source: str | None = None) -> Graph:
    """Import a StableHLO module (MLIR text, bytecode or a portable ``.mlirbc`` artifact) as a graph.

    ``name``: the function to import (default ``main``, else the only public function).
    Raises :class:`StableHLOImportError` for an op kaun_ir cannot express, naming it and its
    ``loc``, and for a module that does not parse (MLIR's diagnostic in the message). Untrusted
    bytes never reach a parser path that can end the process (see ``mlir.open_module``).
    ``source`` (a file name) starts every error message.
    """
    if isinstance(module, (bytes, bytearray)):
        data: str | bytes = bytes(module)
        label = f"the StableHLO module ({len(data)} bytes)"
    elif isinstance(module, str):
        data = module
        label = f"the StableHLO text ({len(data)} characters)"
    else:
        raise TypeError(f"from_stablehlo takes MLIR text or bytes, got {type(module).__name__}")
    label = source or label
    try:
        if isinstance(data, str) and "!quant.uniform" in data:
            raise StableHLOImportError(f"!quant.uniform: {OUT_OF_SCOPE['!quant']}")
        with mlir.open_module(data, label) as parsed:
            if any(
                op_name.startswith("chlo.") and op_name not in _NATIVE_CHLO for op_name in _op_names(parsed)
            ):
                _check_legalisable(parsed)
                mlir.legalize_chlo(parsed)
            return _Importer(parsed).run(name)
    except StableHLOImportError as err:
        if source is None or str(err).startswith(source):
            raise
        raise StableHLOImportError(f"{source}: {err}") from err
    except RecursionError:
        raise StableHLOImportError(f"{label} nests regions or calls too deeply for the importer") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, KaunError) as err:
        # MLIR's diagnostics (ValueError) and what the bindings raise reading a damaged module
        message = str(err)
        raise StableHLOImportError(message if message.startswith(label) else f"{label}: {message}") from err


def _op_names(module) -> set[str]:
    names: set[str] = set()

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    names.add(inner.operation.name)
                    walk(inner.operation)

    walk(module.operation)
    return names


def _check_legalisable(module) -> None:
    """StableHLOImportError for CHLO ops whose legalisation in the jaxlib we run would compute
    something else: a reverse ``chlo.scan`` is legalised as a forward one."""

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    inner = inner.operation
                    if inner.name == "chlo.scan" and "is_reverse" in inner.attributes:
                        if "true" in str(inner.attributes["is_reverse"]):
                            where = location_name(inner.location) or str(inner.location)
                            raise StableHLOImportError(
                                f"chlo.scan at {where}: is_reverse is not supported (the CHLO "
                                "legalisation of the jaxlib in use would run the scan forward)"
                            )
                    walk(inner)

    walk(module.operation)


def location_name(location) -> str:
    """The name of an MLIR location (``loc("a/b/add"(...))`` -> ``"a/b/add"``), or ``""``."""
    match = _LOC_NAME.search(str(location))
    return match.group(1).replace('\\"', '"') if match else ""


def path_of(location) -> str:
    """The layer path recorded by a location name: its scopes, joined with ``.``."""
    scopes = [s for s in location_name(location).split("/")[:-1] if s]
    return ".".join(scopes)


class _Importer:
    def __init__(self, module):
        self.module = module
        self.functions = {}
        for op in module.body.operations:
            if op.operation.name == "func.func":
                self.functions[op.operation.attributes["sym_name"].value] = op.operation
        self.builder: Builder | None = None
        self.location = None  # the op being imported, for error messages
        self.path = ""
        self.calls: list[str] = []  # the functions being inlined, outermost first

    # --- the entry point ---------------------------------------------------------------

    def run(self, name: str | None) -> Graph:
        func = self._entry(name)
        block = func.regions[0].blocks[0]
        builder = Builder(record_source=False)
        with builder:
            self.builder = builder
            args = []
            for i, arg in enumerate(block.arguments):
                try:
                    args.append(builder.add_input(tensor_type(arg.type)))
                except ValueError as err:
                    raise StableHLOImportError(
                        f"argument {i} of @{func.attributes['sym_name'].value}: {err}"
                    ) from None
            outputs = self.block(block, args, {})
        graph = builder.finish(outputs, name=func.attributes["sym_name"].value)
        return Graph.from_outputs(graph.inputs, graph.outputs, graph.name)

    def _entry(self, name: str | None):
        if name is not None:
            if name not in self.functions:
                raise StableHLOImportError(
                    f"no function @{name}; the module has "
                    f"{', '.join('@' + n for n in self.functions) or 'none'}"
                )
            return self.functions[name]
        if "main" in self.functions:
            return self.functions["main"]
        public = [
            n
            for n, f in self.functions.items()
            if "sym_visibility" not in f.attributes or f.attributes["sym_visibility"].value == "public"
        ]
        if len(public) != 1:
            raise StableHLOImportError(
                "the module has no @main and not exactly one public function "
                f"({', '.join('@' + n for n in public) or 'none'}); pass name="
            )
        return self.functions[public[0]]

    # --- blocks, ops and values ---------------------------------------------------------

    def block(self, block, args: Sequence[Value], outer: dict) -> list[Value]:
        """Import the ops of ``block`` (arguments bound to ``args``); returns what it returns.
        ``outer`` maps values defined outside the block (visible inside regions)."""
        env = dict(outer)
        for mlir_arg, value in zip(block.arguments, args):
            env[mlir_arg] = value
        for op in block.operations:
            op = op.operation
            if op.name in ("func.return", "stablehlo.return"):
                return [self.lookup(env, v, op) for v in op.operands]
            operands = [self.lookup(env, v, op) for v in op.operands]
            results = self.op(op, operands, env)
            if len(results) != len(op.results):
                raise self.error(op, f"imported as {len(results)} values, MLIR has {len(op.results)}")
            for mlir_value, value in zip(op.results, results):
                expected = self.type_of(mlir_value, op)
                if value.type != expected:
                    raise self.error(op, f"imported with type {value.type}, MLIR says {expected}")
                env[mlir_value] = value
        raise self.error(block.owner, "block without a return")

    def op(self, op, operands: list[Value], env: dict) -> list[Value]:
        handler = HANDLERS.get(op.name)
        if handler is None:
            raise self.error(op, "unsupported op (kaun_ir has no equivalent)")
        saved = self.location, self.path
        self.location, self.path = op.location, path_of(op.location)
        try:
            return list(handler(self, op, operands, env))
        except StableHLOImportError:
            raise
        except (KaunError, ValueError, TypeError) as err:
            raise self.error(op, str(err)) from None
        finally:
            self.location, self.path = saved

    def lookup(self, env: dict, mlir_value, op) -> Value:
        try:
            return env[mlir_value]
        except KeyError:
            raise self.error(op, "uses a value that is not defined before it") from None

    def type_of(self, mlir_value, op) -> TensorType:
        try:
            return tensor_type(mlir_value.type)
        except ValueError as err:
            raise self.error(op, str(err)) from None

    def error(self, op, message: str) -> StableHLOImportError:
        name = op.name if hasattr(op, "name") else "op"
        where = location_name(op.location) or str(op.location)
        return StableHLOImportError(f"{name} at {where}: {message}")

    # --- building nodes -------------------------------------------------------------------

    def add(self, op_name: str, *inputs: Value, regions: Sequence[Graph] = (), **attrs) -> tuple[Value, ...]:
        """Append one kaun_ir node (type-checked by the op table) with the current layer path."""
        opdef = TABLE[op_name]
        attrs = opdef.check_attrs(attrs)
        types = infer_or_raise(opdef, [v.type for v in inputs], attrs, self.path, regions)
        node = Node(op_name, inputs, attrs, types, regions, path=self.path)
        self.builder.nodes.append(node)
        return node.outputs

    def add1(self, op_name: str, *inputs: Value, **attrs) -> Value:
        (out,) = self.add(op_name, *inputs, **attrs)
        return out

    def constant(self, array) -> Value:
        return self.add1("constant", value=np.asarray(array))

    def call(self, callee: str, operands: Sequence[Value], op) -> list[Value]:
        """Inline function ``callee`` applied to ``operands``."""
        func = self.functions.get(callee)
        if func is None:
            raise self.error(op, f"calls @{callee}, which the module does not define")
        if callee in self.calls:
            cycle = " -> ".join("@" + n for n in self.calls[self.calls.index(callee) :] + [callee])
            raise self.error(op, f"recursive call of @{callee} ({cycle}): recursion cannot be inlined")
        if len(self.calls) >= MAX_CALL_DEPTH:
            raise self.error(
                op,
                f"calls @{callee} nested {len(self.calls) + 1} deep "
                f"(the importer inlines at most {MAX_CALL_DEPTH})",
            )
        if not func.regions or not func.regions[0].blocks:
            raise self.error(op, f"calls @{callee}, which has no body")
        self.calls.append(callee)
        try:
            return self.block(func.regions[0].blocks[0], operands, {})
        finally:
            self.calls.pop()

"""StableHLO text emission: the one home of the type and attribute printers and of the
:class:`Emitter` every op's ``emit`` rule writes through.

Each op keeps its own lowering in its declaration (``OpDef.emit``); what is shared between
those rules and the module-level lowering (``kaun_ir.runtime.lower``: function header,
argument attributes, Shardy mesh and shardings) lives here. Plain text generation: nothing
here imports jaxlib.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir import optable
from kaun_ir.ir.core import TensorType


def tensor_type(t: TensorType) -> str:
    """``tensor<3x4xf32>``; a scalar is ``tensor<f32>``."""
    dims = "".join(f"{d}x" for d in t.shape)
    return f"tensor<{dims}{dtypes.mlir_name(t.dtype)}>"


def i64_array(values: Iterable[int]) -> str:
    """A ``DenseI64ArrayAttr``: ``array<i64: 1, 2>``."""
    vals = [int(v) for v in values]
    return f"array<i64: {', '.join(map(str, vals))}>" if vals else "array<i64>"


def bool_array(values: Iterable[bool]) -> str:
    """A list of bools in MLIR attribute syntax (``array<i1: true, false>``)."""
    vals = ["true" if v else "false" for v in values]
    return f"array<i1: {', '.join(vals)}>" if vals else "array<i1>"


def scalar_literal(value, dtype) -> str:
    """A scalar in MLIR attribute syntax for ``dtype`` (hex for non-finite floats)."""
    dt = np.dtype(dtype)
    if dt == dtypes.bool_:
        return "true" if bool(value) else "false"
    if dt in dtypes.INTEGERS:
        return str(int(value))
    arr = np.asarray(value, dtype=dt)
    if np.isfinite(arr):
        text = repr(float(arr))
        if "e" in text and "." not in text:  # MLIR wants '1.0e-05' where repr gives '1e-05'
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{exponent}"
        return text
    bits = arr.view(f"u{dt.itemsize}")
    return f"0x{int(bits):0{2 * dt.itemsize}X}"


def dense_literal(array: np.ndarray) -> str:
    """``dense<...>`` for an array: a splat where possible, else hex of the raw bytes."""
    arr = np.asarray(array)
    t = TensorType(arr.dtype, arr.shape)
    flat = arr.reshape(-1)
    if flat.size and np.all(flat == flat[0]) and not (arr.dtype in dtypes.FLOATS and np.isnan(flat[0])):
        body = scalar_literal(flat[0], arr.dtype)
    elif flat.size == 0:
        return f"dense<> : {tensor_type(t)}"
    elif arr.dtype == dtypes.bool_:
        # MLIR's hex form for i1 is one byte per element.
        body = f'"0x{flat.astype(np.uint8).tobytes().hex().upper()}"'
    else:
        body = f'"0x{flat.astype(flat.dtype.newbyteorder("<")).tobytes().hex().upper()}"'
    return f"dense<{body}> : {tensor_type(t)}"


def padding_literal(pairs) -> str:
    """``dense<[[lo, hi], ...]> : tensor<Nx2xi64>`` (what StableHLO's window ops take)."""
    rows = ", ".join(f"[{int(lo)}, {int(hi)}]" for lo, hi in pairs)
    return f"dense<[{rows}]> : tensor<{len(pairs)}x2xi64>" if pairs else "dense<> : tensor<0x2xi64>"


def comparison_type(dtype) -> str:
    """StableHLO's ``comparison_type`` for comparing elements of ``dtype``: ``FLOAT``, ``SIGNED``
    for signed integers, ``UNSIGNED`` for unsigned integers and bool (an ``i1`` is unsigned in the
    StableHLO spec, so ``false < true``)."""
    if dtypes.is_float(dtype):
        return "FLOAT"
    return "SIGNED" if np.dtype(dtype) in dtypes.SIGNED else "UNSIGNED"


def compare_attrs(direction: str, dtype) -> dict[str, str]:
    """The attributes of a ``stablehlo.compare`` of ``dtype`` elements (``direction``: ``EQ``,
    ``NE``, ``LT``, ``LE``, ``GT``, ``GE``)."""
    return {
        "comparison_direction": f"#stablehlo<comparison_direction {direction}>",
        "compare_type": f"#stablehlo<comparison_type {comparison_type(dtype)}>",
    }


class Emitter:
    """Collects StableHLO lines for one function body; ops write through :meth:`op`."""

    def __init__(self, indent: int = 2, parent: Emitter | None = None):
        self.lines: list[str] = []
        self.indent = indent
        self.location = parent.location if parent else ""
        self._root = parent._root if parent else self
        self.counter = 0  # used on the root only: SSA names are unique in the whole function
        # private functions the body calls (``stablehlo.composite`` decompositions), on the root
        self.functions: list[str] = []
        self._function_names: dict[str, str] = {}
        # on the root only: a location per node (by id) that replaces the node's layer path
        # (the partitioned stage tags every node to find its ops after sharding propagation)
        self.node_locations: dict[int, str] = {}

    def fresh(self, prefix: str = "") -> str:
        """A new SSA value name (``%<prefix><n>``), unique within the whole module."""
        self._root.counter += 1
        return f"%{prefix}{self._root.counter}"

    def op(
        self,
        name: str,
        operands: Sequence[str],
        operand_types: Sequence[TensorType],
        result_types: Sequence[TensorType],
        attrs: dict[str, str] | None = None,
        regions: Sequence[str] = (),
    ) -> list[str]:
        """Write one op in MLIR's generic form and return the names of its results."""
        base = self.fresh()
        n = len(result_types)
        results = [base] if n == 1 else [f"{base}#{i}" for i in range(n)]
        lhs = "" if n == 0 else (f"{base} = " if n == 1 else f"{base}:{n} = ")
        attr_text = ""
        if attrs:
            attr_text = " {" + ", ".join(f"{k} = {v}" for k, v in attrs.items()) + "}"
        region_text = ""
        if regions:
            region_text = " (" + ", ".join(regions) + ")"
        ins = ", ".join(tensor_type(t) for t in operand_types)
        outs = ", ".join(tensor_type(t) for t in result_types)
        outs = outs if n == 1 else f"({outs})"
        loc = f' loc("{self.location}")' if self.location else ""
        self.lines.append(
            f'{" " * self.indent}{lhs}"{name}"({", ".join(operands)}){region_text}{attr_text}'
            f" : ({ins}) -> {outs}{loc}"
        )
        return results

    def function(self, name_hint: str, graph) -> str:
        """Emit ``graph`` as a private ``func.func`` of the module; returns its symbol name (one
        function per distinct graph, so equal decompositions are shared)."""
        root = self._root
        key = graph.text()
        if key in root._function_names:
            return root._function_names[key]
        name = f"{name_hint}_{len(root._function_names)}"
        root._function_names[key] = name
        body = Emitter(indent=4)
        args = [f"%arg{i}" for i in range(len(graph.inputs))]
        results = body.emit_graph(graph, args)
        root.functions.extend(body.functions)
        header = ", ".join(f"{a}: {tensor_type(v.type)}" for a, v in zip(args, graph.inputs))
        outs = ", ".join(tensor_type(v.type) for v in graph.outputs)
        root.functions += [
            f"  func.func private @{name}({header}) -> ({outs}) {{",
            *body.lines,
            f'    "func.return"({", ".join(results)}) : ({outs}) -> ()',
            "  }",
        ]
        return name

    def region(
        self,
        arg_types: Sequence[TensorType],
        body: Callable[[Emitter, list[str]], Sequence[str]],
        result_types: Sequence[TensorType] | None = None,
    ) -> str:
        """A one-block region: ``body(em, args)`` writes ops and returns the values to return."""
        inner = Emitter(indent=self.indent + 2, parent=self)
        args = [self.fresh("b") for _ in arg_types]
        results = list(body(inner, args))
        rtypes = result_types if result_types is not None else arg_types[: len(results)]
        inner.op("stablehlo.return", results, rtypes, [])
        header = ", ".join(f"{a}: {tensor_type(t)}" for a, t in zip(args, arg_types))
        pad = " " * (self.indent + 1)
        return "{\n" + f"{pad}^bb0({header}):\n" + "\n".join(inner.lines) + f"\n{' ' * self.indent}}}"

    def emit_graph(self, graph, arg_names: Sequence[str]) -> list[str]:
        """Emit every node of ``graph`` (arguments named ``arg_names``); returns its output names.

        The lowering calls this for the main function; ops with regions call it for sub-graphs.
        """
        table = optable.table()
        names: dict[int, str] = {id(v): n for v, n in zip(graph.inputs, arg_names)}
        for node in graph.nodes:
            outer_location = self.location
            self.location = self._root.node_locations.get(id(node), node.location)
            results = table[node.op].emit(self, node, *[names[id(v)] for v in node.inputs])
            self.location = outer_location
            if isinstance(results, str):
                results = [results]
            if len(results) != len(node.outputs):
                raise RuntimeError(
                    f"emission of {node.op} produced {len(results)} results, expected {len(node.outputs)}"
                )
            for value, result in zip(node.outputs, results):
                names[id(value)] = result
        return [names[id(v)] for v in graph.outputs]

    # Short forms for the common cases --------------------------------------------------------

    def compare(self, a: str, b: str, t: TensorType, direction: str) -> str:
        """``a <direction> b`` for two operands of type ``t``; a bool of ``t``'s shape."""
        result = TensorType(dtypes.bool_, t.shape)
        return self.op("stablehlo.compare", [a, b], [t, t], [result], compare_attrs(direction, t.dtype))[0]

    def simple(
        self,
        name: str,
        node,
        *operands: str,
        attrs: dict[str, str] | None = None,
        regions: Sequence[str] = (),
    ) -> list[str]:
        """``name`` applied to the node's operands with the node's result types."""
        return self.op(name, operands, [v.type for v in node.inputs], node.types, attrs, regions)


# ----------------------------------------------------------------------- Shardy (sdy) attributes


def sdy_mesh(mesh) -> str:
    """Shardy's mesh attribute body: ``<["data"=2, "model"=4]>``."""
    return "<[" + ", ".join(f'"{name}"={int(size)}' for name, size in mesh) + "]>"


def sdy_sharding(spec, rank: int, mesh_ref: str) -> str:
    """``#sdy.sharding<@mesh, [{"data"}, {}]>``; dimensions past ``spec`` are unsplit and closed."""
    dims = [tuple(spec[d]) if d < len(spec) else () for d in range(rank)]
    body = ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}" for axes in dims)
    return f"#sdy.sharding<{mesh_ref}, [{body}]>"

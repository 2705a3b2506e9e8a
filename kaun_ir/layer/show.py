"""Looking at models: ``repr`` / ``_repr_html_`` of ``Layer`` and ``Vars``, and
:func:`summary`, a per-layer table of output shapes, parameters, bytes and FLOPs."""

from __future__ import annotations

import html
import types
from collections.abc import Callable
from typing import Any

from kaun_ir import dtypes, ptree, rng, tree
from kaun_ir.ir.cost import node_cost
from kaun_ir.layer.core import Layer
from kaun_ir.layer.initialise import init
from kaun_ir.layer.roll import unrolled
from kaun_ir.surface.tensor import type_of
from kaun_ir.surface.trace import ShapeDtype, leaf_type, trace_flat

__all__ = ["layer_repr", "layer_html", "vars_repr", "vars_html", "summary"]

_SHOWN = (bool, int, float, str)
# closure variables of the standard layers that are plumbing, not settings
_PLUMBING = frozenset({"name", "nd", "spatial", "what", "kind", "layer"})
_MAX_LINE = 100


def _parts(layer) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """``(settings, children)`` of a layer, read from the closures of its two functions: Python
    scalars (and tuples of them) it was made with, and the layers it contains."""
    settings: dict[str, Any] = {}
    children: dict[str, Any] = {}
    for fn in (layer.init, layer.apply):
        if not isinstance(fn, types.FunctionType):
            continue
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if name.startswith("_") or name in _PLUMBING or name in settings or name in children:
                continue
            if isinstance(value, Layer):
                children[name] = value
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Layer) for v in value):
                children[name] = list(value)
            elif isinstance(value, _SHOWN) or (
                isinstance(value, tuple) and all(isinstance(v, _SHOWN) for v in value)
            ):
                settings[name] = value
    return sorted(settings.items()), list(children.items())


def _flat_children(children: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    out = []
    for name, child in children:
        if isinstance(child, list):
            out += [(str(i), c) for i, c in enumerate(child)]
        else:
            out.append((name, child))
    return out


def layer_repr(layer, indent: int = 0) -> str:
    """``sequential(0: linear(out_features=128), 1: relu(), ...)``: the layer's name, the settings
    it was made with and its child layers, one per line when they do not fit on one."""
    settings, children = _parts(layer)
    args = [f"{k}={v!r}" for k, v in settings]
    kids = _flat_children(children)
    one_line = f"{layer.name}({', '.join(args + [f'{k}: {layer_repr(c)}' for k, c in kids])})"
    if len(one_line) + indent <= _MAX_LINE or not kids:
        return one_line
    pad = " " * (indent + 2)
    lines = [f"{pad}{a}," for a in args]
    lines += [f"{pad}{k}: {layer_repr(c, indent + 2 + len(k) + 2)}," for k, c in kids]
    return f"{layer.name}(\n" + "\n".join(lines) + "\n" + " " * indent + ")"


def layer_html(layer) -> str:
    """A nested list of the layer tree (for notebooks)."""
    settings, children = _parts(layer)
    args = ", ".join(f"{k}={html.escape(repr(v))}" for k, v in settings)
    head = f"<code><b>{html.escape(layer.name)}</b>({args})</code>"
    kids = _flat_children(children)
    if not kids:
        return head
    items = "".join(f"<li><code>{html.escape(k)}</code>: {layer_html(c)}</li>" for k, c in kids)
    return f"{head}<ul style='margin:0'>{items}</ul>"


def _leaf_text(leaf: Any) -> str:
    try:
        t = type_of(leaf)
    except TypeError:
        return repr(leaf)
    return f"{dtypes.short_name(t.dtype)}{list(t.shape)}"


def _tree_text(t: Any) -> str:
    if isinstance(t, dict):
        return "{" + ", ".join(f"{k!r}: {_tree_text(v)}" for k, v in t.items()) + "}"
    if isinstance(t, (list, tuple)) and not hasattr(t, "_fields"):
        inner = ", ".join(_tree_text(v) for v in t)
        return f"[{inner}]" if isinstance(t, list) else f"({inner}{',' if len(t) == 1 else ''})"
    if t is None:
        return "None"
    return _leaf_text(t)


def _count_and_bytes(t: Any) -> tuple[int, int]:
    count = nbytes = 0
    for leaf in ptree.leaves(t):
        try:
            ty = type_of(leaf)
        except TypeError:
            continue
        count += ty.size
        nbytes += ty.nbytes
    return count, nbytes


def vars_repr(v) -> str:
    """``Vars(float32, 8,906 parameters (34.8 KiB), params={...shapes...}, state=...)``: shapes
    and dtypes, never the arrays."""
    count, nbytes = _count_and_bytes(v.params)
    text = (
        f"Vars({dtypes.short_name(v.dtype)}, {count:,} parameters ({_bytes(nbytes)}), "
        f"params={_tree_text(v.params)}"
    )
    if ptree.leaves(v.state):
        text += f", state={_tree_text(v.state)}"
    return text + ")"


def vars_html(v) -> str:
    """A table of the variables (path, shape, dtype, size) for notebooks."""
    rows = []
    for kind, t in (("params", v.params), ("state", v.state)):
        for path, leaf in ptree.flatten_with_paths(t):
            ty = type_of(leaf)
            rows.append(
                f"<tr><td>{kind}</td><td><code>{html.escape(path)}</code></td>"
                f"<td>{list(ty.shape)}</td><td>{dtypes.short_name(ty.dtype)}</td>"
                f"<td style='text-align:right'>{ty.size:,}</td></tr>"
            )
    count, nbytes = _count_and_bytes(v.params)
    head = "<tr><th>kind</th><th>path</th><th>shape</th><th>dtype</th><th>size</th></tr>"
    return (
        f"<div><b>Vars</b> ({dtypes.short_name(v.dtype)}, {count:,} parameters, {_bytes(nbytes)})"
        f"<table>{head}{''.join(rows)}</table></div>"
    )


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _flops(n: int) -> str:
    for unit, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def summary(
    model, example: Any, vars=None, training: bool = False, print_fn: Callable | None = print
) -> list[dict]:
    """Print (with ``print_fn``; None prints nothing) and return a table with one row per layer
    of ``model`` on the input ``example`` (an array, a ``kn.ShapeDtype`` or a tree of them):
    ``path`` (the layer path, as in the IR and error messages), ``output`` (the shape of the value
    the layer passes on), ``params`` (number of parameters the layer reads), ``bytes`` (their
    size) and ``flops`` (estimated by the cost model of ``kaun_ir.ir.cost`` for the forward
    pass). A last row ``"total"`` sums the model (parameters counted once).

    ``vars`` (default: ``layer.init(model, example)`` with seed 0) gives the variables; nothing
    is compiled or run: the forward pass is traced on abstract values.
    """
    if vars is None:
        with rng.scope(0):
            vars = init(model, example)
    leaves, treedef = tree.flatten(example)
    specs = []
    for leaf in leaves:  # floating-point inputs take the model's dtype, as layer.apply converts them
        t = leaf_type(leaf)
        specs.append(ShapeDtype(t.shape, vars.dtype if dtypes.is_float(t.dtype) else t.dtype))
    x = tree.unflatten(treedef, specs)
    p_leaves = tree.flatten(vars.params)[0]

    def forward(params, state, inputs):
        return model.apply(params, state, inputs, training=training, ctx={})[0]

    with unrolled():  # one row per block, rolled or not
        traced = trace_flat(forward, (vars.params, vars.state, x), {})
    graph = traced.graph
    n_params = len(p_leaves)
    order: list[str] = []
    groups: dict[str, list] = {}
    for node in graph.nodes:
        path = node.path or "(top)"
        if path not in groups:
            groups[path] = []
            order.append(path)
        groups[path].append(node)
    users: dict[int, set] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value.node is not None:
                users.setdefault(id(value), set()).add(node.path or "(top)")
    outputs = {id(v) for v in graph.outputs}
    rows = []
    for path in order:
        nodes = groups[path]
        flops = sum(node_cost(node)[0] for node in nodes)
        params_used = {
            v.index for node in nodes for v in node.inputs if v.node is None and v.index < n_params
        }
        count = sum(type_of(p_leaves[i]).size for i in params_used)
        nbytes = sum(type_of(p_leaves[i]).nbytes for i in params_used)
        shape = None
        for node in reversed(nodes):  # the last value that leaves the layer
            leaving = [o for o in node.outputs if id(o) in outputs or users.get(id(o), {path}) - {path}]
            if leaving:
                shape = tuple(leaving[-1].type.shape)
                break
        rows.append({"path": path, "output": shape, "params": count, "bytes": nbytes, "flops": flops})
    total_count, total_bytes = _count_and_bytes(vars.params)
    out_shapes = [tuple(v.type.shape) for v in graph.outputs]
    rows.append(
        {
            "path": "total",
            "output": out_shapes[0] if len(out_shapes) == 1 else out_shapes,
            "params": total_count,
            "bytes": total_bytes,
            "flops": sum(r["flops"] for r in rows),
        }
    )
    if print_fn is not None:
        print_fn(_table(rows))
    return rows


def _table(rows: list[dict]) -> str:
    cells = [("layer", "output", "params", "bytes", "FLOPs")]
    for r in rows:
        shape = r["output"]
        out = (
            "-"
            if shape is None
            else str(list(shape))
            if isinstance(shape, tuple)
            else str([list(s) for s in shape])
        )
        cells.append(
            (
                r["path"],
                out,
                f"{r['params']:,}",
                _bytes(r["bytes"]) if r["bytes"] else "0",
                _flops(r["flops"]),
            )
        )
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    lines = []
    for k, row in enumerate(cells):
        if k == len(cells) - 1:
            lines.append("  ".join("-" * w for w in widths))
        lines.append(
            "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)

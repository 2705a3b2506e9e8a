"""A built-in layered drawing of a graph as SVG (no Graphviz needed), and the node model and
cost colours that the other ``kaun-ir viz`` formats share.

The layout is a small Sugiyama-style one: every node gets the rank of its longest path from a
graph input, nodes within a rank are ordered by the barycentre of their neighbours (a few
sweeps down and up), and edges are drawn as curves from the bottom of the producer to the top
of the consumer. Nodes are coloured by their top-level layer. Used by ``kaun-ir viz`` for
``.svg`` when Graphviz is not installed and by ``Graph._repr_svg_`` in notebooks; the interactive
``.html`` page is :mod:`kaun_ir.tools.viz.html`.
"""

from __future__ import annotations

import html

from kaun_ir.ir.core import path_components
from kaun_ir.ir.cost import node_cost

_PALETTE = (
    "#dbeafe",
    "#dcfce7",
    "#fef9c3",
    "#fce7f3",
    "#ede9fe",
    "#ffedd5",
    "#cffafe",
    "#e0e7ff",
    "#fee2e2",
    "#ecfccb",
)
_IO_COLOR = "#e5e7eb"
# the cost overlay's colour ramp (light to dark, on a log scale) and the colour of zero cost;
# the same as in page.js
COST_STOPS = ("#fff7bc", "#fee391", "#fec44f", "#fe9929", "#ec7014", "#cc4c02", "#8c2d04")
ZERO_COLOR = "#f3f4f6"
_CHAR_W, _NODE_H, _GAP_X, _GAP_Y, _MARGIN = 6.6, 34, 18, 46, 20


# ------------------------------------------------------------------ the node model


def describe(graph) -> dict:
    """Nodes and edges of ``graph`` for drawing: ``{"nodes": [...], "edges": [...]}``.

    A node: ``id`` (``arg<i>`` / ``n<k>`` / ``out<i>``, as in ``Graph.to_networkx``), ``op``,
    ``label`` (two lines: op or input name, result types), ``path``, ``group`` (top-level layer),
    ``types``, ``attrs`` (text), ``source``. An edge: ``source``, ``target``, ``type``,
    ``result`` (index at the source), ``operand`` (index at the target).
    """
    from kaun_ir.ir.text import format_attr

    dg = graph.to_networkx()
    nodes, edges = [], []
    parts_of: dict[str, list[str]] = {}  # many nodes share a layer path
    for nid, data in dg.nodes(data=True):
        op = data["op"]
        attrs = {}
        for key, value in data["attrs"].items():
            text = value if isinstance(value, str) else _attr_text(format_attr, value)
            attrs[key] = text if len(text) <= 160 else text[:157] + "..."
        if op == "input":
            title = attrs.get("name") or nid
        elif op == "output":
            title = f"output {attrs['index']}"
        elif op == "sharding_constraint":  # the layout is the point of the node: show it
            dims = ", ".join("{" + ",".join(axes) + "}" for axes in data["attrs"]["spec"])
            title = f"{op} [{dims}]"
        else:
            title = op
        parts = parts_of.get(data["path"])
        if parts is None:
            parts = parts_of[data["path"]] = path_components(data["path"])
        nodes.append(
            {
                "id": nid,
                "op": op,
                "title": title,
                "types": data["types"],
                "path": data["path"],
                "group": parts[0] if parts else "",
                "attrs": attrs,
                "source": data["source"],
            }
        )
    for src, dst, data in dg.edges(data=True):
        # a graph argument is a node of one result (to_networkx's "result" is its argument index)
        result = 0 if dg.nodes[src]["op"] == "input" else data["result"]
        edges.append(
            {"source": src, "target": dst, "type": data["type"], "result": result, "operand": data["index"]}
        )
    return {"name": graph.name, "nodes": nodes, "edges": edges}


def _attr_text(format_attr, value) -> str:
    try:
        return format_attr(value)
    except Exception:  # an attribute the printer does not know: show Python's repr
        return repr(value)


# ------------------------------------------------------------------ layout


def layout(model: dict) -> dict:
    """``{node id: (x, y, width)}`` (top-left corner) plus ``"_size": (width, height)``."""
    ids = [n["id"] for n in model["nodes"]]
    preds: dict[str, list[str]] = {i: [] for i in ids}
    succs: dict[str, list[str]] = {i: [] for i in ids}
    for e in model["edges"]:
        preds[e["target"]].append(e["source"])
        succs[e["source"]].append(e["target"])
    # ids are listed inputs first, then nodes in execution order, then outputs: a topological order
    rank: dict[str, int] = {}
    for i in ids:
        rank[i] = 1 + max((rank[p] for p in preds[i]), default=-1)
    outputs_rank = max((rank[i] for i in ids), default=0)
    for i in ids:
        if i.startswith("out"):
            rank[i] = outputs_rank  # all outputs on the last row
    rows: list[list[str]] = [[] for _ in range(outputs_rank + 1)]
    for i in ids:
        rows[rank[i]].append(i)
    position = {i: float(k) for row in rows for k, i in enumerate(row)}

    def sweep(order, neighbours):
        for row in order:
            for i in row:
                near = [position[j] for j in neighbours[i]]
                if near:
                    position[i] = sum(near) / len(near)
            row.sort(key=lambda i: position[i])
            for k, i in enumerate(row):
                position[i] = float(k)

    for _ in range(2):
        sweep(rows[1:], preds)
        sweep(list(reversed(rows[:-1])), succs)
    sweep(rows[1:], preds)

    width = {n["id"]: max(len(n["title"]), len(_types_line(n))) * _CHAR_W + 16 for n in model["nodes"]}
    row_widths = [sum(width[i] for i in row) + _GAP_X * max(len(row) - 1, 0) for row in rows]
    total_w = max(row_widths, default=0) + 2 * _MARGIN
    boxes: dict = {}
    for r, row in enumerate(rows):
        x = _MARGIN + (total_w - 2 * _MARGIN - row_widths[r]) / 2
        y = _MARGIN + 24 + r * (_NODE_H + _GAP_Y)
        for i in row:
            boxes[i] = (x, y, width[i])
            x += width[i] + _GAP_X
    boxes["_size"] = (max(total_w, 240), _MARGIN * 2 + 24 + len(rows) * (_NODE_H + _GAP_Y))
    return boxes


def _types_line(node: dict) -> str:
    return ", ".join(node["types"])


# ------------------------------------------------------------------ cost overlay


def human(value: float) -> str:
    """``1234567`` -> ``"1.23M"`` (as the page's legend writes it)."""
    units = ("", "k", "M", "G", "T", "P")
    k = 0
    while value >= 1000 and k < len(units) - 1:
        value /= 1000
        k += 1
    return f"{round(value)}{units[k]}" if value >= 100 or k == 0 else f"{value:.3g}{units[k]}"


def _mix(c1: str, c2: str, f: float) -> str:
    a = [int(c1[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(c2[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b))


def cost_color(value: float, lo: float, hi: float) -> str:
    """The overlay colour of ``value`` on the log scale from ``lo`` (lightest) to ``hi`` (darkest)."""
    import math

    if value <= 0:
        return ZERO_COLOR
    a, b = math.log10(lo), math.log10(hi)
    t = min(1.0, max(0.0, (math.log10(value) - a) / (b - a))) if b > a else 1.0
    pos = t * (len(COST_STOPS) - 1)
    i = min(int(pos), len(COST_STOPS) - 2)
    return _mix(COST_STOPS[i], COST_STOPS[i + 1], pos - i)


def is_dark(color: str) -> bool:
    """Whether a ``#rrggbb`` colour is dark enough to need white text."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 120


def node_costs(graph) -> dict[str, tuple[int, int]]:
    """``{node id: (flops, bytes)}`` for the op nodes (``n<k>``) under :func:`kaun_ir.ir.cost.node_cost`."""
    return {f"n{k}": node_cost(node) for k, node in enumerate(graph.nodes)}


def cost_overlay(graph, metric: str) -> dict:
    """Node colours by estimated cost (:func:`kaun_ir.ir.cost.node_cost`) on a log scale.

    ``{"fills": {node id: colour}, "values": {node id: cost}, "title": ..., "legend": [(colour,
    label), ...]}`` for ``metric`` ``"flops"`` or ``"bytes"``; graph inputs and outputs cost 0.
    """
    if metric not in ("flops", "bytes"):
        raise ValueError(f"unknown overlay {metric!r}; choose from flops, bytes")
    which = 0 if metric == "flops" else 1
    values = {nid: cost[which] for nid, cost in node_costs(graph).items()}
    positive = [v for v in values.values() if v > 0]
    lo, hi = (min(positive), max(positive)) if positive else (1, 1)
    fills = {nid: cost_color(v, lo, hi) for nid, v in values.items()}
    steps = len(COST_STOPS)
    legend = [(ZERO_COLOR, "0")]
    for k in range(steps):  # evenly spaced on the log scale
        value = lo * (hi / lo) ** (k / (steps - 1)) if hi > lo else hi
        legend.append((cost_color(value, lo, hi), human(value)))
    title = ("estimated FLOPs" if metric == "flops" else "estimated bytes moved") + " (log scale)"
    return {"fills": fills, "values": values, "title": title, "legend": legend}


# ------------------------------------------------------------------ SVG


def group_colors(model: dict) -> dict[str, str]:
    """A fill colour per top-level layer group of the drawing, in first-use order."""
    groups = []
    for n in model["nodes"]:
        if n["group"] and n["group"] not in groups:
            groups.append(n["group"])
    return {g: _PALETTE[k % len(_PALETTE)] for k, g in enumerate(groups)}


def svg(model: dict, standalone: bool = True, overlay: dict | None = None) -> str:
    """The drawing as SVG text. ``standalone=False`` leaves out the XML namespace declaration
    (for inline use in HTML, where it is implied). ``overlay`` (:func:`cost_overlay`) colours
    the nodes by cost and replaces the legend of layers by the cost scale."""
    boxes = layout(model)
    total_w, total_h = boxes["_size"]
    colors = group_colors(model)
    if overlay is not None:
        total_h += 24  # a second line for the cost legend
    xmlns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [
        f'<svg{xmlns} width="{total_w:.0f}" height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} '
        f'{total_h:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>',
        f'<text x="{_MARGIN}" y="{_MARGIN + 4}" font-size="13" font-weight="bold">'
        f"@{html.escape(model['name'])}</text>",
    ]
    # a legend of the top-level layers, or of the cost scale
    x = _MARGIN + 12 + len(model["name"]) * 8
    if overlay is None:
        for group, color in colors.items():
            out.append(
                f'<rect x="{x:.1f}" y="{_MARGIN - 6}" width="10" height="10" fill="{color}" '
                'stroke="#9ca3af"/>'
            )
            out.append(f'<text x="{x + 14:.1f}" y="{_MARGIN + 3}">{html.escape(group)}</text>')
            x += 24 + len(group) * _CHAR_W
    else:
        out.append(
            f'<g class="legend"><text x="{x:.1f}" y="{_MARGIN + 3}">{html.escape(overlay["title"])}:</text>'
        )
        x += 12 + len(overlay["title"]) * _CHAR_W
        for color, label in overlay["legend"]:
            out.append(
                f'<rect x="{x:.1f}" y="{_MARGIN - 6}" width="14" height="12" fill="{color}" '
                f'stroke="#9ca3af"/>'
            )
            out.append(f'<text x="{x + 17:.1f}" y="{_MARGIN + 4}">{html.escape(label)}</text>')
            x += 26 + len(label) * _CHAR_W
        out.append("</g>")
    shift = 24 if overlay is not None else 0
    out.append(f'<g transform="translate(0,{shift})">')
    out.append('<g class="edges" fill="none" stroke="#6b7280" stroke-width="1">')
    for e in model["edges"]:
        sx, sy, sw = boxes[e["source"]]
        tx, ty, tw = boxes[e["target"]]
        x1, y1, x2, y2 = sx + sw / 2, sy + _NODE_H, tx + tw / 2, ty
        bend = max((y2 - y1) / 2, 12)
        out.append(
            f'<path class="edge" data-source="{e["source"]}" data-target="{e["target"]}" '
            f'd="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" '
            f'marker-end="url(#arrow)"><title>{html.escape(e["type"])}</title></path>'
        )
    out.append("</g>")
    out.append('<g class="nodes">')
    for n in model["nodes"]:
        x, y, w = boxes[n["id"]]
        if overlay is None:
            fill = colors.get(n["group"], _IO_COLOR)
        else:
            fill = overlay["fills"].get(n["id"], ZERO_COLOR)
        ink, ink2 = ("#ffffff", "#ffffff") if is_dark(fill) else ("#000000", "#374151")
        rx = 12 if n["op"] in ("input", "output") else 4
        tip = n["title"] + (f" @ {n['path']}" if n["path"] else "")
        if overlay is not None and n["id"] in overlay["values"]:
            tip += f" ({overlay['values'][n['id']]:,})"
        out.append(
            f'<g class="node" id="node-{n["id"]}" data-id="{n["id"]}"><title>{html.escape(tip)}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_NODE_H}" rx="{rx}" '
            f'fill="{fill}" stroke="#4b5563"/>'
            f'<text x="{x + w / 2:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-weight="bold" '
            f'fill="{ink}">'
            f"{html.escape(n['title'])}</text>"
            f'<text x="{x + w / 2:.1f}" y="{y + 27:.1f}" text-anchor="middle" fill="{ink2}">'
            f"{html.escape(_types_line(n))}</text></g>"
        )
    out.append("</g></g></svg>")
    return "\n".join(out) + "\n"


def render_svg(graph, overlay: str | None = None) -> str:
    """``graph`` drawn as standalone SVG (what ``Graph._repr_svg_`` shows); ``overlay``
    ``"flops"`` / ``"bytes"`` colours the nodes by estimated cost."""
    return svg(describe(graph), overlay=cost_overlay(graph, overlay) if overlay else None)

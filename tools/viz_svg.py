"""A built-in layered drawing of a graph as SVG (no Graphviz needed), and the HTML page around it.

The layout is a small Sugiyama-style one: every node gets the rank of its longest path from a
graph input, nodes within a rank are ordered by the barycentre of their neighbours (a few
sweeps down and up), and edges are drawn as curves from the bottom of the producer to the top
of the consumer. Nodes are coloured by their top-level layer. Used by ``kaun-ir viz`` for
``.svg`` / ``.html`` when Graphviz is not installed and by ``Graph._repr_svg_`` in notebooks.
"""

from __future__ import annotations

import html
import json

from .spec import path_components

_PALETTE = ("#dbeafe", "#dcfce7", "#fef9c3", "#fce7f3", "#ede9fe", "#ffedd5", "#cffafe", "#e0e7ff",
            "#fee2e2", "#ecfccb")
_IO_COLOR = "#e5e7eb"
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
        else:
            title = op
        parts = path_components(data["path"])
        nodes.append({"id": nid, "op": op, "title": title, "types": data["types"], "path": data["path"],
                      "group": parts[0] if parts else "", "attrs": attrs, "source": data["source"]})
    for src, dst, data in dg.edges(data=True):
        # a graph argument is a node of one result (to_networkx's "result" is its argument index)
        result = 0 if dg.nodes[src]["op"] == "input" else data["result"]
        edges.append({"source": src, "target": dst, "type": data["type"], "result": result,
                      "operand": data["index"]})
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


# ------------------------------------------------------------------ SVG


def group_colors(model: dict) -> dict[str, str]:
    groups = []
    for n in model["nodes"]:
        if n["group"] and n["group"] not in groups:
            groups.append(n["group"])
    return {g: _PALETTE[k % len(_PALETTE)] for k, g in enumerate(groups)}


def svg(model: dict, standalone: bool = True) -> str:
    """The drawing as SVG text. ``standalone=False`` leaves out the XML namespace declaration
    (for inline use in HTML, where it is implied)."""
    boxes = layout(model)
    total_w, total_h = boxes["_size"]
    colors = group_colors(model)
    xmlns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [f'<svg{xmlns} width="{total_w:.0f}" height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} '
           f'{total_h:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker></defs>',
           f'<text x="{_MARGIN}" y="{_MARGIN + 4}" font-size="13" font-weight="bold">'
           f'@{html.escape(model["name"])}</text>']
    # a legend of the top-level layers
    x = _MARGIN + 12 + len(model["name"]) * 8
    for group, color in colors.items():
        out.append(f'<rect x="{x:.1f}" y="{_MARGIN - 6}" width="10" height="10" fill="{color}" stroke="#9ca3af"/>')
        out.append(f'<text x="{x + 14:.1f}" y="{_MARGIN + 3}">{html.escape(group)}</text>')
        x += 24 + len(group) * _CHAR_W
    out.append('<g class="edges" fill="none" stroke="#6b7280" stroke-width="1">')
    for e in model["edges"]:
        sx, sy, sw = boxes[e["source"]]
        tx, ty, tw = boxes[e["target"]]
        x1, y1, x2, y2 = sx + sw / 2, sy + _NODE_H, tx + tw / 2, ty
        bend = max((y2 - y1) / 2, 12)
        out.append(f'<path class="edge" data-source="{e["source"]}" data-target="{e["target"]}" '
                   f'd="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" '
                   f'marker-end="url(#arrow)"><title>{html.escape(e["type"])}</title></path>')
    out.append("</g>")
    out.append('<g class="nodes">')
    for n in model["nodes"]:
        x, y, w = boxes[n["id"]]
        fill = colors.get(n["group"], _IO_COLOR)
        rx = 12 if n["op"] in ("input", "output") else 4
        tip = n["title"] + (f" @ {n['path']}" if n["path"] else "")
        out.append(f'<g class="node" id="node-{n["id"]}" data-id="{n["id"]}"><title>{html.escape(tip)}</title>'
                   f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_NODE_H}" rx="{rx}" '
                   f'fill="{fill}" stroke="#4b5563"/>'
                   f'<text x="{x + w / 2:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-weight="bold">'
                   f'{html.escape(n["title"])}</text>'
                   f'<text x="{x + w / 2:.1f}" y="{y + 27:.1f}" text-anchor="middle" fill="#374151">'
                   f'{html.escape(_types_line(n))}</text></g>')
    out.append("</g></svg>")
    return "\n".join(out) + "\n"


def render_svg(graph) -> str:
    """``graph`` drawn as standalone SVG (what ``Graph._repr_svg_`` shows)."""
    return svg(describe(graph))


# ------------------------------------------------------------------ HTML

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ margin: 0; font-family: Helvetica, Arial, sans-serif; display: flex; height: 100vh; }}
#main {{ flex: 1; overflow: auto; }}
#side {{ width: 360px; border-left: 1px solid #d1d5db; padding: 10px; overflow: auto; font-size: 13px; }}
#search {{ width: 100%; box-sizing: border-box; padding: 4px; font-size: 13px; }}
#count {{ color: #6b7280; margin: 4px 0 10px; }}
.node {{ cursor: pointer; }}
.node.match rect {{ stroke: #dc2626; stroke-width: 3; }}
.node.selected rect {{ stroke: #2563eb; stroke-width: 3; }}
.edge.near {{ stroke: #2563eb; stroke-width: 2; }}
table {{ border-collapse: collapse; width: 100%; }}
td {{ border-top: 1px solid #e5e7eb; padding: 2px 4px; vertical-align: top; word-break: break-all; }}
td.k {{ color: #6b7280; white-space: nowrap; word-break: normal; }}
</style>
</head>
<body>
<div id="main">
{svg}
</div>
<div id="side">
<input id="search" type="search" placeholder="search op, layer path, type, input name">
<div id="count">{summary}</div>
<div id="details">Click a node for its details.</div>
</div>
<script type="application/json" id="kir-data">{data}</script>
<script>
(function () {{
  "use strict";
  var data = JSON.parse(document.getElementById("kir-data").textContent);
  var byId = {{}};
  data.nodes.forEach(function (n) {{ byId[n.id] = n; }});
  var incoming = {{}}, outgoing = {{}};
  data.edges.forEach(function (e) {{
    (incoming[e.target] = incoming[e.target] || []).push(e);
    (outgoing[e.source] = outgoing[e.source] || []).push(e);
  }});
  function text(s) {{ return document.createTextNode(String(s)); }}
  function row(table, key, value) {{
    var tr = document.createElement("tr"), k = document.createElement("td"), v = document.createElement("td");
    k.className = "k"; k.appendChild(text(key)); v.appendChild(text(value));
    tr.appendChild(k); tr.appendChild(v); table.appendChild(tr);
  }}
  function select(id) {{
    var n = byId[id];
    document.querySelectorAll(".node.selected").forEach(function (g) {{ g.classList.remove("selected"); }});
    document.querySelectorAll(".edge.near").forEach(function (p) {{ p.classList.remove("near"); }});
    var g = document.getElementById("node-" + id);
    if (g) {{ g.classList.add("selected"); }}
    document.querySelectorAll('.edge[data-source="' + id + '"], .edge[data-target="' + id + '"]')
      .forEach(function (p) {{ p.classList.add("near"); }});
    var details = document.getElementById("details");
    details.textContent = "";
    var h = document.createElement("h3"); h.appendChild(text(n.title)); details.appendChild(h);
    var table = document.createElement("table");
    row(table, "id", n.id);
    row(table, "op", n.op);
    row(table, "layer path", n.path || "(none)");
    row(table, "result types", n.types.join(", "));
    (incoming[id] || []).forEach(function (e) {{
      row(table, "operand " + e.operand, byId[e.source].title + " (" + e.source + ") : " + e.type);
    }});
    (outgoing[id] || []).forEach(function (e) {{
      row(table, "used by", byId[e.target].title + " (" + e.target + ") operand " + e.operand);
    }});
    Object.keys(n.attrs).forEach(function (k) {{ row(table, k, n.attrs[k]); }});
    if (n.source) {{ row(table, "source", n.source); }}
    details.appendChild(table);
  }}
  document.querySelectorAll(".node").forEach(function (g) {{
    g.addEventListener("click", function () {{ select(g.getAttribute("data-id")); }});
  }});
  document.getElementById("search").addEventListener("input", function (ev) {{
    var q = ev.target.value.trim().toLowerCase(), first = null, count = 0;
    data.nodes.forEach(function (n) {{
      var g = document.getElementById("node-" + n.id);
      var hay = [n.title, n.op, n.path, n.types.join(" "), n.id].join(" ").toLowerCase();
      var hit = q !== "" && hay.indexOf(q) >= 0;
      if (g) {{ g.classList.toggle("match", hit); }}
      if (hit) {{ count += 1; if (first === null) {{ first = g; }} }}
    }});
    document.getElementById("count").textContent = q === "" ? {summary_js} : count + " matching nodes";
    if (first) {{ first.scrollIntoView({{block: "center", inline: "center"}}); }}
  }});
}})();
</script>
</body>
</html>
"""


def render_html(graph) -> str:
    """A self-contained page (no network access): the SVG, a search box and a details panel."""
    model = describe(graph)
    summary = f"{len(graph.nodes)} nodes, {len(graph.inputs)} inputs, {len(graph.outputs)} outputs"
    data = json.dumps(model).replace("</", "<\\/")  # no "</script>" inside the data block
    return _PAGE.format(title=html.escape(f"kaun_ir graph @{graph.name}"), svg=svg(model, standalone=False),
                        summary=html.escape(summary), summary_js=json.dumps(summary), data=data)

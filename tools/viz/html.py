"""The interactive HTML page of ``kaun-ir viz``: one self-contained file, no network access.

The page embeds the graph as JSON and draws it with its own script (``page.js``, styles in
``page.css``, both inlined): a layered layout of the *visible* graph, where each layer group
(a node's layer path, split by :func:`~kaun_ir.ir.core.path_components`) is either collapsed
into one box or expanded into a frame around its ops and sub-groups. See ``docs/visualisation.md``
for what a user can do in it.

What this module decides (so the script has a single source for it):

* the group tree: one group per distinct layer-path prefix; graph inputs and outputs sit at the
  top level, except that more than :data:`IO_GROUP_LIMIT` of them are gathered into the groups
  ``(inputs)`` / ``(outputs)`` (a training step has hundreds);
* the start state: groups are expanded breadth first (top-level groups first, in execution
  order) as long as at most :data:`START_VISIBLE_LIMIT` boxes are visible, so a small graph
  starts fully expanded and a large one with its top-level groups collapsed; the bookkeeping
  groups of a training step (:data:`START_COLLAPSED`) start collapsed whatever their size, and
  the view starts fitted to the window;
* the cost overlay: ``(flops, bytes)`` of every node from :func:`~kaun_ir.tools.dump.node_cost`;
* the diff of two stages (:func:`diff_nodes`).
"""

from __future__ import annotations

import html
import json
import os
import re
from collections import defaultdict

from kaun_ir.ir.core import path_components
from kaun_ir.tools.viz.svg import describe, node_costs

#: more graph inputs (outputs) than this are gathered into one group "(inputs)" ("(outputs)")
IO_GROUP_LIMIT = 16
#: the page starts with groups expanded while at most this many boxes are visible
START_VISIBLE_LIMIT = 200
#: top-level groups that start collapsed: what a training step adds around the model (deriving
#: the step's random keys, the optimiser's update), so the page opens on the model's layers
START_COLLAPSED = ("rng", "optimizer")
OVERLAYS = ("flops", "bytes", "comm")
INPUTS_GROUP, OUTPUTS_GROUP = "(inputs)", "(outputs)"

_HERE = os.path.dirname(os.path.abspath(__file__))


def _asset(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as handle:
        return handle.read()


# ------------------------------------------------------------------ the page's graph model


def comm_costs(graph, hlo_text: str) -> dict[str, float]:
    """``{node id: bytes}``: what each node's collectives send per device, from XLA's partitioned
    HLO (:func:`kaun_ir.runtime.collectives.collective_entries`). A collective names the layer and
    op that caused it; its bytes go to the nodes of that layer with that op (shared evenly), else
    to all the layer's nodes."""
    from kaun_ir.runtime.collectives import collective_entries

    by_path: dict[str, list[int]] = {}
    for k, node in enumerate(graph.nodes):
        by_path.setdefault(node.path, []).append(k)
    out: dict[str, float] = {}
    for entry in collective_entries(hlo_text):
        path, _, op = entry["op_name"].rpartition("/")
        members = by_path.get(path, [])
        chosen = [k for k in members if graph.nodes[k].op == op] or members
        for k in chosen:
            out[f"n{k}"] = out.get(f"n{k}", 0.0) + entry["wire_bytes"] / len(chosen)
    return out


def page_graph(graph, stage: str = "", comm: dict | None = None) -> dict:
    """The graph as the page's script reads it.

    ``{"name", "stage", "groups": [[parent, name], ...], "nodes": [...], "edges": [...]}``:
    ``groups`` is the group tree in first-use order (``parent`` is an index into the list or
    -1 for a top-level group); a node is ``{"id", "op", "title", "types", "path", "attrs",
    "source", "g" (index of its innermost group, -1 for none), "cost": [flops, bytes]}``;
    an edge is ``[source node index, target node index, type, result index, operand index]``.
    """
    model = describe(graph)
    costs = node_costs(graph)
    n_inputs = sum(1 for n in model["nodes"] if n["op"] == "input")
    n_outputs = sum(1 for n in model["nodes"] if n["op"] == "output")
    groups: list[list] = []
    index: dict[tuple, int] = {}

    def group_of(parts: list[str]) -> int:
        parent = -1
        for depth in range(len(parts)):
            key = tuple(parts[: depth + 1])
            if key not in index:
                index[key] = len(groups)
                groups.append([parent, parts[depth]])
            parent = index[key]
        return parent

    nodes = []
    position = {}
    group_of_path: dict[str, int] = {}  # many nodes share a layer path
    for n in model["nodes"]:
        if n["op"] == "input" and n_inputs > IO_GROUP_LIMIT:
            parts = [INPUTS_GROUP]
        elif n["op"] == "output" and n_outputs > IO_GROUP_LIMIT:
            parts = [OUTPUTS_GROUP]
        else:
            parts = None
        if parts is not None:
            group = group_of(parts)
        elif n["path"] in group_of_path:
            group = group_of_path[n["path"]]
        else:
            group = group_of_path[n["path"]] = group_of(path_components(n["path"]))
        position[n["id"]] = len(nodes)
        nodes.append(
            {
                "id": n["id"],
                "op": n["op"],
                "title": n["title"],
                "types": n["types"],
                "path": n["path"],
                "attrs": n["attrs"],
                "source": n["source"],
                "g": group,
                "cost": [
                    *costs.get(n["id"], (0, 0)),
                    *([comm.get(n["id"], 0.0)] if comm is not None else []),
                ],
            }
        )
    edges = [
        [position[e["source"]], position[e["target"]], e["type"], e["result"], e["operand"]]
        for e in model["edges"]
    ]
    return {"name": graph.name, "stage": stage, "groups": groups, "nodes": nodes, "edges": edges}


# ------------------------------------------------------------------ diff


def node_signature(graph, node_id: str) -> tuple:
    """What :func:`diff_nodes` compares: for an op ``(op, layer path, attributes, result types,
    operand types)``; for a graph input ``(input name or index, type)``; for an output
    ``(index, type)``."""
    from kaun_ir.ir.text import format_attr

    kind, number = node_id.rstrip("0123456789"), int(node_id.lstrip("argnout"))
    if kind == "arg":
        name = graph.input_names[number] if graph.input_names else str(number)
        return ("input", name, str(graph.inputs[number].type))
    if kind == "out":
        return ("output", number, str(graph.outputs[number].type))
    node = graph.nodes[number]
    attrs = tuple((key, value if isinstance(value, str) else format_attr(value)) for key, value in node.attrs)
    return (
        node.op,
        node.path,
        attrs,
        tuple(str(t) for t in node.types),
        tuple(str(v.type) for v in node.inputs),
        tuple(r.text() for r in node.regions),
    )


def _ids(graph) -> list[str]:
    return (
        [f"arg{i}" for i in range(len(graph.inputs))]
        + [f"n{k}" for k in range(len(graph.nodes))]
        + [f"out{i}" for i in range(len(graph.outputs))]
    )


def diff_nodes(graph_a, graph_b) -> tuple[dict[str, str], dict[str, str]]:
    """Which nodes of ``graph_a`` were removed and which of ``graph_b`` added:
    ``({id in a: "removed"}, {id in b: "added"})``.

    Nodes are matched by :func:`node_signature` (op, layer path, attributes, result and operand
    *types*) as multisets: if a signature occurs ``p`` times in A and ``q`` times in B, the
    first ``min(p, q)`` occurrences of each (in execution order) are kept and the remaining
    ``p - q`` in A are "removed" (or ``q - p`` in B "added"). Operands are compared by type, not
    by producer, so a change early in the graph does not mark everything after it: a node whose
    operands were only rewired to equal-typed values (e.g. after CSE) counts as kept.
    """
    seen_b: dict[tuple, list[str]] = defaultdict(list)
    for nid in _ids(graph_b):
        seen_b[node_signature(graph_b, nid)].append(nid)
    removed: dict[str, str] = {}
    for nid in _ids(graph_a):
        pending = seen_b.get(node_signature(graph_a, nid))
        if pending:
            pending.pop(0)
        else:
            removed[nid] = "removed"
    added = {nid: "added" for ids in seen_b.values() for nid in ids}
    return removed, added


# ------------------------------------------------------------------ the page


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{title}}</title>
<link rel="icon" href="data:,">
<style>
{{css}}</style>
</head>
<body>
<header id="toolbar">
<span id="graph-title"></span>
<input id="search" type="search" placeholder="search: op, node id, input name, layer path (Enter: next)"
 autocomplete="off" spellcheck="false">
<button id="search-prev" title="previous match (Shift+Enter)">&#8249;</button>
<button id="search-next" title="next match (Enter)">&#8250;</button>
<span id="count"></span>
<button id="expand-all">expand all</button>
<button id="collapse-all">collapse all</button>
<button id="zoom-in" title="zoom in (or the mouse wheel)">+</button>
<button id="zoom-out" title="zoom out">&#8722;</button>
<button id="fit" title="fit the drawing into the window">fit</button>
<span id="diff-summary"></span>
<div id="legend"></div>
</header>
<main id="views"></main>
<aside id="side"><div id="details"></div></aside>
<script type="application/json" id="kir-data">{{data}}</script>
<script>
{{js}}</script>
</body>
</html>
"""


def _page(title: str, payload: dict) -> str:
    data = json.dumps(payload, separators=(",", ":"))
    # nothing in the data block may end it: "</script>" -> "<\/script>" (JSON reads it back the same)
    data = data.replace("</", "<\\/").replace("<!--", "<\\u0021--")
    parts = {
        "title": html.escape(title),
        "css": _asset("page.css"),
        "data": data,
        "js": _asset("page.js"),
    }
    # one pass over the template, so nothing inserted is searched for placeholders again
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _PAGE)


def _settings(overlay: str | None) -> dict:
    if overlay is not None and overlay not in OVERLAYS:
        raise ValueError(f"unknown overlay {overlay!r}; choose from {', '.join(OVERLAYS)}")
    return {
        "overlay": overlay,
        "startVisibleLimit": START_VISIBLE_LIMIT,
        "startCollapsed": list(START_COLLAPSED),
    }


def render_html(graph, stage: str = "", overlay: str | None = None, comm: dict | None = None) -> str:
    """The interactive page of one graph; ``overlay`` ``"flops"`` / ``"bytes"`` colours nodes by
    estimated cost, ``"comm"`` by the bytes their collectives send (``comm``, from
    :func:`comm_costs`)."""
    if overlay == "comm" and comm is None:
        raise ValueError("the comm overlay needs the bytes of each node's collectives (comm_costs)")
    payload = {"mode": "single", **_settings(overlay), "graphs": [page_graph(graph, stage, comm)]}
    return _page(f"kaun_ir graph @{graph.name}" + (f" ({stage})" if stage else ""), payload)


def render_diff_html(graph_a, graph_b, stage_a: str, stage_b: str, overlay: str | None = None) -> str:
    """Two graphs side by side, the nodes only in A marked removed and those only in B added
    (:func:`diff_nodes`), with a summary count."""
    removed, added = diff_nodes(graph_a, graph_b)
    a, b = page_graph(graph_a, stage_a), page_graph(graph_b, stage_b)
    for graph, marks in ((a, removed), (b, added)):
        for node in graph["nodes"]:
            if node["id"] in marks:
                node["diff"] = marks[node["id"]]
    summary = {"a": len(a["nodes"]), "b": len(b["nodes"]), "removed": len(removed), "added": len(added)}
    payload = {"mode": "diff", **_settings(overlay), "graphs": [a, b], "diff": summary}
    return _page(f"kaun_ir graph @{graph_a.name}: {stage_a} vs {stage_b}", payload)

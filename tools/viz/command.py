"""``kaun-ir viz``: draw a model's IR graph; the format follows the output file's extension.

    kaun-ir viz kaun_ir.tools.examples:cnn -o cnn.svg
    kaun-ir viz kaun_ir.tools.examples:transformer_block -o block.html
    kaun-ir viz kaun_ir.tools.examples:train_step_mlp -o step.json    # Google Model Explorer

  .dot   Graphviz source: layers as nested clusters, nodes "op / result types", edges labelled
         with the tensor type they carry
  .svg   Graphviz's dot when installed, else the built-in layered layout (colours = top-level layers)
  .png   needs Graphviz's dot; without it an .svg is written next to it instead (exit status 1)
  .json  Google Model Explorer graph JSON (namespaces = layer paths, so layers fold into groups)
  .html  an interactive self-contained page (no network access): layer groups that collapse and
         expand, pan and zoom, search, node details on click (docs/visualisation.md)

The graph is the traced stage (the optimised training step for training setups) unless --stage
says otherwise. ``--renderer builtin`` forces the built-in SVG layout even when Graphviz is installed.

    kaun-ir viz kaun_ir.tools.examples:train_step_mlp --diff autodiff optimized -o diff.html
    kaun-ir viz kaun_ir.tools.examples:cnn --overlay flops -o cnn_flops.html

``--diff A B`` (.html only) shows two stages side by side, the nodes only in A marked removed and
those only in B added (matched by op, layer path, attributes, result and operand types).
``--overlay flops|bytes`` colours nodes by the estimated cost of ``kaun-ir dump --stats`` on a log
scale, with a legend (.html, .svg with the built-in renderer, .dot and .png through Graphviz).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys

from kaun_ir.ir.core import path_components
from kaun_ir.tools import spec as specs
from kaun_ir.tools.dump import add_spec_arguments, error, use_virtual_devices, write_atomic
from kaun_ir.tools.subject import GRAPH_STAGES

FORMATS = (".dot", ".svg", ".png", ".json", ".html")


def add_parser(sub) -> None:
    """Add the ``viz`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "viz",
        help="draw a model's IR graph (.dot, .svg, .png, .json, .html)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help=f"output file; its extension picks the format ({', '.join(FORMATS)})",
    )
    parser.add_argument(
        "--stage",
        choices=GRAPH_STAGES,
        default=None,
        help="which IR stage to draw (default: traced; the optimised training step for training setups)",
    )
    parser.add_argument(
        "--renderer",
        choices=("auto", "graphviz", "builtin"),
        default="auto",
        help="for .svg/.png: Graphviz's dot or the built-in layout (default: dot if installed)",
    )
    parser.add_argument(
        "--diff",
        nargs=2,
        metavar=("STAGE_A", "STAGE_B"),
        choices=GRAPH_STAGES,
        default=None,
        help="(.html only) two stages side by side with removed / added nodes marked, "
        f"e.g. --diff traced optimized; stages: {', '.join(GRAPH_STAGES)}",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        metavar="N",
        help="run on N virtual CPU devices (for graphs sharded over a mesh, e.g. with --overlay comm)",
    )
    parser.add_argument(
        "--overlay",
        choices=("flops", "bytes", "comm"),
        default=None,
        help="colour nodes by estimated FLOPs or bytes moved (log scale, with a legend); comm "
        "(.html only, a graph partitioned over a mesh): draw the partitioned stage and colour "
        "nodes and layers by the bytes their collectives send per device",
    )
    parser.set_defaults(run=run)


# ------------------------------------------------------------------ DOT


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph, overlay: str | None = None) -> str:
    """Graphviz source: one cluster per layer (nested along the layer path), nodes labelled with
    the op (or input name) and result types, edges labelled with the type of the value.
    ``overlay`` ``"flops"`` / ``"bytes"`` fills the nodes by estimated cost (log scale) and adds
    a legend as the graph's label."""
    from kaun_ir.tools.viz.svg import ZERO_COLOR, cost_overlay, describe, group_colors, is_dark

    model = describe(graph)
    colors = group_colors(model)
    costs = cost_overlay(graph, overlay) if overlay else None
    tree: dict = {"nodes": [], "children": {}}
    for n in model["nodes"]:
        place = tree
        for part in path_components(n["path"]):
            place = place["children"].setdefault(part, {"nodes": [], "children": {}})
        place["nodes"].append(n)
    lines = [
        f"digraph {_q(graph.name)} {{",
        "  rankdir=TB;",
        '  node [shape=box, style="rounded,filled", fillcolor="#e5e7eb", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=8, color="#6b7280"];',
    ]
    if costs is not None:
        cells = "".join(
            f'<td bgcolor="{color}"><font color="{"#ffffff" if is_dark(color) else "#000000"}">'
            f"{html.escape(label)}</font></td>"
            for color, label in costs["legend"]
        )
        lines.append(
            f'  labelloc=t; fontname="Helvetica"; label=<<table border="0" cellspacing="2"><tr>'
            f"<td>{html.escape(costs['title'])}:</td>{cells}</tr></table>>;"
        )
    counter = [0]

    def emit(place: dict, prefix: list[str], indent: str) -> None:
        for n in place["nodes"]:
            if costs is None:
                fill = colors.get(n["group"], "#e5e7eb")
            else:
                fill = costs["fills"].get(n["id"], ZERO_COLOR)
            extra = ", shape=oval" if n["op"] in ("input", "output") else ""
            if costs is not None and is_dark(fill):
                extra += ', fontcolor="#ffffff"'
            label = f"{n['title']}\n{', '.join(n['types'])}"
            lines.append(f"{indent}{_q(n['id'])} [label={_q(label)}, fillcolor={_q(fill)}{extra}];")
        for part, child in place["children"].items():
            counter[0] += 1
            path = prefix + [part]
            lines.append(f"{indent}subgraph {_q(f'cluster_{counter[0]}')} {{")
            lines.append(
                f'{indent}  label={_q(part)}; tooltip={_q(".".join(path))}; style=rounded; color="#9ca3af";'
            )
            emit(child, path, indent + "  ")
            lines.append(f"{indent}}}")

    emit(tree, [], "  ")
    for e in model["edges"]:
        lines.append(f"  {_q(e['source'])} -> {_q(e['target'])} [label={_q(e['type'])}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ Model Explorer JSON


def _numpy_type(type_text: str) -> str:
    """``f32[32,784]`` -> ``float32[32,784]`` (Model Explorer shows tensor_shape as written)."""
    from kaun_ir import dtypes

    name, _, dims = type_text.partition("[")
    return f"{dtypes.from_short_name(name).name}[{dims}"


def to_model_explorer(graph) -> dict:
    """The graph as Google Model Explorer's JSON graph collection: ``{"label", "graphs": [{"id",
    "nodes": [{"id", "label", "namespace", "attrs", "incomingEdges", "outputsMetadata"}]}]}``.

    ``namespace`` is the layer path with ``/`` between layers (``"1.residual/body.mlp/0.linear"``),
    so Model Explorer folds each layer into a group; graph inputs and outputs sit at the top.
    """
    from kaun_ir.tools.viz.svg import describe

    model = describe(graph)
    incoming: dict[str, list] = {}
    for e in model["edges"]:
        incoming.setdefault(e["target"], []).append(
            {
                "sourceNodeId": e["source"],
                "sourceNodeOutputId": str(e["result"]),
                "targetNodeInputId": str(e["operand"]),
            }
        )
    nodes = []
    for n in model["nodes"]:
        attrs = [{"key": "op", "value": n["op"]}]
        attrs += [{"key": key, "value": value} for key, value in n["attrs"].items()]
        if n["path"]:
            attrs.append({"key": "layer_path", "value": n["path"]})
        if n["source"]:
            attrs.append({"key": "source", "value": n["source"]})
        if n["op"] == "output":  # an output node has no results of its own: show what it returns
            types = []
        else:
            types = n["types"]
        nodes.append(
            {
                "id": n["id"],
                "label": n["title"],
                "namespace": "/".join(path_components(n["path"])),
                "attrs": attrs,
                "incomingEdges": sorted(incoming.get(n["id"], []), key=lambda e: int(e["targetNodeInputId"])),
                "outputsMetadata": [
                    {"id": str(i), "attrs": [{"key": "tensor_shape", "value": _numpy_type(t)}]}
                    for i, t in enumerate(types)
                ],
            }
        )
    return {"label": graph.name, "graphs": [{"id": graph.name, "nodes": nodes}]}


# ------------------------------------------------------------------ rendering


def graphviz(dot_source: str, fmt: str) -> bytes:
    """Run Graphviz's ``dot -T<fmt>``; RuntimeError with its message if it fails."""
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("Graphviz's dot is not installed")
    done = subprocess.run([exe, f"-T{fmt}"], input=dot_source.encode(), capture_output=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"dot -T{fmt} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def render(
    graph, path: str, renderer: str = "auto", overlay: str | None = None, stage: str = ""
) -> tuple[str, str]:
    """Write ``graph`` to ``path`` in the format of its extension. Returns ``(written path,
    note)``; the note is non-empty when something other than what was asked for was written.
    ``overlay`` (``"flops"`` / ``"bytes"``) colours nodes by estimated cost; it is not available
    for Model Explorer's ``.json``."""
    from kaun_ir.tools.viz.html import render_html
    from kaun_ir.tools.viz.svg import render_svg

    ext = os.path.splitext(path)[1].lower()
    use_dot = renderer == "graphviz" or (renderer == "auto" and shutil.which("dot") is not None)
    if ext == ".dot":
        write_atomic(path, to_dot(graph, overlay))
    elif ext == ".json":
        if overlay:
            raise ValueError(
                "--overlay is not available for .json (Model Explorer has its own per-node data overlays)"
            )
        write_atomic(path, json.dumps(to_model_explorer(graph), indent=1) + "\n")
    elif ext == ".html":
        write_atomic(path, render_html(graph, stage, overlay))
    elif ext == ".svg":
        write_atomic(path, graphviz(to_dot(graph, overlay), "svg") if use_dot else render_svg(graph, overlay))
    elif ext == ".png":
        if use_dot and shutil.which("dot") is not None:
            write_atomic(path, graphviz(to_dot(graph, overlay), "png"))
        else:
            svg_path = os.path.splitext(path)[0] + ".svg"
            write_atomic(svg_path, render_svg(graph, overlay))
            return svg_path, (
                f"PNG output needs Graphviz's dot, which is not installed (install the "
                f"'graphviz' package); wrote an SVG instead: {svg_path}"
            )
    else:
        raise ValueError(
            f"unknown output format {ext or '(no extension)'!r}; use one of {', '.join(FORMATS)}"
        )
    return path, ""


def _comm_page(subject) -> str:
    """The ``--overlay comm`` page: the partitioned stage of ``subject``'s optimized graph, its
    nodes and layers coloured by the bytes their collectives send per device."""
    from kaun_ir import runtime
    from kaun_ir.errors import ModelSpecError
    from kaun_ir.runtime.partitioned import partitioned_graph
    from kaun_ir.tools.viz.html import comm_costs, render_html

    exe = runtime.compile(subject.stage_graph("optimized"))
    if exe.mesh is None:
        raise ModelSpecError(
            f"{subject.name}: --overlay comm needs a graph partitioned over a mesh "
            "(kn.sharding.constrain in the traced function names one); this one runs on one device"
        )
    graph = partitioned_graph(exe)
    return render_html(graph, "partitioned", "comm", comm_costs(graph, exe.hlo_text()))


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir viz`` with the parsed ``args``; returns the exit status."""
    from kaun_ir.errors import KaunError
    from kaun_ir.tools.viz.html import render_diff_html

    ext = os.path.splitext(args.output)[1].lower()
    if ext not in FORMATS:
        return error(
            "viz", f"-o {args.output!r}: the extension picks the format; use one of {', '.join(FORMATS)}"
        )
    if args.renderer == "graphviz" and shutil.which("dot") is None:
        return error("viz", "--renderer graphviz: Graphviz's dot is not installed")
    if args.diff and ext != ".html":
        return error(
            "viz", f"--diff needs an .html output (the page shows both stages side by side), not {ext}"
        )
    if args.diff and args.stage:
        return error("viz", "--diff names its two stages itself; leave out --stage")
    if args.overlay == "comm" and (ext != ".html" or args.diff):
        return error("viz", "--overlay comm draws one partitioned graph as an .html page")
    if args.overlay and ext == ".json":
        return error("viz", "--overlay is not available for .json (use .html, .svg, .dot or .png)")
    try:
        use_virtual_devices(getattr(args, "devices", None))
        if args.diff:
            subject = specs.resolve(args.spec, args.input)
            stage_a, stage_b = args.diff
            page = render_diff_html(
                subject.stage_graph(stage_a), subject.stage_graph(stage_b), stage_a, stage_b, args.overlay
            )
            write_atomic(args.output, page)
            written, note = args.output, ""
        elif args.overlay == "comm":
            write_atomic(args.output, _comm_page(specs.resolve(args.spec, args.input)))
            written, note = args.output, ""
        else:
            subject, graph = specs.load_graph(args.spec, args.input, args.stage)
            stage = args.stage or subject.default_stage
            written, note = render(graph, args.output, args.renderer, args.overlay, stage)
    except (KaunError, ValueError, TypeError, OSError, RuntimeError) as err:
        return error("viz", err)
    if note:
        print(f"kaun-ir viz: {note}", file=sys.stderr)
        return 1
    print(f"wrote {written}", file=sys.stderr)
    return 0

"""``kaun-ir dump``: print one stage of a model's IR, write every stage, or report statistics.

    kaun-ir dump kaun_ir.tools.examples:mlp --stage optimized
    kaun-ir dump my_models:encoder --input f32[8,128,512] --all out/
    kaun-ir dump kaun_ir.tools.examples:cnn --stats

Stages: traced, autodiff, optimized (textual IR), stablehlo (MLIR text), hlo (XLA's optimised
HLO), partitioned (a sharded graph: every value's layout on the mesh in its type, and the
collectives per layer; ``--link-gbps`` adds their time on a link of that bandwidth); see
``kaun_ir/tools/subject.py`` for what each means for layers, functions, graphs and training setups.
``--stats`` counts ops per op and per top-level layer, parameter bytes, and
estimates FLOPs and bytes moved with a simple cost model (:func:`node_cost`).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import sys
import tempfile

from kaun_ir.fileio import atomic_write
from kaun_ir.ir.core import path_components
from kaun_ir.ir.cost import graph_cost, node_cost  # noqa: F401 - the viewer imports node_cost from here
from kaun_ir.tools import spec as specs
from kaun_ir.tools.subject import GRAPH_STAGES, STAGES, parameter_inputs

STAGE_FILES = {
    "traced": "traced.kir",
    "autodiff": "autodiff.kir",
    "optimized": "optimized.kir",
    "stablehlo": "stablehlo.mlir",
    "hlo": "hlo.txt",
}


def _bandwidth(text: str) -> float:
    """``--link-gbps``: a finite number > 0 (argparse turns the error into a usage error)."""
    from kaun_ir.runtime.collectives import check_link_gbps

    try:
        return check_link_gbps(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number of Gbit/s > 0, got {text}") from None


def add_parser(sub) -> None:
    """Add the ``dump`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "dump",
        help="print a model's IR at one stage, write all stages, or report statistics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec_arguments(parser)
    parser.add_argument(
        "--stage",
        choices=(*STAGES, "partitioned"),
        default=None,
        help="which stage to print (default: traced; with --stats: the optimised training step "
        "for training setups, else traced)",
    )
    parser.add_argument(
        "--all",
        metavar="DIR",
        default=None,
        help="write every stage to DIR as <name>.<stage>.<ext> (all stages are computed "
        "first; each file is replaced atomically)",
    )
    parser.add_argument(
        "--stats",
        action="store_true",
        help="print op counts, parameter bytes and estimated FLOPs / bytes moved",
    )
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        metavar="N",
        help="run on N virtual CPU devices (for graphs sharded over a mesh; sets XLA_FLAGS "
        "before the backend starts)",
    )
    parser.add_argument(
        "--link-gbps",
        type=_bandwidth,
        default=None,
        metavar="GBPS",
        help="with --stage partitioned: estimate each layer's communication time on a link of "
        "GBPS gigabits per second",
    )
    parser.add_argument("-o", "--output", default="-", help="output file for one stage ('-': stdout)")
    parser.set_defaults(run=run)


def use_virtual_devices(count: int | None) -> None:
    """Ask XLA's CPU backend for ``count`` devices (only possible before it starts)."""
    if not count:
        return
    from kaun_ir.runtime.xla import backend

    if backend.client.cache_info().currsize:
        raise ValueError("--devices must be given before the XLA backend starts")
    flag = f"--xla_force_host_platform_device_count={int(count)}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def add_spec_arguments(parser) -> None:
    """The SPEC and ``--input`` arguments shared by dump, export and viz; ``--help`` explains SPEC
    and lists the bundled examples."""
    parser.epilog = specs.SPEC_HELP + "\n" + examples_help()
    parser.add_argument(
        "spec",
        metavar="SPEC",
        help="module:function, path/to/file.py:function, or a .kir file (e.g. kaun_ir.tools.examples:mlp)",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="TYPE",
        help="example input type such as f32[32,784]; repeat for several inputs "
        "(overrides the example's default inputs)",
    )


def error(command: str, message) -> int:
    """Print ``kaun-ir COMMAND: error: MESSAGE`` (its first line) on stderr; returns exit status 1.
    A textual-IR parse error is followed by the offending source line and a caret."""
    if isinstance(message, BaseException):
        from kaun_ir.errors import ParseError
        from kaun_ir.tools import cli

        if cli.DEBUG:  # --debug: the traceback instead of the one line
            raise message
        if isinstance(message, ParseError):  # the one line, then the source line with a caret
            print(f"kaun-ir {command}: error: {message}", file=sys.stderr)
            return 1
        message = cli.describe(message)
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    text = lines[0] if lines else str(message)
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    print(f"kaun-ir {command}: error: {text}", file=sys.stderr)
    return 1


def statistics(subject, graph) -> dict:
    """Op counts (per op, per top-level layer), parameter bytes, estimated FLOPs and bytes."""
    per_op: dict[str, int] = {}
    per_layer: dict[str, dict] = {}
    for node in graph.nodes:
        per_op[node.op] = per_op.get(node.op, 0) + 1
        parts = path_components(node.path)
        group = per_layer.setdefault(parts[0] if parts else "(top)", {"nodes": 0, "flops": 0, "bytes": 0})
        flops, nbytes = node_cost(node)
        group["nodes"] += 1
        group["flops"] += flops
        group["bytes"] += nbytes
    params = parameter_inputs(subject, graph)
    flops, nbytes = graph_cost(graph)
    shardings: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "sharding_constraint":
            text = "[" + ", ".join("{" + ",".join(axes) + "}" for axes in node.attr("spec")) + "]"
            label = f"{node.inputs[0].type} {text} mesh {dict(node.attr('mesh'))}"
            shardings[label] = shardings.get(label, 0) + 1
    collectives = by_layer = None
    if shardings:  # partitioned by XLA: count what its partitioner inserted
        from kaun_ir import runtime
        from kaun_ir.runtime.collectives import collective_stats, collectives_by_layer

        hlo = runtime.compile(graph).hlo_text()
        collectives, by_layer = collective_stats(hlo), collectives_by_layer(hlo)
    return {
        "nodes": len(graph.nodes),
        "per_op": per_op,
        "per_layer": per_layer,
        "parameter_inputs": len(params),
        "parameter_bytes": sum(graph.inputs[i].type.nbytes for i in params),
        "parameter_elements": sum(graph.inputs[i].type.size for i in params),
        "parameters_known": subject.kind in ("layer", "train"),
        "flops": flops,
        "bytes": nbytes,
        "shardings": shardings,
        "collectives": collectives,
        "collectives_by_layer": by_layer,
    }


def format_statistics(name: str, stage: str, stats: dict) -> str:
    """The report of ``kaun-ir dump --stats`` for one stage: node and parameter counts, estimated
    FLOPs and bytes, the ops, shardings and collectives, and nodes, FLOPs and bytes per top-level
    layer."""
    lines = [f"{name} ({stage}): {stats['nodes']} nodes"]
    what = "parameters" if stats["parameters_known"] else "inputs (parameters unknown)"
    lines.append(
        f"{what}: {stats['parameter_inputs']} arrays, {stats['parameter_elements']:,} elements, "
        f"{stats['parameter_bytes']:,} bytes"
    )
    lines.append(f"estimated FLOPs: {stats['flops']:,}")
    lines.append(f"estimated bytes moved (unfused): {stats['bytes']:,}")
    lines.append("ops:")
    for op, count in sorted(stats["per_op"].items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {op:24s} {count:6d}")
    if stats.get("shardings"):
        lines.append("shardings (sharding_constraint):")
        for label, count in stats["shardings"].items():
            lines.append(f"  {count:4d} x {label}")
    if stats.get("collectives") is not None:
        lines.append("collectives in XLA's partitioned HLO (per device):")
        for kind, entry in stats["collectives"].items():
            lines.append(f"  {kind:24s} {entry['count']:6d} {entry['bytes']:16,d} bytes")
    if stats.get("collectives_by_layer"):
        from kaun_ir.runtime.collectives import format_comm_table

        lines.append("collectives per layer (see --stage partitioned):")
        lines.extend(f"  {line}" for line in format_comm_table(stats["collectives_by_layer"]).splitlines())
    lines.append("layers (top-level):")
    lines.append(f"  {'layer':24s} {'nodes':>6s} {'FLOPs':>16s} {'bytes':>16s}")
    for layer, group in stats["per_layer"].items():
        lines.append(f"  {layer:24s} {group['nodes']:6d} {group['flops']:16,d} {group['bytes']:16,d}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ writing


write_atomic = atomic_write  # the name the viz module imports


def write_all(subject, directory: str) -> list[str]:
    """Every stage of ``subject`` into ``directory``. All texts are computed before anything is
    written, so a stage that fails leaves the directory untouched; a new directory appears
    complete (it is filled under a temporary name and renamed)."""
    target = os.path.abspath(directory)
    if os.path.exists(target) and not os.path.isdir(target):
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", directory)
    texts = {stage: subject.stage_text(stage) for stage in STAGES}
    names = [f"{subject.name}.{STAGE_FILES[stage]}" for stage in STAGES]
    if not os.path.isdir(target):
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
        try:
            for name, text in zip(names, texts.values()):
                with open(os.path.join(tmp, name), "w") as handle:
                    handle.write(text)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:
        for name, text in zip(names, texts.values()):
            write_atomic(os.path.join(target, name), text)
    return [os.path.join(directory, name) for name in names]


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir dump`` with the parsed ``args``; returns the exit status."""
    from kaun_ir.errors import KaunError

    try:
        use_virtual_devices(getattr(args, "devices", None))
        subject = specs.resolve(args.spec, args.input)
        if args.all:
            for path in write_all(subject, args.all):
                print(path)
            return 0
        if args.stats:
            stage = args.stage or subject.default_stage
            if stage not in GRAPH_STAGES:
                return error("dump", f"--stats works on an IR stage ({', '.join(GRAPH_STAGES)}), not {stage}")
            text = format_statistics(subject.name, stage, statistics(subject, subject.stage_graph(stage)))
        elif args.stage == "partitioned":
            text = subject.partitioned_text(getattr(args, "link_gbps", None))
        else:
            text = subject.stage_text(args.stage or "traced")
    except (KaunError, ValueError, TypeError) as err:
        return error("dump", err)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        write_atomic(args.output, text)
    return 0


def examples_help() -> str:
    """The bundled example models, one line each (for ``--help``)."""
    import inspect

    from kaun_ir.tools import examples
    from kaun_ir.tools.cli import plain

    lines = ["Bundled examples (try: kaun-ir dump kaun_ir.tools.examples:mlp --stage optimized):"]
    for name, fn in inspect.getmembers(examples, inspect.isfunction):
        if (
            name.startswith("_")
            or fn.__module__ != examples.__name__
            or inspect.signature(fn).parameters
            and any(p.default is inspect.Parameter.empty for p in inspect.signature(fn).parameters.values())
        ):
            continue
        summary = plain((fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        lines.append(f"  kaun_ir.tools.examples:{name:26s} {summary}")
    return "\n".join(lines) + "\n"

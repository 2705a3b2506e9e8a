"""``kaun-ir export``: write a model as StableHLO, text (``.mlir``) or a portable artifact (``.mlirbc``).

    kaun-ir export kaun_ir.tools.examples:mlp -o mlp.mlirbc
    kaun-ir export my_models:encoder --input f32[8,128,512] -o encoder.mlir

The exported function is ``@main`` of the optimized stage by default (``--stage`` picks another
IR stage). Its arguments are the graph's inputs in order — for a layer the parameter leaves
(tree-flatten order, dict keys sorted), then the state leaves, then the input(s); ``--list-inputs``
prints them. ``.mlirbc`` is a versioned StableHLO portable artifact (the minimum supported
version of the installed jaxlib), loadable by any StableHLO consumer of that version or newer.
The file is written atomically.
"""

from __future__ import annotations

import argparse
import sys

from kaun_ir.tools import spec as specs
from kaun_ir.tools.dump import add_spec_arguments, error
from kaun_ir.tools.subject import GRAPH_STAGES


def add_parser(sub) -> None:
    """Add the ``export`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "export",
        help="write a model as StableHLO (.mlir text or .mlirbc portable artifact)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="model.mlir or model.mlirbc")
    parser.add_argument(
        "--stage",
        choices=GRAPH_STAGES,
        default="optimized",
        help="which IR stage to export (default: %(default)s)",
    )
    parser.add_argument(
        "--list-inputs",
        action="store_true",
        help="also print the exported function's arguments (name and type)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir export`` with the parsed ``args``; returns the exit status."""
    from kaun_ir import runtime
    from kaun_ir.errors import KaunError

    if not args.output.endswith((".mlir", ".mlirbc")):
        return error("export", f"-o must end in .mlir or .mlirbc, got {args.output!r}")
    try:
        _, graph = specs.load_graph(args.spec, args.input, args.stage)
        runtime.export(graph, args.output)
    except (KaunError, ValueError, TypeError, OSError) as err:
        return error("export", err)
    if args.list_inputs:
        names = graph.input_names or [""] * len(graph.inputs)
        for i, (name, value) in enumerate(zip(names, graph.inputs)):
            print(f"%arg{i}: {value.type}  {name}")
    print(
        f"wrote {args.output}: @main({len(graph.inputs)} inputs) -> {len(graph.outputs)} outputs",
        file=sys.stderr,
    )
    return 0

"""``kaun-ir opt``: run a pass pipeline over textual IR and print the result."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "opt", help="run a pass pipeline over textual IR (.kir)",
        description="Read textual IR from FILE (or stdin with '-'), run the pipeline given by -p, "
                    "and print the resulting IR (or its StableHLO with --emit=stablehlo).")
    parser.add_argument("file", nargs="?", default="-", help="input .kir file, '-' for stdin (default)")
    parser.add_argument("-p", "--pipeline", default="", help='comma-separated passes, e.g. "autodiff,cse,dce"')
    parser.add_argument("--emit", choices=("ir", "stablehlo"), default="ir", help="output form (default: ir)")
    parser.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    parser.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kaun_ir import passes
    from kaun_ir.errors import KaunError
    from kaun_ir.ir import parse

    if args.list_passes:
        for name, description in passes.available().items():
            print(f"{name:24s} {description}")
        return 0
    text = sys.stdin.read() if args.file == "-" else open(args.file).read()
    try:
        graph = parse(text)
        graph = passes.run(graph, args.pipeline) if args.pipeline else graph
    except (KaunError, ValueError, TypeError) as err:
        print(f"kaun-ir opt: error: {err}", file=sys.stderr)
        return 1
    if args.emit == "stablehlo":
        from kaun_ir import runtime

        out = runtime.lower(graph)
    else:
        out = graph.text()
    if args.output == "-":
        sys.stdout.write(out)
    else:
        with open(args.output, "w") as handle:
            handle.write(out)
    return 0

"""``kaun-ir import``: read a StableHLO module and write it as kaun_ir's textual IR.

    kaun-ir import model.mlir -o model.kir
    kaun-ir import step.mlirbc --function main -o step.kir

The module may be MLIR text (for example ``jax.jit(f).lower(x).as_text(debug_info=True)``), MLIR
bytecode or a portable ``.mlirbc`` artifact. Calls and composites are inlined, CHLO ops are
rewritten into StableHLO, and ``loc`` names become layer paths. An op kaun_ir cannot express is
reported with its location. The output is written atomically; ``-o -`` prints it.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    """Add the ``import`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "import",
        help="import a StableHLO module (.mlir/.mlirbc) as textual IR (.kir)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", help="input .mlir (text) or .mlirbc (bytecode / portable artifact)")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="output .kir file ('-' for stdout)"
    )
    parser.add_argument(
        "--function",
        default=None,
        metavar="NAME",
        help="function to import (default: main, else the only public one)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir import`` with the parsed ``args``; returns the exit status."""
    from kaun_ir.errors import KaunError
    from kaun_ir.fileio import atomic_write
    from kaun_ir.tools.cli import describe
    from kaun_ir.tools.spec import import_stablehlo, read_stablehlo_file

    try:
        graph = import_stablehlo(args.file, read_stablehlo_file(args.file), args.function)
        text = graph.text()
        if args.output == "-":
            sys.stdout.write(text)
        else:
            atomic_write(args.output, text.encode())
    except (KaunError, ValueError, TypeError, OSError, UnicodeDecodeError) as err:
        from kaun_ir.tools.dump import error  # one line (see docs/errors.md); --debug re-raises

        return error(
            "import", f"{args.file}: {describe(err)}" if isinstance(err, UnicodeDecodeError) else err
        )
    print(
        f"imported @{graph.name}: {len(graph.inputs)} inputs, {len(graph.nodes)} nodes, "
        f"{len(graph.outputs)} outputs",
        file=sys.stderr,
    )
    return 0

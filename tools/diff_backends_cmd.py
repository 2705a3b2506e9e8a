"""kaun-ir diff-backends: one program compiled by XLA and by IREE, run on the same inputs, compared.

Takes the model's optimized graph (for a training setup the whole training step), compiles it on
both backends, runs both on the same seeded random inputs (floats from N(0, 0.5), integers in
[0, 2)), and prints each output's max absolute and relative difference; when an output differs
beyond the tolerance, the first op whose value diverges (with its layer path and source line).
Needs IREE (pip install 'kaun-ir[iree]'). See docs/debugging.md ("XLA against IREE").

  kaun-ir diff-backends kaun_ir.tools.examples:transformer_train_step
  kaun-ir diff-backends my_model.py:setup --rtol 1e-3 --atol 1e-5 --backends xla,iree-cpu
"""

from __future__ import annotations

import argparse
import sys

from kaun_ir.tools.dump import add_spec_arguments, error


def add_parser(sub) -> None:
    """Add the ``diff-backends`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "diff-backends",
        help="run a model's program on XLA and on IREE and compare the values, naming the op that diverges",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec_arguments(parser)
    parser.add_argument(
        "--backends",
        default="xla,iree",
        metavar="A,B",
        help="the two backends to compare (default: %(default)s; e.g. xla,iree-cpu)",
    )
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance (default: %(default)s)")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance (default: %(default)s)")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the random inputs (default: %(default)s)"
    )
    parser.add_argument(
        "--no-locate",
        action="store_true",
        help="only compare the outputs; do not look for the first op that diverges",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir diff-backends``: 0 when every output agrees, 1 when one differs or on error."""
    from kaun_ir.errors import KaunError
    from kaun_ir.runtime.diff_backends import diff_graph, random_inputs
    from kaun_ir.tools.spec import resolve

    names = [name.strip() for name in args.backends.split(",") if name.strip()]
    if len(names) != 2:
        return error("diff-backends", f"--backends {args.backends!r}: give two backends, e.g. xla,iree")
    try:
        subject = resolve(args.spec, args.input)
        graph = subject.stage_graph("optimized")
        inputs = random_inputs(graph, args.seed)
        report = diff_graph(graph, inputs, names, args.rtol, args.atol, locate=not args.no_locate)
    except (KaunError, ValueError, TypeError, OSError) as err:
        return error("diff-backends", err)
    print(f"{graph.name}: {len(graph.nodes)} nodes, {len(graph.inputs)} inputs (seed {args.seed})")
    print(report.table())
    sys.stdout.flush()
    return 0 if report.ok else 1

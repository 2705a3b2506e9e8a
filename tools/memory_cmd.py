"""kaun-ir memory: where a compiled program's memory goes, and what rematerialisation would save.

Compiles (never runs) the model's optimized graph — for a training setup, the whole training
step — and prints XLA's buffer-assignment totals, the live bytes over the schedule and the
buffers live at the peak by kind and layer (from the op_name metadata of the lowering). For a
training step it compiles the step again with the remat pass under each policy of --remat and
prints what each reaches, then advice in words. It prints exactly what ``kn.memory_report``
returns for the same step. See docs/memory.md ("Memory explained").

  kaun-ir memory kaun_ir.tools.examples:train_step_mlp
  kaun-ir memory my_model.py:setup --remat nothing dots --rows 20
"""

from __future__ import annotations

import argparse
import sys

from kaun_ir.tools.dump import add_spec_arguments, error


def _row_count(text: str) -> int:
    """``--rows``: an int >= 0 (argparse turns the ValueError into a usage error)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parser(sub) -> None:
    """Add the ``memory`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "memory",
        help="explain a compiled step's memory: live bytes, the peak by layer and kind, remat's savings",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_spec_arguments(parser)
    parser.add_argument(
        "--remat",
        nargs="*",
        default=["nothing", "dots"],
        metavar="POLICY",
        type=remat_policy,
        help="remat policies to measure on a training step: nothing, dots or paths:<pattern>|<pattern> "
        "(default: nothing dots; --remat alone: skip)",
    )
    parser.add_argument(
        "--rows", type=_row_count, default=12, help="layer rows to print, >= 0 (default: %(default)s)"
    )
    parser.set_defaults(run=run)


def remat_policy(text: str) -> str:
    """``--remat``'s argument type: a remat policy spec, else a usage error naming the valid ones."""
    from kaun_ir.transforms.remat import RematPolicy

    try:
        RematPolicy(text)
        valid = '"' not in text  # the spec travels inside a quoted pass option
    except ValueError:
        valid = False
    if not valid:
        raise argparse.ArgumentTypeError(
            f"invalid remat policy {text!r}: the policies are nothing, dots and paths:<pattern>|<pattern> "
            "(give --remat with no policy to measure none)"
        )
    return text


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir memory`` with the parsed ``args``; returns the exit status. The report is
    ``kn.memory_report``'s own (the same rows, kinds and advice as the API); this only prints it."""
    from kaun_ir.errors import KaunError
    from kaun_ir.tools.spec import resolve
    from kaun_ir.train.memory import memory_report

    try:
        subject = resolve(args.spec, args.input)
        if subject.kind == "train":
            trainer, state, step_args = subject.train_call()
            report = memory_report(trainer, state, *step_args, remat=tuple(args.remat))
        else:
            report = memory_report(subject.stage_graph("optimized"))
    except (KaunError, ValueError, TypeError, OSError) as err:
        return error("memory", err)
    print(report.text(rows=args.rows))
    sys.stdout.flush()
    return 0

"""kaun-ir memory: where a compiled program's memory goes, and what rematerialisation would save.

Compiles (never runs) the model's optimized graph — for a training setup, the whole training
step — and prints XLA's buffer-assignment totals, the live bytes over the schedule and the
buffers live at the peak by kind and layer (from the op_name metadata of the lowering). For a
training step it compiles the step again with the remat pass under each policy of --remat and
prints what each reaches. See docs/memory.md ("Memory explained").

  kaun-ir memory kaun_ir.tools.examples:train_step_mlp
  kaun-ir memory my_model.py:setup --remat nothing dots --rows 20
"""

from __future__ import annotations

import argparse
import sys

from kaun_ir.tools.dump import add_spec_arguments, error


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
    parser.add_argument("--rows", type=int, default=12, help="layer rows to print (default: %(default)s)")
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
    """Run ``kaun-ir memory`` with the parsed ``args``; returns the exit status."""
    from kaun_ir import passes, runtime
    from kaun_ir.errors import KaunError
    from kaun_ir.runtime.pipelines import train_pipeline
    from kaun_ir.tools.spec import resolve
    from kaun_ir.train.memory import executable_report

    try:
        subject = resolve(args.spec, args.input)
        loss = 0 if subject.kind == "train" else None  # a training step's output 0 is its loss
        report = executable_report(runtime.compile(subject.stage_graph("optimized")), loss_output=loss)
        if subject.kind == "train":
            step = subject.stage_graph("autodiff")
            for policy in args.remat:
                graph = passes.run(step, f'remat{{policy="{policy}" depth=1}},{train_pipeline(None)}')
                measured = executable_report(runtime.compile(graph), loss_output=loss)
                report.remat.append((policy, measured.stats, measured.peak_bytes))
    except (KaunError, ValueError, TypeError, OSError) as err:
        return error("memory", err)
    print(report.text(rows=args.rows))
    sys.stdout.flush()
    return 0

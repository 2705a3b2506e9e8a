"""``kaun-ir opt``: run a pass pipeline over textual IR and print the result.

The IR goes to stdout (or ``-o FILE``); everything else — IR dumps of the instrumentation, timing
and statistics reports, notes and errors — goes to stderr, so ``kaun-ir opt ... > out.kir`` keeps
a clean file. See docs/passes.md.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(sub) -> None:
    """Add the ``opt`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "opt",
        help="run a pass pipeline over textual IR (.kir) or imported StableHLO (.mlir/.mlirbc)",
        description="Read textual IR from FILE (or stdin with '-'), run the pipeline given by -p, "
        "and print the resulting IR (or its StableHLO with --emit=stablehlo). "
        "Diagnostics and instrumentation output go to stderr.",
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        help="input .kir file, StableHLO .mlir/.mlirbc (imported), '-' for stdin (default)",
    )
    parser.add_argument(
        "-p",
        "--pipeline",
        default="",
        help='passes with options, e.g. "autodiff,cse,dce" or "my-pass{factor=2},dce"',
    )
    parser.add_argument("--emit", choices=("ir", "stablehlo"), default="ir", help="output form (default: ir)")
    parser.add_argument(
        "--list-passes", action="store_true", help="list the registered passes with their options and exit"
    )
    parser.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a Python module (name or path to a .py file) that registers "
        "passes, before the pipeline is parsed; may be repeated",
    )
    parser.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass")
    parser.add_argument(
        "--print-ir-after-change",
        action="store_true",
        help="after each pass that changed the IR, print a unified diff of it",
    )
    parser.add_argument("--timing", action="store_true", help="report the wall time of each pass")
    parser.add_argument(
        "--stats",
        action="store_true",
        help="report per-pass statistics (node counts, ops added/removed, pass counters)",
    )
    parser.add_argument(
        "--verify-each", action="store_true", help="verify the IR before the first and after every pass"
    )
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="N",
        help="run only the first N passes of the pipeline (bisection)",
    )
    parser.add_argument("-o", "--output", default="-", help="output file ('-' for stdout)")
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="compile the graph before and after the pipeline on this backend (xla, iree, "
        "iree-cpu...) and report both run times on stderr; repeatable",
    )
    parser.add_argument(
        "--time",
        type=int,
        default=20,
        metavar="N",
        help="with --backend: calls timed per graph and backend (default: %(default)s)",
    )
    parser.set_defaults(run=run)


def list_passes(out) -> None:
    """Every registered pass with its description, then its options with types and defaults."""
    from kaun_ir import passes

    for name, info in sorted(passes.REGISTRY.items()):
        out.write(f"{name:24s} {info.description}\n")
        for option in info.options.values():
            spelled = f"{option.name}=<{option.type.__name__}>"
            allowed = "" if option.allowed() == option.type.__name__ else f"{option.allowed()}; "
            out.write(f"    {spelled:20s} {option.help} ({allowed}default: {option.spell(option.default)})\n")


def load_module(spec: str):
    """Import ``spec`` — a module name (``mypkg.passes``) or a path to a ``.py`` file — so the
    passes it registers become available (``kaun-ir opt --load``). Returns the module."""
    import importlib.util

    if spec.endswith(".py") or os.sep in spec or (os.altsep and os.altsep in spec):
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--load: no such file: {spec}")
        name = os.path.splitext(os.path.basename(path))[0]
        existing = sys.modules.get(name)
        if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
            return existing
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # so the passes' __module__ resolves (reproducers, pickling)
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    return importlib.import_module(spec)


def _error(message) -> int:
    from kaun_ir.tools.dump import error as report

    return report("opt", message)


def _read_input(path: str) -> str | bytes:
    """The input's text (bytes for a ``.mlirbc`` file); ``-`` reads stdin."""
    if path.endswith(".mlirbc"):
        with open(path, "rb") as handle:
            return handle.read()
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _instruments(args: argparse.Namespace) -> tuple[list, list]:
    """The pass manager's instrumentations from the options, and those of them that write a
    report at the end (``--timing``, ``--stats``)."""
    from kaun_ir import passes

    instrumentations: list = []
    if args.print_ir_after_all:
        instrumentations.append(passes.PrintAfterAll(sys.stderr))
    if args.print_ir_after_change:
        instrumentations.append(passes.PrintAfterChange(sys.stderr))
    reports = [passes.Timing()] if args.timing else []
    if args.stats:
        reports.append(passes.Statistics())
    return instrumentations + reports, reports


def _optimize(args: argparse.Namespace, text: str | bytes, pipeline):
    """The input graph (StableHLO imported, anything else parsed as textual IR) run through
    ``pipeline``; the timing and statistics reports go to stderr even when a pass fails."""
    from kaun_ir import passes
    from kaun_ir.ir import parse
    from kaun_ir.tools.spec import import_stablehlo, looks_like_mlir

    instrumentations, reports = _instruments(args)
    try:
        # StableHLO (.mlir / .mlirbc, or MLIR on stdin) is imported; anything else is textual IR
        is_mlir = args.file.endswith((".mlir", ".mlirbc")) or (
            isinstance(text, str) and looks_like_mlir(text)
        )
        graph = import_stablehlo(args.file, text) if is_mlir else parse(text)
        manager = passes.PassManager(
            pipeline, instrumentations, verify_each=args.verify_each or None, stop_after=args.stop_after
        )
        return graph, manager.run(graph)
    finally:  # reports of the passes that ran, also when a later one failed
        for report in reports:
            sys.stderr.write(report.report())


def _write_output(args: argparse.Namespace, graph) -> int:
    """The result as textual IR or StableHLO, to stdout or ``-o``; the exit status."""
    if args.emit == "stablehlo":
        from kaun_ir import runtime

        out = runtime.lower(graph)
    else:
        out = graph.text()
    if args.output == "-":
        sys.stdout.write(out)
        return 0
    from kaun_ir.fileio import atomic_write

    try:
        atomic_write(args.output, out)
    except OSError as err:
        return _error(f"-o {args.output}: {err.strerror}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``kaun-ir opt`` with the parsed ``args``; returns the exit status."""
    from kaun_ir import passes
    from kaun_ir.errors import KaunError

    for module in args.load:
        try:
            load_module(module)
        except Exception as err:  # an ImportError, or whatever the module raised while loading
            return _error(f"--load {module}: {type(err).__name__}: {err}")
    if args.list_passes:
        list_passes(sys.stdout)
        return 0
    if args.stop_after is not None and args.stop_after < 0:
        return _error(f"--stop-after needs a non-negative number of passes, got {args.stop_after}")
    try:
        pipeline = passes.Pipeline.parse(args.pipeline)
    except ValueError as err:
        return _error(err)
    try:
        text = _read_input(args.file)
    except (OSError, UnicodeDecodeError) as err:
        return _error(
            f"{args.file}: {err.reason if isinstance(err, UnicodeDecodeError) else err.strerror}"
            + (" (not a UTF-8 text file)" if isinstance(err, UnicodeDecodeError) else "")
        )
    try:
        before, graph = _optimize(args, text, pipeline)
        if args.backend:
            from kaun_ir.tools import opt_timing

            sys.stderr.write(opt_timing.report(before, graph, args.backend, max(1, args.time)))
    except (KaunError, ValueError, TypeError) as err:
        return _error(err)
    if args.stop_after is not None and args.stop_after < len(pipeline):
        skipped = ",".join(str(s) for s in pipeline.steps[args.stop_after :])
        print(
            f"kaun-ir opt: note: stopped after pass #{args.stop_after}; skipped: {skipped}", file=sys.stderr
        )
    return _write_output(args, graph)

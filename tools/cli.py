"""The ``kaun-ir`` command line.

Errors are one line on stderr, ``kaun-ir COMMAND: error: ...``, with exit status 2 for a usage
error (argparse: unknown option, missing or invalid argument) and 1 for a failure; no Python
traceback unless ``--debug`` is given (anywhere on the command line).
"""

from __future__ import annotations

import argparse
import sys

from . import bench, demo, dump, export, import_cmd, opt, viz
from .spec import plain

DEBUG = False  # set by main() from --debug: commands re-raise instead of printing one line


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit status 2) that point at ``--help``."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kaun-ir",
        description="kaun_ir: trace models into an own IR, transform it with passes, "
        "lower to StableHLO and run with XLA.",
        epilog="Run 'kaun-ir COMMAND --help' for a command's options. Errors are one line on stderr "
        "(exit status 2: usage, 1: failure); --debug shows the Python traceback instead.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, show the full Python traceback (also accepted after COMMAND)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    demo.add_parser(sub)
    opt.add_parser(sub)
    dump.add_parser(sub)
    export.add_parser(sub)
    import_cmd.add_parser(sub)
    viz.add_parser(sub)
    bench.add_parser(sub)
    for command in [parser, *sub.choices.values()]:  # help text for a terminal, not reST
        command.description = plain(command.description)
        command.epilog = plain(command.epilog)
        for action in command._actions:
            action.help = plain(action.help)
    return parser


def describe(err: BaseException) -> str:
    """One line saying what went wrong, without Python internals."""
    if isinstance(err, UnicodeDecodeError):
        return f"not a UTF-8 text file ({err.reason} at byte {err.start})"
    if isinstance(err, OSError) and err.strerror:
        names = " -> ".join(str(n) for n in (err.filename, err.filename2) if n is not None)
        return f"{names}: {err.strerror}" if names else err.strerror
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    message = lines[0] if lines else type(err).__name__
    if message.endswith(":") and len(lines) > 1:  # "...: " introducing the detail on the next line
        message = f"{message} {lines[1]}"
    from kaun_ir.errors import KaunError

    if isinstance(err, (KaunError, ValueError, TypeError, IndexError, KeyError, LookupError)):
        return message
    # anything else is unexpected: say what it was so a bug report can name it
    return f"internal error: {type(err).__name__}: {message} (run with --debug for the traceback)"


def main(argv: list[str] | None = None) -> int:
    global DEBUG
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"kaun-ir {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one place that turns errors into one line
        if debug:
            raise
        print(f"kaun-ir {args.command}: error: {describe(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

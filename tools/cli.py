"""The ``kaun-ir`` command line.

Errors are one line on stderr, ``kaun-ir COMMAND: error: ...``, with exit status 2 for a usage
error (argparse: unknown option, missing or invalid argument) and 1 for a failure; no Python
traceback unless ``--debug`` is given (anywhere on the command line).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

#: commands that train steps: started with huge pages for the C heap (kaun_ir.runtime.malloc_tuning)
TUNED_COMMANDS = ("demo", "bench")
DEBUG = False  # set by main() from --debug: commands re-raise instead of printing one line

# Each command: the module under kaun_ir.tools that implements it (``add_parser`` and ``run``)
# and its one-line summary. ``kaun-ir --help`` lists them without importing any, and
# ``kaun-ir COMMAND ...`` imports only that one (tests/test_tools.py checks the summaries
# against the modules' own).
COMMANDS = {
    "demo": ("demo", "train an MLP and a CNN on digits (or, with 'lm', a char-level GPT on Shakespeare)"),
    "opt": ("opt", "run a pass pipeline over textual IR (.kir) or imported StableHLO (.mlir/.mlirbc)"),
    "dump": ("dump", "print a model's IR at one stage, write all stages, or report statistics"),
    "export": ("export", "write a model as StableHLO (.mlir text or .mlirbc portable artifact)"),
    "import": ("import_cmd", "import a StableHLO module (.mlir/.mlirbc) as textual IR (.kir)"),
    "viz": ("viz.command", "draw a model's IR graph (.dot, .svg, .png, .json, .html)"),
    "bench": ("bench.command", "training-step speed of kaun_ir vs JAX + optax (and PyTorch)"),
    "memory": (
        "memory_cmd",
        "explain a compiled step's memory: live bytes, the peak by layer and kind, remat's savings",
    ),
    "diff-backends": (
        "diff_backends_cmd",
        "run a model's program on XLA and on IREE and compare the values, naming the op that diverges",
    ),
}


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit status 2) that point at ``--help``."""

    def error(self, message):
        """Exit with status 2 and one line naming the problem and pointing at ``--help``."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``kaun-ir`` parser with the full sub-parsers of ``commands`` (default: all of them);
    the other commands get a placeholder that only knows the command's summary."""
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
    for name, (module, summary) in COMMANDS.items():
        if commands is None or name in commands:
            importlib.import_module(f"{__package__}.{module}").add_parser(sub)
        else:
            sub.add_parser(name, help=summary)
    for command in [parser, *sub.choices.values()]:  # help text for a terminal, not reST
        command.description = plain(command.description)
        command.epilog = plain(command.epilog)
        for action in command._actions:
            action.help = plain(action.help)
    return parser


def plain(text: str | None) -> str | None:
    """Docstring text for a terminal: reST markup (````code````, :func:`name`) removed."""
    if not text:
        return text
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _named_command(argv: list[str]) -> str | None:
    """The command on the command line: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


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
    """Run ``kaun-ir`` with ``argv`` (default: the process's arguments); returns the exit status."""
    global DEBUG
    if argv is None and _named_command(sys.argv[1:]) in TUNED_COMMANDS:
        from kaun_ir.runtime import malloc_tuning

        malloc_tuning.restart_with_tunables()  # returns when there is nothing to change
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser(commands=[_named_command(argv)])
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

"""The ``kaun-ir`` command line."""

from __future__ import annotations

import argparse
import sys

from . import bench, demo, dump, export, import_cmd, opt, viz


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kaun-ir",
        description="kaun_ir: trace models into an own IR, transform it with passes, "
                    "lower to StableHLO and run with XLA.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo.add_parser(sub)
    opt.add_parser(sub)
    dump.add_parser(sub)
    export.add_parser(sub)
    import_cmd.add_parser(sub)
    viz.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

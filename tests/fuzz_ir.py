"""Mutation fuzzing of the textual IR: ``parse`` must never crash.

Every mutated text must either be rejected with kaun_ir's own error (``ParseError`` from the
parser, ``IRError`` from ``verify()``, which ``parse`` calls) or be accepted, and then lower to
StableHLO that jaxlib's MLIR parser accepts and verifies. Anything else (a ``RecursionError``,
a ``KeyError``, an MLIR diagnostic for an accepted graph ...) is a crash.

The test suite runs a short seeded campaign (``tests/test_ir_fuzz.py``); ``make fuzz`` runs a
long one: ``python tests/fuzz_ir.py --inputs 100000 --seed 0``.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import sys
import time
import traceback
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))

# pieces a mutation may insert: tokens of the grammar, extreme numbers, odd characters
PIECES = [
    "%0",
    "%1",
    "%99",
    "@g",
    "f32[2]",
    "i32[]",
    "bool[0]",
    "f64[3,3]",
    "f32[1099511627777]",
    "f32[-1]",
    "[",
    "]",
    "{",
    "}",
    "(",
    ")",
    ",",
    ":",
    "=",
    "->",
    "regions",
    "loc(",
    '"a"',
    '"\\ud800"',
    '"\\u0000"',
    "1e999",
    "-0",
    "nan",
    "inf",
    "9" * 30,
    "-9223372036854775809",
    "dense<f32[2]>",
    "dense<i32[]>",
    '"0x00"',
    "true",
    "none",
    "graph @h() -> () {\n  return\n}",
    "return",
    "add",
    "while",
    "dot_general",
    "reduce",
    "\n",
    " ",
    "//",
    "\u00e9",
    "\x00",
    "\ufeff",
]


@dataclass
class Report:
    inputs: int = 0
    accepted: int = 0
    rejected: int = 0
    crashes: list = field(default_factory=list)


def corpus() -> list[str]:
    """Graph texts to mutate: the pass tests' .kir files plus a few traced graphs."""
    texts = []
    for path in sorted(glob.glob(os.path.join(HERE, "kir", "*.kir"))):
        lines = [
            line for line in open(path, encoding="utf-8").read().split("\n") if not line.startswith("//")
        ]
        text = "\n".join(lines).strip() + "\n"
        for chunk in re.split(r"\n(?=graph @)", text):
            if chunk.startswith("graph @"):
                texts.append(chunk.strip() + "\n")
    texts += traced_graphs()
    return texts


def traced_graphs() -> list[str]:
    import numpy as np

    import kaun_ir as kn

    x = np.ones((2, 3), np.float32)

    def mlp(x, w):
        return kn.sum(kn.fn.gelu(x @ w) ** 2)

    def loop(x):
        return kn.fori_loop(0, 3, lambda i, c: c * 2.0 + kn.sin(c), x)

    def misc(x):
        return kn.concatenate([x[:, ::-1], kn.softmax(x, axis=0)], axis=1).astype(kn.int32), kn.argmax(
            x, axis=1
        )

    graphs = [kn.trace(mlp, x, np.ones((3, 4), np.float32)), kn.trace(loop, x), kn.trace(misc, x)]
    graphs.append(kn.trace(kn.grad(mlp), x, np.ones((3, 4), np.float32)))
    return [g.text() for g in graphs] + [graphs[0].text(debug=True)]


def mutate(text: str, rng: random.Random) -> str:
    """One to three random edits of characters, tokens or lines."""
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(9)
        pos = rng.randrange(len(text) + 1)
        if kind == 0 and text:  # delete a span
            end = min(len(text), pos + rng.randint(1, 8))
            text = text[:pos] + text[end:]
        elif kind == 1:  # insert a grammar piece
            text = text[:pos] + rng.choice(PIECES) + text[pos:]
        elif kind == 2 and text:  # replace a character
            text = (
                text[:pos]
                + chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)]))
                + text[pos + 1 :]
            )
        elif kind == 3:  # duplicate or drop a line
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            if rng.random() < 0.5:
                lines.insert(i, lines[i])
            else:
                del lines[i]
            text = "\n".join(lines)
        elif kind == 4:  # change a number
            numbers = list(re.finditer(r"-?\d+", text))
            if numbers:
                m = rng.choice(numbers)
                new = rng.choice(
                    [
                        "0",
                        "-1",
                        "1",
                        "2",
                        "7",
                        "2147483648",
                        "-2147483649",
                        "99999999999999999999",
                        str(rng.randrange(-5, 64)),
                    ]
                )
                text = text[: m.start()] + new + text[m.end() :]
        elif kind == 5:  # swap two value names
            names = re.findall(r"%\d+", text)
            if len(names) >= 2:
                a, b = rng.sample(names, 2)
                text = text.replace(a, "%TMP").replace(b, a).replace("%TMP", b)
        elif kind == 6:  # change a dtype
            types = list(re.finditer(r"\b(f16|bf16|f32|f64|i8|i16|i32|i64|u8|u32|bool)\[", text))
            if types:
                m = rng.choice(types)
                text = (
                    text[: m.start()]
                    + rng.choice(["f32[", "i32[", "bool[", "f64[", "u8[", "bf16["])
                    + text[m.end() :]
                )
        elif kind == 7:  # deep nesting
            depth = rng.choice([40, 200, 2000])
            text = text[:pos] + "[" * depth + "1" + "]" * depth + text[pos:]
        else:  # rename an op to another op of the table
            from kaun_ir.ops import TABLE

            ops = list(re.finditer(r"= ([a-z_]+)", text))
            if ops:
                m = rng.choice(ops)
                text = text[: m.start(1)] + rng.choice(sorted(TABLE)) + text[m.end(1) :]
    return text


def check(text: str) -> tuple[str, str | None]:
    """``("rejected" | "accepted", None)`` when ``text`` is handled correctly, else
    ``("crash", description)``."""
    import kaun_ir as kn
    from kaun_ir.runtime import lower
    from kaun_ir.runtime.xla.mlir import parse_mlir

    try:
        graph = kn.ir.parse(text)
    except (kn.ParseError, kn.IRError):
        return "rejected", None
    except Exception as err:  # noqa: BLE001 - a crash: reported
        return "crash", f"parse raised {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}"
    try:
        graph.verify()
        mlir = lower(graph)
        parse_mlir(mlir)
    except Exception as err:  # noqa: BLE001
        return "crash", f"accepted but does not lower: {type(err).__name__}: {str(err)[:400]}"
    return "accepted", None


def run(
    inputs: int,
    seed: int,
    seconds: float | None = None,
    texts: list[str] | None = None,
    progress: bool = False,
) -> Report:
    """Fuzz ``inputs`` mutants (or until ``seconds`` have passed), seeded."""
    rng = random.Random(seed)
    texts = texts or corpus()
    report = Report()
    start = time.monotonic()
    while report.inputs < inputs and (seconds is None or time.monotonic() - start < seconds):
        text = mutate(rng.choice(texts), rng)
        report.inputs += 1
        outcome, problem = check(text)
        if outcome == "crash":
            report.crashes.append((text, problem))
        elif outcome == "accepted":
            report.accepted += 1
        else:
            report.rejected += 1
        if progress and report.inputs % 5000 == 0:
            print(
                f"{report.inputs} inputs, {report.accepted} accepted, {len(report.crashes)} crashes, "
                f"{time.monotonic() - start:.0f}s",
                file=sys.stderr,
            )
    return report


def _worker(job: tuple[int, int]) -> Report:
    inputs, seed = job
    return run(inputs, seed, progress=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz kaun_ir's textual IR parser and verifier.")
    parser.add_argument(
        "--inputs", type=int, default=100_000, help="number of mutated texts (default 100000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes; worker k fuzzes with seed SEED*1000+k (default: one per CPU)",
    )
    parser.add_argument("--show", type=int, default=5, help="crashes to print in full (default 5)")
    args = parser.parse_args(argv)
    os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
    start = time.monotonic()
    jobs = max(1, min(args.jobs, args.inputs))
    if jobs == 1:
        report = run(args.inputs, args.seed, progress=True)
    else:
        import multiprocessing

        shares = [(args.inputs // jobs + (k < args.inputs % jobs), args.seed * 1000 + k) for k in range(jobs)]
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            parts = pool.map(_worker, shares)
        report = Report(
            sum(p.inputs for p in parts),
            sum(p.accepted for p in parts),
            sum(p.rejected for p in parts),
            [c for p in parts for c in p.crashes],
        )
    print(
        f"fuzz: {report.inputs} inputs in {time.monotonic() - start:.0f}s (seed {args.seed}, {jobs} jobs): "
        f"{report.accepted} accepted, {report.rejected} rejected, {len(report.crashes)} crashes"
    )
    for text, problem in report.crashes[: args.show]:
        print("-" * 72, text, problem, sep="\n")
    return 1 if report.crashes else 0


if __name__ == "__main__":
    sys.exit(main())

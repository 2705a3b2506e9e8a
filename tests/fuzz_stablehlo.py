"""Mutation fuzzing of the StableHLO importer: no input may end the process or leak a raw error.

Real modules — what ``kn.runtime.lower`` writes for traced functions and the example models,
what JAX writes, and each as a portable artifact (``.mlirbc``) and as plain MLIR bytecode — are
mutated (text: character edits, token swaps, truncation, odd escapes and literals; bytecode: byte
flips, truncation, insertions, varint damage) and imported with ``kn.ir.from_stablehlo``. Each
input must either import (and the graph verify) or raise ``StableHLOImportError``: any other
exception is a *raw error*, and a process death (a signal, an abort inside jaxlib) or an input
taking longer than ``--timeout`` seconds is a *death*.

The inputs are checked in a worker process that the harness restarts after a death, so a death
is counted and reported with the input that caused it, never the end of the campaign. Input
``i`` of seed ``s`` depends only on ``(s, i)``: a reported input is reproduced by its number.

    python tests/fuzz_stablehlo.py --inputs 20000 --seed 0     (make fuzz-import)

``tests/test_stablehlo_fuzz.py`` runs a short campaign in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import re
import select
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))

# pieces a text mutation may insert
TEXT_PIECES = [
    '"\\ff"',
    '"\\00"',
    '"\\c3\\28"',
    "\\ff",
    "0x7C00",
    "0xFFFFFFFFFFFFFFFFFF",
    "dense<1.0>",
    "dense<0x7FC0>",
    'dense<"0x00">',
    "dense<[1, 2, 3]>",
    "dense<1.0> : tensor<1000000x1000000xf32>",
    "tensor<1000000000x1000000000xf32>",
    "tensor<?xf32>",
    "tensor<*xf32>",
    "tensor<2xcomplex<f32>>",
    "tensor<2xf8E4M3FN>",
    "func.call @main",
    "func.call @nope",
    "stablehlo.custom_call",
    "chlo.erf",
    "sdy.sharding",
    "loc(",
    'loc("a/b/c")',
    "#loc",
    "{",
    "}",
    "(",
    ")",
    "<",
    ">",
    ":",
    ",",
    "%0",
    "%arg0",
    "@main",
    "\u00e9",
    "\x00",
    "\ufeff",
    "99999999999999999999",
    "-1",
    "1e999",
    "nan",
    "\n",
]
OP_NAMES = [
    "stablehlo.add",
    "stablehlo.multiply",
    "stablehlo.negate",
    "stablehlo.tanh",
    "stablehlo.dot_general",
    "stablehlo.reduce",
    "stablehlo.broadcast_in_dim",
    "stablehlo.convert",
    "stablehlo.while",
    "stablehlo.constant",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.compare",
    "stablehlo.select",
    "stablehlo.slice",
    "func.call",
]


@dataclass
class Report:
    """The counts of one campaign and the inputs that failed."""

    inputs: int = 0
    imported: int = 0
    rejected: int = 0
    raw_errors: list = field(default_factory=list)  # (index, kind, description)
    deaths: list = field(default_factory=list)  # (index, kind, description)

    def summary(self) -> str:
        return (
            f"{self.inputs} inputs: {self.imported} imported, {self.rejected} rejected "
            f"(StableHLOImportError), {len(self.raw_errors)} raw errors, {len(self.deaths)} deaths"
        )


# ------------------------------------------------------------------------ the corpus


def corpus() -> dict[str, list]:
    """``{"text": [...], "bytes": [...]}``: real modules as MLIR text and as bytecode."""
    os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
    import jax
    import jax.numpy as jnp
    import numpy as np

    import kaun_ir as kn
    from kaun_ir.runtime.xla import mlir
    from kaun_ir.tools.spec import load_graph

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
    for spec in ("kaun_ir.tools.examples:mlp", "kaun_ir.tools.examples:cnn"):
        graphs.append(load_graph(spec, [], None)[1])
    texts = [kn.runtime.lower(g) for g in graphs]

    def jax_step(p, x):
        def loss(p):
            h = jnp.tanh(x @ p["w"]) + jnp.array([1.0, jnp.inf, -0.0, jnp.nan], jnp.float16).astype(x.dtype)
            return jnp.sum(jax.nn.softmax(h) ** 2)

        return jax.tree_util.tree_map(lambda a, g: a - 0.1 * g, p, jax.grad(loss)(p))

    def jax_calls(x):
        inner = jax.jit(lambda y: jnp.sin(y) * 2)
        return inner(inner(x)).astype(jnp.bfloat16) + jnp.bfloat16(jnp.inf)

    p = {"w": np.ones((3, 4), np.float32)}
    texts.append(jax.jit(jax_step).lower(p, x).as_text(debug_info=True))
    texts.append(jax.jit(jax_calls).lower(x).as_text())
    texts.append(jax.jit(lambda a: jax.lax.fori_loop(0, 4, lambda i, c: c + a, a)).lower(x).as_text())
    portable = [mlir.serialize_portable(t) for t in texts]
    plain = [mlir.deserialize_portable(b) for b in portable[:3]]
    return {"text": texts, "bytes": portable + plain}


# ------------------------------------------------------------------------ mutations


# Each edit of MLIR text takes (text, a position in it, rng) and returns the edited text.


def _delete_span(text: str, pos: int, rng: random.Random) -> str:
    return text[:pos] + text[min(len(text), pos + rng.randint(1, 12)) :] if text else text


def _insert_piece(text: str, pos: int, rng: random.Random) -> str:
    return text[:pos] + rng.choice(TEXT_PIECES) + text[pos:]


def _replace_character(text: str, pos: int, rng: random.Random) -> str:
    if not text:
        return text
    char = chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000), rng.randrange(0, 32)]))
    return text[:pos] + char + text[pos + 1 :]


def _truncate(text: str, pos: int, rng: random.Random) -> str:
    return text[:pos]


def _shuffle_lines(text: str, pos: int, rng: random.Random) -> str:
    """Duplicate, drop or swap lines."""
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    choice = rng.randrange(3)
    if choice == 0:
        lines.insert(i, lines[j])
    elif choice == 1:
        del lines[i]
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _change_number(text: str, pos: int, rng: random.Random) -> str:
    numbers = list(re.finditer(r"-?\d+", text))
    if not numbers:
        return text
    m = rng.choice(numbers)
    new = rng.choice(["0", "-1", "1", "2", "3", "64", "4294967296", "99999999999999999999"])
    return text[: m.start()] + new + text[m.end() :]


def _swap_names(text: str, pos: int, rng: random.Random) -> str:
    """Swap two SSA names."""
    names = sorted(set(re.findall(r"%[\w#]+", text)))
    if len(names) < 2:
        return text
    a, b = rng.sample(names, 2)
    text = re.sub(re.escape(a) + r"\b", "%TMP", text)
    return re.sub(re.escape(b) + r"\b", a, text).replace("%TMP", b)


def _change_element_type(text: str, pos: int, rng: random.Random) -> str:
    types = list(re.finditer(r"x(f16|bf16|f32|f64|i1|i8|i32|i64|ui8|ui32)>", text))
    if not types:
        return text
    m = rng.choice(types)
    new = rng.choice(["f16", "bf16", "f32", "f64", "i1", "i32", "ui64", "f8E5M2", "complex<f32>"])
    return text[: m.start(1)] + new + text[m.end(1) :]


def _rename_op(text: str, pos: int, rng: random.Random) -> str:
    ops = list(re.finditer(r"\b(stablehlo|func|chlo)\.[a-z_]+", text))
    if not ops:
        return text
    m = rng.choice(ops)
    return text[: m.start()] + rng.choice(OP_NAMES) + text[m.end() :]


def _redirect_call(text: str, pos: int, rng: random.Random) -> str:
    """A call of a function into itself or of main."""
    calls = list(re.finditer(r"func\.func (?:public |private )?@(\w+)", text))
    if not calls:
        return text
    name = rng.choice(calls).group(1)
    return re.sub(r"call @\w+", f"call @{name}", text, count=1)


# characters and lines first, then tokens (numbers, names, types, ops, calls)
TEXT_EDITS = (
    _delete_span,
    _insert_piece,
    _replace_character,
    _truncate,
    _shuffle_lines,
    _change_number,
    _swap_names,
    _change_element_type,
    _rename_op,
    _redirect_call,
)


def mutate_text(text: str, rng: random.Random) -> str:
    """One to three edits of characters, tokens or lines of MLIR text."""
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        # edits of tokens (the second half) keep the text parseable more often
        kind = rng.randrange(10) if rng.random() < 0.4 else rng.randrange(5, 10)
        pos = rng.randrange(len(text) + 1)
        text = TEXT_EDITS[kind](text, pos, rng)
    return text


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to four edits of bytecode: byte flips (often in the string table), truncation,
    insertions, deletions and damaged varints."""
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        # in-place edits (flips, new bytes) keep the sections' frame and reach the deserialiser
        kind = rng.randrange(7) if rng.random() < 0.3 else rng.randrange(2)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:  # flip bits of a byte
            i = min(pos, len(buf) - 1)
            buf[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:  # a random byte, often where the strings are (the last third)
            i = rng.randrange(len(buf) * 2 // 3, len(buf)) if rng.random() < 0.5 else min(pos, len(buf) - 1)
            buf[i] = rng.choice([0x00, 0x7F, 0x80, 0xC3, 0xFF, rng.randrange(256)])
        elif kind == 2:  # truncate
            del buf[pos:]
        elif kind == 3:  # insert bytes
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 4 and buf:  # delete bytes
            del buf[pos : pos + rng.randint(1, 16)]
        elif kind == 5 and buf:  # a huge varint (a length, a count)
            i = min(pos, len(buf) - 1)
            buf[i : i + 1] = rng.choice([b"\x00" + b"\xff" * 8, b"\xfe", b"\x80\xff"])
        elif kind == 6:  # splice a piece of the input elsewhere
            a = rng.randrange(len(buf) + 1)
            piece = buf[a : a + rng.randint(1, 32)]
            buf[pos:pos] = piece
    return bytes(buf)


def make_input(index: int, seed: int, inputs: dict[str, list]) -> str | bytes:
    """Input ``index`` of the campaign ``seed``: a mutant of a random corpus module."""
    rng = random.Random(f"{seed}:{index}")
    if rng.random() < 0.5:
        return mutate_text(rng.choice(inputs["text"]), rng)
    return mutate_bytes(rng.choice(inputs["bytes"]), rng)


def check(data: str | bytes) -> tuple[str, str | None]:
    """``("imported" | "rejected", None)`` when ``data`` is handled as documented, else
    ``("raw", description)``."""
    import kaun_ir as kn
    from kaun_ir.errors import StableHLOImportError

    try:
        graph = kn.ir.from_stablehlo(data)
    except StableHLOImportError:
        return "rejected", None
    except Exception as err:  # noqa: BLE001 - a raw error: reported
        return "raw", f"{type(err).__name__}: {str(err)[:300]}\n{traceback.format_exc(limit=-4)}"
    try:
        graph.verify()
    except Exception as err:  # noqa: BLE001 - an imported graph that does not verify
        return "raw", f"imported but does not verify: {type(err).__name__}: {str(err)[:300]}"
    return "imported", None


# ------------------------------------------------------------------------ worker and harness


def _worker(corpus_file: str, seed: int, start: int, stop: int) -> None:
    """Check inputs ``start..stop-1``, one JSON line each on stdout (``begin`` before checking)."""
    with open(corpus_file, "rb") as handle:
        inputs = pickle.load(handle)
    check(inputs["bytes"][0])  # imports kaun_ir and starts the reading helper: not an input's time
    out = sys.stdout
    out.write(json.dumps({"ready": start}) + "\n")
    out.flush()
    for index in range(start, stop):
        data = make_input(index, seed, inputs)
        out.write(json.dumps({"begin": index}) + "\n")
        out.flush()
        outcome, problem = check(data)
        out.write(json.dumps({"index": index, "outcome": outcome, "problem": problem}) + "\n")
        out.flush()


def run(inputs: int, seed: int, timeout: float = 300.0, progress: bool = False) -> Report:
    """Fuzz ``inputs`` mutants of seed ``seed`` in worker processes; returns the report."""
    report = Report()
    with tempfile.TemporaryDirectory() as scratch:
        corpus_file = os.path.join(scratch, "corpus.pickle")
        with open(corpus_file, "wb") as handle:
            pickle.dump(corpus(), handle)
        next_index, started = 0, time.monotonic()
        while next_index < inputs:
            next_index = _run_worker(
                corpus_file, seed, next_index, inputs, timeout, report, progress, started
            )
    return report


def _run_worker(corpus_file, seed, start, stop, timeout, report, progress, started) -> int:
    """One worker from input ``start``; returns the next input to check (after a death: the one
    after the input that killed it)."""
    env = dict(
        os.environ, KAUN_IR_BACKEND="cpu", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    code = f"import fuzz_stablehlo as f; f._worker({corpus_file!r}, {seed}, {start}, {stop})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    current, started_up = None, False
    try:
        while True:
            # a worker's start (imports, the helper process) gets its own, longer bound
            ready, _, _ = select.select([proc.stdout], [], [], timeout if started_up else max(timeout, 300.0))
            if not ready:
                proc.kill()
                proc.wait()
                if not started_up:
                    raise RuntimeError(f"the fuzzing worker did not start: {proc.stderr.read()[-600:]}")
                report.inputs += 1
                report.deaths.append((current, "hang", f"no answer within {timeout:.0f} s"))
                if progress:
                    print(f"input {current}: no answer within {timeout:.0f} s", file=sys.stderr, flush=True)
                return (current if current is not None else start) + 1
            line = proc.stdout.readline()
            if not line:
                break
            record = json.loads(line)
            if "ready" in record:
                started_up = True
                continue
            if "begin" in record:
                current = record["begin"]
                continue
            current = None
            report.inputs += 1
            if record["outcome"] == "imported":
                report.imported += 1
            elif record["outcome"] == "rejected":
                report.rejected += 1
            else:
                report.raw_errors.append((record["index"], "raw", record["problem"]))
                if progress:
                    print(f"input {record['index']}: raw error", file=sys.stderr, flush=True)
            if progress and report.inputs % 1000 == 0:
                print(f"{report.summary()}, {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
        code = proc.wait()
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if current is None and code == 0:
        return stop
    where = current if current is not None else start
    report.inputs += 1
    how = f"signal {-code}" if code < 0 else f"exit status {code}"
    report.deaths.append((where, "death", f"worker died ({how}): {stderr.strip()[-600:]}"))
    if progress:
        print(f"input {where}: worker died ({how})", file=sys.stderr, flush=True)
    return where + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fuzz kaun_ir's StableHLO importer (text and bytecode).")
    parser.add_argument("--inputs", type=int, default=20_000, help="number of mutated inputs (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds an input may take (default 300)"
    )
    parser.add_argument("--show", type=int, default=5, help="failures to print in full (default 5)")
    parser.add_argument(
        "--reproduce", type=int, default=None, metavar="I", help="print input I and check it here"
    )
    args = parser.parse_args(argv)
    if args.reproduce is not None:
        data = make_input(args.reproduce, args.seed, corpus())
        print(repr(data))
        print(check(data))
        return 0
    start = time.monotonic()
    report = run(args.inputs, args.seed, args.timeout, progress=True)
    print(f"fuzz-import: seed {args.seed}, {time.monotonic() - start:.0f}s: {report.summary()}")
    for index, kind, problem in (report.deaths + report.raw_errors)[: args.show]:
        print("-" * 72, f"input {index} ({kind}; --reproduce {index} --seed {args.seed})", problem, sep="\n")
    return 1 if report.deaths or report.raw_errors else 0


if __name__ == "__main__":
    sys.exit(main())

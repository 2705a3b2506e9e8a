"""The StableHLO interpreter's own test suite run through kaun_ir: import, compile, run, compare.

openxla/stablehlo keeps its reference interpreter's tests in ``stablehlo/tests/interpret``: files
of functions separated by ``// -----``, each computing with StableHLO ops and checking results
with ``check.*`` ops against expected constants. This runner splits the files, turns each test
function into one whose results are the checked values (the ``check`` ops removed), imports it
with ``kn.ir.from_stablehlo``, compiles and runs it as imported ("raw") and after the default
pass pipeline ("optimised"), and compares the results with the expected constants written in
the test — the suite's values, parsed here, are the oracle.

The suite is not part of this project: point ``KAUN_IR_STABLEHLO_SUITE`` at a checkout of
openxla/stablehlo (or at its ``stablehlo/tests/interpret`` folder). Without it the tests skip.

    KAUN_IR_STABLEHLO_SUITE=path/to/stablehlo python tests/stablehlo_interpret_suite.py

prints the counts (total, in scope, passing raw and optimised), each exclusion with its reason
and every failure. ``tests/test_stablehlo_interpret_suite.py`` runs each case as a test.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

SUITE_ENV = "KAUN_IR_STABLEHLO_SUITE"
SUITE_SUBDIR = os.path.join("stablehlo", "tests", "interpret")

# element types in StableHLO spelling -> NumPy dtypes (what kaun_ir has)
DTYPES = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "ui8": np.dtype(np.uint8),
    "ui16": np.dtype(np.uint16),
    "ui32": np.dtype(np.uint32),
    "ui64": np.dtype(np.uint64),
}
FLOATS = {DTYPES[name] for name in ("f16", "bf16", "f32", "f64")}

# What is left out, first match wins: (pattern searched in a case's text, reason). Each reason is
# a documented limit of kaun_ir (docs/interop.md, "What stays out") or a feature of the reference
# interpreter itself rather than of StableHLO programs.
EXCLUSIONS = [
    (
        r"interpreter\.run_parallel|stablehlo\.(all_gather|all_reduce|all_to_all|collective_\w+|reduce_scatter"
        r"|replica_id|partition_id)\b",
        "collectives and process ids: the interpreter runs a grid of processes (interpreter.run_parallel)",
    ),
    (
        r"!stablehlo\.token|stablehlo\.(after_all|create_token|infeed|outfeed|send|recv)\b",
        "tokens (after_all, infeed, outfeed, send, recv): side-effect ordering, not in kaun_ir graphs",
    ),
    (
        r"interpreter\.probe|check\.expect_serialized_eq",
        "interpreter.probe: the interpreter's instrumentation writes tensors to files",
    ),
    (r"interpreter\.print", "interpreter.print: checks the interpreter's printing with FileCheck"),
    (r"!quant\.|uniform_quantize|uniform_dequantize", "quantized types are not kaun_ir dtypes"),
    (r"complex<|stablehlo\.(complex|real|imag|fft)\b", "complex numbers are not a kaun_ir dtype"),
    (r"[<x](u?i2|u?i4)>", "sub-byte integers (i2, i4, ui2, ui4) are not kaun_ir dtypes"),
    (r"[<x]f(8|6|4)E\w+>", "f8 / f6 / f4 floats are not kaun_ir dtypes"),
    (r"tensor<[^>]*\?", "dynamic shapes: kaun_ir compiles static shapes"),
    (
        r"stablehlo\.(dynamic_broadcast_in_dim|dynamic_conv|dynamic_gather|dynamic_iota|dynamic_pad"
        r"|dynamic_reshape|real_dynamic_slice)\b",
        "ops whose result shape is an operand (dynamic_reshape, dynamic_iota, ...): refused by the importer",
    ),
    (
        r"is_reverse\s*=\s*true",
        "chlo.scan with is_reverse: refused (the CHLO legalisation of the jaxlib in use runs it forward)",
    ),
    (
        r"(?s)stablehlo\.(ceil|floor)\b.*tensor<\d+x(bf16|f32|f64)>",
        "ceil / floor of subnormal bf16, f32, f64 inputs: XLA's CPU runtime reads subnormals as zero "
        "(as jax.jit(jnp.ceil) does), the interpreter does not",
    ),
    (
        r"\btuple<|stablehlo\.(tuple|get_tuple_element)\b",
        "tuples: a kaun_ir graph's values are tensors (a function's results are a flat list)",
    ),
]


CHECK_KINDS = ("expect_eq_const", "expect_almost_eq_const", "expect_eq", "expect_almost_eq", "expect_close")


@dataclass
class Check:
    """One ``check`` op: ``kind``, the checked value(s) and the expected constant, if any."""

    kind: str  # expect_eq_const, expect_almost_eq_const, expect_eq, expect_almost_eq, expect_close
    values: list[str]  # SSA names: one for the _const forms, two otherwise
    types: list[str]  # their tensor types
    expected: np.ndarray | None = None
    tolerance: float = 1e-4
    max_ulp: int = 0
    min_ulp: int = 0


@dataclass
class Case:
    """One ``// -----`` piece of a suite file."""

    file: str  # relative to the suite folder
    index: int  # its position in the file, from 0
    text: str
    name: str = ""  # the function holding the checks
    exclusion: str | None = None
    checks: list[Check] = field(default_factory=list)
    module: str = ""  # the rewritten module: the checked values are the function's results

    @property
    def id(self) -> str:
        return f"{self.file}:{self.index}:{self.name}"


# ------------------------------------------------------------------ finding and splitting


def suite_dir(path: str | None = None) -> str | None:
    """The folder of ``.mlir`` files named by ``path`` or ``$KAUN_IR_STABLEHLO_SUITE`` (a checkout
    of openxla/stablehlo or the folder itself); None when neither is set."""
    path = path or os.environ.get(SUITE_ENV)
    if not path:
        return None
    inner = os.path.join(path, SUITE_SUBDIR)
    found = inner if os.path.isdir(inner) else path
    if not os.path.isdir(found):
        raise FileNotFoundError(f"{SUITE_ENV}={path!r}: no such folder (name a stablehlo checkout)")
    return found


def load_cases(folder: str) -> list[Case]:
    """Every case of every ``.mlir`` file under ``folder`` (sorted), prepared or excluded."""
    cases = []
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if name.endswith(".mlir"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
                cases.extend(split_file(os.path.relpath(path, folder), text))
    return cases


def split_file(file: str, text: str) -> list[Case]:
    """The cases of one file: every function holding ``check`` ops in each ``// -----`` piece
    (a piece may hold several), each prepared or given an exclusion."""
    cases = []
    for index, piece in enumerate(re.split(r"^// -----\s*$", text, flags=re.M)):
        body = "\n".join(line for line in piece.splitlines() if not line.lstrip().startswith("//"))
        if "func.func" not in body:  # the text before the first function, or an empty piece
            continue
        tests = [name for name, start, end in functions(body) if "check." in body[start:end]]
        for name in tests or [""]:
            case = Case(file, index, body, name=name)
            prepare(case)
            cases.append(case)
    return cases


def prepare(case: Case) -> None:
    """Set the case's exclusion, or its checks and rewritten module."""
    if not case.name:
        found = functions(case.text)
        case.name = found[0][0] if found else ""
    for pattern, reason in EXCLUSIONS:
        if re.search(pattern, case.text):
            case.exclusion = reason
            return
    if "check." not in case.text:
        case.exclusion = "no check ops: the file checks what the interpreter prints with FileCheck"
        return
    try:
        case.module = _rewrite(case)
    except ValueError as err:  # a form this runner does not know: shown among the exclusions
        case.exclusion = f"not understood by the runner: {err}"


# ------------------------------------------------------------------ rewriting a test function


_CHECK = re.compile(r"^[ \t]*check\.(\w+)\s+", re.M)
_FUNC = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@([\w.$-]+)\s*\(([^)]*)\)")


def functions(text: str) -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every ``func.func`` in ``text``, ``end`` after its closing brace."""
    found = []
    for head in _FUNC.finditer(text):
        depth, end = 0, len(text)
        for pos in range(text.index("{", head.end()), len(text)):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            if depth == 0:
                end = pos + 1
                break
        found.append((head.group(1), head.start(), end))
    return found


def _statement_end(text: str, start: int) -> int:
    """The end of the statement starting at ``start``: the first newline outside brackets that
    does not follow a comma."""
    depth = 0
    for pos in range(start, len(text)):
        char = text[pos]
        if char in "<[({":
            depth += 1
        elif char in ">])}":
            depth -= 1
        elif char == "\n" and depth <= 0 and not text[start:pos].rstrip().endswith(","):
            return pos
    return len(text)


def _rewrite(case: Case) -> str:
    """The case's text with its test function returning the checked values instead of checking
    them, and the piece's other test functions left out."""
    text, kept = case.text, ""
    for name, start, end in reversed(functions(text)):
        if name == case.name:
            kept = _rewrite_function(case, text[start:end])
            text = text[:start] + "@@TEST@@" + text[end:]
        elif "check." in text[start:end]:
            text = text[:start] + text[end:]
    return text.replace("@@TEST@@", kept)


def _rewrite_function(case: Case, text: str) -> str:
    """One test function returning its checked values (``case.checks`` records the checks)."""
    head = _FUNC.match(text)
    if head.group(2).strip():
        raise ValueError(f"@{case.name} takes arguments (the interpreter's --args)")
    matches = list(_CHECK.finditer(text))
    pieces, last = [], text.index("{", head.end()) + 1
    for match in matches:
        end = _statement_end(text, match.end())
        pieces.append(text[last : match.start()])
        case.checks.append(parse_check(match.group(1), text[match.end() : end]))
        last = end
    rest = text[last:]
    returned = re.search(r"\n[ \t]*(?:func\.)?return\b[^\n]*", rest)
    if returned is None:
        raise ValueError(f"@{case.name} has no return after its checks")
    values = [v for check in case.checks for v in check.values]
    types = [t for check in case.checks for t in check.types]
    new_return = f"\n  func.return {', '.join(values)} : {', '.join(types)}"
    rest = rest[: returned.start()] + new_return + rest[returned.end() :]
    signature = f"func.func @{case.name}() -> ({', '.join(types)}) {{"
    return signature + "".join(pieces) + rest


def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    parts, depth, start = [], 0, 0
    for pos, char in enumerate(text):
        if char in "<[({":
            depth += 1
        elif char in ">])}":
            depth -= 1
        elif char == sep and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_check(kind: str, operands: str) -> Check:
    """A ``check.<kind>`` op from the text after its name."""
    operands = " ".join(operands.split())
    attrs = re.search(r"\{([^{}]*)\}\s*$", operands)  # an attribute dictionary at the end
    options = dict(re.findall(r"(\w+)\s*=\s*([-+\w.]+)", attrs.group(1))) if attrs else {}
    if attrs:
        operands = operands[: attrs.start()]
    if kind.endswith("_const"):
        value, literal = _split_top(operands)[:2]
        dense, _, type_ = literal.partition(" : ")
        check = Check(kind, [value], [type_.strip()])
        check.expected = parse_dense(dense.strip(), type_.strip())
    else:
        body, _, type_text = operands.rpartition(" : ")
        parts = _split_top(body)
        options.update(dict(p.replace(" ", "").split("=", 1) for p in parts[2:]))
        first_type = _split_top(type_text)[0]
        check = Check(kind, parts[:2], [first_type, first_type])
    if kind not in CHECK_KINDS:
        raise ValueError(f"unknown check op check.{kind}")
    check.tolerance = float(options.get("tolerance", "1e-4").split(":")[0])
    check.max_ulp = int(options.get("max_ulp_difference", 0))
    check.min_ulp = int(options.get("min_ulp_difference", 0))
    return check


# ------------------------------------------------------------------ expected constants


def tensor_type(text: str) -> tuple[tuple[int, ...], np.dtype]:
    """``tensor<2x3xf32>`` -> ``((2, 3), float32)``."""
    match = re.fullmatch(r"tensor<((?:\d+x)*)(\w+)>", text.strip())
    if match is None or match.group(2) not in DTYPES:
        raise ValueError(f"unsupported type {text}")
    shape = tuple(int(d) for d in match.group(1).split("x") if d)
    return shape, DTYPES[match.group(2)]


_TOKEN = re.compile(
    r"\s*([\[\],]|true|false|[-+]?0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|\d+\.?\d*(?:[eE][-+]?\d+)?))"
)


def _scalar(token: str, dtype: np.dtype):
    """One element literal as a NumPy scalar of ``dtype``: hexadecimal is the bit pattern."""
    if token in ("true", "false"):
        return np.bool_(token == "true")
    if dtype == np.bool_:
        return np.bool_(int(token, 0))
    unsigned = np.dtype(f"u{dtype.itemsize}")
    if token.lstrip("-+").startswith("0x"):
        return np.array(int(token, 16) % (1 << (8 * dtype.itemsize)), unsigned).view(dtype)
    if dtype in FLOATS:
        return np.array(float(token)).astype(dtype)
    return np.array(int(token) % (1 << (8 * dtype.itemsize)), unsigned).view(dtype)


def parse_dense(literal: str, type_text: str) -> np.ndarray:
    """``dense<...>`` of ``tensor<...>`` as an array: nested lists, a splat or a hex string."""
    shape, dtype = tensor_type(type_text)
    match = re.fullmatch(r"dense<(.*)>", literal, flags=re.S)
    if match is None:
        raise ValueError(f"not a dense literal: {literal[:60]}")
    body = match.group(1).strip()
    if body.startswith('"0x'):
        raw = bytes.fromhex(body.strip('"')[2:])
        flat = np.frombuffer(raw, dtype=np.uint8 if dtype == np.bool_ else dtype).astype(dtype)
    else:
        tokens, pos = [], 0
        while pos < len(body):
            found = _TOKEN.match(body, pos)
            if found is None:
                raise ValueError(f"cannot read {body[pos : pos + 20]!r} in {literal[:60]}")
            if found.group(1) not in "[],":
                tokens.append(found.group(1))
            pos = found.end()
        flat = np.array([_scalar(t, dtype) for t in tokens], dtype=dtype)
    size = int(np.prod(shape, dtype=np.int64))
    if flat.size == 1 and size != 1:
        flat = np.full(size, flat[0], dtype=dtype)
    if flat.size != size:
        raise ValueError(f"{literal[:60]} has {flat.size} elements, {type_text} needs {size}")
    return flat.reshape(shape)


# ------------------------------------------------------------------ comparing


def _ordered(values: np.ndarray) -> np.ndarray:
    """Float bits as integers ordered like the floats (for ULP distances)."""
    bits = values.view(f"i{values.dtype.itemsize}").astype(np.int64)
    return np.where(bits < 0, np.int64(np.iinfo(bits.dtype).min) - bits, bits)


def mismatch(check: Check, got: list[np.ndarray]) -> str | None:
    """None when ``got`` (the checked values) satisfies ``check``, else what differs."""
    actual = got[0]
    expected = check.expected if check.expected is not None else got[1]
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
    if actual.dtype not in FLOATS:
        ok = actual == expected
    else:
        a, b = actual.astype(np.float64), expected.astype(np.float64)
        both_nan = np.isnan(a) & np.isnan(b)
        if check.kind in ("expect_eq", "expect_eq_const"):
            ok = (a == b) | both_nan
        elif check.kind == "expect_close":
            finite = np.isfinite(a) & np.isfinite(b)
            ulps = np.abs(_ordered(actual) - _ordered(expected))
            in_range = (ulps >= check.min_ulp) & (ulps <= check.max_ulp)
            ok = np.where(finite, in_range, (a == b) | both_nan)
        else:  # almost equal: the interpreter's rule (equal, both NaN, or finite and within tolerance)
            with np.errstate(invalid="ignore"):
                close = np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) <= check.tolerance)
            ok = (a == b) | both_nan | close
    bad = np.flatnonzero(~np.asarray(ok))  # flat: np.argwhere finds nothing in a 0-d array
    if not bad.size:
        return None
    where = tuple(int(i) for i in np.unravel_index(bad[0], actual.shape))
    return (
        f"check.{check.kind}: {len(bad)} of {actual.size} elements differ, first at {list(where)}: "
        f"got {actual[where]!r}, expected {expected[where]!r}"
    )


# ------------------------------------------------------------------ running


def run_case(case: Case, optimised: bool) -> str | None:
    """Import, (optimise,) compile and run ``case``; None when every check holds, else why not."""
    import kaun_ir as kn

    try:
        graph = kn.ir.from_stablehlo(case.module, name=case.name)
        if optimised:
            graph = kn.passes.run(graph, kn.runtime.pipelines.default_jit_pipeline())
        outputs = [np.asarray(out) for out in kn.runtime.compile(graph)()]
    except Exception as err:  # noqa: BLE001 - any failure is the case's result, reported
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:400]}"
    position = 0
    for check in case.checks:
        count = len(check.values)
        problem = mismatch(check, outputs[position : position + count])
        position += count
        if problem:
            return problem
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the suite and print the counts, the exclusions and the failures; 1 if any failed."""
    parser = argparse.ArgumentParser(description="The StableHLO interpreter's test suite through kaun_ir.")
    parser.add_argument("suite", nargs="?", help=f"a stablehlo checkout (default: ${SUITE_ENV})")
    parser.add_argument("-k", default="", help="only cases whose id contains this text")
    args = parser.parse_args(argv)
    folder = suite_dir(args.suite)
    if folder is None:
        parser.error(f"give the suite's folder or set {SUITE_ENV}")
    os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
    cases = [c for c in load_cases(folder) if args.k in c.id]
    scope = [c for c in cases if c.exclusion is None]
    failures = {"raw": [], "optimised": []}
    for case in scope:
        for mode in failures:
            problem = run_case(case, optimised=mode == "optimised")
            if problem:
                failures[mode].append((case.id, problem))
    reasons: dict[str, list[str]] = {}
    for case in cases:
        if case.exclusion:
            reasons.setdefault(case.exclusion, []).append(case.id)
    print(f"{len(cases)} cases, {len(scope)} in scope, {len(cases) - len(scope)} excluded")
    for mode, failed in failures.items():
        print(f"{mode}: {len(scope) - len(failed)} of {len(scope)} pass")
    for reason, ids in reasons.items():
        print(f"excluded {len(ids)}: {reason}")
    for mode, failed in failures.items():
        for case_id, problem in failed:
            print(f"FAIL ({mode}) {case_id}: {problem}")
    return 1 if failures["raw"] or failures["optimised"] else 0


if __name__ == "__main__":
    sys.exit(main())

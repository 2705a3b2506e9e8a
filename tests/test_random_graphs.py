"""Semantic checks of the passes on random graphs and on every graph in tests/kir/.

Graphs are generated from the op table (seeded): random DAGs of elementwise, shape, reduce,
dot and conversion ops with consistent shapes, built with ``kaun_ir.surface.tensor.apply`` inside a
``Builder``, and salted with what the passes look for (identity constants including -0.0,
chains of reshapes/transposes/negations, constant subexpressions, duplicated nodes, dead
nodes). For every graph and every pipeline:

- the pass does not modify its input graph;
- the result verifies and its text round-trips through the parser;
- the NumPy reference interpreter gives bit-identical results before and after (inputs hold
  -0.0, NaN and infinities); every pass here is exact, so no tolerance is needed;
- where the graph has a float scalar loss, ``autodiff`` keeps the forward results bit for bit
  and canonicalize/fold/cse/dce of the gradient graph compute the same gradients;
- for a sample of graphs, XLA runs the original and the optimised graph to the same results.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from passutil import assert_bit_identical, assert_close, random_inputs, same_snapshot, snapshot

import kaun_ir as kn
from kaun_ir import dtypes
from kaun_ir.errors import KaunError
from kaun_ir.ir import Builder, TensorType, interpret, parse
from kaun_ir.ir.core import Graph
from kaun_ir.passes import canonicalize as _canonicalize  # noqa: F401  (registers the pass)
from kaun_ir.passes import fold as _fold  # noqa: F401  (registers the pass)
from kaun_ir.surface.tensor import Tensor, apply
from kaun_ir.transforms.autodiff import GradientError

PIPELINES = [
    "cse",
    "dce",
    "canonicalize",
    "fold",
    "fold{max_elements=4}",
    "canonicalize,fold,cse,dce",
    "fold,canonicalize,cse,dce,canonicalize",
]
GRADIENT_PIPELINES = ["canonicalize,fold,cse,dce"]
N_GRAPHS = 150
KIR_DIR = pathlib.Path(__file__).parent / "kir"

F32, F64, I32 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)
FLOAT_UNARY = [
    "negate",
    "abs",
    "exponential",
    "tanh",
    "floor",
    "sign",
    "sine",
    "log",
    "sqrt",
    "round_nearest_even",
]
FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
INT_UNARY = ["negate", "abs", "not"]
INT_BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "and", "xor"]
SPECIAL = {"f": (0.0, -0.0, 1.0, 2.0, 0.5, -1.0), "i": (0, 1, 2, -1)}


class RandomGraph:
    """Grows a pool of tensors of one dtype by applying random ops to members of the pool."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        r = self.rng.random()
        self.dtype = F32 if r < 0.65 else F64 if r < 0.8 else I32
        self.kind = "f" if dtypes.is_float(self.dtype) else "i"
        self.pool: list[Tensor] = []

    # -- helpers

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def pick(self, ok=lambda t: True) -> Tensor | None:
        candidates = [t for t in self.pool if ok(t)]
        if not candidates:
            return None
        # prefer recent values so graphs get deep, not just wide
        weights = np.linspace(1.0, 3.0, len(candidates))
        return candidates[int(self.rng.choice(len(candidates), p=weights / weights.sum()))]

    def random_shape(self) -> tuple[int, ...]:
        return self.choice([(), (3,), (2, 3), (3, 2), (4,), (2, 3, 2), (1, 3), (6,)])

    def data(self, shape) -> np.ndarray:
        if self.kind == "f":
            return self.rng.standard_normal(shape).astype(self.dtype)
        return self.rng.integers(-4, 5, size=shape).astype(self.dtype)

    def constant(self, shape) -> Tensor:
        """A constant of ``shape``: dense random data, a dense splat or a broadcast special scalar."""
        r = self.rng.random()
        if r < 0.35:
            value = np.asarray(self.choice(SPECIAL[self.kind]), self.dtype)
            scalar = apply("constant", value=value)
            return (
                scalar
                if shape == ()
                else apply("broadcast_in_dim", scalar, shape=shape, broadcast_dimensions=())
            )
        if r < 0.5:
            return apply("constant", value=np.full(shape, self.choice(SPECIAL[self.kind]), self.dtype))
        return apply("constant", value=self.data(shape))

    def partner(self, x: Tensor) -> Tensor:
        """A second operand of x's shape: from the pool, or a constant."""
        other = self.pick(lambda t: t.shape == x.shape and t is not x)
        return other if other is not None and self.rng.random() < 0.6 else self.constant(x.shape)

    # -- steps (each returns a new tensor or None when it does not apply)

    def unary(self, x):
        return apply(self.choice(FLOAT_UNARY if self.kind == "f" else INT_UNARY), x)

    def binary(self, x):
        op = self.choice(FLOAT_BINARY if self.kind == "f" else INT_BINARY)
        y = self.partner(x)
        return apply(op, *((x, y) if self.rng.random() < 0.7 else (y, x)))

    def identity_arith(self, x):
        """x op c with c a (maybe) identity constant: what canonicalize looks at."""
        op = self.choice(["add", "subtract", "multiply"] + (["divide"] if self.kind == "f" else []))
        c = self.constant(x.shape)
        return apply(op, *((x, c) if op in ("subtract", "divide") or self.rng.random() < 0.5 else (c, x)))

    def double_negate(self, x):
        return apply("negate", apply("negate", x))

    def constant_expr(self, x):
        """An expression of constants only (fold folds it), combined with x."""
        shape = x.shape
        a, b = self.constant(shape), self.constant(shape)
        op = self.choice(["add", "multiply", "maximum"] if self.kind == "f" else ["add", "multiply", "xor"])
        c = apply(op, a, b)
        if self.rng.random() < 0.5:
            c = apply("negate", c)
        return apply("add", x, c)

    def reshape(self, x):
        size = x.type.size
        shapes = [
            s
            for s in [(size,), (1, size), (size, 1), (2, size // 2), (3, size // 3), (size // 2, 2), ()]
            if int(np.prod(s, dtype=np.int64)) == size
        ]
        y = apply("reshape", x, shape=self.choice(shapes))
        if self.rng.random() < 0.4:
            y = apply("reshape", y, shape=self.choice(shapes))
        return y

    def transpose(self, x):
        if x.ndim < 2:
            return None
        y = apply("transpose", x, permutation=tuple(int(p) for p in self.rng.permutation(x.ndim)))
        if self.rng.random() < 0.5:
            y = apply("transpose", y, permutation=tuple(int(p) for p in self.rng.permutation(y.ndim)))
        return y

    def broadcast(self, x):
        if x.ndim >= 3:
            return None
        lead = int(self.rng.integers(1, 3))
        y = apply(
            "broadcast_in_dim", x, shape=(lead,) + x.shape, broadcast_dimensions=tuple(range(1, x.ndim + 1))
        )
        if self.rng.random() < 0.3:
            y = apply(
                "broadcast_in_dim", y, shape=(2,) + y.shape, broadcast_dimensions=tuple(range(1, y.ndim + 1))
            )
        return y

    def slice(self, x):
        if x.ndim == 0:
            return None
        start, limit, strides = [], [], []
        full = self.rng.random() < 0.3
        for n in x.shape:
            lo = 0 if full else int(self.rng.integers(0, n))
            hi = n if full else int(self.rng.integers(lo + 1, n + 1))
            start.append(lo), limit.append(hi), strides.append(1 if full else int(self.rng.integers(1, 3)))
        return apply(
            "slice", x, start_indices=tuple(start), limit_indices=tuple(limit), strides=tuple(strides)
        )

    def concatenate(self, x):
        if x.ndim == 0:
            return None
        if self.rng.random() < 0.3:
            return apply("concatenate", x, dimension=0)
        return apply("concatenate", x, self.partner(x), dimension=int(self.rng.integers(x.ndim)))

    def pad(self, x):
        if x.ndim == 0:
            return None
        low = tuple(int(self.rng.integers(0, 2)) for _ in x.shape)
        high = tuple(int(self.rng.integers(0, 2)) for _ in x.shape)
        interior = tuple(int(self.rng.integers(0, 2)) for _ in x.shape)
        return apply("pad", x, self.constant(()), low=low, high=high, interior=interior)

    def reverse(self, x):
        dims = tuple(d for d in range(x.ndim) if self.rng.random() < 0.5)
        return apply("reverse", x, dimensions=dims)

    def reduce(self, x):
        if x.ndim == 0:
            return None
        dims = tuple(d for d in range(x.ndim) if self.rng.random() < 0.6) or (0,)
        return apply("reduce", x, kind=self.choice(["sum", "max", "min"]), dimensions=dims)

    def dot(self, x):
        if x.ndim == 0:
            return None
        k = x.shape[-1]
        y = self.pick(lambda t: t.ndim in (1, 2) and t.shape[0] == k)
        if y is None or self.rng.random() < 0.3:
            y = self.constant((k, int(self.rng.integers(1, 4))))
        return apply(
            "dot_general",
            x,
            y,
            lhs_batch=(),
            rhs_batch=(),
            lhs_contracting=(x.ndim - 1,),
            rhs_contracting=(0,),
        )

    def convert(self, x):
        if self.kind == "f":
            middle = self.choice([F64 if self.dtype == F32 else F32, I32, dtypes.bfloat16])
        else:
            middle = self.choice([np.dtype(np.int64), F64, F32, np.dtype(np.int8)])
        y = apply("convert", x, dtype=middle)
        return apply("convert", y, dtype=self.dtype)

    def select(self, x):
        y = self.partner(x)
        r = self.rng.random()
        if r < 0.4:
            pred = apply("compare", x, y, direction=self.choice(["LT", "GE", "EQ", "NE"]))
        elif r < 0.7:
            scalar = apply("constant", value=np.asarray(self.rng.random() < 0.5))
            pred = (
                scalar
                if x.shape == () or self.rng.random() < 0.5
                else apply("broadcast_in_dim", scalar, shape=x.shape, broadcast_dimensions=())
            )
        else:
            pred = apply("constant", value=np.asarray(self.rng.random(x.shape) < 0.5))
        return apply("select", pred, *((x, y) if self.rng.random() < 0.8 else (x, x)))

    def clamp(self, x):
        lo, hi = sorted(self.data(()).tolist() for _ in range(2))
        return apply(
            "clamp",
            apply("constant", value=np.asarray(lo, self.dtype)),
            x,
            apply("constant", value=np.asarray(hi, self.dtype)),
        )

    def stop_gradient(self, x):
        y = apply("stop_gradient", x)
        return apply("stop_gradient", y) if self.rng.random() < 0.5 else y

    def duplicate(self, x):
        """The same node twice (cse merges them)."""
        op = "negate" if self.kind == "f" else "abs"
        return apply("add", apply(op, x), apply(op, x))

    STEPS = (
        "unary",
        "binary",
        "binary",
        "identity_arith",
        "identity_arith",
        "double_negate",
        "constant_expr",
        "reshape",
        "transpose",
        "broadcast",
        "slice",
        "concatenate",
        "pad",
        "reverse",
        "reduce",
        "dot",
        "convert",
        "select",
        "clamp",
        "stop_gradient",
        "duplicate",
    )

    def build(self) -> Graph:
        with Builder(record_source=False) as b:
            for _ in range(int(self.rng.integers(1, 4))):
                self.pool.append(Tensor(b.add_input(TensorType(self.dtype, self.random_shape())), b))
            for _ in range(int(self.rng.integers(6, 22))):
                x = self.pick(lambda t: t.type.size <= 64)
                y = getattr(self, self.choice(self.STEPS))(x)
                if y is not None:
                    self.pool.append(y)
            last = self.pool[-1]
            # output 0 is a scalar (a loss, when the dtype is float), then a few other values
            loss = (
                apply("reduce", last, kind="sum", dimensions=tuple(range(last.ndim))) if last.ndim else last
            )
            extra = [self.pick() for _ in range(int(self.rng.integers(0, 3)))]
            return b.finish([loss.value, last.value] + [t.value for t in extra])


def random_graph(seed: int) -> Graph:
    return RandomGraph(seed).build()


# ------------------------------------------------------------------------------ the checks


def check_pipelines(graph: Graph, rng: np.random.Generator, pipelines=PIPELINES) -> dict[str, Graph]:
    """Run each pipeline; check no mutation, validity, round trip and bit-identical results.

    Three input sets: a few special values, many, and signed zeros only.
    """
    inputs = [random_inputs(graph, rng, special) for special in (True, 0.6, "zeros")]
    with np.errstate(all="ignore"):
        wants = [interpret(graph, *args) for args in inputs]
    results = {}
    for pipeline in pipelines:
        before = snapshot(graph)
        out = kn.passes.run(graph, pipeline).verify()
        assert same_snapshot(graph, before), f"{pipeline} modified its input"
        assert out.output_types == graph.output_types and out.input_types == graph.input_types
        assert parse(out.text()).text() == out.text()
        for args, want in zip(inputs, wants):
            with np.errstate(all="ignore"):
                got = interpret(out, *args)
            for i, (g, w) in enumerate(zip(got, want)):
                assert_bit_identical(g, w, f"{pipeline}: output {i}\n{graph.text()}\nafter:\n{out.text()}")
        results[pipeline] = out
    return results


def check_autodiff(graph: Graph, rng: np.random.Generator) -> bool:
    """autodiff keeps the forward outputs; optimising the gradient graph keeps the gradients."""
    try:
        grad = kn.passes.run(graph, "autodiff")
    except GradientError:
        return False
    args = random_inputs(graph, rng, special=False)
    with np.errstate(all="ignore"):
        forward = interpret(graph, *args)
        full = interpret(grad, *args)
    for i, (g, w) in enumerate(zip(full, forward)):
        assert_bit_identical(g, w, f"autodiff changed forward output {i}")
    check_pipelines(grad, rng, GRADIENT_PIPELINES)
    return True


@pytest.mark.parametrize("seed", range(N_GRAPHS))
def test_random_graph(seed):
    graph = random_graph(seed).verify()
    rng = np.random.default_rng(1000 + seed)
    results = check_pipelines(graph, rng)
    if dtypes.is_float(graph.outputs[0].dtype) and any(dtypes.is_float(v.dtype) for v in graph.inputs):
        assert check_autodiff(graph, rng)
    # canonicalize and fold each reach their fixpoint: running one again changes nothing
    for name in ("canonicalize", "fold"):
        once = results[name]
        assert kn.passes.run(once, name).text() == once.text(), name


def test_random_graphs_exercise_the_rules():
    """The generator must actually give the passes work (else the test above proves little)."""
    from kaun_ir.passes.canonicalize import RULES
    from kaun_ir.passes.rewrite import last_statistics

    fired: dict[str, int] = {}
    shrunk = 0
    for seed in range(N_GRAPHS):
        graph = random_graph(seed)
        for name in ("canonicalize", "fold"):
            out = kn.passes.REGISTRY[name].call(graph)
            for rule, n in last_statistics().items():
                fired[rule] = fired.get(rule, 0) + n
            shrunk += len(out.nodes) < len(graph.nodes)
    # rarely generated exactly; the sums of zero pads have their own tests (test_canonicalize_pads.py)
    canonical = set(RULES.names()) - {
        "pad-identity",
        "reverse-identity",
        "add-adjacent-zero-pads",
        "add-zero-of-concatenate",
        "add-zero-twice",
    }
    assert canonical - set(fired) <= {
        "convert-identity",
        "broadcast-identity",
        "reshape-identity",
        "transpose-identity",
    }, sorted(canonical - set(fired))
    assert sum(n for r, n in fired.items() if r.startswith("fold-")) > 100
    assert shrunk > N_GRAPHS


@pytest.mark.parametrize("seed", range(0, N_GRAPHS, 10))
def test_random_graph_on_xla(seed):
    """XLA runs the original and the optimised graph to the same results."""
    graph = random_graph(seed)
    out = kn.passes.run(graph, "canonicalize,fold,cse,dce")
    args = random_inputs(graph, np.random.default_rng(seed), special=False)
    want = kn.runtime.compile(graph)(*args)
    got = kn.runtime.compile(out)(*args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(np.asarray(g), np.asarray(w), f"output {i}", rtol=1e-6, atol=1e-6)


def test_generator_is_deterministic_and_varied():
    assert random_graph(3).text() == random_graph(3).text()
    texts = {random_graph(s).text() for s in range(20)}
    assert len(texts) == 20
    ops = set()
    for s in range(N_GRAPHS):
        ops |= set(random_graph(s).op_counts())
    assert {
        "dot_general",
        "reduce",
        "transpose",
        "reshape",
        "broadcast_in_dim",
        "select",
        "convert",
        "pad",
        "slice",
        "concatenate",
        "clamp",
        "compare",
        "stop_gradient",
        "constant",
    } <= ops


# ------------------------------------------------------------------------------ the .kir graphs


def kir_graphs() -> list[tuple[str, Graph]]:
    graphs = []
    for path in sorted(KIR_DIR.glob("*.kir")):
        try:
            graphs.append((path.stem, parse(path.read_text()).verify()))
        except KaunError:
            continue  # the files that test parse and type errors
    return graphs


KIR_GRAPHS = kir_graphs()


def test_kir_graphs_are_found():
    names = {name for name, _ in KIR_GRAPHS}
    assert {"cse", "dce", "autodiff_mlp", "canonicalize-arith", "fold-arith"} <= names
    assert "parse_error" not in names


@pytest.mark.parametrize("name, graph", KIR_GRAPHS, ids=[n for n, _ in KIR_GRAPHS])
def test_kir_graph(name, graph):
    rng = np.random.default_rng(len(name))
    check_pipelines(graph, rng)
    has_loss = graph.outputs[0].type.shape == () and dtypes.is_float(graph.outputs[0].dtype)
    if has_loss and name != "autodiff_errors":
        assert check_autodiff(graph, rng)

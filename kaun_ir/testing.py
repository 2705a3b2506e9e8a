"""``kaun_ir.testing.check_op``: the op table's generated tests, run on one op (a user primitive).

Call it from your own test suite after registering an op::

    def test_my_op():
        kn.testing.check_op("my_op")

For every sample the op declares it checks, as kaun_ir's own tests do for built-in ops: the type
rule against the shapes and dtypes of the NumPy reference; that the single-op graph prints and
parses back to the same text; the XLA result against the reference; the VJP rule against
central finite differences of the reference in float64 (or against ``jax.vjp`` of ``jax_fn``
when given); forward mode (derived from the VJP) the same way; and the batching rule against
the reference run once per example. A failed check raises ``AssertionError`` naming the op,
the sample and the check.

This is a test helper: ``jax_fn`` is an independent oracle, and JAX's ``vjp``/``jvp`` run only
here, on that oracle, never on the path kaun_ir compiles and executes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir import interpret, parse
from kaun_ir.ir.core import Graph, Node, TensorType
from kaun_ir.names import public_dir
from kaun_ir.ops import TABLE, OpDef
from kaun_ir.runtime import compile as compile_graph
from kaun_ir.transforms.autodiff import differentiable, gradient_graph
from kaun_ir.transforms.jvp import jvp_graph
from kaun_ir.transforms.vmap import batch_graph

_TOLERANCE = {
    np.dtype(np.float64): (1e-9, 1e-12),
    np.dtype(np.float32): (2e-5, 2e-6),
    np.dtype(np.float16): (2e-3, 2e-3),
    dtypes.bfloat16: (2e-2, 2e-2),
}


def single_op_graph(opdef: OpDef, inputs: Sequence[np.ndarray], attrs: dict, regions=()) -> Graph:
    """A graph with one input per array and the op applied once."""
    types = [TensorType(np.asarray(a).dtype, np.shape(a)) for a in inputs]
    args = Graph.arguments(types)
    attrs = opdef.check_attrs(dict(attrs))
    node = Node(opdef.name, args, attrs, opdef.infer_types(types, attrs, regions), regions)
    return Graph(args, node.outputs, [node], name=opdef.name)


def _close(got, want, what: str, rtol=None, atol=None) -> float:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(
            f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        )
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return 0.0
    default = _TOLERANCE.get(want.dtype, (0.0, 0.0))
    rtol = default[0] if rtol is None else rtol
    atol = default[1] if atol is None else atol
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=what, equal_nan=True
    )
    finite = np.isfinite(want)
    return float(np.max(np.abs(got - want)[finite], initial=0.0))


def check_op(
    op: str | OpDef,
    jax_fn: Callable | None = None,
    batch_size: int = 3,
    seed: int = 0,
    fd_step: float = 1e-6,
    fd_tol: float = 1e-5,
) -> dict[str, Any]:
    """Run the generated op-table tests on op ``op`` (a name in the op table, or its OpDef).

    ``jax_fn(*inputs, **attrs)``, when given, is the equivalent JAX function: the derivative
    checks then compare with ``jax.vjp`` / ``jax.jvp`` instead of finite differences. Returns a
    summary ``{"samples": n, "checks": [...], "worst": {check: largest abs error}}``.
    """
    opdef = TABLE[op] if isinstance(op, str) else op
    name = opdef.name
    if TABLE.get(name) is not opdef:
        raise AssertionError(f"{name}: the op is not in the op table (register it first)")
    if (opdef.vjp is None) == (opdef.nondiff is None):
        raise AssertionError(f"{name}: declare exactly one of vjp= or nondiff=")
    if (opdef.batch is None) == (opdef.nobatch is None):
        raise AssertionError(f"{name}: declare exactly one of batch= or nobatch=")
    samples = list(opdef.samples(np.random.default_rng(seed)))
    if not samples:
        raise AssertionError(f"{name}: samples() yields no sample")
    worst: dict[str, float] = {}
    checks: list[str] = []

    def record(check: str, error: float) -> None:
        worst[check] = max(worst.get(check, 0.0), error)
        if check not in checks:
            checks.append(check)

    for k, sample in enumerate(samples):
        where = f"{name} sample {k}"
        inputs = [np.asarray(a) for a in sample.inputs]
        graph = single_op_graph(opdef, inputs, sample.attrs, sample.regions).verify()
        expected = interpret(graph, *inputs)
        for value, out in zip(graph.outputs, expected):
            if np.shape(out) != value.type.shape or np.asarray(out).dtype != value.type.dtype:
                raise AssertionError(
                    f"{where}: the type rule says {value.type} but the reference returns "
                    f"{np.asarray(out).dtype}{list(np.shape(out))}"
                )
        record("type rule", 0.0)
        if parse(graph.text()).text() != graph.text():
            raise AssertionError(f"{where}: the text form does not parse back to itself")
        record("text round trip", 0.0)
        got = compile_graph(graph)(*inputs)
        for j, (g, w) in enumerate(zip(got, expected)):
            record(
                "XLA vs reference",
                _close(g, w, f"{where}: XLA output {j} vs the reference", sample.rtol, sample.atol),
            )
        if opdef.vjp is not None:
            _check_derivatives(opdef, sample, inputs, where, jax_fn, fd_step, fd_tol, record)
        if opdef.batch is not None:
            _check_batching(opdef, sample, inputs, where, batch_size, record)
    return {"samples": len(samples), "checks": checks, "worst": worst}


def _float64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if dtypes.is_float(a.dtype) else a


def _check_derivatives(opdef, sample, inputs, where, jax_fn, step, tol, record) -> None:
    wide = [_float64(a) for a in inputs]
    graph = single_op_graph(opdef, wide, sample.attrs, sample.regions)
    wrt = [i for i, v in enumerate(graph.inputs) if differentiable(v.type)]
    outs = [k for k, v in enumerate(graph.outputs) if differentiable(v.type)]
    if not wrt or not outs:
        return
    rng = np.random.default_rng(7)
    cts = [rng.standard_normal(graph.outputs[k].type.shape) for k in outs]
    tangents = [rng.standard_normal(wide[i].shape) for i in wrt]
    backward = compile_graph(gradient_graph(graph, wrt=wrt, of=outs, seed_inputs=True, keep_outputs=False))
    got_ct = [np.asarray(g) for g in backward(*wide, *cts)]
    forward = compile_graph(jvp_graph(graph, wrt))
    got_t = [np.asarray(t) for t in forward(*wide, *tangents)[len(graph.outputs) :]]
    got_t = [got_t[k] for k in outs]

    def run(point):  # the float outputs at a point, by the reference
        full = list(wide)
        for i, value in zip(wrt, point):
            full[i] = value
        results = interpret(graph, *full)
        return [np.asarray(results[k], np.float64) for k in outs]

    if jax_fn is not None:
        import jax  # noqa: PLC0415 - jax loads only when a program compiles or compares

        def jax_outputs(*point):
            full = list(wide)
            for i, value in zip(wrt, point):
                full[i] = value
            result = jax_fn(*full, **opdef.check_attrs(dict(sample.attrs)))
            result = result if isinstance(result, (tuple, list)) else (result,)
            return tuple(result[k] for k in outs)

        with jax.enable_x64(True):
            _, pullback = jax.vjp(jax_outputs, *[wide[i] for i in wrt])
            want_ct = [np.asarray(c) for c in pullback(tuple(cts))]
            want_t = [
                np.asarray(t) for t in jax.jvp(jax_outputs, tuple(wide[i] for i in wrt), tuple(tangents))[1]
            ]
        label, rtol, atol = "jax", 1e-9, 1e-11
    else:
        # central differences: the directional derivative along each input element (for the VJP)
        # and along the tangent (for the JVP)
        base = [wide[i] for i in wrt]
        want_ct = []
        for n, x in enumerate(base):
            column = np.zeros(x.shape)
            for index in np.ndindex(*x.shape):
                plus = [b.copy() for b in base]
                minus = [b.copy() for b in base]
                plus[n][index] += step
                minus[n][index] -= step
                slopes = [(p - m) / (2 * step) for p, m in zip(run(plus), run(minus))]
                column[index] = sum(float(np.sum(s * c)) for s, c in zip(slopes, cts))
            want_ct.append(column)
        plus = [b + step * t for b, t in zip(base, tangents)]
        minus = [b - step * t for b, t in zip(base, tangents)]
        want_t = [(p - m) / (2 * step) for p, m in zip(run(plus), run(minus))]
        label, rtol, atol = "finite differences", tol, tol
    for i, (g, w) in enumerate(zip(got_ct, want_ct)):
        record(
            f"VJP vs {label}",
            _close(g, w, f"{where}: VJP, cotangent of input {wrt[i]} vs {label}", rtol, atol),
        )
    for k, (g, w) in enumerate(zip(got_t, want_t)):
        record(
            f"JVP vs {label}",
            _close(g, w, f"{where}: JVP, tangent of output {outs[k]} vs {label}", rtol, atol),
        )


def _check_batching(opdef, sample, inputs, where, size, record) -> None:
    rng = np.random.default_rng(11)
    graph = single_op_graph(opdef, inputs, sample.attrs, sample.regions)
    attrs = opdef.check_attrs(dict(sample.attrs))
    n = len(inputs)
    flag_sets = [(True,) * n] + (
        [(True,) + (False,) * (n - 1), (False,) * (n - 1) + (True,)] if n > 1 else []
    )
    for flags in flag_sets:
        arrays = []
        for a, batched in zip(inputs, flags):
            if not batched:
                arrays.append(a)
                continue
            variants = [a] + [
                rng.permutation(a.reshape(-1)).reshape(a.shape) if a.ndim else a for _ in range(size - 1)
            ]
            arrays.append(np.stack(variants))
        batched_graph, _ = batch_graph(graph, flags, size, force=True)
        got = compile_graph(batched_graph.verify())(*arrays)
        per_example = [
            opdef.run_reference([x[b] if f else x for x, f in zip(arrays, flags)], attrs, sample.regions)
            for b in range(size)
        ]
        for j, g in enumerate(got):
            want = np.stack([np.asarray(outs[j]) for outs in per_example]).astype(np.asarray(g).dtype)
            record(
                "batching vs reference per example",
                _close(
                    g,
                    want,
                    f"{where}: batching {flags}, output {j} vs the reference per example",
                    sample.rtol,
                    sample.atol,
                ),
            )


__all__ = ["check_op", "single_op_graph"]

__dir__ = public_dir(__all__)

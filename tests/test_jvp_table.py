"""Forward mode, generated from the op table: ``jvp_graph`` (derived from the VJP rules) vs
``jax.jvp`` of the equivalent JAX function, in float64, for every differentiable op."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax_ops import JAX_OPS
from optest import samples_of, single_op_graph

import kaun_ir as kn
from kaun_ir import dtypes, ops
from kaun_ir.transforms.autodiff import differentiable
from kaun_ir.transforms.jvp import jvp_graph

PER_OP = 1  # the derivation is generic; the VJP rules themselves are checked on every sample


def _cases():
    by_op: dict[str, list] = {}
    for name, index, sample in samples_of(ops.TABLE):
        op = ops.TABLE[name]
        if op.vjp is None or name not in JAX_OPS:
            continue
        arrays = [np.asarray(a) for a in sample.inputs]
        if not any(a.dtype in (np.float32, np.float64) for a in arrays):
            continue
        if any(a.dtype in (dtypes.bfloat16, np.float16) for a in arrays):
            continue
        by_op.setdefault(name, []).append((index, sample))
    cases = []
    for name, samples in sorted(by_op.items()):
        nonempty = [(i, s) for i, s in samples if all(np.size(a) for a in s.inputs)] or samples
        ranked = sorted(
            nonempty,
            key=lambda item: (
                -sum(np.ndim(a) for a in item[1].inputs),
                sum(np.size(a) for a in item[1].inputs),
            ),
        )
        picked = {nonempty[0][0]: nonempty[0][1]}
        for i, s in ranked:
            if len(picked) >= PER_OP:
                break
            picked.setdefault(i, s)
        cases += [(name, i, s) for i, s in picked.items()]
    return cases


CASES = _cases()


def test_every_differentiable_op_is_checked():
    # forward mode has no rule of its own: every op with a VJP rule has a JVP, and is checked here
    checked = {name for name, _, _ in CASES}
    differentiable_ops = {n for n, op in ops.TABLE.items() if op.vjp is not None}
    assert differentiable_ops <= checked, sorted(differentiable_ops - checked)


# jax cannot run forward mode through a jax.custom_vjp function; its Jacobian (by jax's reverse
# mode) times the tangent is the oracle there
REVERSE_ONLY = {"custom_vjp"}


def _jvp_by_jacrev(fn, xs, ts):
    single = lambda *a: fn(*a)  # noqa: E731
    primal = single(*xs)
    blocks = jax.jacrev(single, argnums=tuple(range(len(xs))))(*xs)
    outs = primal if isinstance(primal, (tuple, list)) else (primal,)
    rows = blocks if isinstance(primal, (tuple, list)) else (blocks,)
    tangent = []
    for _, row in zip(outs, rows):
        total = 0
        for x, t, block in zip(xs, ts, row):
            total = total + np.tensordot(np.asarray(block), t, axes=np.ndim(x))
        tangent.append(total)
    return primal, tuple(tangent) if isinstance(primal, (tuple, list)) else tangent[0]


def _widen(a):
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype == np.float32 else a


@pytest.mark.parametrize("name,index,sample", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_jvp_matches_jax(name, index, sample):
    opdef = ops.TABLE[name]
    # region-carrying ops keep their dtypes: the regions are typed for them
    inputs = [np.asarray(a) if sample.regions else _widen(a) for a in sample.inputs]
    attrs = {
        k: (np.dtype(np.float64) if isinstance(v, np.dtype) and v == np.float32 else v)
        for k, v in opdef.check_attrs(dict(sample.attrs)).items()
    }
    graph = single_op_graph(opdef, type(sample)(tuple(inputs), attrs, regions=sample.regions))
    wrt = [k for k, v in enumerate(graph.inputs) if differentiable(v.type)]
    rng = np.random.default_rng(index)
    tangents = [rng.standard_normal(inputs[k].shape).astype(inputs[k].dtype) for k in wrt]
    forward = jvp_graph(graph, wrt).verify()
    got = kn.runtime.compile(forward)(*inputs, *tangents)
    n_out = len(graph.outputs)

    def jax_fn(*float_inputs):
        full = list(inputs)
        for k, value in zip(wrt, float_inputs):
            full[k] = value
        extra = {"regions": sample.regions} if sample.regions else {}
        return JAX_OPS[name](*full, **attrs, **extra)

    with jax.enable_x64(True):
        if name in REVERSE_ONLY:
            primal, tangent = _jvp_by_jacrev(jax_fn, [inputs[k] for k in wrt], tangents)
        else:
            primal, tangent = jax.jvp(jax_fn, tuple(inputs[k] for k in wrt), tuple(tangents))
    primal = primal if isinstance(primal, (tuple, list)) else (primal,)
    tangent = tangent if isinstance(tangent, (tuple, list)) else (tangent,)
    single = any(np.asarray(a).dtype == np.float32 for a in inputs)
    rtol, atol = (1e-5, 1e-6) if single else (1e-9, 1e-11)
    for k, (g, w) in enumerate(zip(got[:n_out], primal)):
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=rtol,
            atol=atol,
            err_msg=f"{name} sample {index}: primal output {k}",
        )
    for k, (g, w) in enumerate(zip(got[n_out:], tangent)):
        if not differentiable(graph.outputs[k].type):
            continue
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=rtol,
            atol=atol,
            err_msg=f"{name} sample {index}: tangent of output {k}",
        )

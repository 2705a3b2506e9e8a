"""VJP rules, generated from the op table: kaun_ir's reverse mode vs ``jax.vjp``."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax_ops import JAX_OPS
from optest import samples_of, single_op_graph

import kaun_ir as kn
from kaun_ir import dtypes, ops
from kaun_ir.transforms.autodiff import differentiable, gradient_graph

DIFFERENTIABLE = {name for name, op in ops.TABLE.items() if op.vjp is not None}


def test_every_op_declares_its_derivative():
    for name, op in ops.TABLE.items():
        assert (op.vjp is None) != (op.nondiff is None), f"{name}: declare exactly one of vjp= or nondiff="


def test_every_differentiable_op_has_a_jax_oracle():
    assert DIFFERENTIABLE <= set(JAX_OPS), sorted(DIFFERENTIABLE - set(JAX_OPS))


def _float_cases():
    cases = []
    for name, index, sample in samples_of(ops.TABLE):
        if name not in DIFFERENTIABLE:
            continue
        if not any(dtypes.is_float(np.asarray(a).dtype) for a in sample.inputs):
            continue
        cases.append((name, index, sample))
    return cases


CASES = _float_cases()


def _widen(a):
    """Run the check in float64 where the sample is float32 (tighter comparison)."""
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype == np.float32 else a


def _promote_attrs(attrs):
    return {
        k: (np.dtype(np.float64) if isinstance(v, np.dtype) and v == np.float32 else v)
        for k, v in attrs.items()
    }


@pytest.mark.parametrize("name,index,sample", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_vjp_matches_jax(name, index, sample):
    opdef = ops.TABLE[name]
    # region-carrying ops keep their dtypes: the regions are typed for them
    inputs = [np.asarray(a) if sample.regions else _widen(a) for a in sample.inputs]
    attrs = _promote_attrs(opdef.check_attrs(dict(sample.attrs)))
    if any(np.asarray(a).dtype in (dtypes.bfloat16, np.float16) for a in inputs):
        pytest.skip("low-precision samples are covered by the forward tests")
    wide = type(sample)(tuple(inputs), attrs, regions=sample.regions)
    graph = single_op_graph(opdef, wide)
    outs_float = [k for k, v in enumerate(graph.outputs) if differentiable(v.type)]
    if not outs_float:
        pytest.skip("no floating-point output")
    rng = np.random.default_rng(index)
    cotangents = [
        rng.standard_normal(graph.outputs[k].type.shape).astype(graph.outputs[k].type.dtype)
        for k in outs_float
    ]
    grad_graph = gradient_graph(graph, of=tuple(outs_float), seed_inputs=True, keep_outputs=False)
    grad_graph.verify()
    got = kn.runtime.compile(grad_graph)(*inputs, *cotangents)
    wrt = [k for k, v in enumerate(graph.inputs) if differentiable(v.type)]

    def jax_fn(*float_inputs):
        full = list(inputs)
        for k, value in zip(wrt, float_inputs):
            full[k] = value
        extra = {"regions": sample.regions} if sample.regions else {}
        out = JAX_OPS[name](*full, **attrs, **extra)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(out[k] for k in outs_float)

    with jax.enable_x64(True):  # the oracle must not narrow the float64 inputs
        _, pullback = jax.vjp(jax_fn, *[inputs[k] for k in wrt])
        want = pullback(tuple(cotangents))
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=1e-7,
            atol=1e-9,
            err_msg=f"{name} sample {index}: cotangent of input {wrt[k]}",
        )

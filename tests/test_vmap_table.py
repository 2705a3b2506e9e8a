"""Batching rules, generated from the op table: ``kn.vmap``'s rules vs the op's own reference run
once per example, and vs ``jax.vmap`` of the equivalent JAX function in float64.

Every op with a batching rule is checked on a few of its samples under several choices of which
operands carry the batch axis. Shapes are the samples' own (small), batch size 3.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax_ops import JAX_OPS
from optest import assert_close, samples_of, single_op_graph, tolerance

import kaun_ir as kn
from kaun_ir import ops
from kaun_ir.surface.tensor import apply
from kaun_ir.transforms.vmap import batch_graph

SIZE = 3
PER_OP = 2  # samples per op: enough to cover the rule's branches, few enough to stay fast
# ops that share the one elementwise rule need one sample each; the reference loops of the
# window ops are slow in Python, so they get their smallest sample
ONE_SAMPLE = {"select_and_scatter_add", "reduce_window"}


def test_every_op_declares_its_batching():
    for name, op in ops.TABLE.items():
        assert (op.batch is None) != (op.nobatch is None), (
            f"{name}: declare exactly one of batch= (a batching rule) or nobatch= (why it has none)"
        )


def _chosen():
    """A few samples per op: the first one, and the one with the most operand axes."""
    by_op: dict[str, list] = {}
    for name, index, sample in samples_of(ops.TABLE):
        if ops.TABLE[name].batch is None:
            continue
        by_op.setdefault(name, []).append((index, sample))
    cases = []
    for name, samples in by_op.items():
        usable = [(i, s) for i, s in samples if all(np.size(a) > 0 for a in s.inputs)] or samples
        shared = getattr(ops.TABLE[name].batch, "__qualname__", "").startswith("elementwise")
        if name in ONE_SAMPLE:
            usable = sorted(usable, key=lambda item: sum(np.size(a) for a in item[1].inputs))
        # the most operand axes first (the rule's axis bookkeeping), then the smallest
        ranked = sorted(
            usable,
            key=lambda item: (
                -sum(np.ndim(a) for a in item[1].inputs),
                sum(np.size(a) for a in item[1].inputs),
            ),
        )
        picked = {usable[0][0]: usable[0][1]}
        for i, s in ranked:
            if len(picked) >= (1 if shared or name in ONE_SAMPLE else PER_OP):
                break
            picked.setdefault(i, s)
        cases += [(name, i, s) for i, s in picked.items()]
    return cases


CASES = _chosen()


def _flag_sets(n: int):
    """Which operands are batched: all of them, only the first, only the last."""
    sets = [(True,) * n]
    if n > 1:
        sets += [(True,) + (False,) * (n - 1), (False,) * (n - 1) + (True,)]
    return sets


def _variants(a: np.ndarray, rng) -> np.ndarray:
    """``SIZE`` different inputs of ``a``'s dtype and domain, stacked on a new axis 0: the sample
    itself, then permutations of its elements (scalars: shifted values)."""
    out = [a]
    for k in range(1, SIZE):
        if a.ndim == 0:
            if a.dtype == np.bool_:
                out.append(np.logical_xor(a, k % 2 == 1))
            elif a.dtype.kind in "iu":
                out.append(np.asarray(a + k - 1).astype(a.dtype))
            else:
                out.append(np.asarray(a + 0.5 * k).astype(a.dtype))
        else:
            out.append(rng.permutation(a.reshape(-1)).reshape(a.shape))
    return np.stack(out)


def _reference(opdef, sample, arrays, flags, attrs):
    """The op's reference run once per example, stacked."""
    per_example = []
    for b in range(SIZE):
        args = [a[b] if f else a for a, f in zip(arrays, flags)]
        per_example.append(opdef.run_reference(args, attrs, sample.regions))
    return [np.stack([outs[k] for outs in per_example]) for k in range(len(per_example[0]))]


@pytest.mark.parametrize("name,index,sample", CASES, ids=[f"{n}-{i}" for n, i, _ in CASES])
def test_batching_rule_matches_reference(name, index, sample):
    opdef = ops.TABLE[name]
    graph = single_op_graph(opdef, sample)
    attrs = opdef.check_attrs(dict(sample.attrs))
    rng = np.random.default_rng(index)
    for flags in _flag_sets(len(sample.inputs)):
        arrays = [_variants(np.asarray(a), rng) if f else np.asarray(a) for a, f in zip(sample.inputs, flags)]
        batched, out_flags = batch_graph(graph, flags, SIZE, force=True)
        batched.verify()
        got = kn.runtime.compile(batched)(*arrays)
        want = _reference(opdef, sample, arrays, flags, attrs)
        for k, (g, w) in enumerate(zip(got, want)):
            rtol, atol = tolerance(w.dtype, sample)
            assert_close(
                np.asarray(g), w, rtol, atol, what=f"{name} sample {index} batched {flags} output {k}"
            )


def _float64_cases():
    cases = []
    for name, index, sample in CASES:
        if name not in JAX_OPS or ops.TABLE[name].regions:
            continue
        if not any(np.asarray(a).dtype in (np.float32, np.float64) for a in sample.inputs):
            continue
        cases.append((name, index, sample))
    return cases


def _widen(a):
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype == np.float32 else a


F64_CASES = _float64_cases()


@pytest.mark.parametrize("name,index,sample", F64_CASES, ids=[f"{n}-{i}" for n, i, _ in F64_CASES])
def test_vmap_matches_jax_vmap(name, index, sample):
    """kn.vmap (with the batch axis at a different place per operand) vs jax.vmap, in float64."""
    opdef = ops.TABLE[name]
    attrs = {
        k: (np.dtype(np.float64) if isinstance(v, np.dtype) and v == np.float32 else v)
        for k, v in opdef.check_attrs(dict(sample.attrs)).items()
    }
    inputs = [_widen(a) for a in sample.inputs]
    rng = np.random.default_rng(index + 100)
    # operand k is mapped along its last axis when k is even, not mapped when k % 3 == 1 (the
    # first operand is always mapped)
    in_axes = tuple(None if (k % 3 == 1) else (np.ndim(a) if k % 2 == 0 else 0) for k, a in enumerate(inputs))
    arrays = []
    for a, axis in zip(inputs, in_axes):
        arrays.append(a if axis is None else np.moveaxis(_variants(a, rng), 0, axis))

    def ours(*xs):
        return apply(name, *xs, **attrs)

    got = kn.vmap(ours, in_axes=in_axes, out_axes=-1)(*arrays)
    with jax.enable_x64(True):
        want = jax.vmap(lambda *xs: JAX_OPS[name](*xs, **attrs), in_axes=in_axes, out_axes=-1)(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(
            np.asarray(g),
            np.asarray(w),
            rtol=1e-12,
            atol=1e-12,
            err_msg=f"{name} sample {index} in_axes {in_axes}",
        )

"""Every op survives a portable StableHLO artifact: generated from the op table, each op's samples
are exported together to ``.mlirbc`` (CHLO legalised on the way), deserialised, compiled by XLA
and run, and must match the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from optest import assert_close, samples_of, tolerance

import kaun_ir as kn
from kaun_ir import ops
from kaun_ir.ir.core import Graph, Node, TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.runtime.xla import backend, compiler, mlir, transfer


def _all_samples_graph(opdef, samples) -> Graph:
    """One graph applying the op once per sample, each to its own inputs."""
    types = [TensorType(np.asarray(a).dtype, np.shape(a)) for s in samples for a in s.inputs]
    args = Graph.arguments(types)
    nodes, outputs, k = [], [], 0
    for sample in samples:
        ins = args[k : k + len(sample.inputs)]
        k += len(sample.inputs)
        attrs = opdef.check_attrs(dict(sample.attrs))
        node = Node(
            opdef.name,
            ins,
            attrs,
            opdef.infer_types([v.type for v in ins], attrs, sample.regions),
            sample.regions,
            path=f"sample{len(nodes)}",
        )
        nodes.append(node)
        outputs.extend(node.outputs)
    return Graph(args, outputs, nodes, name=opdef.name)


@pytest.mark.parametrize("name", sorted(ops.TABLE))
def test_op_samples_through_a_portable_artifact(name, tmp_path):
    opdef = ops.TABLE[name]
    samples = [s for _, _, s in samples_of({name: opdef})]
    graph = _all_samples_graph(opdef, samples).verify()
    path = str(tmp_path / f"{name}.mlirbc")
    kn.runtime.export(graph, path)
    with open(path, "rb") as handle:
        module = mlir.deserialize_portable(handle.read())
    assert b"chlo." not in module  # legalised: portable consumers need not know CHLO
    device = backend.default_device()
    loaded = compiler.compile(module, device)
    arrays = [
        transfer.to_device(np.asarray(a), np.asarray(a).dtype, device) for s in samples for a in s.inputs
    ]
    actual = compiler.execute(loaded, arrays)
    k = 0
    for index, sample in enumerate(samples):
        expected = interpret(_all_samples_graph(opdef, [sample]), *sample.inputs)
        for j, want in enumerate(expected):
            rtol, atol = tolerance(want.dtype, sample)
            assert_close(np.asarray(actual[k]), want, rtol, atol, what=f"{name} sample {index} output {j}")
            k += 1
    assert k == len(actual)


@pytest.mark.interop  # the serialisation half needs flatbuffers
def test_jax_calls_a_kaun_ir_graph():
    import jax

    graph = kn.trace(
        lambda x, w: (kn.erf(x @ w), (x * x).sum()),
        kn.ShapeDtype((2, 3), kn.float32),
        kn.ShapeDtype((3, 4), kn.float32),
    )
    exported = kn.runtime.to_jax_export(graph)
    r = np.random.default_rng(0)
    x, w = r.standard_normal((2, 3), np.float32), r.standard_normal((3, 4), np.float32)
    want = kn.runtime.compile(graph)(x, w)
    for got in (exported.call(x, w), jax.jit(exported.call)(x, w)):
        for g, e in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6, atol=1e-6)
    pytest.importorskip("flatbuffers", reason="jax.export serialisation needs the flatbuffers package")
    reloaded = jax.export.deserialize(exported.serialize())
    np.testing.assert_allclose(np.asarray(reloaded.call(x, w)[0]), np.asarray(want[0]), rtol=1e-6, atol=1e-6)

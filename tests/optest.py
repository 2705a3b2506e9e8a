"""Helpers for tests generated from the op table: tolerances and single-op graphs."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import Graph, Node, TensorType

DEFAULT_TOL = {
    np.dtype(np.float64): (1e-9, 1e-12),
    np.dtype(np.float32): (2e-5, 2e-6),
    np.dtype(np.float16): (2e-3, 2e-3),
    dtypes.bfloat16: (2e-2, 2e-2),
}


def tolerance(dtype, sample) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOL.get(np.dtype(dtype), (0.0, 0.0))
    return (
        sample.rtol if sample.rtol is not None else rtol,
        sample.atol if sample.atol is not None else atol,
    )


def single_op_graph(opdef, sample) -> Graph:
    """A graph with one input per sample array and the op applied once."""
    types = [TensorType(np.asarray(a).dtype, np.shape(a)) for a in sample.inputs]
    args = Graph.arguments(types)
    attrs = opdef.check_attrs(dict(sample.attrs))
    out_types = opdef.infer_types(types, attrs, sample.regions)
    node = Node(opdef.name, args, attrs, out_types, sample.regions)
    return Graph(args, node.outputs, [node], name=opdef.name)


def samples_of(table):
    """``[(op_name, index, sample)]`` for every sample of every op, with a fixed seed per op."""
    cases = []
    for name in sorted(table):
        rng = np.random.default_rng(sum(map(ord, name)))
        for i, sample in enumerate(table[name].samples(rng)):
            cases.append((name, i, sample))
    return cases


def assert_close(actual, expected, rtol, atol, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64),
            expected.astype(np.float64),
            rtol=rtol,
            atol=atol,
            err_msg=what,
            equal_nan=True,
        )

"""Tests generated from the op table: every sample of every op, through every rule."""

from __future__ import annotations

import numpy as np
import pytest
from optest import assert_close, samples_of, single_op_graph, tolerance

import kaun_ir as kn
from kaun_ir import ops
from kaun_ir.ir import interpret, parse

CASES = samples_of(ops.TABLE)
IDS = [f"{name}-{i}" for name, i, _ in CASES]


def test_every_op_has_every_rule():
    for name, opdef in ops.TABLE.items():
        assert opdef.name == name
        assert callable(opdef.infer) and callable(opdef.reference) and callable(opdef.emit), name
        assert opdef.doc, f"{name} has no doc"
        assert list(opdef.samples(np.random.default_rng(0))), f"{name} has no samples"


def test_every_op_is_sampled():
    assert {name for name, _, _ in CASES} == set(ops.TABLE)


@pytest.mark.parametrize("name,index,sample", CASES, ids=IDS)
def test_type_rule_matches_reference(name, index, sample):
    opdef = ops.TABLE[name]
    graph = single_op_graph(opdef, sample)
    outs = opdef.run_reference(
        [np.asarray(a) for a in sample.inputs], opdef.check_attrs(dict(sample.attrs)), sample.regions
    )
    assert len(outs) == len(graph.outputs)
    for out, value in zip(outs, graph.outputs):
        assert np.shape(out) == value.type.shape, f"{name}: reference shape vs type rule"


@pytest.mark.parametrize("name,index,sample", CASES, ids=IDS)
def test_print_parse_roundtrip(name, index, sample):
    graph = single_op_graph(ops.TABLE[name], sample)
    text = graph.text()
    again = parse(text)
    assert again.text() == text


@pytest.mark.parametrize("name,index,sample", CASES, ids=IDS)
def test_xla_matches_reference(name, index, sample):
    opdef = ops.TABLE[name]
    graph = single_op_graph(opdef, sample).verify()
    mlir = kn.runtime.lower(graph)
    kn.runtime.parse_mlir(mlir)
    expected = interpret(graph, *sample.inputs)
    actual = kn.runtime.compile(graph)(*sample.inputs)
    for k, (got, want) in enumerate(zip(actual, expected)):
        rtol, atol = tolerance(want.dtype, sample)
        assert_close(np.asarray(got), want, rtol, atol, what=f"{name} sample {index} output {k}")

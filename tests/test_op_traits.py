"""The traits, StableHLO names and FLOP rules declared in the op table (``OpDef.traits``,
``OpDef.stablehlo``, ``OpDef.flops``): declared for every op, from the vocabulary, and true of
the op's samples."""

from __future__ import annotations

import numpy as np
import pytest
from optest import samples_of, single_op_graph

import kaun_ir as kn
from kaun_ir import ops
from kaun_ir.ops.base import TRAITS, OpDef
from kaun_ir.runtime.interop.stablehlo_ops import HANDLERS

CASES = samples_of(ops.TABLE)

#: the commutative ops, written out: a trait that changes results if wrong is checked twice
COMMUTATIVE = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"}

#: ops with a StableHLO name that the importer does not turn back into the op, and why
NOT_IMPORTED = {
    "sharding_constraint": "imported as its operand: placement is the importing program's business",
}


def _cases_with(trait: str):
    return [(name, i, sample) for name, i, sample in CASES if ops.TABLE[name].has(trait)]


def _ids(cases) -> list[str]:
    return [f"{name}-{i}" for name, i, _ in cases]


def _arrays(sample) -> list[np.ndarray]:
    return [np.asarray(a) for a in sample.inputs]


def test_every_op_declares_its_traits():
    undeclared = [name for name, opdef in ops.TABLE.items() if opdef.traits is None]
    assert not undeclared, f"ops without traits=... (write traits=() for none): {undeclared}"


def test_traits_come_from_the_vocabulary():
    for name, opdef in ops.TABLE.items():
        assert isinstance(opdef.traits, frozenset), name
        assert opdef.traits <= set(TRAITS), name
    with pytest.raises(ValueError, match="unknown trait"):
        OpDef(
            name="typo",
            arity=1,
            infer=lambda x: x,
            reference=lambda x: x,
            emit=None,
            samples=lambda rng: [],
            traits={"elementwsie"},
        )
    with pytest.raises(ValueError, match="unknown trait"):
        ops.with_trait("pure")


def test_commutative_ops_are_the_expected_ones():
    assert ops.with_trait("commutative") == COMMUTATIVE


@pytest.mark.parametrize(
    "name,index,sample", _cases_with("elementwise"), ids=_ids(_cases_with("elementwise"))
)
def test_elementwise_shape_and_positions(name, index, sample):
    """The result has the operands' broadcast shape, and rearranging the elements of every
    non-scalar operand (here: reversing their order) rearranges the result the same way."""
    opdef = ops.TABLE[name]
    attrs = opdef.check_attrs(dict(sample.attrs))
    arrays = _arrays(sample)
    (out_type,) = single_op_graph(opdef, sample).outputs
    assert out_type.type.shape == np.broadcast_shapes(*(a.shape for a in arrays))
    (expected,) = opdef.run_reference(arrays, attrs)
    flipped = [a if a.ndim == 0 else a.reshape(-1)[::-1].reshape(a.shape) for a in arrays]
    (got,) = opdef.run_reference(flipped, attrs)
    want = np.asarray(expected).reshape(-1)[::-1].reshape(np.shape(expected))
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:  # NumPy's vectorised and scalar loops may differ in the last bit
        np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize(
    "name,index,sample", _cases_with("commutative"), ids=_ids(_cases_with("commutative"))
)
def test_commutative_operands_swap(name, index, sample):
    opdef = ops.TABLE[name]
    attrs = opdef.check_attrs(dict(sample.attrs))
    a, b = _arrays(sample)
    np.testing.assert_array_equal(opdef.run_reference([a, b], attrs), opdef.run_reference([b, a], attrs))


@pytest.mark.parametrize("name,index,sample", CASES, ids=_ids(CASES))
def test_flop_rule_applies_to_every_sample(name, index, sample):
    opdef = ops.TABLE[name]
    (node,) = single_op_graph(opdef, sample).nodes
    flops = opdef.count_flops([v.type for v in node.inputs], node.types, dict(node.attrs))
    assert flops >= 0
    if opdef.flops is None:
        assert flops == 0, f"{name} has no FLOP rule but counts {flops}"


def test_stablehlo_names_are_unique_and_imported():
    owners: dict[str, str] = {}
    for name, opdef in ops.TABLE.items():
        if opdef.stablehlo is None:
            continue
        assert opdef.stablehlo not in owners, f"{name} and {owners[opdef.stablehlo]} claim {opdef.stablehlo}"
        owners[opdef.stablehlo] = name
        assert opdef.stablehlo in HANDLERS or name in NOT_IMPORTED, f"no importer for {opdef.stablehlo}"


def _first_samples():
    seen: dict[str, object] = {}
    for name, _, sample in CASES:
        opdef = ops.TABLE[name]
        if opdef.stablehlo and name not in NOT_IMPORTED and name not in seen:
            seen[name] = sample
    return sorted(seen.items())


@pytest.mark.parametrize("name,sample", _first_samples(), ids=[name for name, _ in _first_samples()])
def test_stablehlo_name_round_trips(name, sample):
    """Lowered, the op is written as its StableHLO op; imported again, that op becomes ``name``."""
    opdef = ops.TABLE[name]
    text = kn.runtime.lower(single_op_graph(opdef, sample))
    assert opdef.stablehlo in text
    imported = kn.ir.from_stablehlo(text)
    assert name in {node.op for node in imported.walk()}

"""``kaun_ir.ops.rules``: the helpers the op table's rules are written with build, node for node,
the graphs the NumPy-style surface (``kn.where``, ``kn.equal`` ...) builds, and the hooks the
layers above install are checked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.ops import rules

SHAPES = ((), (3,), (2, 3))
DTYPES = (np.float32, np.float64, np.int32, np.bool_)


def _same_graph(rule_fn, surface_fn, *args):
    """Both functions traced over the same inputs print the same graph."""
    assert kn.trace(rule_fn, *args).text() == kn.trace(surface_fn, *args).text()


def _constants(shape, dtype):
    """The non-traced operands a rule passes: a weak Python scalar and a NumPy constant."""
    scalar = {np.bool_: True, np.int32: 2}.get(dtype, 0.5)
    return [scalar, np.full(shape, scalar, dtype)]


def _check_with(other, x, pred):
    _same_graph(lambda a: rules.compare("GT", a, other), lambda a: kn.greater(a, other), x)
    _same_graph(lambda a: rules.compare("EQ", other, a), lambda a: kn.equal(other, a), x)
    _same_graph(lambda a: rules.binary("maximum", a, other), lambda a: kn.maximum(a, other), x)
    _same_graph(lambda p, a: rules.where(p, a, other), lambda p, a: kn.where(p, a, other), pred, x)
    _same_graph(lambda p, a: rules.where(p, other, a), lambda p, a: kn.where(p, other, a), pred, x)


@pytest.mark.parametrize("shape,dtype", list(itertools.product(SHAPES, DTYPES)))
def test_compare_binary_and_where_match_the_surface(shape, dtype):
    x = np.ones(shape, dtype)
    pred = np.ones(shape, np.bool_)
    for other in _constants((), dtype) + _constants(shape, dtype):
        _check_with(other, x, pred)
    # a scalar predicate broadcast over the branches, branches broadcast to the predicate, and a
    # predicate that is not bool
    _same_graph(lambda p, a: rules.where(p, a, a), lambda p, a: kn.where(p, a, a), np.array(True), x)
    wide = np.ones((4,) + shape, np.bool_)
    _same_graph(lambda p, a: rules.where(p, a, 0), lambda p, a: kn.where(p, a, 0), wide, x)
    _same_graph(lambda p, a: rules.where(p, a, a), lambda p, a: kn.where(p, a, a), x.astype(np.int32), x)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", (np.float32, kn.dtypes.bfloat16, np.int8, np.bool_))
def test_fills_casts_and_sums_match_the_surface(shape, dtype):
    x = np.ones(shape, dtype)
    _same_graph(lambda a: rules.full_like(a, 1), lambda a: kn.ones_like(a), x)
    _same_graph(lambda a: rules.full_like(a, 0), lambda a: kn.zeros_like(a), x)
    _same_graph(lambda a: rules.astype(a, np.float64), lambda a: kn.astype(a, np.float64), x)
    _same_graph(lambda a: rules.astype(a, dtype), lambda a: kn.astype(a, dtype), x)
    _same_graph(lambda a: rules.sum_all(a), lambda a: kn.sum(a), x)


def test_trace_and_inline_round_trip():
    t = kn.ir.TensorType(np.float32, (3,))
    graph = rules.trace(lambda a, b: [a * b, a + 1.0], [t, t], "region")
    assert [v.type for v in graph.outputs] == [t, t]
    x, y = np.arange(3, dtype=np.float32), np.full(3, 2.0, np.float32)
    product, shifted = kn.jit(lambda a, b: tuple(rules.inline(graph, [a, b])))(x, y)
    np.testing.assert_array_equal(np.asarray(product), x * y)
    np.testing.assert_array_equal(np.asarray(shifted), x + 1.0)


def test_a_region_may_not_read_the_enclosing_trace():
    t = kn.ir.TensorType(np.float32, (3,))

    def outer(a):
        return rules.trace(lambda b: b + a, [t], "region")

    with pytest.raises(RuntimeError, match="reads values of the enclosing trace"):
        kn.trace(outer, np.ones(3, np.float32))


def test_hooks_are_installed_by_the_composition_root_and_checked():
    with pytest.raises(TypeError, match="unknown op-rule hook"):
        rules.install(not_a_hook=print)
    saved = rules._HOOKS.pop("gradient_graph")
    try:
        with pytest.raises(RuntimeError, match="kaun_ir.transforms.autodiff, which the composition root"):
            rules.gradient_graph(kn.trace(lambda a: a, np.ones(2, np.float32)))
    finally:
        rules._HOOKS["gradient_graph"] = saved

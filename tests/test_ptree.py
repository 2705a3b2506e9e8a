"""``kn.ptree``: structure, paths, traversals and errors, with ``jax.tree_util`` as the oracle for
leaf order and restructuring, and ``jax.vjp`` for derivatives taken through ptree functions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import ptree


def make_tree(rng=None):
    rng = rng or np.random.default_rng(0)
    return {
        "layers": [
            {
                "weight": rng.standard_normal((3, 2)).astype(np.float32),
                "bias": rng.standard_normal(2).astype(np.float32),
            },
            {
                "weight": rng.standard_normal((2, 4)).astype(np.float32),
                "bias": rng.standard_normal(4).astype(np.float32),
            },
        ],
        "norm": {"scale": np.ones(4, np.float32)},
        "emb": rng.standard_normal((5, 3)).astype(np.float32),
    }


def test_flatten_order_matches_jax_tree_util():
    t = make_tree()
    leaves, _ = ptree.flatten(t)
    expected = jax.tree_util.tree_leaves(t)
    assert len(leaves) == len(expected) == 6
    for a, b in zip(leaves, expected):
        assert a is b


def test_rebuild_replaces_leaves_and_keeps_structure():
    t = {"a": [np.zeros(1), (np.ones(2), np.ones(3))], "b": np.zeros(4), "c": None, "d": {}}
    leaves, rebuild = ptree.flatten(t)
    new = rebuild([f"leaf{i}" for i in range(len(leaves))])
    assert new == {"a": ["leaf0", ("leaf1", "leaf2")], "b": "leaf3", "c": None, "d": {}}
    assert isinstance(new["a"][1], tuple)  # tuples stay tuples
    with pytest.raises(ValueError, match="4 leaves, got 3"):
        rebuild([1, 2, 3])
    with pytest.raises(ValueError, match="4 leaves, got 5"):
        rebuild([1, 2, 3, 4, 5])


def test_flatten_with_paths():
    t = make_tree()
    paths = ptree.flatten_with_paths(t)
    assert [p for p, _ in paths] == [
        "emb",
        "layers.0.bias",
        "layers.0.weight",
        "layers.1.bias",
        "layers.1.weight",
        "norm.scale",
    ]
    assert paths[2][1] is t["layers"][0]["weight"]
    # the same order as flatten
    assert [id(leaf) for _, leaf in paths] == [id(leaf) for leaf in ptree.flatten(t)[0]]


def test_flatten_with_paths_root_tuples_and_empties():
    x = np.zeros(3)
    assert ptree.flatten_with_paths(x) == [("", x)]
    t = {"opt": (x, [x, {}], None), "empty": [], "n": 7}
    assert [p for p, _ in ptree.flatten_with_paths(t)] == ["n", "opt.0", "opt.1.0"]
    assert ptree.flatten_with_paths({}) == []
    # ten or more list items: indices are decimal and the order is positional, not textual
    long = [np.full(1, i) for i in range(12)]
    assert [p for p, _ in ptree.flatten_with_paths(long)] == [str(i) for i in range(12)]


def test_map_matches_jax_tree_map():
    t = make_tree()
    got = ptree.map(lambda a: a * 2 + 1, t)
    want = jax.tree_util.tree_map(lambda a: a * 2 + 1, t)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(a, b)


def test_map2_values_and_list_tuple_pairing():
    a, b = make_tree(np.random.default_rng(1)), make_tree(np.random.default_rng(2))
    got = ptree.map2(lambda x, y: x - 3 * y, a, b)
    want = jax.tree_util.tree_map(lambda x, y: x - 3 * y, a, b)
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(x, y)
    # a list pairs with a tuple of the same length; the result follows the first tree
    out = ptree.map2(lambda x, y: x + y, [1, 2], (10, 20))
    assert out == [11, 22]


@pytest.mark.parametrize(
    "b, fragment",
    [
        ({"x": {"w": 1}, "y": 2}, "at 'x': keys only in the first tree ['v'], only in the second []"),
        ({"x": {"w": 1, "v": 2}, "y": [1]}, "at 'y': a leaf vs a list of length 1"),
        ({"x": {"w": 1, "v": [1, 2]}, "y": 2}, "at 'x.v': a leaf vs a list of length 2"),
        ({"x": {"w": 1, "v": 2}}, "at the root: keys only in the first tree ['y']"),
    ],
)
def test_map2_mismatch_names_the_path(b, fragment):
    a = {"x": {"w": 1, "v": 2}, "y": 2}
    with pytest.raises(ValueError, match="different structures") as err:
        ptree.map2(lambda p, q: p, a, b)
    assert fragment in str(err.value)


def test_map2_list_length_mismatch_names_the_path():
    a = {"layers": [{"w": 1}, {"w": 2}]}
    b = {"layers": [{"w": 1}, {"w": 2}, {"w": 3}]}
    with pytest.raises(ValueError, match="at 'layers': a list of length 2 vs a list of length 3"):
        ptree.map2(lambda p, q: p, a, b)
    c = {"layers": [{"w": 1}, {"u": 2}]}
    with pytest.raises(ValueError, match="at 'layers.1'"):
        ptree.map2(lambda p, q: p, a, c)


def test_fold_and_iter_visit_leaves_in_order():
    t = {"b": [3, 4], "a": 1, "c": {"z": 5, "y": 2}}
    assert ptree.fold(lambda acc, x: acc + [x], [], t) == [1, 3, 4, 2, 5]
    seen = []
    assert ptree.iter(seen.append, t) is None
    assert seen == [1, 3, 4, 2, 5]
    assert ptree.fold(lambda acc, x: acc * 10 + x, 0, t) == 13425


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: ptree.map(lambda a: a, t),
        lambda t: ptree.flatten(t),
        lambda t: ptree.flatten_with_paths(t),
        lambda t: ptree.fold(lambda acc, a: acc, 0, t),
        lambda t: ptree.iter(lambda a: None, t),
        lambda t: ptree.count_parameters(t),
        lambda t: ptree.map2(lambda a, b: a, t, t),
    ],
)
def test_keys_with_dots_are_rejected(fn):
    with pytest.raises(ValueError, match=r"'w\.b' at 'layers.0' contains '\.'"):
        fn({"layers": [{"w.b": np.zeros(1)}]})


def test_bad_keys():
    with pytest.raises(TypeError, match="keys must be strings, got 1"):
        ptree.flatten({1: np.zeros(1)})
    with pytest.raises(TypeError, match="keys must be strings, got 1"):
        ptree.flatten({"a": {1: np.zeros(1), "b": 2}})  # unsortable mixed keys
    with pytest.raises(ValueError, match="empty dict key at 'a'"):
        ptree.flatten_with_paths({"a": {"": 1}})


def test_count_parameters():
    t = make_tree()
    assert ptree.count_parameters(t) == sum(np.size(x) for x in jax.tree_util.tree_leaves(t))
    assert ptree.count_parameters(t) == 6 + 2 + 8 + 4 + 4 + 15
    assert ptree.count_parameters({"w": jnp.zeros((4, 5)), "step": 3, "none": None}) == 21
    assert ptree.count_parameters({"spec": kn.ShapeDtype((2, 3))}) == 6
    assert ptree.count_parameters([]) == 0
    with pytest.raises(TypeError, match="has no shape"):
        ptree.count_parameters({"name": "text"})


def test_zeros_like_concrete_gives_device_arrays():
    t = {
        "w": np.ones((2, 3), np.float32),
        "h": np.ones(4, ml_dtypes.bfloat16),
        "j": jnp.ones((2,), jnp.int32),
        "s": kn.ShapeDtype((3,), np.float16),
        "e": [],
        "n": None,
    }
    z = ptree.zeros_like(t)
    assert z["e"] == [] and z["n"] is None
    for key in ("w", "h", "j", "s"):
        assert isinstance(z[key], jax.Array), key
        np.testing.assert_array_equal(np.asarray(z[key]), 0)
    assert z["w"].shape == (2, 3) and z["w"].dtype == np.float32
    assert z["h"].dtype == ml_dtypes.bfloat16 and z["j"].dtype == np.int32
    assert z["s"].shape == (3,) and z["s"].dtype == np.float16


def test_ptree_functions_work_while_tracing():
    t = make_tree()

    def f(params):
        doubled = ptree.map(lambda a: a * 2.0, params)
        zeros = ptree.zeros_like(params)
        summed = ptree.map2(lambda a, b: a + b, doubled, zeros)
        total = ptree.fold(lambda acc, a: acc + a.sum(), 0.0, summed)
        leaves, rebuild = ptree.flatten(summed)
        return rebuild([leaf + total for leaf in leaves])

    got = kn.jit(f)(t)
    total = sum(float(np.sum(2 * x)) for x in jax.tree_util.tree_leaves(t))
    want = jax.tree_util.tree_map(lambda a: 2 * a + total, t)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-4)

    graph = kn.trace(f, t)  # restructuring only: the graph has one input per leaf
    assert len(graph.inputs) == 6


def test_vjp_through_ptree_functions_matches_jax():
    t = make_tree()
    rng = np.random.default_rng(3)
    cotangent = ptree.map(lambda a: rng.standard_normal(a.shape).astype(np.float32), t)

    def f(params):  # elementwise, restructured with map / map2 / flatten
        cubes = ptree.map2(lambda a, b: a * b, params, ptree.map(lambda a: a * a, params))
        leaves, rebuild = ptree.flatten(cubes)
        return rebuild([leaf * 0.5 for leaf in leaves])

    out, back = kn.vjp(f, t)
    (got,) = back(cotangent)
    want_out, jax_back = jax.vjp(lambda p: jax.tree_util.tree_map(lambda a: 0.5 * a**3, p), t)
    (want,) = jax_back(cotangent)
    assert [p for p, _ in ptree.flatten_with_paths(got)] == [p for p, _ in ptree.flatten_with_paths(t)]
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want_out)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_unflatten_from_paths_round_trip():
    t = make_tree()
    rebuilt = ptree.unflatten_from_paths(ptree.flatten_with_paths(t))
    assert jax.tree_util.tree_structure(rebuilt) == jax.tree_util.tree_structure(t)
    assert ptree.unflatten_from_paths({"": 5}) == 5
    # keys 0..n-1 give a list (order by number, not by text); anything else a dict
    items = {f"l.{i}": i for i in range(11)}
    items.update({"d.0": "a", "d.2": "b"})
    out = ptree.unflatten_from_paths(items)
    assert out == {"l": list(range(11)), "d": {"0": "a", "2": "b"}}


@pytest.mark.parametrize(
    "items, message",
    [
        ([("a", 1), ("a.b", 2)], "is a leaf and also a prefix"),
        ([("a.b", 2), ("a", 1)], "is a leaf and also a prefix"),
        ([("a", 1), ("a", 2)], "appears twice"),
        ([("", 1), ("a", 2)], "must be the only path"),
        ([("a..b", 1)], "empty segment"),
    ],
)
def test_unflatten_from_paths_errors(items, message):
    with pytest.raises(ValueError, match=message):
        ptree.unflatten_from_paths(items)


def test_structure_equal():
    a = {"x": [1, 2], "y": {"z": 3}}
    assert ptree.structure_equal(a, {"x": (5, 6), "y": {"z": np.zeros(2)}})
    assert not ptree.structure_equal(a, {"x": [1], "y": {"z": 3}})
    assert not ptree.structure_equal(a, {"x": [1, 2], "y": {"w": 3}})


def test_unflattener_matches_unflatten_on_shallow_and_very_deep_trees():
    """The generated rebuilder equals ``unflatten``; a tree nested deeper than Python's parser
    allows in one expression falls back to ``unflatten`` instead of failing."""
    from kaun_ir import tree

    shallow = {"b": (1, [2, None, 3]), "a": {"z": 4, "y": (5,)}, "c": []}
    deep: object = 0
    for i in range(150):
        deep = {"k": deep, "i": i} if i % 2 else (deep, i)
    for value in (shallow, deep, 7):
        leaves, treedef = tree.flatten(value)
        assert tree.unflattener(treedef)(leaves) == tree.unflatten(treedef, leaves) == value

"""NaN, +-Inf, +-0 and empty arrays through the public function surface, against jax.numpy / jax.nn.

Generated over the public names: every name in the ``__all__`` of the NumPy-style surface modules
(``kaun_ir.surface``'s ``elementwise``, ``promotion``, ``shapes``, ``creation``, ``indexing``,
``take``, ``dynamic_slice``, ``reductions``, ``linalg``) and of ``kaun_ir.nn.activations`` is
either checked here against its JAX counterpart or listed in ``NOT_ARITHMETIC`` with the reason it
has no special-value semantics of its own; a new public function fails
``test_every_public_function_is_classified`` until it is put in one of them.

Functions are evaluated together in a few compiled functions (one executable per group), so the
file compiles a handful of executables, not one per function.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.nn import activations
from kaun_ir.surface import (
    creation,
    dynamic_slice,
    elementwise,
    indexing,
    linalg,
    promotion,
    reductions,
    shapes,
    take,
)

F32 = np.float32
SPECIAL = np.array(
    [
        np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -0.5,
        3.0,
        -3.0,
        6.0,
        100.0,
        -100.0,
        3e38,
        -3e38,
        1e-45,
        -1e-45,
    ],
    F32,
)

UNARY = {
    "abs": jnp.abs,
    "ceil": jnp.ceil,
    "cos": jnp.cos,
    "erf": jax.scipy.special.erf,
    "exp": jnp.exp,
    "expm1": jnp.expm1,
    "floor": jnp.floor,
    "log": jnp.log,
    "log1p": jnp.log1p,
    "negative": jnp.negative,
    "reciprocal": jnp.reciprocal,
    "round": jnp.round,
    "rsqrt": jax.lax.rsqrt,
    "sign": jnp.sign,
    "sin": jnp.sin,
    "sqrt": jnp.sqrt,
    "square": jnp.square,
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
}
ACTIVATIONS = {
    "relu": jax.nn.relu,
    "relu6": jax.nn.relu6,
    "leaky_relu": jax.nn.leaky_relu,
    "elu": jax.nn.elu,
    "selu": jax.nn.selu,
    "celu": jax.nn.celu,
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_approx": functools.partial(jax.nn.gelu, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.swish,
    "softplus": jax.nn.softplus,
    "softsign": jax.nn.soft_sign,
    "mish": jax.nn.mish,
    "log_sigmoid": jax.nn.log_sigmoid,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
    "hard_sigmoid": jax.nn.hard_sigmoid,
    "hard_tanh": jax.nn.hard_tanh,
    "hard_swish": jax.nn.hard_swish,
    "hard_silu": jax.nn.hard_silu,
}
BINARY = {
    name: getattr(jnp, name)
    for name in (
        "add",
        "subtract",
        "multiply",
        "divide",
        "true_divide",
        "maximum",
        "minimum",
        "power",
        "arctan2",
        "mod",
        "remainder",
        "floor_divide",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
    )
}
REDUCTIONS = {
    name: getattr(jnp, name)
    for name in ("sum", "mean", "max", "min", "prod", "var", "std", "argmax", "argmin", "all", "any")
}
REDUCTIONS |= {
    "logsumexp": jax.scipy.special.logsumexp,
    "softmax": jax.nn.softmax,
    "log_softmax": jax.nn.log_softmax,
}
LINALG = {
    "matmul": jnp.matmul,
    "dot": jnp.dot,
    "outer": jnp.outer,
    "tensordot": functools.partial(jnp.tensordot, axes=1),
    "einsum": functools.partial(jnp.einsum, "ij,jk->ik"),
}
OTHER = {"where", "clip"}  # checked by their own tests below

NOT_ARITHMETIC = {
    # these move, make or describe arrays; they compute nothing a special value could change
    "arange": "creation",
    "full": "creation",
    "full_like": "creation",
    "ones": "creation",
    "ones_like": "creation",
    "zeros": "creation",
    "zeros_like": "creation",
    "broadcast_shapes": "shapes only",
    "shape_of": "shapes only",
    "dtype_of": "dtypes only",
    "promote": "dtype promotion",
    "broadcast_to": "data movement",
    "concatenate": "data movement",
    "expand_dims": "data movement",
    "getitem": "data movement",
    "advanced_getitem": "data movement",
    "take": "data movement",
    "take_along_axis": "data movement",
    "dynamic_slice": "data movement",
    "dynamic_update_slice": "data movement",
    "one_hot": "creation",
    "reshape": "data movement",
    "squeeze": "data movement",
    "stack": "data movement",
    "transpose": "data movement",
    # integer and boolean only: no NaN, infinity or signed zero exists in their domain
    "bitwise_and": "integers only",
    "bitwise_or": "integers only",
    "bitwise_xor": "integers only",
    "invert": "integers only",
    "left_shift": "integers only",
    "right_shift": "integers only",
    "logical_not": "booleans only",
    # float -> int of NaN/inf is implementation-defined in XLA and NumPy alike
    "astype": "conversion",
    # the identity on values (its derivative is zero)
    "stop_gradient": "identity",
}

# Deliberate, documented differences (docs/errors.md "Numerics"): (function, input) -> why
KNOWN: dict[str, str] = {}


def _public(module) -> set[str]:
    return set(module.__all__)


def test_every_public_function_is_classified():
    families = (elementwise, promotion, shapes, creation, indexing, take, dynamic_slice, reductions, linalg)
    surface = set().union(*(_public(module) for module in families)) | _public(activations)
    covered = set(UNARY) | set(ACTIVATIONS) | set(BINARY) | set(REDUCTIONS) | set(LINALG) | OTHER
    missing = sorted(surface - covered - set(NOT_ARITHMETIC))
    assert not missing, f"public functions with no special-value check or exemption: {missing}"


def _assert_same(name, got, want, signed_zero=True):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != jax {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != jax {want.dtype}"
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: NaN positions")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{name}: +inf positions")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{name}: -inf positions")
    finite = np.isfinite(got)
    np.testing.assert_allclose(got[finite], want[finite], rtol=3e-5, atol=1e-6, err_msg=name)
    if signed_zero:
        zeros = finite & (got == 0) & (want == 0)
        np.testing.assert_array_equal(
            np.signbit(got[zeros]), np.signbit(want[zeros]), err_msg=f"{name}: sign of zero"
        )


def _kn(name):
    return getattr(kn.fn, name) if name in ACTIVATIONS else getattr(kn, name)


@pytest.fixture(scope="module")
def unary_results():
    names = sorted(set(UNARY) | set(ACTIVATIONS))
    compiled = kn.jit(lambda x: {n: _kn(n)(x) for n in names})
    oracle = jax.jit(lambda x: {n: (UNARY | ACTIVATIONS)[n](x) for n in names})
    empty = np.zeros((2, 0), F32)
    return {"special": (compiled(SPECIAL), oracle(SPECIAL)), "empty": (compiled(empty), oracle(empty))}


@pytest.mark.parametrize("name", sorted(set(UNARY) | set(ACTIVATIONS)))
@pytest.mark.parametrize("case", ["special", "empty"])
def test_unary_and_activations_match_jax(unary_results, name, case):
    got, want = unary_results[case]
    # celu(-0.0): jax.nn.celu adds max(x, 0) and gets +0.0; ours selects the -0.0 branch value
    _assert_same(name, got[name], want[name], signed_zero=name != "celu")


def test_relu_keeps_nan_and_a_nan_sample_poisons_the_loss():
    x = np.array([np.nan, -1.0, 2.0], F32)
    np.testing.assert_array_equal(np.isnan(np.asarray(kn.fn.relu(x))), [True, False, False])
    loss = kn.jit(lambda w, x: kn.sum(kn.fn.relu(x * w)))(np.ones(3, F32), x)
    assert np.isnan(np.asarray(loss))


def test_activation_gradients_at_finite_special_points_match_jax():
    # at the kinks both libraries pick one-sided derivatives; NaN/inf inputs are left out here
    # because the gradient of a NaN input is NaN in any loss that uses it
    x = np.array([0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 6.0, -6.0, 100.0, -100.0], F32)
    names = sorted(ACTIVATIONS)
    got = kn.jit(lambda v: {n: kn.grad(lambda u, n=n: kn.sum(_kn(n)(u)))(v) for n in names})(x)
    want = jax.jit(lambda v: {n: jax.grad(lambda u, n=n: jnp.sum(ACTIVATIONS[n](u)))(v) for n in names})(x)
    for name in names:
        _assert_same(f"d {name}", got[name], want[name], signed_zero=False)


@pytest.fixture(scope="module")
def binary_results():
    a, b = (v.ravel() for v in np.meshgrid(SPECIAL[:12], SPECIAL[:12]))
    compiled = kn.jit(lambda x, y: {n: getattr(kn, n)(x, y) for n in BINARY})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return a, b, compiled(a, b), jax.jit(lambda x, y: {n: f(x, y) for n, f in BINARY.items()})(a, b)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_functions_match_jax_on_every_pair_of_special_values(binary_results, name):
    a, b, got, want = binary_results
    keep = np.ones(a.shape, bool)
    if name in KNOWN:
        keep = ~(np.isfinite(a) & np.isinf(b))
    _assert_same(name, np.asarray(got[name])[keep], np.asarray(want[name])[keep])


def test_empty_binary():
    e = np.zeros((0, 3), F32)
    got = kn.jit(lambda x, y: {n: getattr(kn, n)(x, y) for n in BINARY})(e, np.ones(3, F32))
    for name, ref in BINARY.items():
        _assert_same(name, got[name], ref(e, np.ones(3, F32)))


ROWS = np.array(
    [
        [np.nan, 1, 2],
        [np.inf, -np.inf, 0],
        [np.inf, 1, 2],
        [-np.inf, -np.inf, -np.inf],
        [1, 2, 3],
        [0.0, -0.0, -0.0],
        [-0.0, -0.0, -0.0],
        [3e38, 3e38, 1],
    ],
    F32,
)


@pytest.mark.parametrize("axis", [1, 0, None])
def test_reductions_match_jax_on_rows_of_special_values(axis):
    names = sorted(REDUCTIONS)
    got = kn.jit(lambda x: {n: getattr(kn, n)(x, axis=axis) for n in names})(ROWS)
    want = jax.jit(lambda x: {n: REDUCTIONS[n](x, axis=axis) for n in names})(ROWS)
    for name in names:
        # max/min of +0.0 and -0.0 may return either (IEEE leaves it open; XLA fusions differ)
        _assert_same(f"{name}(axis={axis})", got[name], want[name], signed_zero=name not in ("max", "min"))


@pytest.mark.parametrize("axis", [0, 1, None])
def test_reductions_of_empty_arrays_match_jax(axis):
    empty = np.zeros((0, 3), F32)
    wanted = {}
    for name, ref in sorted(REDUCTIONS.items()):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                wanted[name] = ref(empty, axis=axis)
        except ValueError:  # jax refuses max/min/argmax of an empty axis: so must we
            with pytest.raises(ValueError, match=name):
                kn.trace(lambda x, name=name: getattr(kn, name)(x, axis=axis), empty)
    got = kn.jit(lambda x: {n: getattr(kn, n)(x, axis=axis) for n in wanted})(empty)
    for name, want in wanted.items():
        _assert_same(f"{name}(empty, axis={axis})", got[name], want)


def test_linalg_propagates_nan_and_inf_like_jax():
    a = np.array([[np.nan, 1.0], [np.inf, 0.0], [0.0, -0.0], [-np.inf, np.inf]], F32)
    b = np.array([[0.0, 1.0, -0.0], [1.0, 0.0, np.inf]], F32)

    def products(a, b):
        return {
            "matmul": kn.matmul(a, b),
            "dot": kn.dot(a, b),
            "tensordot": kn.tensordot(a, b, axes=1),
            "einsum": kn.einsum("ij,jk->ik", a, b),
            "outer": kn.outer(a[:, 0], b[0]),
            "empty": kn.matmul(a[:, :0], b[:0]),
        }

    got = kn.jit(products)(a, b)
    for name, ref in LINALG.items():
        want = ref(a[:, 0], b[0]) if name == "outer" else ref(a, b)
        _assert_same(name, got[name], want, signed_zero=False)
    _assert_same("matmul(empty)", got["empty"], jnp.matmul(a[:, :0], b[:0]))


def test_where_and_clip_keep_nan():
    got = kn.jit(lambda x: (kn.where(x > 0, x, -x), kn.clip(x, -1.0, 1.0), kn.clip(x, np.nan, 1.0)))(SPECIAL)
    _assert_same("where", got[0], jnp.where(SPECIAL > 0, SPECIAL, -SPECIAL))
    _assert_same("clip", got[1], jnp.clip(SPECIAL, -1.0, 1.0))
    _assert_same("clip(nan bound)", got[2], jnp.clip(SPECIAL, np.nan, 1.0))

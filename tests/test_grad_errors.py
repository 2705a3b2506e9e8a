"""Errors of kn.grad / kn.value_and_grad / kn.vjp and the autodiff transformation.

Each error must say what went wrong in the user's terms: which argument (and which leaf of a
parameter tree), which op and layer path, and what to do instead.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.surface.tensor import apply
from kaun_ir.transforms.autodiff import gradient_graph


def test_grad_wrt_integer_argument_names_it():
    with pytest.raises(kn.GradientError, match=r"argument 0 \(leaf '0' of type i32\[3\]\).*floating-point"):
        kn.grad(lambda n, x: kn.sum(x * n))(np.arange(3, dtype=np.int32), np.ones(3, np.float32))


def test_grad_wrt_integer_leaf_of_a_tree_names_the_leaf():
    params = {"w": np.ones(3, np.float32), "steps": np.int32(4)}
    with pytest.raises(kn.GradientError, match=r"argument 0 \(leaf '0\.steps' of type i32\[\]\)"):
        kn.grad(lambda p: kn.sum(p["w"]) * p["steps"])(params)


def test_grad_wrt_integer_argument_picked_by_argnums():
    x, n = np.ones(2, np.float32), np.arange(2, dtype=np.int64)
    with pytest.raises(kn.GradientError, match=r"argument 1 .*i64\[2\]"):
        kn.grad(lambda x, n: kn.sum(x * n), argnums=(0, 1))(x, n)
    # not differentiating w.r.t. the integer argument is fine
    np.testing.assert_array_equal(np.asarray(kn.grad(lambda x, n: kn.sum(x * n))(x, n)), [0.0, 1.0])


def test_gradient_graph_wrt_integer_input_names_it():
    graph = kn.ir.parse(
        'graph @g(%0: f32[2] "x", %1: i32[2] "count") -> (f32[]) {\n'
        "  %2 = convert %1 {dtype = f32} : f32[2]\n"
        "  %3 = multiply %0, %2 : f32[2]\n"
        '  %4 = reduce %3 {dimensions = [0], kind = "sum"} : f32[]\n'
        "  return %4\n}\n"
    )
    with pytest.raises(kn.GradientError, match=r"count of type i32\[2\]"):
        gradient_graph(graph, wrt=[1])
    with pytest.raises(IndexError, match="wrt index 2 out of range for 2 inputs"):
        gradient_graph(graph, wrt=[2])


def test_grad_of_non_scalar_output_points_to_vjp():
    with pytest.raises(kn.GradientError, match=r"shape \[3\].*scalar.*kn\.vjp"):
        kn.grad(lambda x: x * 2.0)(np.ones(3, np.float32))
    with pytest.raises(kn.GradientError, match=r"shape \[2, 2\].*kn\.vjp"):
        kn.value_and_grad(lambda x: kn.tanh(x))(np.ones((2, 2), np.float32))


def test_grad_of_integer_output():
    with pytest.raises(kn.GradientError, match=r"i32\[\] is not floating point"):
        kn.grad(lambda x: kn.astype(kn.sum(x), kn.int32))(np.ones(3, np.float32))


def test_grad_of_tree_output_without_has_aux():
    with pytest.raises(kn.GradientError, match="single scalar array"):
        kn.grad(lambda x: (kn.sum(x), kn.sum(x)))(np.ones(3, np.float32))


def test_grad_through_nondifferentiable_op_names_op_and_layer_path():
    def f(x):
        with kn.ir.scope("encoder"), kn.ir.scope("0.quantize"):
            bits = apply("bitcast_convert", x, dtype=kn.float32)
        return kn.sum(bits * x)

    with pytest.raises(
        kn.GradientError, match=r"through bitcast_convert at encoder\.0\.quantize: bit reinterpretation"
    ):
        kn.grad(f)(np.ones(3, np.float32))


def test_grad_through_while_loop_names_op_and_layer_path():
    def f(x):
        with kn.ir.scope("rnn"):  # a trip count known only at run time
            y = kn.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, kn.tanh(s[1] * x)), (np.int32(0), x))[
                1
            ]
        return kn.sum(y)

    with pytest.raises(kn.GradientError, match=r"through while at rnn: reverse mode through a while loop"):
        kn.grad(f)(np.ones(2, np.float32))


def test_nondifferentiable_op_inside_jit_reports_the_full_path():
    @kn.jit
    def step(x):
        with kn.ir.scope("model"):
            return kn.grad(lambda x: kn.sum(apply("bitcast_convert", x, dtype=kn.float32)))(x)

    with pytest.raises(kn.GradientError, match=r"bitcast_convert at model[:\s]"):
        step(np.ones(2, np.float32))


def test_argmax_based_code_differentiates_through_the_selected_values():
    # argmax itself has no derivative, but its integer result is not active: the gradient
    # flows through the value that was picked (like jax), and nothing is raised
    x = np.array([0.5, 3.0, -1.0], np.float32)
    g = kn.grad(lambda x: x[kn.argmax(x)] * 2.0)(x)
    np.testing.assert_array_equal(np.asarray(g), [0.0, 2.0, 0.0])


@pytest.mark.parametrize(
    "returns",
    [
        lambda x: kn.sum(x),  # not a tuple
        lambda x: (kn.sum(x), x, x),  # three elements
        lambda x: [kn.sum(x), x],  # a list, not a tuple
    ],
)
def test_has_aux_with_wrong_structure(returns):
    message = re.escape("with has_aux=True the function must return (output, aux)")
    with pytest.raises(TypeError, match=message):
        kn.grad(returns, has_aux=True)(np.ones(3, np.float32))
    with pytest.raises(TypeError, match=re.escape("must return (output, aux)")):
        kn.value_and_grad(returns, has_aux=True)(np.ones(3, np.float32))


def test_has_aux_whose_output_is_a_tree():
    with pytest.raises(kn.GradientError, match="single scalar array"):
        kn.grad(lambda x: ((kn.sum(x), kn.sum(x)), x), has_aux=True)(np.ones(3, np.float32))


@pytest.mark.parametrize("argnums, bad", [(2, 2), ((0, 5), 5), (-3, -3)])
def test_argnums_out_of_range(argnums, bad):
    with pytest.raises(IndexError, match=rf"argnums {bad} out of range for 2 positional arguments"):
        kn.grad(lambda x, y: kn.sum(x * y), argnums=argnums)(np.ones(2, np.float32), np.ones(2, np.float32))


def test_vjp_cotangent_with_wrong_structure():
    _, back = kn.vjp(lambda x: {"a": x * 2.0, "b": kn.sum(x)}, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="structure of f's output"):
        back((np.ones(3, np.float32), np.float32(1.0)))


@pytest.mark.parametrize(
    "cotangent",
    [np.ones(4, np.float32), np.ones((3, 1), np.float32), np.ones(3, np.float64)],
    ids=["length", "rank", "dtype"],
)
def test_vjp_cotangent_with_wrong_type_is_a_clear_error(cotangent):
    # must be reported before compiling, naming the expected type (not an XLA failure)
    _, back = kn.vjp(lambda x: x * 2.0, np.ones(3, np.float32))
    with pytest.raises((ValueError, TypeError), match=r"cotangent.*f32\[3\]"):
        back(cotangent)


def test_autodiff_pass_on_non_scalar_output():
    graph = kn.trace(lambda x: x * 2.0, kn.ShapeDtype((3,)))
    with pytest.raises(kn.GradientError, match="use kn.vjp"):
        kn.passes.run(graph, "autodiff")

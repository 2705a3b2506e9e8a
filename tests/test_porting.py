"""Traps for code ported from PyTorch, each fixed or made loud: conv2d's padding forms, the
command line's TrainSetup, the default stage of a training step's statistics, graph input names,
and differentiating a model exported to JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import layer, loss, optim, rng
from kaun_ir.errors import ModelSpecError
from kaun_ir.tools.spec import TrainSetup, resolve


@pytest.mark.parametrize(
    "padding, pairs", [(0, [(0, 0), (0, 0)]), (1, [(1, 1), (1, 1)]), ((1, 2), [(1, 1), (2, 2)])]
)
def test_conv2d_takes_pytorch_padding_forms(padding, pairs):
    x = np.random.default_rng(0).normal(size=(2, 3, 7, 6)).astype(np.float32)
    conv = layer.conv2d(3, 4, 3, padding=padding)
    with rng.scope(0):
        v = layer.init(conv, x)
    y, _ = layer.apply(conv, v, x)
    w, b = np.asarray(v.params["weight"]), np.asarray(v.params["bias"])
    want = jax.lax.conv_general_dilated(x, w, (1, 1), pairs, dimension_numbers=("NCHW", "OIHW", "NCHW"))
    np.testing.assert_allclose(np.asarray(y), np.asarray(want) + b[None, :, None, None], rtol=1e-5, atol=1e-5)


def test_conv2d_default_padding_is_same_not_pytorchs_zero():
    x = np.zeros((1, 2, 8, 8), np.float32)
    with rng.scope(0):
        v = layer.init(layer.conv2d(2, 2, 3), x)
    assert layer.apply(layer.conv2d(2, 2, 3), v, x)[0].shape == (1, 2, 8, 8)  # PyTorch: (1, 2, 6, 6)


# -- TrainSetup ------------------------------------------------------------------------------------


def _model():
    return layer.sequential([layer.linear(8, 16), layer.relu(), layer.linear(16, 3)])


def explicit_setup():
    return TrainSetup(
        _model(),
        optim.adam(1e-3),
        loss=loss.cross_entropy_sparse,
        inputs=(kn.ShapeDtype((4, 8)),),
        targets=(kn.ShapeDtype((4,), kn.int32),),
    )


def loss_given_as_builder():
    return TrainSetup(_model(), optim.adam(1e-3), loss.cross_entropy_sparse, (kn.ShapeDtype((4, 8)),))


def no_inputs():
    return TrainSetup(
        _model(), optim.adam(1e-3), loss=loss.cross_entropy_sparse, targets=(kn.ShapeDtype((4,), kn.int32),)
    )


def test_trainsetup_loss_form_and_argument_names():
    subject = resolve(f"{__name__}:explicit_setup")
    assert subject.default_stage == "optimized"
    autodiff, optimized = subject.stage_graph("autodiff"), subject.stage_graph("optimized")
    assert len(optimized.nodes) < len(autodiff.nodes)
    names = optimized.input_names
    assert "params.0.weight" in names and "x" in names and "targets.0" in names
    assert not any(name[0].isdigit() for name in names)
    assert subject.stage_graph("traced").input_names[-1] == "x"


def test_trainsetup_errors_name_it():
    with pytest.raises(ModelSpecError, match=r"TrainSetup's loss_fn_builder.*loss=fn"):
        resolve(f"{__name__}:loss_given_as_builder").stage_graph("autodiff")
    with pytest.raises(ModelSpecError, match="TrainSetup has no example input"):
        resolve(f"{__name__}:no_inputs")
    with pytest.raises(ModelSpecError, match="targets="):
        TrainSetup(
            _model(), optim.adam(1e-3), loss=loss.cross_entropy_sparse, inputs=(kn.ShapeDtype((4, 8)),)
        )
    with pytest.raises(ModelSpecError, match="exactly one of"):
        TrainSetup(_model(), optim.adam(1e-3))


def test_layer_graph_inputs_are_named_by_argument():
    subject = resolve("kaun_ir.tools.examples:mlp")
    names = subject.stage_graph(subject.default_stage).input_names
    assert names[0].startswith("params.") and names[-1] == "x"


# -- jax.export and gradients ----------------------------------------------------------------------


def test_jax_grad_of_an_exported_graph_matches_jax():
    graph = kn.trace(
        lambda x, w: kn.tanh(x @ w), kn.ShapeDtype((2, 3), kn.float32), kn.ShapeDtype((3, 4), kn.float32)
    )
    exported = kn.runtime.to_jax_export(graph)
    a = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)

    def through_export(x, w):
        return jnp.sum(exported.call(x, w)[0] ** 2)

    def reference(x, w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    for got, want in zip(jax.grad(through_export, (0, 1))(a, b), jax.grad(reference, (0, 1))(a, b)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    # second order: the VJP's export carries its own VJP
    second = jax.grad(lambda x: jnp.sum(jax.grad(through_export)(x, b) ** 2))(a)
    want2 = jax.grad(lambda x: jnp.sum(jax.grad(reference)(x, b) ** 2))(a)
    np.testing.assert_allclose(np.asarray(second), np.asarray(want2), rtol=1e-4, atol=1e-5)


def test_integer_graphs_are_exported_without_a_vjp():
    graph = kn.trace(lambda ids: kn.astype(ids, kn.float32) * 2.0, kn.ShapeDtype((3,), kn.int32))
    assert not kn.runtime.to_jax_export(graph).has_vjp()

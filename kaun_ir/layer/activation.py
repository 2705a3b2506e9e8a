"""Activation functions as layers: ``relu``, ``gelu``, ``silu``, ``tanh``, ``sigmoid``.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir.layer.construct import (
    stateless,
)
from kaun_ir.layer.core import Layer
from kaun_ir.nn import activations

__all__ = ["relu", "gelu", "silu", "tanh", "sigmoid"]


def _activation(name: str, f: Callable) -> Layer:
    return stateless(name, lambda p, x, training, ctx: f(x))


def relu() -> Layer:
    """``max(x, 0)`` as a layer."""
    return _activation("relu", activations.relu)


def gelu(approximate: bool = False) -> Layer:
    """GELU as a layer: exact (erf) by default, the tanh form with ``approximate=True``."""
    return _activation("gelu", activations.gelu_approx if approximate else activations.gelu)


def silu() -> Layer:
    """``x * sigmoid(x)`` (swish) as a layer."""
    return _activation("silu", activations.silu)


def tanh() -> Layer:
    """``tanh`` as a layer."""
    return _activation("tanh", activations.tanh)


def sigmoid() -> Layer:
    """``sigmoid`` as a layer."""
    return _activation("sigmoid", activations.sigmoid)

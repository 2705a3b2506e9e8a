"""Activation functions (re-exported in ``kn.fn``), elementwise: ``[...] -> [...]``.

All are composites of primitives, so they trace, compile and differentiate like any kaun_ir
function, and work on concrete arrays (compiled once per shape and dtype). Integer inputs are
converted to float32 (``relu`` keeps integers). Derivatives at kinks follow ``jax.nn``: ``relu``
and ``relu6`` have derivative 0 at 0 (and at 6), ``leaky_relu`` has 1 at 0.

Numerically sensitive forms are written so that neither the value nor the gradient overflows:
``softplus(x) = max(x, 0) + log1p(exp(-|x|))``, ``log_sigmoid(x) = -softplus(-x)``, and the
exponential branch of ``elu`` / ``selu`` / ``celu`` only ever sees ``x <= 0`` (a ``where``
whose unused branch overflowed would give ``inf * 0 = nan`` in the gradient).
"""

from __future__ import annotations

import math

from kaun_ir import dtypes
from kaun_ir.surface.elementwise import abs, erf, exp, expm1, log1p, maximum, where
from kaun_ir.surface.elementwise import sigmoid as _sigmoid
from kaun_ir.surface.elementwise import tanh as _tanh
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, dtype_of

__all__ = [
    "relu",
    "relu6",
    "leaky_relu",
    "elu",
    "selu",
    "celu",
    "gelu",
    "gelu_approx",
    "silu",
    "swish",
    "softplus",
    "softsign",
    "mish",
    "log_sigmoid",
    "sigmoid",
    "tanh",
    "hard_sigmoid",
    "hard_tanh",
    "hard_swish",
    "hard_silu",
]


def _float(x):
    return x if dtypes.is_float(dtype_of(x)) else astype(x, dtypes.float32)


@op_function
def relu(x):
    """``max(x, 0)``; derivative 0 at 0 (like ``jax.nn.relu``). Integer inputs stay integers.
    NaN stays NaN (the comparison is written so that NaN takes the ``x`` branch)."""
    return where(x <= 0, 0, x)


@op_function
def relu6(x):
    """``min(max(x, 0), 6)``; derivative 0 at 0 and 6 (like ``jax.nn.relu6``)."""
    x = _float(x)
    return where(x <= 0, 0.0, where(x >= 6.0, 6.0, x))  # NaN falls through to x


@op_function
def leaky_relu(x, negative_slope=0.01):
    """``x`` for ``x >= 0``, ``negative_slope * x`` below (``jax.nn.leaky_relu``)."""
    x = _float(x)
    return where(x >= 0, x, x * float(negative_slope))


def _non_positive(x):
    """``x`` where ``x <= 0``, else 0: the argument of the exponential branches, so that it never
    overflows; at 0 the derivative flows through it (matching ``jax.nn``), unlike ``minimum``'s
    tie split."""
    return where(x > 0, 0.0, x)


def _exp_branch(x, alpha: float):
    """``alpha * (exp(x / alpha) - 1)`` evaluated on ``x <= 0`` only (no overflow)."""
    return expm1(_non_positive(x) / alpha) * alpha


@op_function
def elu(x, alpha=1.0):
    """``x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise (``jax.nn.elu``)."""
    x = _float(x)
    return where(x > 0, x, expm1(_non_positive(x)) * float(alpha))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@op_function
def selu(x):
    """Scaled ELU, ``scale * elu(x, alpha)`` with the self-normalising constants
    ``alpha = 1.6732632...``, ``scale = 1.0507009...`` (``jax.nn.selu``)."""
    x = _float(x)
    return where(x > 0, x, expm1(_non_positive(x)) * _SELU_ALPHA) * _SELU_SCALE


@op_function
def celu(x, alpha=1.0):
    """``x`` for ``x > 0``, ``alpha * (exp(x / alpha) - 1)`` otherwise (``jax.nn.celu``)."""
    x = _float(x)
    alpha = float(alpha)
    if alpha == 0:
        raise ValueError("celu: alpha must be non-zero")
    return where(x > 0, x, _exp_branch(x, alpha))


@op_function
def gelu(x):
    """Exact GELU, ``x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2)))`` (``jax.nn.gelu(approximate=False)``,
    PyTorch's default)."""
    x = _float(x)
    return (x * 0.5) * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0)  # halve first: no overflow at max


@op_function
def gelu_approx(x):
    """The tanh approximation of GELU, ``x / 2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``
    (``jax.nn.gelu(approximate=True)``)."""
    x = _float(x)
    inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return (x * 0.5) * (_tanh(inner) + 1.0)


@op_function
def silu(x):
    """``x * sigmoid(x)`` (also called swish; ``jax.nn.silu``)."""
    x = _float(x)
    return x * _sigmoid(x)


swish = silu


@op_function
def softplus(x):
    """``log(1 + exp(x))``, computed as ``max(x, 0) + log1p(exp(-|x|))`` (no overflow)."""
    x = _float(x)
    return maximum(x, 0.0) + log1p(exp(-abs(x)))


@op_function
def softsign(x):
    """``x / (1 + |x|)``."""
    x = _float(x)
    return x / (abs(x) + 1.0)


@op_function
def mish(x):
    """``x * tanh(softplus(x))`` (Misra, 2019)."""
    x = _float(x)
    return x * _tanh(softplus.traced(x))


@op_function
def log_sigmoid(x):
    """``log(sigmoid(x)) = -softplus(-x)``, stable for large ``|x|``."""
    x = _float(x)
    return -softplus.traced(-x)


@op_function
def sigmoid(x):
    """``1 / (1 + exp(-x))`` (the ``logistic`` primitive)."""
    return _sigmoid(_float(x))


@op_function
def tanh(x):
    """Hyperbolic tangent."""
    return _tanh(_float(x))


@op_function
def hard_sigmoid(x):
    """``relu6(x + 3) / 6`` (``jax.nn.hard_sigmoid``): 0 below -3, 1 above 3, linear between."""
    x = _float(x)
    return relu6.traced(x + 3.0) / 6.0


@op_function
def hard_tanh(x):
    """``x`` clipped to ``[-1, 1]``; derivative 0 outside (``jax.nn.hard_tanh``)."""
    x = _float(x)
    return where(x > 1.0, 1.0, where(x < -1.0, -1.0, x))


@op_function
def hard_swish(x):
    """``x * hard_sigmoid(x)`` (``jax.nn.hard_swish``, MobileNetV3)."""
    x = _float(x)
    return x * hard_sigmoid.traced(x)


hard_silu = hard_swish

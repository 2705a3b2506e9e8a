"""Normalisation layers: ``batch_norm`` (with running statistics as state), ``layer_norm`` and
``rms_norm``.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``).
"""

from __future__ import annotations

from kaun_ir.errors import ShapeError
from kaun_ir.layer.construct import (
    infer_size,
    optional_positive_int,
    path_prefix,
    positive_float,
)
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import functional as nn
from kaun_ir.nn import init as initializers
from kaun_ir.surface.elementwise import add, multiply, stop_gradient
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import type_of

__all__ = ["batch_norm", "layer_norm", "rms_norm"]


def batch_norm(
    num_features: int | None = None,
    momentum: float = 0.99,
    eps: float = 1e-5,
    unbiased_running_var: bool = False,
) -> Layer:
    """Batch normalisation over the feature axis 1 of ``[N, C, ...]`` (``[N, C]``, NCHW ...).

    Parameters ``{"scale": ones[C], "bias": zeros[C]}``; state ``{"running_mean": zeros[C],
    "running_var": ones[C]}``. In training the batch's mean and biased variance normalise the
    input and update the state as ``running = momentum * running + (1 - momentum) * batch``
    (Flax / Kaun convention: ``momentum=0.99`` keeps 99% of the old value); in evaluation the
    running statistics are used and the state is returned unchanged. ``num_features`` may be left
    out (``batch_norm()``): it is then axis 1 of the example given to ``layer.init``.

    Against PyTorch's ``BatchNorm``: its ``momentum`` is the weight of the *new* batch, so
    PyTorch's ``momentum=0.1`` (its default) is ``momentum=0.9`` here; and PyTorch updates
    ``running_var`` with the *unbiased* batch variance (times ``n / (n - 1)``, ``n`` the number
    of values per channel) while normalising with the biased one: ``unbiased_running_var=True``
    does the same, so ported running statistics match.
    """
    num_features = optional_positive_int(num_features, "num_features", "batch_norm")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum <= 1.0:
        raise ValueError(f"layer.batch_norm: momentum must be in [0, 1], got {momentum!r}")
    momentum = float(momentum)
    eps = positive_float(eps, "eps", "batch_norm")

    def init_(dt, x=None):
        n = infer_size(num_features, x, 1, 2, "num_features", "batch_norm", "[N, C, ...]")
        params = {"scale": initializers.ones(None, (n,), dt), "bias": initializers.zeros(None, (n,), dt)}
        state = {
            "running_mean": initializers.zeros(None, (n,), dt),
            "running_var": initializers.ones(None, (n,), dt),
        }
        return Vars(params, state, dt)

    def apply_(params, state, x, *, training, ctx):
        num_features = type_of(params["scale"]).shape[0]
        t = type_of(x)
        if t.ndim < 2 or t.shape[1] != num_features:
            raise ShapeError(
                f"{path_prefix()}batch_norm(num_features={num_features}) expects an input "
                f"[N, {num_features}, ...], got {t}"
            )
        if not training:
            y = nn.batch_norm(
                x, params["scale"], params["bias"], state["running_mean"], state["running_var"], eps
            )
            return y, state
        # one op with its own derivative rule (two reductions in the backward pass, not four)
        y, mean, var = nn.batch_norm_training(x, params["scale"], params["bias"], eps)
        running_var = var
        if unbiased_running_var:
            n = t.size // num_features  # values per channel
            running_var = multiply(var, n / (n - 1) if n > 1 else 1.0)

        def update(running, batch):
            # kn functions, not operators: ``running`` may be a concrete jax.Array captured by
            # the trace, and jax.Array's own operators would compute it eagerly in jax
            batch = astype(stop_gradient(batch), type_of(running).dtype)
            return add(multiply(running, momentum), multiply(batch, 1.0 - momentum))

        return y, {
            "running_mean": update(state["running_mean"], mean),
            "running_var": update(state["running_var"], running_var),
        }

    return Layer(init_, apply_, "batch_norm")


def _last_axis(x, dim: int, what: str):
    t = type_of(x)
    if t.ndim < 1 or t.shape[-1] != dim:
        raise ShapeError(f"{path_prefix()}{what} expects an input [..., {dim}], got {t}")


def layer_norm(dim: int | None = None, eps: float = 1e-5, use_bias: bool = True) -> Layer:
    """Layer normalisation over the last axis (``kn.fn.layer_norm``): ``[..., dim] -> [..., dim]``.
    Parameters ``{"scale": ones[dim], "bias": zeros[dim]}`` (no bias with ``use_bias=False``).
    ``dim`` may be left out (``layer_norm()``): it is then the last axis of the example given to
    ``layer.init``."""
    dim = optional_positive_int(dim, "dim", "layer_norm")
    eps = positive_float(eps, "eps", "layer_norm")

    def init_(dt, x=None):
        n = infer_size(dim, x, -1, 1, "dim", "layer_norm", "[..., dim]")
        p = {"scale": initializers.ones(None, (n,), dt)}
        if use_bias:
            p["bias"] = initializers.zeros(None, (n,), dt)
        return Vars(p, [], dt)

    def apply_(p, state, x, *, training, ctx):
        n = type_of(p["scale"]).shape[0]
        _last_axis(x, n, f"layer_norm(dim={n})")
        return nn.layer_norm(x, p["scale"], p.get("bias"), eps), state

    return Layer(init_, apply_, "layer_norm")


def rms_norm(dim: int | None = None, eps: float = 1e-6) -> Layer:
    """RMS normalisation over the last axis (``kn.fn.rms_norm``): ``[..., dim] -> [..., dim]``.
    Parameters ``{"scale": ones[dim]}``. ``dim`` may be left out (``rms_norm()``): it is then the
    last axis of the example given to ``layer.init``."""
    dim = optional_positive_int(dim, "dim", "rms_norm")
    eps = positive_float(eps, "eps", "rms_norm")

    def init_(dt, x=None):
        n = infer_size(dim, x, -1, 1, "dim", "rms_norm", "[..., dim]")
        return Vars({"scale": initializers.ones(None, (n,), dt)}, [], dt)

    def apply_(p, state, x, *, training, ctx):
        n = type_of(p["scale"]).shape[0]
        _last_axis(x, n, f"rms_norm(dim={n})")
        return nn.rms_norm(x, p["scale"], eps), state

    return Layer(init_, apply_, "rms_norm")

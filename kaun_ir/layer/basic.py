"""Layer constructors: dense, convolution, pooling, reshaping, dropout, normalisation,
embedding and activations.

Each returns a :class:`~kaun_ir.layer.core.Layer`. Hyper-parameters are checked when the layer
is built (``ValueError`` naming the argument); input shapes when it is applied (``ShapeError``
naming the layer path, e.g. ``"1.linear: ..."``). Parameters are made eagerly by ``layer.init``,
one compiled initialiser call per parameter with a key from the current ``kn.rng`` scope.
Layers without parameters (or without state) have ``[]`` as their params (state).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import dtypes, rng
from kaun_ir.errors import ShapeError
from kaun_ir.ir.builder import current_path
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.nn import activations, fn
from kaun_ir.nn import functional as nn
from kaun_ir.nn import init as initializers
from kaun_ir.surface.elementwise import add, multiply, stop_gradient
from kaun_ir.surface.linalg import matmul
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import type_of

__all__ = [
    "linear",
    "conv1d",
    "conv2d",
    "max_pool1d",
    "max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "flatten",
    "dropout",
    "batch_norm",
    "layer_norm",
    "rms_norm",
    "embedding",
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
]


# ------------------------------------------------------------------------------ helpers


def _where() -> str:
    path = current_path()
    return f"{path}: " if path else ""


def positive_int(value: Any, arg: str, layer: str) -> int:
    """``value`` as an int, or ValueError naming ``arg`` of constructor ``layer``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"layer.{layer}: {arg} must be a positive int, got {value!r}")
    return int(value)


def optional_positive_int(value: Any, arg: str, layer: str) -> int | None:
    """None (a size to infer from the input at ``layer.init``) or a positive int."""
    return None if value is None else positive_int(value, arg, layer)


def infer_size(
    given: int | None, x: Any, axis: int, min_ndim: int, arg: str, layer: str, expects: str
) -> int:
    """The size ``arg`` of ``layer``: read from axis ``axis`` of the abstract input ``x`` (a
    ``kn.ShapeDtype``, or None when ``layer.init`` got no example) and checked against ``given``.
    Errors name the layer path (the scope ``layer.init`` runs the child's init in)."""
    where = f"{current_path() or layer}: "  # the path ends with the layer's name
    if x is None:
        if given is None:
            raise ValueError(
                f"{where}{arg} was not given and there is no example input to infer it from; "
                f"pass {arg}=... or call layer.init(model, example)"
            )
        return given
    if not hasattr(x, "shape"):
        raise TypeError(f"{where}{layer} expects one array as input, got {type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) < min_ndim:
        raise ShapeError(f"{where}{layer} expects an input {expects}, got shape {list(shape)}")
    inferred = shape[axis]
    if given is not None and given != inferred:
        raise ShapeError(
            f"{where}{arg}={given} but the input {list(shape)} has {inferred} (an input {expects})"
        )
    return inferred


def rate_in_unit_interval(value: Any, arg: str, layer: str) -> float:
    """A probability in ``[0, 1)``, or ValueError naming ``arg``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"layer.{layer}: {arg} must be a number in [0, 1), got {value!r}")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"layer.{layer}: {arg} must be in [0, 1), got {value}")
    return value


def positive_float(value: Any, arg: str, layer: str) -> float:
    """``value`` as a float, or ``ValueError`` naming the layer and the argument unless it is a
    positive number."""
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not is_number or not value > 0:
        raise ValueError(f"layer.{layer}: {arg} must be a positive number, got {value!r}")
    return float(value)


# factories that users may pass uncalled (weight_init=kn.init.glorot_uniform)
_FACTORIES = {
    initializers.glorot_uniform,
    initializers.glorot_normal,
    initializers.he_uniform,
    initializers.he_normal,
    initializers.lecun_uniform,
    initializers.lecun_normal,
}


def resolve_init(value: Any, default: Callable, arg: str, layer: str) -> Callable:
    """An initialiser ``(key, shape, dtype) -> array`` from an argument: None means ``default``;
    a no-argument factory such as ``kn.init.glorot_uniform`` is called."""
    if value is None:
        return default
    if value in _FACTORIES:
        return value()
    if not callable(value):
        raise ValueError(
            f"layer.{layer}: {arg} must be an initialiser (key, shape, dtype) -> array, got {value!r}"
        )
    return value


def make_param(initializer: Callable, shape: tuple[int, ...], dt) -> Any:
    """One parameter: the initialiser called with the next key of the current rng scope."""
    return initializer(rng.next_key(), shape, dt)


def stateless(name: str, forward: Callable[..., Any], make_params: Callable | None = None) -> Layer:
    """A layer without state: ``forward(params, x, training, ctx) -> y``; ``make_params(dtype)``
    builds the parameter tree (``[]`` when omitted)."""

    def init_(dt):
        return Vars(make_params(dt) if make_params is not None else [], [], dt)

    def apply_(params, state, x, *, training, ctx):
        return forward(params, x, training, ctx), state

    return Layer(init_, apply_, name)


def warn_if_integer(t, what: str) -> None:
    """Integer inputs are promoted to the parameters' float dtype; say so (once per call site and
    trace), since token ids fed to a dense layer are usually a mistake (use ``embedding``)."""
    if not dtypes.is_float(t.dtype):
        import warnings

        warnings.warn(
            f"{_where()}{what}: integer input {t} is converted to floating point (cast it "
            "yourself, or use layer.embedding for token ids)",
            UserWarning,
            stacklevel=3,
        )


def dense(params, x, in_features: int, what: str):
    """``x @ weight + bias`` with a check of ``x``'s last axis (shared with attention)."""
    t = type_of(x)
    if t.ndim < 1 or t.shape[-1] != in_features:
        raise ShapeError(f"{_where()}{what} expects an input [..., {in_features}], got {t}")
    warn_if_integer(t, what)
    y = matmul(x, params["weight"])
    return y + params["bias"] if "bias" in params else y


# ------------------------------------------------------------------------------ dense, conv


def linear(
    in_features: int | None = None,
    out_features: int | None = None,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """Fully connected layer ``y = x @ weight + bias``: ``[..., in] -> [..., out]``.

    Parameters ``{"weight": [in_features, out_features], "bias": [out_features]}`` (no bias with
    ``use_bias=False``). ``in_features`` may be left out (``linear(out_features=10)``): it is
    then the last axis of the example given to ``layer.init(model, example)``. Defaults:
    ``weight_init = kn.init.glorot_uniform()``, ``bias_init = kn.init.zeros``.
    """
    if out_features is None:
        raise ValueError(
            "layer.linear: out_features is required (linear(out_features=n) infers in_features "
            "from the example given to layer.init)"
        )
    in_features = optional_positive_int(in_features, "in_features", "linear")
    out_features = positive_int(out_features, "out_features", "linear")
    weight_init = resolve_init(weight_init, initializers.glorot_uniform(), "weight_init", "linear")
    bias_init = resolve_init(bias_init, initializers.zeros, "bias_init", "linear")

    def init_(dt, x=None):
        n_in = infer_size(in_features, x, -1, 1, "in_features", "linear", "[..., in_features]")
        p = {"weight": make_param(weight_init, (n_in, out_features), dt)}
        if use_bias:
            p["bias"] = make_param(bias_init, (out_features,), dt)
        return Vars(p, [], dt)

    def apply_(params, state, x, *, training, ctx):
        n_in = type_of(params["weight"]).shape[0]
        return dense(params, x, n_in, f"linear(in_features={n_in}, out_features={out_features})"), state

    return Layer(init_, apply_, "linear")


def _int_tuple(value: Any, nd: int, arg: str, layer: str, minimum: int) -> tuple[int, ...]:
    values = (value,) * nd if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        raise ValueError(f"layer.{layer}: {arg} must be an int or {nd} ints, got {value!r}") from None
    if len(values) != nd or any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum for v in values
    ):
        bound = "positive" if minimum > 0 else "non-negative"
        raise ValueError(f"layer.{layer}: {arg} must be a {bound} int or {nd} such ints, got {value!r}")
    return tuple(int(v) for v in values)


def _conv_layer(
    nd: int,
    in_channels,
    out_channels,
    kernel_size,
    stride,
    padding,
    dilation,
    groups,
    weight_init,
    bias_init,
    use_bias,
) -> Layer:
    name = f"conv{nd}d"
    if out_channels is None:
        raise ValueError(
            f"layer.{name}: out_channels is required ({name}(out_channels=n) infers in_channels "
            "from the example given to layer.init)"
        )
    in_channels = optional_positive_int(in_channels, "in_channels", name)
    out_channels = positive_int(out_channels, "out_channels", name)
    groups = positive_int(groups, "groups", name)
    if (in_channels or groups) % groups or out_channels % groups:
        raise ValueError(
            f"layer.{name}: groups={groups} must divide in_channels ({in_channels}) and "
            f"out_channels ({out_channels})"
        )
    kernel = _int_tuple(kernel_size, nd, "kernel_size", name, 1)
    strides = _int_tuple(stride, nd, "stride", name, 1)
    dilations = _int_tuple(dilation, nd, "dilation", name, 1)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"layer.{name}: padding must be 'same', 'valid' or ints, got {padding!r}")
        if padding == "same" and any(s != 1 for s in strides):
            raise ValueError(f"layer.{name}: padding='same' needs stride 1, got stride={stride!r}")
        pads: Any = padding
    else:
        pads = _int_tuple(padding, nd, "padding", name, 0)
    weight_init = resolve_init(weight_init, initializers.glorot_uniform(), "weight_init", name)
    bias_init = resolve_init(bias_init, initializers.zeros, "bias_init", name)
    conv = fn.conv1d if nd == 1 else fn.conv2d
    spatial = "H, W" if nd == 2 else "L"

    def init_(dt, x=None):
        # channels are axis 1 of a batched input [N, C, ...], axis 0 of an unbatched [C, ...]
        axis = 1 if x is not None and len(getattr(x, "shape", ())) == nd + 2 else 0
        channels = infer_size(
            in_channels, x, axis, nd + 1, "in_channels", name, f"[N, C, {spatial}] or [C, {spatial}]"
        )
        if channels % groups:
            raise ShapeError(f"{_where()}{name}: groups={groups} must divide the input's {channels} channels")
        p = {"weight": make_param(weight_init, (out_channels, channels // groups) + kernel, dt)}
        if use_bias:
            p["bias"] = make_param(bias_init, (out_channels,), dt)
        return Vars(p, [], dt)

    def apply_(p, state, x, *, training, ctx):
        return conv(
            x, p["weight"], p.get("bias"), stride=strides, padding=pads, dilation=dilations, groups=groups
        ), state

    return Layer(init_, apply_, name)


def conv1d(
    in_channels: int | None = None,
    out_channels: int | None = None,
    kernel_size=3,
    stride=1,
    padding="same",
    dilation=1,
    groups: int = 1,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """1-d convolution over ``[N, C, L]`` (or ``[C, L]``) -> ``[N, out_channels, L_out]``
    (``kn.fn.conv1d``). Parameters ``{"weight": [out, in/groups, k], "bias": [out]}``;
    ``padding`` is ``"same"`` (default; stride 1 only), ``"valid"`` or an int. ``in_channels``
    may be left out (``conv1d(out_channels=8)``) and is then read from the example given to
    ``layer.init(model, example)``. Default initialisers: glorot_uniform (fans per
    ``kn.init``'s [out, in, *kernel] rule) and zeros."""
    return _conv_layer(
        1,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        weight_init,
        bias_init,
        use_bias,
    )


def conv2d(
    in_channels: int | None = None,
    out_channels: int | None = None,
    kernel_size=3,
    stride=1,
    padding="same",
    dilation=1,
    groups: int = 1,
    weight_init=None,
    bias_init=None,
    use_bias: bool = True,
) -> Layer:
    """2-d convolution over NCHW ``[N, C, H, W]`` (or ``[C, H, W]``) -> ``[N, out_channels, H', W']``
    (``kn.fn.conv2d``, PyTorch's conventions). Parameters ``{"weight": [out, in/groups, kh, kw],
    "bias": [out]}``; ``kernel_size``, ``stride``, ``dilation``, ``padding`` are ints or pairs,
    ``padding`` also ``"same"`` (default; stride 1 only) or ``"valid"``. ``in_channels`` may be
    left out (``conv2d(out_channels=32, kernel_size=3)``) and is then read from the example given
    to ``layer.init(model, example)``. Default initialisers: glorot_uniform (fans per
    ``kn.init``'s [out, in, kh, kw] rule) and zeros."""
    return _conv_layer(
        2,
        in_channels,
        out_channels,
        kernel_size,
        stride,
        padding,
        dilation,
        groups,
        weight_init,
        bias_init,
        use_bias,
    )


# ------------------------------------------------------------------------------ pooling, flatten


def _pool_layer(nd: int, kind: str, kernel_size, stride, padding) -> Layer:
    name = f"{kind}_pool{nd}d"
    kernel = _int_tuple(kernel_size, nd, "kernel_size", name, 1)
    strides = kernel if stride is None else _int_tuple(stride, nd, "stride", name, 1)
    pads = _int_tuple(padding, nd, "padding", name, 0)
    if any(2 * p > k for p, k in zip(pads, kernel)):
        raise ValueError(
            f"layer.{name}: padding {padding!r} must be at most half the kernel size {kernel_size!r}"
        )
    pool = getattr(fn, name)
    return stateless(name, lambda p, x, training, ctx: pool(x, kernel, strides, pads))


def max_pool1d(kernel_size, stride=None, padding=0) -> Layer:
    """Max pooling over ``[N, C, L]``; ``stride`` defaults to ``kernel_size`` (``kn.fn.max_pool1d``)."""
    return _pool_layer(1, "max", kernel_size, stride, padding)


def max_pool2d(kernel_size, stride=None, padding=0) -> Layer:
    """Max pooling over NCHW ``[N, C, H, W]``; ``stride`` defaults to ``kernel_size``
    (``kn.fn.max_pool2d``)."""
    return _pool_layer(2, "max", kernel_size, stride, padding)


def avg_pool1d(kernel_size, stride=None, padding=0) -> Layer:
    """Average pooling over ``[N, C, L]``; ``stride`` defaults to ``kernel_size``."""
    return _pool_layer(1, "avg", kernel_size, stride, padding)


def avg_pool2d(kernel_size, stride=None, padding=0) -> Layer:
    """Average pooling over NCHW ``[N, C, H, W]``; ``stride`` defaults to ``kernel_size``
    (``kn.fn.avg_pool2d``, zero padding counted)."""
    return _pool_layer(2, "avg", kernel_size, stride, padding)


def flatten() -> Layer:
    """``[N, d1, d2, ...] -> [N, d1 * d2 * ...]`` (the batch axis is kept)."""

    def forward(p, x, training, ctx):
        t = type_of(x)
        if t.ndim < 1:
            raise ShapeError(f"{_where()}flatten expects an input with a batch axis, got {t}")
        return reshape(x, (t.shape[0], math.prod(t.shape[1:])))

    return stateless("flatten", forward)


# ------------------------------------------------------------------------------ dropout


def dropout(rate: float) -> Layer:
    """Inverted dropout (``kn.fn.dropout``): in training, zero each element with probability
    ``rate`` and scale the rest by ``1 / (1 - rate)``; the identity in evaluation.

    The randomness comes from ``ctx["rng"]`` (see ``kn.layer``'s context): in training with
    ``rate > 0`` and no key, applying the layer raises ValueError.
    """
    rate = rate_in_unit_interval(rate, "rate", "dropout")

    def forward(p, x, training, ctx):
        if not training or rate == 0.0:
            return x
        key = ctx.get("rng")
        if key is None:
            raise ValueError(
                f"{_where()}dropout in training mode needs a random key: pass "
                "ctx={'rng': key} to layer.apply, or call it inside `with kn.rng.scope(seed):`"
            )
        return nn.dropout(key, x, rate)

    return stateless("dropout", forward)


# ------------------------------------------------------------------------------ normalisation


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
                f"{_where()}batch_norm(num_features={num_features}) expects an input "
                f"[N, {num_features}, ...], got {t}"
            )
        if not training:
            y = nn.batch_norm(
                x, params["scale"], params["bias"], state["running_mean"], state["running_var"], eps
            )
            return y, state
        mean, var = nn.batch_stats(x)
        y = nn.batch_norm(x, params["scale"], params["bias"], mean, var, eps)
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
        raise ShapeError(f"{_where()}{what} expects an input [..., {dim}], got {t}")


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


# ------------------------------------------------------------------------------ embedding


def embedding(vocab_size: int, embed_dim: int, scale: bool = True, embedding_init=None) -> Layer:
    """Token embedding: integer ids ``I`` -> ``I + [embed_dim]``, the rows of
    ``{"weight": [vocab_size, embed_dim]}`` (``kn.fn.embedding``; out-of-range ids are clamped).

    With ``scale=True`` (Kaun's default) the rows are multiplied by ``sqrt(embed_dim)``, as in
    the Transformer paper. The default initialiser is ``kn.init.normal(1 / sqrt(embed_dim))``,
    so scaled embeddings start with unit variance.
    """
    vocab_size = positive_int(vocab_size, "vocab_size", "embedding")
    embed_dim = positive_int(embed_dim, "embed_dim", "embedding")
    table_init = resolve_init(
        embedding_init, initializers.normal(1.0 / math.sqrt(embed_dim)), "embedding_init", "embedding"
    )
    factor = math.sqrt(embed_dim)

    def forward(p, ids, training, ctx):
        t = type_of(ids)
        if not dtypes.is_integer(t.dtype):
            raise TypeError(f"{_where()}embedding expects integer token ids, got {t}")
        y = nn.embedding(p["weight"], ids)
        return y * factor if scale else y

    return stateless(
        "embedding", forward, lambda dt: {"weight": make_param(table_init, (vocab_size, embed_dim), dt)}
    )


# ------------------------------------------------------------------------------ activations


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

"""The catalogue of bad inputs behind docs/errors.md: each case is a call a user could make, the
exception class it must raise and a pattern its message must match (what it names).

Grouped by public family. ``tests/test_error_catalogue.py`` runs every case and also checks that
the last traceback frame is kaun_ir's own code (no raw error from jaxlib, MLIR, NumPy or
safetensors reaches the user). Arrays are tiny; ``kn.trace`` is used where a compile would add
nothing, so the whole catalogue runs in a few seconds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

import kaun_ir as kn
from kaun_ir import data, layer, optim, ptree, rng, train
from kaun_ir.checkpoint import core as checkpoint
from kaun_ir.nn import init, loss, metric

F32, I32 = np.float32, np.int32
A23 = np.ones((2, 3), F32)
A3 = np.ones(3, F32)
I2 = np.zeros(2, I32)


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    name: str
    call: Callable[[], Any]
    error: type
    pattern: str  # re.search on str(error)


CASES: list[Case] = []


def case(family: str, name: str, error: type, pattern: str):
    def register(call):
        CASES.append(Case(family, name, call, error, pattern))
        return call

    return register


def add(family: str, name: str, call: Callable[[], Any], error: type, pattern: str) -> None:
    CASES.append(Case(family, name, call, error, pattern))


def traced(f, *args):
    return lambda: kn.trace(f, *args)


# ------------------------------------------------------------------ tracing ops (eager and traced)
T = "tracing"
add(T, "add-broadcast", lambda: kn.add(A23, np.ones(4, F32)), kn.ShapeError, r"add: shapes \[2,3\] and \[4\]")
add(
    T,
    "add-broadcast-traced",
    traced(lambda x, y: x + y, A23, np.ones(4, F32)),
    kn.ShapeError,
    r"add: shapes \[2,3\] and \[4\]",
)
add(T, "matmul-inner", lambda: kn.matmul(A23, A23), kn.ShapeError, r"matmul.*\[2,3\].*\[2,3\]")
add(T, "matmul-scalar", lambda: kn.matmul(np.float32(1), A3), kn.ShapeError, r"matmul")
add(T, "dot-mismatch", lambda: kn.dot(A3, np.ones(4, F32)), kn.ShapeError, r"dot")
add(T, "einsum-bad-spec", lambda: kn.einsum("ij,jk->il", A23, A23.T), ValueError, r"einsum")
add(T, "einsum-operand-count", lambda: kn.einsum("ij,jk->ik", A23), ValueError, r"einsum")
add(T, "einsum-size", lambda: kn.einsum("ij,jk->ik", A23, A23), kn.ShapeError, r"einsum")
add(T, "tensordot-axes", lambda: kn.tensordot(A23, A23, axes=1), kn.ShapeError, r"tensordot")
add(T, "reshape-count", lambda: kn.reshape(A23, (4, 2)), kn.ShapeError, r"reshape.*6 elements.*\[4, 2\]")
add(T, "reshape-two-minus-one", lambda: kn.reshape(A23, (-1, -1)), kn.ShapeError, r"reshape")
add(T, "reshape-negative", lambda: kn.reshape(A23, (-2, 3)), kn.ShapeError, r"reshape")
add(T, "broadcast_to-shrink", lambda: kn.broadcast_to(A23, (3,)), kn.ShapeError, r"broadcast")
add(T, "broadcast_to-incompatible", lambda: kn.broadcast_to(A23, (2, 4)), kn.ShapeError, r"broadcast")
add(
    T,
    "concatenate-axis-out-of-range",
    lambda: kn.concatenate([A23, A23], axis=5),
    kn.ShapeError,
    r"concatenate: axis 5 is out of range for a tensor of rank 2",
)
add(
    T,
    "concatenate-negative-axis",
    lambda: kn.concatenate([A23, A23], axis=-3),
    kn.ShapeError,
    r"concatenate: axis -3",
)
add(
    T,
    "concatenate-float-axis",
    lambda: kn.concatenate([A23, A23], axis=1.0),
    TypeError,
    r"concatenate: axis must be an int",
)
add(T, "concatenate-empty", lambda: kn.concatenate([]), ValueError, r"concatenate needs at least one")
add(
    T,
    "concatenate-shapes",
    lambda: kn.concatenate([A23, np.ones((3, 3), F32)], axis=1),
    kn.ShapeError,
    r"concatenate",
)
add(T, "concatenate-rank", lambda: kn.concatenate([A23, A3]), kn.ShapeError, r"concatenate")
add(
    T,
    "concatenate-scalars",
    lambda: kn.concatenate([np.float32(1), np.float32(2)]),
    kn.ShapeError,
    r"zero-dimensional",
)
add(T, "stack-axis", lambda: kn.stack([A23, A23], axis=3), kn.ShapeError, r"stack: axis 3")
add(
    T,
    "stack-shapes",
    lambda: kn.stack([A23, A3]),
    kn.ShapeError,
    r"stack: arrays must have one shape, got \[2, 3\], \[3\]",
)
add(T, "stack-empty", lambda: kn.stack([]), ValueError, r"stack needs at least one")
add(T, "expand_dims-axis", lambda: kn.expand_dims(A23, 3), kn.ShapeError, r"expand_dims: axis 3")
add(T, "squeeze-not-one", lambda: kn.squeeze(A23, axis=0), kn.ShapeError, r"squeeze.*not of size 1")
add(T, "squeeze-axis", lambda: kn.squeeze(A23, axis=2), kn.ShapeError, r"squeeze: axis 2")
add(T, "transpose-not-permutation", lambda: kn.transpose(A23, (0, 0)), kn.ShapeError, r"permutation")
add(T, "transpose-axis", lambda: kn.transpose(A23, (0, 2)), kn.ShapeError, r"transpose: axis 2")
add(T, "transpose-length", lambda: kn.transpose(A23, (0,)), kn.ShapeError, r"permutation")
add(T, "sum-axis", lambda: kn.sum(A23, axis=2), kn.ShapeError, r"sum: axis 2 is out of bounds")
add(T, "mean-axis-repeat", lambda: kn.mean(A23, axis=(0, 0)), kn.ShapeError, r"repeated axis")
add(T, "max-axis-float", lambda: kn.max(A23, axis=0.5), TypeError, r"max: axis must be an int")
add(T, "max-empty", lambda: kn.max(np.zeros((0,), F32)), ValueError, r"max")
add(T, "argmax-empty", lambda: kn.argmax(np.zeros((0,), F32)), ValueError, r"argmax")
add(T, "argmax-tuple-axis", lambda: kn.argmax(A23, axis=(0, 1)), TypeError, r"argmax")
add(T, "softmax-axis", lambda: kn.softmax(A23, axis=-3), kn.ShapeError, r"softmax: axis -3")
add(T, "var-axis", lambda: kn.var(A23, axis=4), kn.ShapeError, r"var: axis 4")
add(T, "logsumexp-axis", lambda: kn.logsumexp(A23, axis=2), kn.ShapeError, r"logsumexp")
add(T, "where-shapes", lambda: kn.where(A23 > 0, A23, np.ones(4, F32)), kn.ShapeError, r"where|select")
add(T, "clip-shapes", lambda: kn.clip(A23, np.zeros(4, F32), 1.0), kn.ShapeError, r"clip|maximum")
add(T, "arange-zero-step", lambda: kn.arange(0, 10, 0), ValueError, r"arange: step must not be zero")
add(T, "arange-inf", lambda: kn.arange(0, float("inf")), ValueError, r"arange: stop must be finite")
add(T, "arange-string", lambda: kn.arange("3"), TypeError, r"arange")
add(T, "full-bad-shape", lambda: kn.full((2, -1), 1.0), ValueError, r"shape|negative")
add(T, "zeros-bad-dtype", lambda: kn.zeros((2,), dtype="complex512"), TypeError, r"dtype")
add(T, "astype-bad-dtype", lambda: kn.astype(A3, "float128x"), TypeError, r"dtype")
add(T, "one_hot-float-labels", lambda: kn.one_hot(A3, 3), TypeError, r"one_hot")
add(T, "one_hot-bad-classes", lambda: kn.one_hot(I2, -1), (TypeError, ValueError), r"one_hot: num_classes")
add(T, "take-axis", lambda: kn.take(A23, I2, axis=2), kn.ShapeError, r"take: axis 2")
add(T, "take-float-indices", lambda: kn.take(A23, A3), TypeError, r"take")
add(T, "take_along_axis-rank", lambda: kn.take_along_axis(A23, I2, axis=0), kn.ShapeError, r"take_along_axis")
add(T, "bitwise-float", lambda: kn.bitwise_and(A3, A3), TypeError, r"bitwise_and|and")
add(T, "shift-float", lambda: kn.left_shift(A3, A3), TypeError, r"shift")
add(T, "power-shapes", lambda: kn.power(A23, np.ones(4, F32)), kn.ShapeError, r"power")
add(T, "string-operand", lambda: kn.exp("x"), TypeError, r"<U1 is not supported")
add(T, "object-array", lambda: kn.exp(np.array([object()])), TypeError, r"object|dtype")
add(T, "complex-operand", lambda: kn.exp(np.ones(2, np.complex64)), TypeError, r"complex")
add(
    T,
    "python-big-int",
    lambda: kn.add(np.ones(2, I32), 2**40),
    (TypeError, OverflowError, ValueError),
    r"int32|overflow|2\^?40|1099511627776",
)
add(T, "bool-tensor-in-if", traced(lambda x: 1.0 if x[0] > 0 else 0.0, A3), kn.TracerError, r"bool|traced")
add(T, "numpy-on-tracer", traced(lambda x: np.asarray(x), A3), kn.TracerError, r"traced|NumPy|numpy")
add(T, "float-of-tracer", traced(lambda x: float(kn.sum(x)), A3), kn.TracerError, r"float|traced")
add(T, "trace-non-array-output", traced(lambda x: "s", A3), TypeError, r"not supported")
add(T, "trace-bad-arg", lambda: kn.trace(lambda x: x, object()), TypeError, r"object|argument|input")
add(
    T,
    "jit-bad-pipeline",
    lambda: kn.jit(lambda x: x, pipeline="no-such-pass")(A3),
    ValueError,
    r"no-such-pass",
)
add(T, "grad-non-scalar", lambda: kn.grad(lambda x: x * 2.0)(A3), kn.GradientError, r"scalar")
add(
    T, "grad-int-input", lambda: kn.grad(lambda x: kn.sum(x))(np.ones(3, I32)), kn.GradientError, r"int|float"
)
add(
    T,
    "grad-argnums",
    lambda: kn.grad(lambda x: kn.sum(x), argnums=3)(A3),
    (ValueError, IndexError, kn.GradientError),
    r"argnums",
)
add(
    T,
    "fori_loop-carry-type",
    lambda: kn.fori_loop(0, 3, lambda i, c: c.astype(I32), A3),
    (TypeError, kn.ShapeError),
    r"carry .*f32\[3\].*i32\[3\]|body returns .* but the loop carries",
)
add(
    T,
    "while_loop-carry-type",
    lambda: kn.while_loop(lambda c: kn.sum(c) < 3.0, lambda c: c.astype(I32), A3),
    (TypeError, kn.ShapeError),
    r"i32\[3\]",
)
add(
    T,
    "vmap-axis-size",
    lambda: kn.vmap(lambda a, b: a + b)(A23, np.ones((3, 3), F32)),
    ValueError,
    r"2.*3|3.*2|size",
)

# ------------------------------------------------------------------ indexing
X = "indexing"
add(X, "int-out-of-bounds", traced(lambda x: x[5], A23), IndexError, r"index 5 is out of bounds.*size 2")
add(X, "negative-out-of-bounds", traced(lambda x: x[:, -4], A23), IndexError, r"index -4")
add(X, "too-many-indices", traced(lambda x: x[0, 0, 0], A23), IndexError, r"too many indices")
add(X, "two-ellipses", traced(lambda x: x[..., ...], A23), IndexError, r"single ellipsis")
add(X, "float-index", traced(lambda x: x[1.5], A23), (TypeError, IndexError), r"1\.5")
add(X, "bool-scalar-index", traced(lambda x: x[True], A23), IndexError, r"boolean scalar")
add(X, "string-index", traced(lambda x: x["a"], A23), IndexError, r"unsupported index 'a'")
add(X, "float-array-index", traced(lambda x: x[np.array([0.5])], A23), (TypeError, IndexError), r"integer")
add(X, "slice-step-zero", traced(lambda x: x[::0], A23), ValueError, r"step|zero")
add(X, "dynamic_slice-float", lambda: kn.dynamic_slice(A23, (1.5, 0), (1, 1)), TypeError, r"dynamic_slice")
add(X, "dynamic_slice-size", lambda: kn.dynamic_slice(A23, (0, 0), (3, 1)), kn.ShapeError, r"dynamic_slice")
add(
    X,
    "dynamic_update_slice-shape",
    lambda: kn.dynamic_update_slice(A23, np.ones((3, 3), F32), (0, 0)),
    kn.ShapeError,
    r"dynamic_update_slice",
)
add(X, "setitem-on-tracer", traced(lambda x: x.__setitem__(0, 1.0), A23), TypeError, r"immutable")

# ------------------------------------------------------------------ layers
L = "layers"
add(L, "linear-zero-features", lambda: layer.linear(0, 3), ValueError, r"linear.*in_features")
add(L, "linear-float-features", lambda: layer.linear(2.5, 3), (ValueError, TypeError), r"linear")
add(
    L,
    "linear-bad-init",
    lambda: layer.linear(2, 3, weight_init="glorot"),
    (ValueError, TypeError),
    r"weight_init",
)
add(L, "conv2d-zero-channels", lambda: layer.conv2d(0, 4), ValueError, r"conv2d.*in_channels")
add(L, "conv2d-bad-padding", lambda: layer.conv2d(1, 4, padding="full"), ValueError, r"padding")
add(L, "conv2d-groups", lambda: layer.conv2d(3, 4, groups=2), ValueError, r"groups")
add(L, "conv2d-negative-stride", lambda: layer.conv2d(1, 4, stride=-1), ValueError, r"stride")
add(L, "conv2d-kernel-zero", lambda: layer.conv2d(1, 4, kernel_size=0), ValueError, r"kernel_size")
add(L, "max_pool-zero", lambda: layer.max_pool2d(0), ValueError, r"kernel_size")
add(L, "dropout-rate", lambda: layer.dropout(1.5), ValueError, r"dropout.*rate")
add(L, "dropout-nan", lambda: layer.dropout(float("nan")), ValueError, r"rate")
add(L, "batch_norm-momentum", lambda: layer.batch_norm(3, momentum=2.0), ValueError, r"momentum")
add(L, "layer_norm-eps", lambda: layer.layer_norm(3, eps=-1.0), ValueError, r"eps")
add(L, "embedding-zero", lambda: layer.embedding(0, 4), ValueError, r"vocab_size")
add(L, "attention-heads", lambda: layer.multi_head_attention(10, 3), ValueError, r"num_heads")
add(
    L,
    "attention-kv-heads",
    lambda: layer.multi_head_attention(8, 4, num_kv_heads=3),
    ValueError,
    r"num_kv_heads",
)
add(L, "sequential-not-layer", lambda: layer.sequential([layer.relu(), "relu"]), TypeError, r"1|str|Layer")
add(L, "sequential-not-list", lambda: layer.sequential(layer.relu()), TypeError, r"list|sequence|Layer")
add(L, "compose-not-layer", lambda: layer.compose(layer.relu(), 3), TypeError, r"Layer|int")


@functools.cache
def _model_and_vars():
    model = layer.sequential([layer.linear(3, 4), layer.relu(), layer.linear(4, 2)])
    with rng.scope(0):
        return model, layer.init(model)


add(
    L,
    "apply-wrong-input-width",
    lambda: layer.apply(*_model_and_vars(), np.ones((5, 7), F32)),
    kn.ShapeError,
    r"^0\.linear: .*\[5,7\]|0: linear",
)
add(L, "apply-rank-0", lambda: layer.apply(*_model_and_vars(), np.float32(1)), kn.ShapeError, r"linear")
add(L, "apply-not-vars", lambda: layer.apply(_model_and_vars()[0], {"w": 1}, A3), TypeError, r"Vars")
add(L, "apply-not-layer", lambda: layer.apply("model", _model_and_vars()[1], A3), TypeError, r"Layer")
add(
    L,
    "apply-params-of-other-model",
    lambda: layer.apply(layer.sequential([layer.linear(3, 4)]), _model_and_vars()[1], np.ones((2, 3), F32)),
    ValueError,
    r"param|structure|match",
)
add(
    L,
    "init-bad-dtype",
    lambda: layer.init(layer.linear(2, 2), dtype=np.int32),
    (TypeError, ValueError),
    r"dtype|float",
)
add(L, "init-outside-scope", lambda: layer.init(layer.linear(2, 2)), RuntimeError, r"rng|scope|seed")

# ------------------------------------------------------------------ functional nn
N = "nn"
add(N, "conv2d-rank", lambda: kn.fn.conv2d(A23, np.ones((1, 1, 1, 1), F32)), kn.ShapeError, r"conv2d")
add(
    N,
    "conv2d-channels",
    lambda: kn.fn.conv2d(np.ones((1, 2, 4, 4), F32), np.ones((1, 3, 1, 1), F32)),
    kn.ShapeError,
    r"conv2d.*channel",
)
add(
    N,
    "conv2d-kernel-too-big",
    lambda: kn.fn.conv2d(np.ones((1, 1, 2, 2), F32), np.ones((1, 1, 3, 3), F32), padding="valid"),
    kn.ShapeError,
    r"conv2d",
)
add(N, "max_pool2d-rank", lambda: kn.fn.max_pool2d(A23, 2), kn.ShapeError, r"max_pool2d")
add(N, "layer_norm-axis", lambda: kn.fn.layer_norm(A23, axis=2), kn.ShapeError, r"layer_norm: axis 2")
add(N, "layer_norm-bool-axis", lambda: kn.fn.layer_norm(A23, axis=True), TypeError, r"layer_norm: axis")
add(N, "dropout-rate", lambda: kn.fn.dropout(kn.random.key(0), A3, 1.5), ValueError, r"dropout|rate")
add(N, "embedding-float-ids", lambda: kn.fn.embedding(A23, A3), TypeError, r"embedding|int")
add(
    N,
    "attention-shapes",
    lambda: kn.fn.dot_product_attention(
        np.ones((1, 2, 4), F32), np.ones((1, 3, 5), F32), np.ones((1, 3, 5), F32)
    ),
    kn.ShapeError,
    r"attention",
)
add(N, "celu-alpha", lambda: kn.fn.celu(A3, alpha=0.0), ValueError, r"celu: alpha")
add(N, "loss-shapes", lambda: loss.mse(A23, A3.reshape(3, 1)), kn.ShapeError, r"mse")
add(
    N,
    "cross_entropy-labels-float",
    lambda: loss.cross_entropy_sparse(A23, np.array([0.5, 1.0], F32)),
    TypeError,
    r"cross_entropy_sparse.*int",
)
add(
    N,
    "cross_entropy-labels-range",
    lambda: loss.cross_entropy_sparse(A23, np.array([0, 3], I32)),
    ValueError,
    r"cross_entropy_sparse.*3",
)
add(
    N,
    "cross_entropy-one-hot-shape",
    lambda: loss.cross_entropy(A23, np.ones((2, 4), F32)),
    kn.ShapeError,
    r"cross_entropy",
)
add(N, "metric-shapes", lambda: metric.accuracy(np.zeros(3, I32), np.zeros(4, I32)), ValueError, r"accuracy")
add(
    N,
    "metric-average",
    lambda: metric.f1(np.zeros(3, I32), np.zeros(3, I32), average="mean"),
    ValueError,
    r"average",
)

# ------------------------------------------------------------------ initialisers
add("init", "init-bad-shape", lambda: init.zeros(kn.random.key(0), (2, -3)), ValueError, r"shape")
add(
    "init",
    "init-int-dtype",
    lambda: init.normal()(kn.random.key(0), (2,), I32),
    (TypeError, ValueError),
    r"float|dtype",
)
add("init", "variance-mode", lambda: init.variance_scaling(1.0, mode="fan_sideways"), ValueError, r"mode")
add(
    "init",
    "variance-distribution",
    lambda: init.variance_scaling(1.0, distribution="cauchy"),
    ValueError,
    r"distribution",
)
add("init", "variance-scale", lambda: init.variance_scaling(-1.0), ValueError, r"scale")
add("init", "uniform-range", lambda: init.uniform((1.0, 0.0))(kn.random.key(0), (2,)), ValueError, r"uniform")

# ------------------------------------------------------------------ optimisers
OPT = "optim"
P = {"w": np.ones(2, F32)}
add(OPT, "sgd-negative-momentum", lambda: optim.sgd(0.1, momentum=-0.5), ValueError, r"momentum")
add(OPT, "adam-b1", lambda: optim.adam(0.1, b1=1.5), ValueError, r"b1")
add(OPT, "adam-eps", lambda: optim.adam(0.1, eps=-1.0), ValueError, r"eps")
add(OPT, "lr-string", lambda: optim.sgd("fast"), TypeError, r"lr")
add(OPT, "lr-nan", lambda: optim.sgd(float("nan")), ValueError, r"lr")
add(OPT, "adamw-decay", lambda: optim.adamw(0.1, weight_decay=-1.0), ValueError, r"weight_decay")
add(OPT, "rmsprop-decay", lambda: optim.rmsprop(0.1, decay=2.0), ValueError, r"decay")
add(OPT, "init-not-algorithm", lambda: optim.init("adam", P), TypeError, r"optim|Algorithm")
add(
    OPT,
    "step-grad-structure",
    lambda: optim.update(optim.sgd(0.1), optim.init(optim.sgd(0.1), P), P, {"v": np.ones(2, F32)}),
    ValueError,
    r"w|v|structure",
)
add(
    OPT,
    "step-grad-shape",
    lambda: optim.update(optim.sgd(0.1), optim.init(optim.sgd(0.1), P), P, {"w": np.ones(3, F32)}),
    (ValueError, kn.ShapeError),
    r"w|shape",
)
add(
    OPT,
    "apply_updates-structure",
    lambda: optim.apply_updates(P, [np.ones(2, F32)]),
    ValueError,
    r"structure|dict|list",
)
add(OPT, "clip-negative", lambda: optim.clip_by_global_norm(-1.0, P), ValueError, r"max_norm")
add(OPT, "schedule-steps", lambda: optim.schedule.cosine_decay(0.1, 0), ValueError, r"decay_steps")
add(OPT, "schedule-warmup", lambda: optim.schedule.warmup_cosine(0.1, 1.0, -5), ValueError, r"warmup_steps")
add(OPT, "schedule-rate", lambda: optim.schedule.exponential_decay(0.1, 0.0, 10), ValueError, r"decay_rate")
add(
    OPT,
    "state_of_trees-count",
    lambda: optim.state_of_trees(optim.adam(0.1), 1, []),
    ValueError,
    r"tree|adam|expect",
)

# ------------------------------------------------------------------ training
R = "train"


@functools.cache
def _trainer():
    return train.make(layer.sequential([layer.linear(3, 2)]), optim.sgd(0.1))


@functools.cache
def _state():  # never consumed: every case using it fails before running a step
    with rng.scope(0):
        return train.init(_trainer())


def _mse_of(y):
    return lambda out: loss.mse(out, y)


add(R, "make-not-layer", lambda: train.make("mlp", optim.sgd(0.1)), TypeError, r"Layer")
add(R, "make-not-optimizer", lambda: train.make(layer.linear(2, 2), "sgd"), TypeError, r"optim")
add(
    R,
    "step-bad-input",
    lambda: train.step(_trainer(), _state(), np.ones((4, 5), F32), _mse_of(np.ones((4, 2), F32))),
    kn.ShapeError,
    r"linear|\[4,5\]",
)
add(
    R,
    "step-not-state",
    lambda: train.step(_trainer(), {"params": 1}, np.ones((4, 3), F32), _mse_of(np.ones((4, 2), F32))),
    TypeError,
    r"State|state",
)
add(
    R,
    "step-state-of-other-model",
    lambda: train.step(
        train.make(layer.sequential([layer.linear(3, 5), layer.linear(5, 2)]), optim.sgd(0.1)),
        _state(),
        np.ones((4, 3), F32),
        _mse_of(np.ones((4, 2), F32)),
    ),
    ValueError,
    r"state does not match the model",
)
add(
    R,
    "step-loss-not-scalar",
    lambda: train.step(_trainer(), _state(), np.ones((4, 3), F32), lambda out: out),
    (ValueError, kn.GradientError, TypeError),
    r"scalar",
)
add(
    R,
    "step-loss-not-callable",
    lambda: train.step(_trainer(), _state(), np.ones((4, 3), F32), 3.0),
    TypeError,
    r"loss",
)
add(R, "fit-not-data", lambda: train.fit(_trainer(), _state(), 42), TypeError, r"data|iterable|int")
add(
    R,
    "predict-shape",
    lambda: train.predict(_trainer(), _state(), np.ones((4, 7), F32)),
    kn.ShapeError,
    r"linear",
)


def _pipelined_init(model, stages):
    pipe = kn.sharding.pipeline(stages=stages, microbatches=2)
    return lambda: rng.run(0, lambda: train.init(train.make(model, optim.sgd(0.1), pipeline=pipe)))


add(
    R,
    "pipeline-flat-repeats",
    _pipelined_init(layer.sequential([layer.linear(2, 2), layer.tanh()] * 2), 2),
    ValueError,
    r"repeat the group \(linear, tanh\) 2 times: make each repetition one block",
)
add(
    R,
    "pipeline-stages-do-not-divide",
    _pipelined_init(layer.sequential([layer.linear(2, 2)] * 3), 2),
    ValueError,
    r"2 stages do not divide the 3 identical blocks.*among 1, 3",
)
add(
    R,
    "ema-params-of-other-model",
    lambda: optim.ema_params(
        optim.chain(optim.sgd(0.1), optim.ema(0.5)),
        optim.init(optim.chain(optim.sgd(0.1), optim.ema(0.5)), {"a": A3}),
        {"b": A3},
    ),
    ValueError,
    r"holds \['a'\] that the parameters lack",
)

# ------------------------------------------------------------------ data pipelines
D = "data"
add(D, "batch-zero", lambda: data.batch(0, data.of_array([1, 2])), ValueError, r"batch.*0")
add(D, "batch-float", lambda: data.batch(2.5, data.of_array([1, 2])), (ValueError, TypeError), r"batch")
add(D, "batch-not-data", lambda: data.batch(2, [1, 2]), TypeError, r"Data|data")
add(
    D,
    "of_tensors-mismatch",
    lambda: data.of_tensors((np.ones((3, 2)), np.ones((4,)))),
    ValueError,
    r"3|4|first dimension|leading",
)
add(D, "prepare-mismatch", lambda: data.prepare((np.ones((3, 2)), np.ones((4,))), 2), ValueError, r"3|4")
add(
    D,
    "prepare-batch-size",
    lambda: data.prepare((np.ones((3, 2)), np.ones((3,))), -1),
    ValueError,
    r"batch_size",
)
add(D, "of_fn-negative", lambda: data.of_fn(-1, lambda i: i), ValueError, r"of_fn|-1")
add(D, "repeat-negative", lambda: data.repeat(-2, 1), ValueError, r"repeat|-2")
add(D, "map-not-callable", lambda: data.map(3, data.of_array([1])), TypeError, r"map|callable")
add(D, "shuffle-seed", lambda: data.shuffle(data.of_array([1]), seed="x"), TypeError, r"seed")
add(D, "prefetch-size", lambda: data.prefetch(data.of_array([1]), size=0), ValueError, r"size")
add(D, "of_tensor-scalar", lambda: data.of_tensor(np.float32(3)), ValueError, r"of_tensor|scalar|dimension")
add(
    D,
    "stack-ragged",
    lambda: data.to_array(data.batch(2, data.of_array([np.ones(2), np.ones(3)]))),
    ValueError,
    r"shape|\(2,\)|\(3,\)",
)

# ------------------------------------------------------------------ parameter trees, rng
add("ptree", "map2-structure", lambda: ptree.map2(lambda a, b: a, {"a": 1}, {"b": 1}), ValueError, r"a|b")
add("ptree", "dotted-key", lambda: ptree.flatten({"a.b": 1}), ValueError, r"a\.b")
add("ptree", "non-string-key", lambda: ptree.flatten({1: 1}), (ValueError, TypeError), r"key")
add(
    "ptree",
    "set-container",
    lambda: ptree.count_parameters({"a": {1, 2}}),
    (TypeError, ValueError),
    r"set|leaf|a",
)
add(
    "ptree",
    "unflatten-paths-conflict",
    lambda: ptree.unflatten_from_paths({"a": 1, "a.b": 2}),
    ValueError,
    r"a",
)
add("rng", "next_key-outside", lambda: rng.next_key(), RuntimeError, r"scope")
add("rng", "scope-float-seed", lambda: rng.run(1.5, lambda: 0), TypeError, r"seed")
add("rng", "random-bad-key", lambda: kn.random.uniform(np.ones(3, F32), (2,)), TypeError, r"key")
add("rng", "random-bad-shape", lambda: kn.random.normal(kn.random.key(0), (2, -1)), ValueError, r"shape")
add(
    "rng",
    "random-int-dtype",
    lambda: kn.random.normal(kn.random.key(0), (2,), dtype=I32),
    TypeError,
    r"float",
)
add("rng", "split-negative", lambda: kn.random.split(kn.random.key(0), -1), ValueError, r"split|num|-1")
add("rng", "key-string", lambda: kn.random.key("seed"), TypeError, r"seed")

# ------------------------------------------------------------------ checkpoints
C = "checkpoint"


def _file(name: str, data: bytes) -> str:
    import tempfile

    directory = tempfile.mkdtemp(prefix="kaun_ir_catalogue_")
    path = f"{directory}/{name}"
    with open(path, "wb") as handle:
        handle.write(data)
    return path


def _truncated() -> str:
    import tempfile

    path = checkpoint.save(
        f"{tempfile.mkdtemp(prefix='kaun_ir_catalogue_')}/ok.safetensors", {"w": np.ones((8, 8), F32)}
    )
    data = open(path, "rb").read()
    return _file("cut.safetensors", data[: len(data) - 16])


add(
    C,
    "load-missing",
    lambda: checkpoint.load("/nonexistent/dir/model.safetensors"),
    FileNotFoundError,
    r"model\.safetensors",
)
add(
    C,
    "load-directory",
    lambda: checkpoint.load(_file("x", b"").rsplit("/", 1)[0]),
    checkpoint.CheckpointError,
    r"kaun_ir_catalogue_.*is a directory",
)
add(
    C,
    "load-empty",
    lambda: checkpoint.load(_file("empty.safetensors", b"")),
    checkpoint.CheckpointError,
    r"empty\.safetensors: the file is empty",
)
add(
    C,
    "load-text",
    lambda: checkpoint.load(_file("notes.txt", b"hello world, not a checkpoint")),
    checkpoint.CheckpointError,
    r"notes\.txt: not a SafeTensors file",
)
add(
    C,
    "load-truncated",
    lambda: checkpoint.load(_truncated()),
    checkpoint.CheckpointError,
    r"cut\.safetensors: .*truncated",
)
add(
    C,
    "load_raw-truncated",
    lambda: checkpoint.load_raw(_truncated()),
    checkpoint.CheckpointError,
    r"cut\.safetensors",
)


def _saved(tree) -> str:
    return checkpoint.save(_file("placeholder", b"") + ".safetensors", tree)


add(
    C,
    "load-like-missing-key",
    lambda: checkpoint.load(_saved({"a": np.ones(2, F32)}), like={"b": np.ones(2, F32)}),
    ValueError,
    r"no tensor 'b'",
)
add(
    C,
    "load-like-shape",
    lambda: checkpoint.load(_saved({"a": np.ones(2, F32)}), like={"a": np.ones(3, F32)}),
    ValueError,
    r"'a'.*shape|shape.*'a'|a:",
)
add(
    C,
    "save-dotted-key",
    lambda: checkpoint.save(_file("d", b"") + ".safetensors", {"a.b": np.ones(2)}),
    ValueError,
    r"a\.b",
)
add(
    C,
    "save-object-leaf",
    lambda: checkpoint.save(_file("o", b"") + ".safetensors", {"a": object()}),
    TypeError,
    r"'a'|a:|object",
)
add(
    C,
    "save-missing-directory",
    lambda: checkpoint.save("/nonexistent/dir/model.safetensors", {"a": np.ones(2)}),
    FileNotFoundError,
    r"/nonexistent/dir",
)

# ------------------------------------------------------------------ textual IR, passes, runtime
G = "ir"
GOOD = "graph @main(%0: f32[2]) -> (f32[2]) {\n  %1 = negate %0 : f32[2]\n  return %1\n}\n"
add(G, "parse-empty", lambda: kn.ir.parse(""), kn.ParseError, r"line 1, column 1: expected 'graph'")
add(
    G,
    "parse-unknown-op",
    lambda: kn.ir.parse(GOOD.replace("negate", "frobnicate")),
    kn.ParseError,
    r"line 2, column 8: unknown op 'frobnicate'",
)
add(
    G,
    "parse-undefined-value",
    lambda: kn.ir.parse(GOOD.replace("return %1", "return %7")),
    kn.ParseError,
    r"undefined value %7",
)
add(
    G,
    "parse-bad-type",
    lambda: kn.ir.parse(GOOD.replace("%0: f32[2]", "%0: q32[2]")),
    kn.ParseError,
    r"tensor type",
)
add(
    G,
    "parse-wrong-result-type",
    lambda: kn.ir.parse(GOOD.replace("negate %0 : f32[2]", "negate %0 : f32[3]")),
    (kn.ParseError, kn.IRError),
    r"f32\[3\]",
)
add(
    G,
    "parse-deep-nesting",
    lambda: kn.ir.parse(GOOD.replace("negate %0 :", "negate %0 {x = " + "[" * 5000 + "]" * 5000 + "} :")),
    kn.ParseError,
    r"nested deeper",
)
add(
    G,
    "parse-surrogate",
    lambda: kn.ir.parse(GOOD.replace("f32[2]\n  return", 'f32[2] loc("\\udc00")\n  return')),
    kn.ParseError,
    r"lone surrogate",
)
add(
    G,
    "parse-huge-dim",
    lambda: kn.ir.parse(GOOD.replace("[2]", "[99999999999999999999]")),
    kn.ParseError,
    r"limited to",
)
add(G, "parse-nul", lambda: kn.ir.parse("graph\x00"), kn.ParseError, r"unexpected character")
add(G, "parse-bytes", lambda: kn.ir.parse(b"graph"), TypeError, r"str")
add(G, "parse-arity", lambda: kn.ir.parse(GOOD.replace("negate %0", "add %0")), kn.IRError, r"add.*2 operand")
add(
    G,
    "parse-duplicate",
    lambda: kn.ir.parse(GOOD.replace("%1 = negate", "%0 = negate")),
    kn.ParseError,
    r"defined twice",
)
add(G, "parse-trailing", lambda: kn.ir.parse(GOOD + "graph"), kn.ParseError, r"end of input")
add(G, "passes-unknown", lambda: kn.passes.run(kn.ir.parse(GOOD), "cse,frob"), ValueError, r"frob")
add(
    G,
    "passes-bad-option",
    lambda: kn.passes.run(kn.ir.parse(GOOD), "fold{max_elements=many}"),
    ValueError,
    r"max_elements",
)
add(G, "passes-syntax", lambda: kn.passes.run(kn.ir.parse(GOOD), "cse dce"), ValueError, r"','")
add(G, "passes-not-graph", lambda: kn.passes.run("graph", "cse"), TypeError, r"Graph|graph")
add(
    G,
    "runtime-wrong-arg-count",
    lambda: kn.runtime.compile(kn.ir.parse(GOOD))(),
    TypeError,
    r"takes 1 argument",
)
add(
    G,
    "runtime-wrong-shape",
    lambda: kn.runtime.compile(kn.ir.parse(GOOD))(np.ones(3, F32)),
    TypeError,
    r"argument 0: expected shape \(2,\)",
)
add(
    G,
    "runtime-wrong-dtype",
    lambda: kn.runtime.compile(kn.ir.parse(GOOD))(np.ones(2, I32)),
    TypeError,
    r"argument 0: expected f32\[2\], got i32",
)
add(
    G,
    "runtime-export-extension",
    lambda: kn.runtime.export(kn.ir.parse(GOOD), _file("e", b"") + ".txt"),
    ValueError,
    r"\.mlir",
)
add(G, "donated-array-reused", lambda: _reuse_donated(), ValueError, r"donat")


def _reuse_donated():
    f = kn.jit(lambda x: x * 2.0, donate_argnums=(0,))
    x = kn.jit(lambda v: v + 0.0)(np.ones(4, F32))  # a device array that can be donated
    f(x)
    f(x)


# ------------------------------------------------------------------ pretrained and sharded checkpoints
def _directory(files: dict) -> str:
    """A scratch directory holding ``files`` (name -> bytes, or a dict of arrays for SafeTensors)."""
    import os
    import tempfile

    from safetensors.numpy import save_file

    directory = tempfile.mkdtemp(prefix="kaun_ir_catalogue_")
    for name, content in files.items():
        if isinstance(content, dict):
            save_file(content, os.path.join(directory, name))
        else:
            with open(os.path.join(directory, name), "wb") as handle:
                handle.write(content)
    return directory


_GPT2 = b'{"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 16, "n_positions": 8}'
_WTE = {"transformer.wte.weight": np.ones((16, 8), F32)}


def _hf(index: bytes, config: bytes = _GPT2) -> str:
    return _directory(
        {"config.json": config, "model.safetensors.index.json": index, "part.safetensors": _WTE}
    )


def _pieces(pieces: str) -> str:
    return (
        '{"format": "kaun_ir-sharded-1", "processes": 1, "arrays": {"a": {"shape": [8], "dtype": "float32", '
        f'"pieces": {pieces}}}}}}}'
    )


def _sharded(index: str, tensors: dict | None = None) -> str:
    shard = "shards-00000-of-00001.safetensors"
    return _directory({"index.json": index.encode(), shard: tensors or {"a|0:4": np.ones(4, F32)}})


_A8 = {"a": np.zeros(8, F32)}
_SHARD = '"shards-00000-of-00001.safetensors"'
for _name, _index, _pattern in [
    ("weight_map-parent", b'{"weight_map": {"transformer.wte.weight": "../x.safetensors"}}', r"outside the"),
    (
        "weight_map-absolute",
        b'{"weight_map": {"transformer.wte.weight": "/etc/passwd"}}',
        r"'/etc/passwd', out",
    ),
    (
        "weight_map-missing-file",
        b'{"weight_map": {"transformer.wte.weight": "no.safetensors"}}',
        r"not exist",
    ),
    ("index-not-json", b'{"weight_map": ', r"index\.json: not valid JSON"),
    ("index-not-utf8", b"\xff\xfe", r"index\.json: not UTF-8 text"),
    ("index-no-weight_map", b"{}", r"index\.json: missing entry 'weight_map'"),
    ("index-a-list", b"[]", r"index\.json: the document is an array"),
]:
    add(
        "pretrained",
        _name,
        lambda i=_index: kn.models.from_pretrained(_hf(i)),
        checkpoint.CheckpointError,
        _pattern,
    )
_INDEX = b'{"weight_map": {"transformer.wte.weight": "part.safetensors"}}'
add(
    "pretrained",
    "config-not-json",
    lambda: kn.models.from_pretrained(_hf(_INDEX, b"{")),
    checkpoint.CheckpointError,
    r"config\.json: not valid JSON",
)
add(
    "pretrained",
    "config-missing-key",
    lambda: kn.models.from_pretrained(_hf(_INDEX, b'{"model_type": "llama"}')),
    checkpoint.CheckpointError,
    r"config\.json: missing entry 'num_attention_heads'",
)
add(
    "pretrained",
    "shard-not-safetensors",
    lambda: kn.models.from_pretrained(
        _directory({"config.json": _GPT2, "model.safetensors": b"\x08" + b"\0" * 7 + b"not json"})
    ),
    checkpoint.CheckpointError,
    r"model\.safetensors: not a SafeTensors file",
)
for _name, _index, _pattern in [
    (
        "pieces-overlap",
        _pieces(f'[{{"file": {_SHARD}, "bounds": [[0, 4]]}}, {{"file": {_SHARD}, "bounds": [[0, 4]]}}]'),
        r"overlap",
    ),
    ("pieces-gap", _pieces(f'[{{"file": {_SHARD}, "bounds": [[0, 4]]}}]'), r"cover 4 of the 8 elements"),
    ("piece-parent", _pieces('[{"file": "../x.safetensors", "bounds": [[0, 8]]}]'), r"outside the directory"),
    ("piece-absolute", _pieces('[{"file": "/etc/passwd", "bounds": [[0, 8]]}]'), r"outside the directory"),
    ("piece-bounds", _pieces(f'[{{"file": {_SHARD}, "bounds": [0, 8]}}]'), r"not a region of shape \[8\]"),
    ("index-not-json", "{", r"index\.json: not valid JSON"),
    ("index-no-arrays", '{"format": "kaun_ir-sharded-1"}', r"index\.json: missing entry 'arrays'"),
    ("index-a-list", "[]", r"index\.json: the document is an array"),
]:
    add(
        "sharded",
        _name,
        lambda i=_index: checkpoint.load_sharded(_sharded(i), _A8),
        checkpoint.CheckpointError,
        _pattern,
    )
add(
    "sharded",
    "piece-missing-in-file",
    lambda: checkpoint.load_sharded(_sharded(_pieces(f'[{{"file": {_SHARD}, "bounds": [[0, 8]]}}]')), _A8),
    checkpoint.CheckpointError,
    r"shards-00000-of-00001\.safetensors: piece 'a\|0:8'",
)
add(
    "sharded",
    "save-over-a-file",
    lambda: checkpoint.save_sharded(_file("notes.txt", b"keep"), _A8),
    FileExistsError,
    r"not a directory.*notes\.txt",
)
add(
    "sharded",
    "save-unsupported-dtype",
    lambda: checkpoint.save_sharded(_file("x", b"") + "-ckpt", {"z": np.ones(2, np.complex128)}),
    TypeError,
    r"leaf 'z' has dtype complex128",
)
add(
    C,
    "save-unsupported-dtype",
    lambda: checkpoint.save(_file("o", b"") + ".safetensors", {"a": {"b": np.array(["text"])}}),
    TypeError,
    r"leaf 'a\.b' has dtype <U4",
)
add(
    C,
    "load-damaged-structure",
    lambda: checkpoint.load(_saved_with_structure("{not json")),
    checkpoint.CheckpointError,
    r"s\.safetensors: damaged tree structure",
)


def _saved_with_structure(structure: str) -> str:
    from safetensors.numpy import save_file

    path = _file("s.safetensors", b"")
    save_file({"a": np.ones(2, F32)}, path, metadata={"kaun_ir.tree": structure})
    return path


# ---------------------------------------------------- fine-tuning (train.init(vars=), LoRA, EMA)
add(
    R,
    "init-vars-wrong-shape",
    lambda: train.init(_trainer(), vars=[{"weight": np.zeros((3, 4), F32), "bias": np.zeros(2, F32)}]),
    kn.ShapeError,
    r"'0\.weight' have shape \[3,4\].*expects \[3,2\]",
)
add(
    R,
    "init-vars-missing-path",
    lambda: train.init(_trainer(), vars=[{"weight": np.zeros((3, 2), F32)}]),
    kn.ShapeError,
    r"lack \['0\.bias'\]",
)
add(
    R,
    "accumulate-closure-form",
    lambda: train.make(layer.linear(2, 2), optim.sgd(0.1), accumulate=2),
    ValueError,
    r"loss=fn",
)
add(
    R,
    "predict-ema-without-ema",
    lambda: train.predict(_trainer(), _state(), np.ones((1, 3), F32), ema=True),
    ValueError,
    r"optim\.ema",
)
add("layers", "lora-no-target", lambda: layer.lora(layer.linear(2, 2), 1, targets=42), TypeError, r"targets")

# ------------------------------------------------------------------ runtime hardening (issue 29)
R29 = "runtime-faults"
add(
    R29,
    "distributed-port-not-numeric",
    lambda: kn.distributed.initialize("127.0.0.1:abc", 2, 1),
    ValueError,
    r"'abc'",
)
add(R29, "distributed-port-range", lambda: kn.distributed.initialize("h:0", 2, 1), ValueError, r"1\.\.65535")
add(
    R29,
    "distributed-no-port",
    lambda: kn.distributed.initialize("h", 2, 1),
    ValueError,
    r"'h' is not 'host:port'",
)
add(R29, "distributed-id", lambda: kn.distributed.initialize("h:1", 2, 5), ValueError, r"process_id 5")
add(
    R29,
    "distributed-count-type",
    lambda: kn.distributed.initialize("h:1", "2", 0),
    TypeError,
    r"num_processes",
)
add(
    R29,
    "distributed-timeout",
    lambda: kn.distributed.initialize("h:1", 2, 0, None, -1),
    ValueError,
    r"timeout_s",
)
add(R29, "jit-device-int", lambda: kn.jit(lambda v: v + 1.0, device=99)(A3), TypeError, r"device=99.*cpu")
add(R29, "fori-float-bounds", lambda: kn.fori_loop(0.0, 3.5, lambda i, c: c, A3), TypeError, r"lower bound")
add(R29, "sort-axis-range", lambda: kn.sort(A23, axis=2), kn.ShapeError, r"kn\.sort: axis 2")
add(
    R29,
    "argsort-axis-type",
    lambda: kn.argsort(A23, axis=0.5),
    TypeError,
    r"kn\.argsort: axis must be an int",
)
add(R29, "sort-scalar", lambda: kn.sort(np.float32(1)), kn.ShapeError, r"at least one axis")
add(
    R29, "jit-static-unhashable", lambda: kn.jit(lambda a, s: a)(A3, {1}), TypeError, r"args\[1\] is a static"
)
add(R29, "jit-kwarg-unhashable", lambda: kn.jit(lambda a, s: a)(A3, s={1}), TypeError, r"kwargs\['s'\].*set")
add(
    R29,
    "jit-dict-keys",
    lambda: kn.jit(lambda a, d: a)(A3, {1: A3, "b": A3}),
    TypeError,
    r"args\[1\] holds a dict",
)
add(
    R29,
    "operand-none",
    lambda: kn.jit(lambda a, s: a * s)(A3, None),
    TypeError,
    r"multiply: operand 1 is NoneType",
)
add(R29, "operand-str", lambda: kn.add(A3, "abc"), TypeError, r"add: operand 1 is str 'abc', not an array")
add(
    R29,
    "jit-not-callable",
    lambda: kn.jit(3),
    TypeError,
    r"kn\.jit: the function to compile must be callable, got int",
)
add(R29, "jit-donate-names", lambda: kn.jit(lambda a: a, donate_argnums=("a",)), TypeError, r"donate_argnums")
add(
    R29,
    "mesh-device-int",
    lambda: kn.sharding.mesh((1,), ("d",), devices=[99]),
    TypeError,
    r"devices= must hold",
)


def _nested_residual():
    model = layer.sequential([layer.linear(8, 8), layer.residual(layer.linear(8, 3))])
    x = np.ones((2, 8), F32)
    layer.apply(model, rng.run(0, lambda: layer.init(model, x)), x)


add(
    R29,
    "residual-names-its-path",
    _nested_residual,
    kn.ShapeError,
    r"^1\.residual: the block's output f32\[2,3\]",
)

# ------------------------------------------------------------------ StableHLO import (untrusted modules)
SI = "stablehlo-import"
SHLO_ERR = kn.runtime.stablehlo_import.StableHLOImportError


def _shlo(body: str, result: str = "tensor<2xf32>", extra: str = "") -> str:
    return (
        f"module {{\n  func.func @main(%a: tensor<2xf32>) -> {result} {{\n{body}\n"
        f"    return %r : {result}\n  }}\n{extra}}}\n"
    )


@functools.cache
def _portable_bytes() -> bytes:
    from kaun_ir.runtime.xla import mlir

    graph = kn.trace(lambda x: kn.tanh(x) + 1.0, A3)
    data = mlir.serialize_portable(kn.runtime.lower(graph))
    mlir._TRUSTED.clear()  # read back as a stranger's file
    return data


def damaged_bytecode() -> bytes:
    """A portable artifact whose string table is no longer UTF-8 (it used to abort the process)."""
    data = bytearray(_portable_bytes())
    data[data.index(b"builtin") + 1] = 0xFF
    return bytes(data)


_CALLS = "    %r = func.call @f(%a) : (tensor<2xf32>) -> tensor<2xf32>"
_F = (
    "  func.func private @f(%a: tensor<2xf32>) -> tensor<2xf32> {{\n"
    "    %0 = func.call @{callee}(%a) : (tensor<2xf32>) -> tensor<2xf32>\n"
    "    return %0 : tensor<2xf32>\n  }}\n"
)
add(SI, "bytecode-non-utf8-strings", lambda: kn.ir.from_stablehlo(damaged_bytecode()), SHLO_ERR, r"not UTF-8")
add(SI, "bytecode-truncated", lambda: kn.ir.from_stablehlo(_portable_bytes()[:50]), SHLO_ERR, r"truncated")
add(SI, "bytecode-no-magic", lambda: kn.ir.from_stablehlo(b"\xff\xfe"), SHLO_ERR, r"neither MLIR bytecode")
add(
    SI,
    "bytecode-version",
    lambda: kn.ir.from_stablehlo(b"ML\xefR\x7f" + _portable_bytes()[5:]),
    SHLO_ERR,
    r"bytecode version 63",
)
add(SI, "text-not-mlir", lambda: kn.ir.from_stablehlo("module { nope }"), SHLO_ERR, r"does not parse")
add(SI, "not-text-or-bytes", lambda: kn.ir.from_stablehlo(None), TypeError, r"text or bytes, got NoneType")
add(
    SI,
    "recursive-call",
    lambda: kn.ir.from_stablehlo(_shlo(_CALLS, extra=_F.format(callee="f"))),
    SHLO_ERR,
    r"recursive call of @f \(@f -> @f\)",
)
add(
    SI,
    "call-undefined",
    lambda: kn.ir.from_stablehlo(_shlo(_CALLS, extra=_F.format(callee="g"))),
    SHLO_ERR,
    r"'g' does not reference a valid function",
)
add(
    SI,
    "constant-bad-literal",
    lambda: kn.ir.from_stablehlo(
        _shlo("    %r = stablehlo.constant dense<[1, 300]> : tensor<2xi8>", "tensor<2xi8>")
    ),
    SHLO_ERR,
    r"does not parse|cannot read",
)
add(SI, "ir-parse-none", lambda: kn.ir.parse(None), TypeError, r"takes the textual IR as a str, got NoneType")

# -- kn.linalg and kn.profile --------------------------------------------------------------------------
LA = "linalg"
add(LA, "det-not-square", lambda: kn.linalg.det(A23), kn.ShapeError, r"square matrices .* got shape \[2, 3\]")
add(LA, "norm-matrix-ord-2", lambda: kn.linalg.norm(np.eye(2, dtype=F32), 2), ValueError, r"ord=2 .*singular")
add(LA, "qr-mode", lambda: kn.linalg.qr(A23, mode="full"), ValueError, r"mode must be .* got 'full'")
add("profile", "steps-zero", lambda: kn.profile("unused", steps=0).__enter__(), ValueError, r"steps .* got 0")

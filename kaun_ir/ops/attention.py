"""``fused_attention`` and ``fused_attention_grad``: scaled dot-product attention as one op, and
its backward pass as another.

``fused_attention(q, k, v)`` with ``q [B, T, H, D]``, ``k [B, S, H, D]``, ``v [B, S, H, E]``
returns ``out = softmax(q k^T * scale, masked) v`` as ``[B, T, H, E]`` and the log-sum-exp of
every row of masked, scaled logits as ``lse [B, H, T]`` (what the backward pass needs to
rebuild the probabilities without storing them). ``causal`` masks key ``j > i`` for query ``i``.

``fused_attention_grad(q, k, v, out, lse, ct_out, ct_lse)`` returns ``(ct_q, ct_k, ct_v)``.

Both lower to a kernel of their own where the emitter has one (``Emitter.kernel``: a
``stablehlo.custom_call`` to a CPU kernel that the runtime compiled and registered, float32
only), else to their plain StableHLO decomposition, inlined. The decomposition is also what
their derivatives, batching and the interpreter's reference follow.
"""

from __future__ import annotations

import functools

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.rules import apply, gradient_graph, inline, trace

#: the kernel names (``Emitter.kernel``) of the two ops
FORWARD_KERNEL = "attention_forward"
BACKWARD_KERNEL = "attention_backward"


def _check(q: TensorType, k: TensorType, v: TensorType, what: str) -> None:
    if not (q.dtype == k.dtype == v.dtype) or not dtypes.is_float(q.dtype):
        raise TypeError(f"{what}: q, k, v must share one floating-point dtype, got {q}, {k}, {v}")
    layout = f"{what}: q, k, v must be [B, T, H, D], [B, S, H, D], [B, S, H, E]; got {q}, {k}, {v}"
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ShapeError(layout)
    b, _, h, d = q.shape
    if k.shape[0] != b or k.shape[2] != h or k.shape[3] != d or v.shape[:3] != k.shape[:3]:
        raise ShapeError(layout)


def _infer(q: TensorType, k: TensorType, v: TensorType, scale, causal):
    _check(q, k, v, "fused_attention")
    b, t, h, _ = q.shape
    return TensorType(q.dtype, (b, t, h, v.shape[3])), TensorType(q.dtype, (b, h, t))


def _grad_infer(q, k, v, out, lse, ct_out, ct_lse, scale, causal):
    _check(q, k, v, "fused_attention_grad")
    want_out, want_lse = _infer(q, k, v, scale, causal)
    for got, want, name in ((out, want_out, "out"), (ct_out, want_out, "ct_out")):
        if got != want:
            raise ShapeError(f"fused_attention_grad: {name} must be {want}, got {got}")
    for got, name in ((lse, "lse"), (ct_lse, "ct_lse")):
        if got != want_lse:
            raise ShapeError(f"fused_attention_grad: {name} must be {want_lse}, got {got}")
    return q, k, v


# NumPy references (float64) --------------------------------------------------------------------


def _np_logits(q, k, scale, causal):
    s = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        t, n = s.shape[-2:]
        s = np.where(np.tril(np.ones((t, n), bool)), s, -np.inf)
    return s


def _reference(q, k, v, scale, causal):
    s = _np_logits(q, k, scale, causal)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    out = np.einsum("bhts,bshe->bthe", e / total, v.astype(np.float64))
    lse = (m + np.log(total))[..., 0]
    return out.astype(q.dtype), lse.astype(q.dtype)


def _grad_reference(q, k, v, out, lse, ct_out, ct_lse, scale, causal):
    s = _np_logits(q, k, scale, causal)
    p = np.exp(s - lse.astype(np.float64)[..., None])
    g = ct_out.astype(np.float64)
    dp = np.einsum("bthe,bshe->bhts", g, v.astype(np.float64))
    delta = np.einsum("bthe,bthe->bht", g, out.astype(np.float64)) - ct_lse.astype(np.float64)
    ds = p * (dp - delta[..., None]) * scale
    ct_q = np.einsum("bhts,bshd->bthd", ds, k.astype(np.float64))
    ct_k = np.einsum("bhts,bthd->bshd", ds, q.astype(np.float64))
    ct_v = np.einsum("bhts,bthe->bshe", p, g)
    return ct_q.astype(q.dtype), ct_k.astype(q.dtype), ct_v.astype(q.dtype)


# The decomposition, in ops -----------------------------------------------------------------------


def _logits(q, k, scale: float, causal: bool):
    """``q k^T * scale`` as ``[B, H, T, S]``, masked entries a large negative (finite) number."""
    s = apply(
        "dot_general", q, k, lhs_batch=(0, 2), rhs_batch=(0, 2), lhs_contracting=(3,), rhs_contracting=(3,)
    )
    s = s * np.asarray(scale, q.dtype)
    if causal:
        shape = tuple(s.shape)
        rows = apply("iota", dtype=dtypes.int32, shape=shape, dimension=2)
        cols = apply("iota", dtype=dtypes.int32, shape=shape, dimension=3)
        allowed = apply("compare", rows, cols, direction="GE")
        low = np.asarray(-0.7 * float(np.finfo(q.dtype).max), q.dtype)
        s = apply("select", allowed, s, apply("broadcast_in_dim", low, shape=shape, broadcast_dimensions=()))
    return s


def _expand_last(x, shape):
    """``x [..]`` broadcast along one more (last) axis to ``shape``."""
    return apply("broadcast_in_dim", x, shape=tuple(shape), broadcast_dimensions=tuple(range(x.ndim)))


def _forward(q, k, v, scale: float, causal: bool):
    s = _logits(q, k, scale, causal)
    m = apply("reduce", s, kind="max", dimensions=(3,))
    e = apply("exponential", s - _expand_last(m, s.shape))
    total = apply("reduce", e, kind="sum", dimensions=(3,))
    p = e / _expand_last(total, s.shape)
    out = apply(
        "dot_general", p, v, lhs_batch=(0, 1), rhs_batch=(0, 2), lhs_contracting=(3,), rhs_contracting=(1,)
    )  # [B, H, T, E]
    return apply("transpose", out, permutation=(0, 2, 1, 3)), m + apply("log", total)


def _dot(a, b, batch_a, batch_b, contract_a, contract_b):
    return apply(
        "dot_general",
        a,
        b,
        lhs_batch=batch_a,
        rhs_batch=batch_b,
        lhs_contracting=(contract_a,),
        rhs_contracting=(contract_b,),
    )


def _backward(q, k, v, out, lse, ct_out, ct_lse, scale: float, causal: bool):
    s = _logits(q, k, scale, causal)
    p = apply("exponential", s - _expand_last(lse, s.shape))
    dp = _dot(ct_out, v, (0, 2), (0, 2), 3, 3)  # [B, H, T, S]
    delta = apply("reduce", ct_out * out, kind="sum", dimensions=(3,))  # [B, T, H]
    delta = apply("transpose", delta, permutation=(0, 2, 1)) - ct_lse
    ds = p * (dp - _expand_last(delta, s.shape)) * np.asarray(scale, q.dtype)
    ct_q = apply(
        "dot_general", ds, k, lhs_batch=(0, 1), rhs_batch=(0, 2), lhs_contracting=(3,), rhs_contracting=(1,)
    )  # [B, H, T, D]
    ct_k = apply(
        "dot_general", ds, q, lhs_batch=(0, 1), rhs_batch=(0, 2), lhs_contracting=(2,), rhs_contracting=(1,)
    )  # [B, H, S, D]
    ct_v = _dot(p, ct_out, (0, 1), (0, 2), 2, 1)  # [B, H, S, E]
    back = (0, 2, 1, 3)
    return tuple(apply("transpose", x, permutation=back) for x in (ct_q, ct_k, ct_v))


@functools.lru_cache(maxsize=256)
def _graph(which: str, types: tuple[TensorType, ...], scale: float, causal: bool):
    fn = _forward if which == "forward" else _backward
    return trace(lambda *xs: fn(*xs, scale=scale, causal=causal), types, f"fused_attention_{which}")


# Emission ---------------------------------------------------------------------------------------


def _float_attr(x: float) -> str:
    return f"{float(np.float32(x))!r} : f32"


def _emit_with(which: str, kernel: str):
    def emit(em, node, *operands):
        target = em.kernel(kernel)
        q = node.inputs[0].type
        scale, causal = node.attr("scale"), node.attr("causal")
        usable = q.dtype == dtypes.float32 and min(q.shape) > 0 and node.inputs[1].type.shape[1] > 0
        if target is None or not usable:
            graph = _graph(which, tuple(v.type for v in node.inputs), scale, causal)
            return em.emit_graph(graph, list(operands))
        config = f"{{scale = {_float_attr(scale)}, causal = {int(bool(causal))} : i32}}"
        attrs = {"call_target_name": f'"{target}"', "api_version": "4 : i32", "backend_config": config}
        return em.simple("stablehlo.custom_call", node, *operands, attrs=attrs)

    return emit


# Derivatives and batching -------------------------------------------------------------------------


def _vjp(cts, outs, q, k, v, scale, causal):
    ct_out, ct_lse = cts
    out, lse = outs
    return apply("fused_attention_grad", q, k, v, out, lse, ct_out, ct_lse, scale=scale, causal=causal)


def _grad_vjp(cts, outs, *operands, scale, causal):
    """The decomposition's own reverse mode (second derivatives, and forward mode through it)."""
    graph = _graph("backward", tuple(x.type for x in operands), scale, causal)
    backward = gradient_graph(
        graph, wrt=list(range(len(operands))), of=(0, 1, 2), seed_inputs=True, keep_outputs=False
    )
    return inline(backward, list(operands) + list(cts))


def _fold(x, is_batched: bool, size: int):
    """``x`` with the vmapped axis folded into its batch axis (broadcast first if it has none)."""
    shape = tuple(x.shape)
    if not is_batched:
        every = tuple(range(1, len(shape) + 1))
        x = apply("broadcast_in_dim", x, shape=(size, *shape), broadcast_dimensions=every)
        shape = (size, *shape)
    return apply("reshape", x, shape=(shape[0] * shape[1], *shape[2:]))


def _batching(name: str):
    def batch(batched, size, *operands, **attrs):
        folded = [_fold(x, b, size) for x, b in zip(operands, batched)]
        results = apply(name, *folded, **attrs)
        results = results if isinstance(results, tuple) else (results,)
        return tuple(apply("reshape", r, shape=(size, r.shape[0] // size, *r.shape[1:])) for r in results)

    return batch


def _flops(inputs, outputs, **attrs) -> int:
    """Two products of ``B*H*T*S`` multiply-adds over ``D`` and ``E`` and the softmax (the
    backward pass: recomputed logits and four products)."""
    b, t, h, d = inputs[0].shape
    s, e = inputs[1].shape[1], inputs[2].shape[3]
    cells = b * h * t * s
    if len(inputs) == 3:
        return 2 * cells * (d + e) + 5 * cells
    return 2 * cells * (2 * d + 3 * e) + 8 * cells


def _samples(rng):
    for causal in (False, True):
        for q_len, k_len in ((5, 5), (3, 6), (6, 4)):
            shapes = ((2, q_len, 3, 4), (2, k_len, 3, 4), (2, k_len, 3, 5))
            ins = tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)
            yield Sample(ins, {"scale": 0.5, "causal": causal}, rtol=1e-4, atol=1e-5)
    wide = tuple(rng.standard_normal(s) for s in ((1, 4, 2, 3), (1, 4, 2, 3), (1, 4, 2, 2)))
    yield Sample(wide, {"scale": 0.3, "causal": True}, rtol=1e-10)


def _grad_samples(rng):
    for sample in _samples(rng):
        q, k, v = sample.inputs
        out, lse = _reference(q, k, v, **sample.attrs)
        ct_out = rng.standard_normal(out.shape).astype(q.dtype)
        ct_lse = rng.standard_normal(lse.shape).astype(q.dtype)
        yield Sample((q, k, v, out, lse, ct_out, ct_lse), sample.attrs, rtol=sample.rtol, atol=sample.atol)


OPS = [
    OpDef(
        name="fused_attention",
        traits=(),
        arity=3,
        attrs=("scale", "causal"),
        infer=_infer,
        reference=_reference,
        emit=_emit_with("forward", FORWARD_KERNEL),
        samples=_samples,
        vjp=_vjp,
        batch=_batching("fused_attention"),
        stablehlo=None,
        flops=_flops,
        doc=(
            "Scaled dot-product attention per head, ``(out, lse)``: ``out = softmax(q k^T * scale) v`` "
            "over ``q [B, T, H, D]``, ``k [B, S, H, D]``, ``v [B, S, H, E]`` (``causal``: key ``j > i`` "
            "masked for query ``i``), ``lse [B, H, T]`` the rows' log-sum-exp. Lowered to a CPU kernel "
            "where the runtime registered one (float32), else to its StableHLO decomposition."
        ),
    ),
    OpDef(
        name="fused_attention_grad",
        traits=(),
        arity=7,
        attrs=("scale", "causal"),
        infer=_grad_infer,
        reference=_grad_reference,
        emit=_emit_with("backward", BACKWARD_KERNEL),
        samples=_grad_samples,
        vjp=_grad_vjp,
        batch=_batching("fused_attention_grad"),
        stablehlo=None,
        flops=_flops,
        doc=(
            "The reverse mode of ``fused_attention``: ``(q, k, v, out, lse, ct_out, ct_lse) -> (ct_q, "
            "ct_k, ct_v)``, the probabilities rebuilt from ``lse``. Lowered like ``fused_attention``."
        ),
    ),
]

__all__ = ["OPS", "FORWARD_KERNEL", "BACKWARD_KERNEL"]

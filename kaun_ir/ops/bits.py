"""Ops on the bits of a number: ``popcnt`` and ``count_leading_zeros`` (integers) and
``reduce_precision`` (a float rounded to fewer exponent and mantissa bits, kept in its dtype)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample, per_output_element
from kaun_ir.ops.batching import elementwise
from kaun_ir.ops.elementwise_common import ELEMENTWISE_TRAITS, random_array, require_kinds
from kaun_ir.ops.rules import apply

_COUNTS = "bit counts are integers: no derivative"


def _unsigned_view(x: np.ndarray) -> np.ndarray:
    """The bits of an integer array as the unsigned dtype of its width."""
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def _popcnt(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(_unsigned_view(x)).astype(x.dtype)


def _clz(x: np.ndarray) -> np.ndarray:
    bits = 8 * x.dtype.itemsize
    u = _unsigned_view(x).astype(np.uint64)
    length = np.zeros(x.shape, np.int64)  # the position of the highest set bit, plus one
    for k in range(bits):
        length = np.where((u >> np.uint64(k)) != 0, k + 1, length)
    return (bits - length).astype(x.dtype)


def _integer_infer(name):
    def infer(x: TensorType) -> TensorType:
        require_kinds(x, "iu", name)
        return x

    return infer


def _integer_samples(rng):
    for dt in (np.int32, np.uint32, np.int64, np.int8, np.uint16):
        info = np.iinfo(dt)
        edges = np.array([0, 1, -1 if info.min < 0 else 2, info.min, info.max], dtype=np.int64).astype(dt)
        yield Sample((edges,))
        yield Sample((random_array(rng, (3, 4), dt, -1000, 1000),))
    yield Sample((np.zeros((0, 2), np.int32),))


def _bit_op(name: str, ref, doc: str) -> OpDef:
    return OpDef(
        name=name,
        arity=1,
        infer=_integer_infer(name),
        reference=ref,
        emit=lambda em, node, x: em.simple(f"stablehlo.{name}", node, x),
        samples=_integer_samples,
        doc=doc,
        nondiff=_COUNTS,
        batch=elementwise(name),
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
    )


# reduce_precision ------------------------------------------------------------------------------

#: (exponent bits, mantissa bits) of the float dtypes
_FORMATS = {2: (5, 10), 4: (8, 23), 8: (11, 52)}


def _format(dtype) -> tuple[int, int]:
    dt = np.dtype(dtype)
    if dt == dtypes.bfloat16:
        return 8, 7
    return _FORMATS[dt.itemsize]


def _rp_infer(x: TensorType, exponent_bits, mantissa_bits) -> TensorType:
    require_kinds(x, "f", "reduce_precision")
    if not isinstance(exponent_bits, int) or exponent_bits < 1:
        raise ShapeError(f"exponent_bits must be an integer >= 1, got {exponent_bits!r}")
    if not isinstance(mantissa_bits, int) or mantissa_bits < 0:
        raise ShapeError(f"mantissa_bits must be an integer >= 0, got {mantissa_bits!r}")
    return x


def _rp_reference(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """Round to nearest even at ``mantissa_bits``, then flush to zero below and to infinity above
    the exponent range of ``exponent_bits`` (XLA's algorithm, on the integer bits); NaN stays NaN,
    except with ``mantissa_bits = 0``, where it becomes +inf (the StableHLO spec)."""
    src_e, src_m = _format(x.dtype)
    width = 8 * x.dtype.itemsize
    udt = np.dtype(f"u{x.dtype.itemsize}")
    one = udt.type(1)
    bits = x.view(udt).copy()
    with np.errstate(over="ignore"):
        if mantissa_bits < src_m:
            drop = src_m - mantissa_bits
            last = one << udt.type(drop)
            bias = (last >> one) - one
            last_bit = (bits & last) >> udt.type(drop)
            bits = ((bits + last_bit + bias) & ~(last - one)).astype(udt)
        if exponent_bits < src_e:
            sign = one << udt.type(width - 1)
            exp_mask = ((one << udt.type(src_e)) - one) << udt.type(src_m)
            src_bias = (1 << (src_e - 1)) - 1
            reduced_bias = (1 << (exponent_bits - 1)) - 1
            exponent = bits & exp_mask
            overflow = exponent > udt.type((src_bias + reduced_bias) << src_m)
            underflow = exponent <= udt.type((src_bias - reduced_bias) << src_m)
            signed_zero = bits & sign
            bits = np.where(overflow, signed_zero | exp_mask, np.where(underflow, signed_zero, bits))
    out = bits.astype(udt).view(x.dtype)
    # NaN stays NaN where the format has a mantissa to hold it; without one (mantissa_bits = 0)
    # the StableHLO spec (and its interpreter, and XLA's constant folding) make it +inf
    out = np.where(np.isnan(x), x if mantissa_bits > 0 else np.array(np.inf, x.dtype), out)
    return np.asarray(out, x.dtype)


def _rp_emit(em, node, x):
    attrs = {
        "exponent_bits": f"{node.attr('exponent_bits')} : i32",
        "mantissa_bits": f"{node.attr('mantissa_bits')} : i32",
    }
    return em.simple("stablehlo.reduce_precision", node, x, attrs=attrs)


def _rp_samples(rng):
    specials = np.array([0.0, -0.0, 1.0, -1.5, 65504.0, 70000.0, 1e-8, -1e-30, np.inf, -np.inf, np.nan])
    for dt in (np.float32, np.float64):
        x = random_array(rng, (3, 5), dt, -100, 100)
        yield Sample((x,), {"exponent_bits": 5, "mantissa_bits": 10})  # to f16
        yield Sample((x,), {"exponent_bits": 8, "mantissa_bits": 7})  # to bf16
        yield Sample((specials.astype(dt),), {"exponent_bits": 5, "mantissa_bits": 10})
        yield Sample((specials.astype(dt),), {"exponent_bits": 4, "mantissa_bits": 3})
    # ties: 1 + 2^-11 lies halfway between two f16 numbers and rounds to the even one
    ties = np.array([1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11)], np.float32)
    yield Sample((ties,), {"exponent_bits": 5, "mantissa_bits": 10})
    # the dtype's own format: nothing changes
    yield Sample((random_array(rng, (4,), np.float32),), {"exponent_bits": 8, "mantissa_bits": 23})
    yield Sample((random_array(rng, (2, 3), np.float16),), {"exponent_bits": 5, "mantissa_bits": 4})


def _rp_vjp(ct, y, x, exponent_bits, mantissa_bits):
    """Treated as linear (as JAX does): the cotangent is rounded the same way."""
    return (apply("reduce_precision", ct, exponent_bits=exponent_bits, mantissa_bits=mantissa_bits),)


OPS = [
    _bit_op("popcnt", _popcnt, "Elementwise number of set bits of an integer (stablehlo.popcnt)."),
    _bit_op(
        "count_leading_zeros",
        _clz,
        "Elementwise number of leading zero bits of an integer (its width for 0) "
        "(stablehlo.count_leading_zeros).",
    ),
    OpDef(
        name="reduce_precision",
        arity=1,
        attrs=("exponent_bits", "mantissa_bits"),
        infer=_rp_infer,
        reference=_rp_reference,
        emit=_rp_emit,
        samples=_rp_samples,
        doc=(
            "A float rounded to a format of ``exponent_bits`` and ``mantissa_bits`` and kept in its "
            "dtype: round to nearest even, overflow to infinity, underflow to zero "
            "(stablehlo.reduce_precision). Its derivative rounds the cotangent the same way."
        ),
        vjp=_rp_vjp,
        batch=elementwise("reduce_precision"),
        traits=ELEMENTWISE_TRAITS,
        flops=per_output_element,
    ),
]

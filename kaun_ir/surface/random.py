"""``kn.random``: counter-based random numbers, bit-compatible with ``jax.random``'s default.

A key is a ``uint32[2]`` array. Nothing is stateful: every function is a pure function of its
key, so the same key always gives the same numbers, and a key passed into a ``kn.jit`` function
as an argument gives fresh numbers on every call without recompiling. Use :func:`split` /
:func:`fold_in` to derive independent keys.

The generator is Threefry-2x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC 2011), written as a composite of uint32 add / xor / shifts, so it needs no primitive of its
own. Counters, key splitting, folding and the bits-to-float conversions follow jax's default
(``jax_threefry_partitionable=True``) implementation, so for the same key :func:`bits`,
:func:`split`, :func:`fold_in`, :func:`uniform`, :func:`bernoulli` and :func:`randint` give the
same values as ``jax.random`` with ``jax.random.PRNGKey``, and :func:`normal` matches up to the
rounding of the inverse error function.

Example::

    key = kn.random.key(0)
    k1, k2 = kn.random.split(key)
    w = kn.random.normal(k1, (784, 128)) * 0.05
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.surface.creation import arange, full, zeros
from kaun_ir.surface.elementwise import abs as absolute
from kaun_ir.surface.elementwise import clip, log1p, maximum, mod, sqrt, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.indexing import getitem
from kaun_ir.surface.promotion import astype, broadcast_shapes, dtype_of, shape_of
from kaun_ir.surface.shapes import reshape, stack
from kaun_ir.surface.tensor import apply, type_of

_MASK32 = 0xFFFFFFFF
_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)

# ------------------------------------------------------------------------------ Threefry-2x32

# Threefry-2x32's rotation constants (two alternating groups of four rounds) and key-schedule parity
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotate_left(x, r: int):
    return (x << r) | (x >> (32 - r))  # >> is a logical shift on uint32


def _threefry2x32(k1, k2, x1, x2):
    """Threefry-2x32 with 20 rounds: key words k1, k2 (uint32 scalars) and counter words x1, x2
    (uint32, one shape) -> two uint32 arrays of that shape."""
    ks = (k1, k2, k1 ^ k2 ^ _PARITY)
    x = [x1 + ks[0], x2 + ks[1]]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x[0] = x[0] + x[1]
            x[1] = _rotate_left(x[1], r) ^ x[0]
        # key injection after every four rounds, with the injection counter
        x = [x[0] + ks[(group + 1) % 3], x[1] + ks[(group + 2) % 3] + (group + 1)]
    return x[0], x[1]


# ------------------------------------------------------------------------------ helpers


def _check_key(key, name: str) -> None:
    t = type_of(key)
    if t.dtype != dtypes.uint32 or t.shape != (2,):
        raise TypeError(
            f"kn.random.{name}: expected a key (u32[2], from kn.random.key / split / fold_in), got {t}"
        )


def _key_words(key):
    """The two uint32 scalars of a key, as graph values."""
    return getitem(key, 0), getitem(key, 1)


def _shape(shape: Any, name: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"kn.random.{name}: shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise ShapeError(f"kn.random.{name}: negative dimension in shape {list(shape)}")
    return shape


def _hash_counts(key, shape: tuple[int, ...]):
    """Threefry of the counters 0, 1, ... (row-major over ``shape``) -> two uint32[shape]."""
    size = math.prod(shape)
    if size > _MASK32:
        raise ValueError(f"at most 2**32 - 1 random values per call, asked for {size} (split the key)")
    # jax splits a 64-bit counter into (high, low) words; below 2**32 values the high word is 0
    low = reshape(arange(size, dtype=dtypes.uint32), shape)
    high = zeros(shape, dtypes.uint32)
    k1, k2 = _key_words(key)
    return _threefry2x32(k1, k2, high, low)


def _bits(key, shape: tuple[int, ...], width: int):
    """``width``-bit unsigned random integers of ``shape``."""
    b1, b2 = _hash_counts(key, shape)
    if width == 64:
        return (astype(b1, dtypes.uint64) << 32) | astype(b2, dtypes.uint64)
    mixed = b1 ^ b2
    return mixed if width == 32 else astype(mixed, np.dtype(f"uint{width}"))  # keeps the low bits


def _check_broadcast(name: str, what: str, value_shape, shape) -> None:
    if broadcast_shapes(value_shape, shape, op=f"kn.random.{name}") != tuple(shape):
        raise ShapeError(
            f"kn.random.{name}: {what} of shape {list(value_shape)} does not broadcast to the "
            f"requested shape {list(shape)}"
        )


# ------------------------------------------------------------------------------ keys


def key(seed) -> Any:
    """A key (``uint32[2]``) from an integer seed: ``[seed >> 32, seed & 0xFFFFFFFF]``.

    A Python int is read as a 64-bit two's-complement integer (so ``key(s)`` equals
    ``jax.random.PRNGKey(s)`` for 0 <= s < 2**31, and for every s under ``jax_enable_x64``);
    a NumPy integer keeps its own width (a 32-bit seed has a zero high word). A Python or NumPy
    seed gives a NumPy array; a traced or device integer scalar gives a traced / device key.
    """
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("kn.random.key: the seed must be an integer, got a bool")
    if isinstance(seed, int):
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"kn.random.key: seed {seed} does not fit in 64 bits")
        return np.array([(seed >> 32) & _MASK32, seed & _MASK32], dtype=np.uint32)
    if isinstance(seed, (np.ndarray, np.generic)):
        arr = np.asarray(seed)
        if arr.shape != () or arr.dtype.kind not in "iu":
            raise TypeError(
                f"kn.random.key: the seed must be an integer scalar, got {arr.dtype}{list(arr.shape)}"
            )
        value = int(arr)
        high = (value >> 32) & _MASK32 if arr.dtype.itemsize == 8 else 0
        return np.array([high, value & _MASK32], dtype=np.uint32)
    if not (hasattr(seed, "dtype") and hasattr(seed, "shape")):
        raise TypeError(f"kn.random.key: the seed must be an integer, got {type(seed).__name__} {seed!r}")
    return _key_from_scalar(seed)


@op_function
def _key_from_scalar(seed):
    t = type_of(seed)
    if t.shape != () or not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.key: the seed must be an integer scalar, got {t}")
    low = astype(seed, dtypes.uint32)  # integer conversion keeps the low 32 bits
    # an arithmetic and a logical shift agree on the 32 bits that are kept
    high = astype(seed >> 32, dtypes.uint32) if t.dtype.itemsize == 8 else zeros((), dtypes.uint32)
    return stack([high, low])


@op_function
def split(key, num=2):
    """``num`` new keys from ``key``: u32[2] -> u32[num, 2] (``num`` may be a shape tuple).

    The new keys give statistically independent streams; same values as ``jax.random.split``.
    Do not keep drawing from ``key`` itself after splitting it.
    """
    _check_key(key, "split")
    shape = _shape(num, "split")
    b1, b2 = _hash_counts(key, shape)
    return stack([b1, b2], axis=-1)


def fold_in(key, data) -> Any:
    """A new key from ``key`` and an integer ``data`` (e.g. a step or layer index): u32[2].

    ``data`` is a Python int (taken modulo 2**32), or an integer scalar array / traced value
    (converted to uint32). Same values as ``jax.random.fold_in``; as there, ``fold_in(key, i)``
    equals ``split(key, n)[i]``, so derive keys either by folding or by splitting, not both.
    """
    if isinstance(data, (bool, np.bool_)):
        raise TypeError("kn.random.fold_in: data must be an integer, got a bool")
    if isinstance(data, (int, np.integer)):
        # an array, not a static Python int, so new values do not compile new executables
        data = np.asarray(int(data) & _MASK32, dtype=np.uint32)
    return _fold_in(key, data)


@op_function
def _fold_in(key, data):
    _check_key(key, "fold_in")
    t = type_of(data)
    if t.shape != () or not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.fold_in: data must be an integer scalar, got {t}")
    k1, k2 = _key_words(key)
    # the counter pair is (0, data): jax folds in threefry_seed(data) = [data >> 32, data]
    y1, y2 = _threefry2x32(k1, k2, np.zeros((), np.uint32), astype(data, dtypes.uint32))
    return stack([y1, y2])


# ------------------------------------------------------------------------------ samplers


@op_function
def bits(key, shape=(), dtype=dtypes.uint32):
    """Uniform random bits: u32[2] -> ``dtype[shape]`` for uint8/16/32/64 (``jax.random.bits``)."""
    _check_key(key, "bits")
    dt = dtypes.canonical(dtype)
    if dt not in dtypes.UNSIGNED:
        raise TypeError(
            f"kn.random.bits: dtype must be an unsigned integer dtype, got {dtypes.short_name(dt)}"
        )
    return _bits(key, _shape(shape, "bits"), 8 * dt.itemsize)


def _float_bound(value, dt, shape, name: str, what: str):
    if isinstance(value, (bool, int, float)) or isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value, dtype=dt)
        _check_broadcast(name, what, arr.shape, shape)
        return arr
    _check_broadcast(name, what, shape_of(value), shape)
    return astype(value, dt)


@op_function
def uniform(key, shape=(), dtype=dtypes.float32, minval=0.0, maxval=1.0):
    """Uniform floats in ``[minval, maxval)``: u32[2] -> ``dtype[shape]``.

    ``minval`` / ``maxval`` are scalars or arrays broadcastable to ``shape``. The random bits
    fill the mantissa of a float in [1, 2), from which 1 is subtracted (as ``jax.random.uniform``
    does), so the values are multiples of 2**-nmant.
    """
    _check_key(key, "uniform")
    shape = _shape(shape, "uniform")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.uniform: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    info = ml_dtypes.finfo(dt)
    nbits, nmant = info.bits, info.nmant
    rng_bits = 8 if nmant < 8 else nbits  # bfloat16: 8 random bits, as jax
    uint_dt = np.dtype(f"uint{nbits}")
    raw = astype(_bits(key, shape, rng_bits), uint_dt)
    one = np.array(1.0, dt).view(uint_dt)  # exponent bits of 1.0
    floats = apply("bitcast_convert", (raw >> (rng_bits - nmant)) | one, dtype=dt) - 1.0
    low = _float_bound(minval, dt, shape, "uniform", "minval")
    high = _float_bound(maxval, dt, shape, "uniform", "maxval")
    return maximum(low, floats * (high - low) + low)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): polynomial in
# w = -log(1 - x**2), the form XLA uses for erf_inv. float32: two branches (w < 5 / w >= 5).
_ERFINV_F32_SMALL = (
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
)
_ERFINV_F32_LARGE = (
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
)
# float64: three branches, w < 6.25 (23 terms), w < 16 (19 terms), w >= 16 (17 terms)
_ERFINV_F64_W6 = (
    -3.6444120640178196996e-21,
    -1.685059138182016589e-19,
    1.2858480715256400167e-18,
    1.115787767802518096e-17,
    -1.333171662854620906e-16,
    2.0972767875968561637e-17,
    6.6376381343583238325e-15,
    -4.0545662729752068639e-14,
    -8.1519341976054721522e-14,
    2.6335093153082322977e-12,
    -1.2975133253453532498e-11,
    -5.4154120542946279317e-11,
    1.051212273321532285e-09,
    -4.1126339803469836976e-09,
    -2.9070369957882005086e-08,
    4.2347877827932403518e-07,
    -1.3654692000834678645e-06,
    -1.3882523362786468719e-05,
    0.0001867342080340571352,
    -0.00074070253416626697512,
    -0.0060336708714301490533,
    0.24015818242558961693,
    1.6536545626831027356,
)
_ERFINV_F64_W16 = (
    2.2137376921775787049e-09,
    9.0756561938885390979e-08,
    -2.7517406297064545428e-07,
    1.8239629214389227755e-08,
    1.5027403968909827627e-06,
    -4.013867526981545969e-06,
    2.9234449089955446044e-06,
    1.2475304481671778723e-05,
    -4.7318229009055733981e-05,
    6.8284851459573175448e-05,
    2.4031110387097893999e-05,
    -0.0003550375203628474796,
    0.00095328937973738049703,
    -0.0016882755560235047313,
    0.0024914420961078508066,
    -0.0037512085075692412107,
    0.005370914553590063617,
    1.0052589676941592334,
    3.0838856104922207635,
)
_ERFINV_F64_LARGE = (
    -2.7109920616438573243e-11,
    -2.5556418169965252055e-10,
    1.5076572693500548083e-09,
    -3.7894654401267369937e-09,
    7.6157012080783393804e-09,
    -1.4960026627149240478e-08,
    2.9147953450901080826e-08,
    -6.7711997758452339498e-08,
    2.2900482228026654717e-07,
    -9.9298272942317002539e-07,
    4.5260625972231537039e-06,
    -1.9681778105531670567e-05,
    7.5995277030017761139e-05,
    -0.00021503011930044477347,
    -0.00013871931833623122026,
    1.0103004648645343977,
    4.8499064014085844221,
)


def _erf_inv(x):
    """Inverse error function of a float32 / float64 tensor in [-1, 1] (a composite: there is no
    erf_inv primitive). Accurate to a few ulp; erf_inv(+-1) = +-inf."""
    dt = dtype_of(x)

    def const(v):
        return np.asarray(v, dt)

    def pick(cond, a, b):
        return where(cond, const(a), const(b))

    w = -log1p(-(x * x))
    if dt == dtypes.float64:
        lt_6 = w < 6.25
        lt_16 = w < 16.0
        w = where(lt_6, w - 3.125, sqrt(w) - pick(lt_16, 3.25, 5.0))

        def coefficient(i):
            c = const(_ERFINV_F64_W6[i])
            if i < len(_ERFINV_F64_W16):
                c = where(lt_6, c, const(_ERFINV_F64_W16[i]))
            if i < len(_ERFINV_F64_LARGE):
                c = where(lt_16, c, const(_ERFINV_F64_LARGE[i]))
            return c

        # one Horner loop for the three polynomials; the longer ones take extra steps
        p = coefficient(0)
        for i in range(1, len(_ERFINV_F64_W6)):
            step = coefficient(i) + p * w
            if i < len(_ERFINV_F64_LARGE):
                p = step
            elif i < len(_ERFINV_F64_W16):
                p = where(lt_16, step, p)
            else:
                p = where(lt_6, step, p)
    else:
        small = w < 5.0
        w = where(small, w - 2.5, sqrt(w) - 3.0)
        p = pick(small, _ERFINV_F32_SMALL[0], _ERFINV_F32_LARGE[0])
        for a, b in zip(_ERFINV_F32_SMALL[1:], _ERFINV_F32_LARGE[1:]):
            p = pick(small, a, b) + p * w
    return where(absolute(x) == 1.0, x * float("inf"), p * x)


@op_function
def normal(key, shape=(), dtype=dtypes.float32):
    """Standard normal floats: u32[2] -> ``dtype[shape]``.

    Inverse-CDF sampling like ``jax.random.normal``: ``sqrt(2) * erf_inv(u)`` for ``u`` uniform
    in (-1, 1). ``erf_inv`` is a composite polynomial (Giles' approximation, the one XLA uses),
    evaluated in float32 for float16 / bfloat16.
    """
    _check_key(key, "normal")
    shape = _shape(shape, "normal")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.normal: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    low = np.nextafter(np.array(-1.0, dt), np.array(0.0, dt))  # keeps erf_inv finite
    u = uniform(key, shape, dt, low, 1.0)
    compute = dtypes.float32 if dt in _LOW_PRECISION else dt
    z = astype(_erf_inv(astype(u, compute)), dt)
    return z * np.asarray(np.sqrt(2.0), dt)


@op_function
def bernoulli(key, p=0.5, shape=None):
    """Random booleans that are True with probability ``p``: u32[2] -> ``bool[shape]``.

    ``p`` is a scalar or an array broadcastable to ``shape`` (default: ``p``'s shape); the
    draw is ``uniform(key, shape, p.dtype) < p`` (float32 for Python or integer ``p``).
    """
    _check_key(key, "bernoulli")
    if isinstance(p, (bool, int, float)):
        p = np.asarray(p, np.float32)
    elif isinstance(p, (np.ndarray, np.generic)):
        p = np.asarray(p) if np.asarray(p).dtype in dtypes.FLOATS else np.asarray(p, np.float32)
    elif not dtypes.is_float(dtype_of(p)):
        p = astype(p, dtypes.float32)
    p_shape, p_dtype = shape_of(p), dtype_of(p)
    shape = p_shape if shape is None else _shape(shape, "bernoulli")
    _check_broadcast("bernoulli", "p", p_shape, shape)
    return uniform(key, shape, p_dtype) < p


def _int_bound(value, dt, shape, what: str):
    """``(tensor of dt, value exceeds dt's maximum)``; Python ints are clipped to dt's range."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"kn.random.randint: {what} must be an integer, got a bool")
    if isinstance(value, (int, np.integer)):
        info = np.iinfo(dt)
        value = int(value)
        clipped = min(max(value, int(info.min)), int(info.max))
        return full((), clipped, dt), value > info.max
    t = type_of(value)
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.randint: {what} must be an integer array, got {t}")
    _check_broadcast("randint", what, t.shape, shape)
    return apply("convert", value, dtype=dt), False


def _clip_int(value, low: int, high: int):
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return min(max(int(value), low), high)
    t = type_of(value)
    if not dtypes.is_integer(t.dtype):
        raise TypeError(f"kn.random.randint: bounds must be integers, got {t}")
    return clip(astype(value, dtypes.int32), low, high)


@op_function
def randint(key, shape, minval, maxval, dtype=dtypes.int32):
    """Random integers in ``[minval, maxval)``: u32[2] -> ``dtype[shape]`` (``jax.random.randint``).

    ``dtype`` is an 8-, 16- or 32-bit integer dtype. ``minval`` / ``maxval`` are Python ints,
    clipped to the dtype's range (``maxval`` may be one past its maximum), or integer arrays
    broadcastable to ``shape`` (converted to ``dtype``; clipped too for 8/16-bit dtypes, which
    are sampled as int32 and converted, as jax does). Where ``maxval <= minval`` the result is
    ``minval``. Like jax, two random words per value are reduced modulo the span, so the bias for
    spans that are not powers of two is small.
    """
    _check_key(key, "randint")
    shape = _shape(shape, "randint")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_integer(dt) or dt.itemsize > 4:
        raise TypeError(
            f"kn.random.randint: dtype must be an 8-, 16- or 32-bit integer dtype, got "
            f"{dtypes.short_name(dt)}"
        )
    if dt.itemsize < 4:  # as jax: clip to dt's range (maxval may be one past it), sample in int32
        info = np.iinfo(dt)
        minval = _clip_int(minval, int(info.min), int(info.max))
        maxval = _clip_int(maxval, int(info.min), int(info.max) + 1)
        return astype(_randint(key, shape, minval, maxval, dtypes.int32), dt)
    return _randint(key, shape, minval, maxval, dt)


def _randint(key, shape, minval, maxval, dt):
    """randint for a 32-bit integer dtype ``dt``."""
    nbits = 8 * dt.itemsize
    udt = np.dtype(f"uint{nbits}")
    low, _ = _int_bound(minval, dt, shape, "minval")
    high, high_out_of_range = _int_bound(maxval, dt, shape, "maxval")
    keys = split(key)
    higher = _bits(getitem(keys, 0), shape, nbits)
    lower = _bits(getitem(keys, 1), shape, nbits)
    span = apply("convert", high - low, dtype=udt)  # wraps modulo 2**nbits, as intended
    span = where(high <= low, 1, span)
    if high_out_of_range:  # e.g. randint(k, s, 0, 2**32, uint32): the span is one larger
        span = where(high > low, span + 1, span)
    # A span of 0 (the full range, wrapped) means "no reduction": XLA defines x % 0 = x, but its
    # constant folder crashes (SIGFPE) on a constant zero divisor, so the divisor is never 0.
    wrapped = span == 0
    divisor = where(wrapped, 1, span)

    def rem(x):
        return where(wrapped, x, mod(x, divisor))

    # (higher * 2**nbits + lower) mod span without overflow: multiplier = 2**nbits mod span
    multiplier = rem(full((), 2 ** (nbits // 2), udt))
    multiplier = rem(multiplier * multiplier)
    offset = rem(rem(higher) * multiplier + rem(lower))
    return low + apply("convert", offset, dtype=dt)


def gumbel(key, shape=(), dtype=dtypes.float32):
    """Standard Gumbel samples ``-log(-log(u))`` with ``u`` uniform in ``[tiny, 1)`` (as
    ``jax.random.gumbel``): u32[2] -> ``dtype[shape]``."""
    _check_key(key, "gumbel")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.gumbel: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    tiny = float(ml_dtypes.finfo(dt).tiny)
    from kaun_ir.surface.elementwise import log, negative

    return negative(log(negative(log(uniform(key, shape, dt, minval=tiny, maxval=1.0)))))


@op_function
def categorical(key, logits, axis: int = -1, shape=None):
    """Samples from the categorical distributions ``softmax(logits, axis)``: int32 indices along
    ``axis`` (``jax.random.categorical``'s semantics), drawn by the Gumbel-max trick
    ``argmax(logits + gumbel, axis)``.

    ``logits`` ``[..., n, ...]`` (unnormalised log-probabilities; ``-inf`` excludes a class);
    ``shape`` (default: ``logits``' shape without ``axis``) is the shape of the result and must
    end with that batch shape (leading axes draw independent samples). Top-k sampling::

        values, indices = kn.top_k(logits, k)                    # [B, k] each
        choice = kn.random.categorical(key, values)              # [B] positions among the k
        token = kn.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]

    Outside a trace the whole draw is one compiled executable per signature.
    """
    from kaun_ir.surface.elementwise import add
    from kaun_ir.surface.promotion import astype, shape_of
    from kaun_ir.surface.reductions import argmax
    from kaun_ir.surface.shapes import expand_dims

    _check_key(key, "categorical")
    if isinstance(logits, (list, tuple, int, float)):
        logits = np.asarray(logits, np.float32)
    logits_shape = tuple(shape_of(logits))
    ndim = len(logits_shape)
    if ndim == 0:
        raise ValueError("kn.random.categorical: logits must have at least one axis")
    if isinstance(axis, bool) or not isinstance(axis, int) or not -ndim <= axis < ndim:
        raise ValueError(
            f"kn.random.categorical: axis {axis!r} is out of range for logits of shape {list(logits_shape)}"
        )
    axis = axis % ndim
    batch = logits_shape[:axis] + logits_shape[axis + 1 :]
    shape = batch if shape is None else _shape(shape, "categorical")
    if len(shape) < len(batch) or tuple(shape[len(shape) - len(batch) :]) != batch:
        raise ValueError(
            f"kn.random.categorical: shape {list(shape)} must end with the logits' batch shape "
            f"{list(batch)} (the logits' shape without axis {axis})"
        )
    prefix = tuple(shape[: len(shape) - len(batch)])
    noise_shape = prefix + logits_shape
    dt = dtype_of(logits)
    if not dtypes.is_float(dt):
        logits, dt = astype(logits, dtypes.float32), dtypes.float32
    for _ in prefix:
        logits = expand_dims(logits, 0)
    return argmax(add(logits, gumbel(key, noise_shape, dt)), axis=len(prefix) + axis)


__all__ = [
    "key",
    "split",
    "fold_in",
    "bits",
    "uniform",
    "normal",
    "bernoulli",
    "randint",
    "gumbel",
    "categorical",
]

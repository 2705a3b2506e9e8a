"""The continuous samplers of ``kn.random``: uniform, normal (through a composite inverse error
function) and Gumbel floats."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from kaun_ir import dtypes
from kaun_ir.surface.elementwise import abs as absolute
from kaun_ir.surface.elementwise import log, log1p, maximum, negative, sqrt, where
from kaun_ir.surface.function import op_function
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.surface.random.checks import check_broadcast, check_key, check_shape
from kaun_ir.surface.random.threefry import random_bits
from kaun_ir.surface.tensor import apply

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)


def _float_bound(value, dt, shape, name: str, what: str):
    if isinstance(value, (bool, int, float)) or isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value, dtype=dt)
        check_broadcast(name, what, arr.shape, shape)
        return arr
    check_broadcast(name, what, shape_of(value), shape)
    return astype(value, dt)


@op_function
def uniform(key, shape=(), dtype=dtypes.float32, minval=0.0, maxval=1.0):
    """Uniform floats in ``[minval, maxval)``: u32[2] -> ``dtype[shape]``.

    ``minval`` / ``maxval`` are scalars or arrays broadcastable to ``shape``. The random bits
    fill the mantissa of a float in [1, 2), from which 1 is subtracted (as ``jax.random.uniform``
    does), so the values are multiples of 2**-nmant.
    """
    check_key(key, "uniform")
    shape = check_shape(shape, "uniform")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.uniform: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    info = ml_dtypes.finfo(dt)
    nbits, nmant = info.bits, info.nmant
    rng_bits = 8 if nmant < 8 else nbits  # bfloat16: 8 random bits, as jax
    uint_dt = np.dtype(f"uint{nbits}")
    raw = astype(random_bits(key, shape, rng_bits), uint_dt)
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


def erf_inv(x):
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
    check_key(key, "normal")
    shape = check_shape(shape, "normal")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.normal: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    low = np.nextafter(np.array(-1.0, dt), np.array(0.0, dt))  # keeps erf_inv finite
    u = uniform(key, shape, dt, low, 1.0)
    compute = dtypes.float32 if dt in _LOW_PRECISION else dt
    z = astype(erf_inv(astype(u, compute)), dt)
    return z * np.asarray(np.sqrt(2.0), dt)


def gumbel(key, shape=(), dtype=dtypes.float32):
    """Standard Gumbel samples ``-log(-log(u))`` with ``u`` uniform in ``[tiny, 1)`` (as
    ``jax.random.gumbel``): u32[2] -> ``dtype[shape]``."""
    check_key(key, "gumbel")
    dt = dtypes.canonical(dtype)
    if not dtypes.is_float(dt):
        raise TypeError(f"kn.random.gumbel: dtype must be a float dtype, got {dtypes.short_name(dt)}")
    tiny = float(ml_dtypes.finfo(dt).tiny)
    return negative(log(negative(log(uniform(key, shape, dt, minval=tiny, maxval=1.0)))))

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

from kaun_ir.names import public_dir
from kaun_ir.surface.random.continuous import gumbel, normal, uniform
from kaun_ir.surface.random.discrete import bernoulli, bits, categorical, randint
from kaun_ir.surface.random.keys import fold_in, key, split

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

__dir__ = public_dir(__all__)

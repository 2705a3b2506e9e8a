"""JAX equivalents of ``custom_vjp`` / ``custom_jvp``: ``jax.custom_vjp`` / ``jax.custom_jvp`` whose
functions run the op's regions with :func:`jax_interpret`, so ``jax.vjp`` / ``jax.jvp`` use the
same user rules through JAX's own machinery (the oracle for the generated derivative tests)."""

from __future__ import annotations

import jax
from jax_ops_control import jax_interpret


def _custom_vjp(*operands, regions, name, num_outputs):
    primal, fwd, bwd = regions

    @jax.custom_vjp
    def f(*xs):
        return jax_interpret(primal, *xs)

    def f_fwd(*xs):
        outs = jax_interpret(fwd, *xs)
        return tuple(outs[:num_outputs]), tuple(outs[num_outputs:])

    def f_bwd(residuals, cts):
        return tuple(jax_interpret(bwd, *residuals, *cts))

    f.defvjp(f_fwd, f_bwd)
    outs = f(*operands)
    return outs if len(outs) > 1 else outs[0]


def _custom_jvp(*operands, regions, name):
    primal, rule = regions
    n = len(primal.outputs)

    @jax.custom_jvp
    def f(*xs):
        return jax_interpret(primal, *xs)

    @f.defjvp
    def f_jvp(xs, ts):
        outs = jax_interpret(rule, *xs, *ts)
        return tuple(outs[:n]), tuple(outs[n:])

    outs = f(*operands)
    return outs if len(outs) > 1 else outs[0]


JAX_OPS = {"custom_vjp": _custom_vjp, "custom_jvp": _custom_jvp}

"""JAX equivalents of the region-carrying primitives (``scan``), for the VJP tests.

A region is run by :func:`jax_interpret`, which evaluates an IR graph op by op with the
``jax.lax`` functions of ``JAX_OPS``, so ``jax.vjp`` can differentiate through it.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def jax_interpret(graph, *args):
    """Evaluate ``graph`` with JAX (``constant`` and ``stop_gradient`` inline, others via JAX_OPS)."""
    from jax_ops import JAX_OPS

    env = {id(v): a for v, a in zip(graph.inputs, args)}
    for node in graph.nodes:
        ins = [env[id(v)] for v in node.inputs]
        attrs = node.attr_dict
        if node.op == "constant":
            outs = jnp.asarray(attrs["value"].array)
        elif node.op == "stop_gradient":
            outs = lax.stop_gradient(ins[0])
        elif node.regions:
            outs = JAX_OPS[node.op](*ins, regions=node.regions, **attrs)
        else:
            outs = JAX_OPS[node.op](*ins, **attrs)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for value, out in zip(node.outputs, outs):
            env[id(value)] = out
    return tuple(env[id(v)] for v in graph.outputs)


def _scan(*operands, regions, num_consts, num_carry, length, reverse=False, unroll=1):
    (body,) = regions
    consts = operands[:num_consts]
    carry = tuple(operands[num_consts : num_consts + num_carry])
    xs = tuple(operands[num_consts + num_carry :])

    def step(h, x):
        outs = jax_interpret(body, *consts, *h, *x)
        return tuple(outs[:num_carry]), tuple(outs[num_carry:])

    h, ys = lax.scan(step, carry, xs, length=length, reverse=reverse, unroll=unroll)
    return tuple(h) + tuple(ys)


def _case(index, *operands, regions):
    n = len(regions)
    chosen = jnp.where((index < 0) | (index >= n), n - 1, index)  # StableHLO: out of range is the last
    branches = [lambda *a, g=g: tuple(jax_interpret(g, *a)) for g in regions]
    out = lax.switch(chosen, branches, *operands)
    return out if len(out) != 1 else out[0]


JAX_OPS = {"scan": _scan, "case": _case}

"""Forward mode (``kn.jvp``, ``kn.linearize``) and Jacobians / Hessians built on it.

Forward mode is derived from reverse mode instead of a second rule per op. For a graph ``f``,
reverse mode builds ``u -> J(x)^T u``, which is linear in the cotangent ``u``. Its transpose is
``t -> J(x) t``, the JVP, and the transpose of a linear map is exactly what reverse mode
computes when applied to it: :func:`jvp_graph` differentiates the VJP graph with respect to its
cotangent inputs, seeded with the tangents, and evaluates it at ``u = 0`` (any value gives the
same result, the map being linear). ``dce`` then removes the dead reverse-sweep values and
``fold``/``cse`` tidy the rest.

Why this way: every op already has a VJP rule written with other ops (so grad-of-grad works),
and every op that has one gets forward mode with no new rule to write, check or keep in step:
user primitives with a VJP rule and ``custom_vjp`` functions included. The price is that the
tangent graph is built by two reverse sweeps, so it is larger before ``dce`` than a direct JVP
would be; XLA sees only what the outputs need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.ir.builder import Builder, current_builder
from kaun_ir.ir.clone import copy_nodes
from kaun_ir.ir.core import Graph, Value
from kaun_ir.surface.function import jit
from kaun_ir.surface.tensor import Tensor, apply, to_value, type_of
from kaun_ir.surface.trace import is_array_leaf, trace_flat
from kaun_ir.transforms.autodiff import GradientError, differentiable, gradient_graph


def jvp_graph(graph: Graph, wrt: Sequence[int] | None = None) -> Graph:
    """A graph computing ``graph``'s outputs and their tangents (the JVP).

    Inputs: ``graph``'s inputs, then one tangent per input in ``wrt`` (default: every
    floating-point input), of that input's type. Outputs: ``graph``'s outputs, then one tangent
    per output (zeros of the output's type for outputs that are not floating point).
    """
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    wrt = [i for i, v in enumerate(graph.inputs) if differentiable(v.type)] if wrt is None else list(wrt)
    float_outs = [k for k, v in enumerate(graph.outputs) if differentiable(v.type)]
    with Builder(record_source=False) as builder:
        args = [builder.add_input(v.type) for v in graph.inputs]
        tangents = [builder.add_input(graph.inputs[i].type) for i in wrt]
        outs: list[Value] = []
        if float_outs and wrt:
            # u -> J^T u (inputs: x, u; outputs: f(x), then J^T u per wrt input)
            backward = gradient_graph(graph, wrt=wrt, of=float_outs, seed_inputs=True, keep_outputs=True)
            cotangent_inputs = list(range(n_in, n_in + len(float_outs)))
            gradient_outputs = list(range(n_out, n_out + len(wrt)))
            # its transpose, t -> J t (inputs: x, u, t; outputs: ..., then J t per output in float_outs)
            forward = gradient_graph(
                backward, wrt=cotangent_inputs, of=gradient_outputs, seed_inputs=True, keep_outputs=True
            )
            zeros = [_zeros(graph.outputs[k].type) for k in float_outs]
            env = {id(old): new for old, new in zip(forward.inputs, args + zeros + tangents)}
            results = copy_nodes(forward, env, builder.nodes)
            primal = results[:n_out]
            tangent_of = dict(zip(float_outs, results[n_out + len(wrt) :]))
        else:
            env = {id(old): new for old, new in zip(graph.inputs, args)}
            primal = copy_nodes(graph, env, builder.nodes)
            tangent_of = {}
        outs = list(primal)
        for k, value in enumerate(graph.outputs):
            outs.append(tangent_of[k] if k in tangent_of else _zeros(value.type))
    names = list(graph.input_names) if graph.input_names else [""] * n_in
    names += [f"tangent{i}" for i in wrt]
    return builder.finish(outs, name=graph.name, input_names=names)


def _zeros(t) -> Value:
    zero = apply("constant", value=np.zeros((), t.dtype))
    full = apply("broadcast_in_dim", zero, shape=t.shape, broadcast_dimensions=()) if t.shape else zero
    return full.value


# ----------------------------------------------------------------------------- kn.jvp


def _check_tangents(primals: tuple, tangents: tuple) -> None:
    if not isinstance(tangents, (tuple, list)) or len(tangents) != len(primals):
        got = (
            f"{len(tangents)} tangent(s)" if isinstance(tangents, (tuple, list)) else type(tangents).__name__
        )
        raise GradientError(
            f"jvp needs one tangent per primal ({len(primals)}), got {got}; pass them as a "
            "tuple, e.g. kn.jvp(f, (x,), (t,))"
        )
    for i, (p, t) in enumerate(zip(primals, tangents)):
        p_leaves, p_def = tree.flatten(p)
        t_leaves, t_def = tree.flatten(t)
        if p_def != t_def:
            raise GradientError(f"the tangent of primal {i} must have the primal's tree structure")
        for (path, pl), tl in zip(tree.paths(p), t_leaves):
            if not is_array_leaf(pl):
                continue
            where = f"primal {i}" + (f" leaf {path!r}" if path else "")
            pt, tt = type_of(pl), type_of(tl)
            if not differentiable(pt):
                continue  # integer / bool primals have no tangent; theirs is ignored
            if tt.dtype != pt.dtype:
                raise GradientError(
                    f"the tangent of {where} has dtype {dtypes.short_name(tt.dtype)} but the "
                    f"primal is {dtypes.short_name(pt.dtype)}: a tangent must have its "
                    "primal's dtype"
                )
            if tt.shape != pt.shape:
                raise GradientError(
                    f"the tangent of {where} has shape {list(tt.shape)} but the primal has "
                    f"shape {list(pt.shape)}"
                )


def _jvp_traced(f: Callable, primals: tuple, tangents: tuple):
    traced = trace_flat(f, tuple(primals), {})
    graph = traced.graph
    n_args = len(traced.array_positions)
    wrt = [k for k in range(n_args) if differentiable(graph.inputs[k].type)]
    result = jvp_graph(graph, wrt)
    builder = current_builder()
    p_leaves = tree.flatten((tuple(primals), {}))[0]
    t_leaves = tree.flatten((tuple(tangents), {}))[0]
    operands = [p_leaves[p] for p in traced.array_positions] + traced.captures
    operands += [t_leaves[traced.array_positions[k]] for k in wrt]
    values = [to_value(builder, x) for x in operands]
    env = {id(old): new for old, new in zip(result.inputs, values)}
    outs = [Tensor(v, builder) for v in copy_nodes(result, env, builder.nodes)]
    n_out = len(graph.outputs)
    return tree.unflatten(traced.out_treedef, outs[:n_out]), tree.unflatten(traced.out_treedef, outs[n_out:])


def jvp(f: Callable, primals: Sequence, tangents: Sequence) -> tuple[Any, Any]:
    """``(f(*primals), J_f(primals) @ tangents)``: forward-mode derivative of ``f``.

    ``primals`` and ``tangents`` are tuples with one entry per positional argument of ``f``; each
    tangent has its primal's tree structure, shapes and dtypes (tangents of integer or bool
    leaves are ignored). The output tangent has the structure of ``f``'s output; outputs that are
    not floating point get zero tangents. Works on concrete arrays (compiled with ``kn.jit``)
    and inside traces (``kn.jit``, ``kn.grad``, ``kn.vmap``).
    """
    primals, tangents = tuple(primals), tuple(tangents) if isinstance(tangents, (tuple, list)) else tangents
    _check_tangents(primals, tangents)
    if current_builder() is not None:
        return _jvp_traced(f, primals, tangents)

    return jit(lambda p, t: _jvp_traced(f, p, t))(primals, tangents)


def linearize(f: Callable, *primals) -> tuple[Any, Callable]:
    """``(f(*primals), f_jvp)`` where ``f_jvp(*tangents)`` is the JVP at ``primals``.

    ``f_jvp`` is compiled once (per tangent signature) and can be called with many tangents; it
    recomputes the forward values the tangent needs inside its compiled graph.
    """
    out = jit(f)(*primals) if current_builder() is None else f(*primals)
    compiled = None

    def f_jvp(*tangents):
        nonlocal compiled
        _check_tangents(primals, tangents)
        if current_builder() is not None:
            return _jvp_traced(f, primals, tangents)[1]
        if compiled is None:
            compiled = jit(lambda p, t: _jvp_traced(f, p, t)[1])
        return compiled(tuple(primals), tuple(tangents))

    return out, f_jvp

"""Reverse-mode automatic differentiation over the IR, and ``kn.grad`` / ``kn.vjp`` on top of it.

:func:`gradient_graph` is the transformation: it copies a graph's forward nodes into a new
graph and appends a reverse sweep that applies each op's VJP rule (declared with the op in the
op table, written in terms of other ops, so the result can itself be differentiated). The
``autodiff`` pass in ``kaun_ir.passes`` wraps it; ``kn.grad`` traces a function, applies it and
inlines the result into the surrounding trace (or compiles it with ``kn.jit`` when called on
concrete arrays), so derivatives compose with ``kn.jit`` and nest (grad of grad).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.errors import GradientError
from kaun_ir.ir.builder import Builder, at, current_builder, location
from kaun_ir.ir.clone import copy_node, copy_nodes
from kaun_ir.ir.core import Graph, TensorType, Value
from kaun_ir.ir.provenance import SEED, Provenance, backward_of
from kaun_ir.ops import TABLE
from kaun_ir.surface.function import jit, op_function
from kaun_ir.surface.tensor import Tensor, apply, to_value, type_of
from kaun_ir.surface.trace import is_array_leaf, trace_flat
from kaun_ir.transforms.remat import has_marks, rematerialize


def differentiable(t: TensorType) -> bool:
    """Only floating-point values carry cotangents."""
    return dtypes.is_float(t.dtype)


def _zeros(t: TensorType, builder: Builder) -> Tensor:
    scalar = apply("constant", value=np.zeros((), t.dtype))
    return apply("broadcast_in_dim", scalar, shape=t.shape, broadcast_dimensions=()) if t.shape else scalar


def gradient_graph(
    graph: Graph,
    wrt: Sequence[int] | None = None,
    of: Sequence[int] = (0,),
    seed_inputs: bool = False,
    keep_outputs: bool = True,
) -> Graph:
    """A graph computing ``graph``'s outputs and the gradients of outputs ``of`` w.r.t. inputs ``wrt``.

    - ``wrt``: input indices (default: every floating-point input). Requesting an integer or
      bool input raises :class:`GradientError`.
    - ``of``: output indices to differentiate. Without ``seed_inputs`` they must be float
      scalars (a loss) and are seeded with 1. With ``seed_inputs=True`` the new graph takes one
      extra trailing input per output in ``of`` holding its cotangent (any shape).
    - Result outputs: ``graph``'s outputs (if ``keep_outputs``), then one gradient per ``wrt``
      input, in order. Inputs that the outputs do not depend on get zero gradients.
    """
    n_in = len(graph.inputs)
    wrt = [i for i, v in enumerate(graph.inputs) if differentiable(v.type)] if wrt is None else list(wrt)
    _check_request(graph, wrt, of, seed_inputs)
    active, needed = _activity(graph, wrt, of)
    with Builder(record_source=False) as builder:
        args = [builder.add_input(v.type) for v in graph.inputs]
        env: dict[int, Value] = {id(old): new for old, new in zip(graph.inputs, args)}
        residuals = _copy_forward(graph, env, builder, active, needed)
        cotangents: dict[int, Tensor] = {}
        for k in of:
            out = graph.outputs[k]
            if seed_inputs:
                seed = Tensor(builder.add_input(out.type), builder)
            else:
                with location(provenance=Provenance(SEED)):
                    seed = apply("constant", value=np.ones((), out.type.dtype))
            _accumulate(cotangents, out, seed)
        for node in reversed(graph.nodes):
            cts = [cotangents.get(id(o)) for o in node.outputs]
            if all(c is None for c in cts) or not any(id(v) in active for v in node.inputs):
                continue
            in_cts = _apply_vjp(node, cts, env, builder, residuals.get(id(node)))
            for value, ct in zip(node.inputs, in_cts):
                if ct is not None and id(value) in active:
                    # a sum of cotangents belongs to the layer that produced the value (a
                    # parameter's: to the layer that reads it)
                    producer = value.node if value.node is not None else node
                    with at(producer, provenance=backward_of(producer.op)):
                        _accumulate(cotangents, value, ct)
        grads = []
        for i in wrt:
            ct = cotangents.get(id(graph.inputs[i]))
            grads.append(ct.value if ct is not None else _zeros(graph.inputs[i].type, builder).value)
        outputs = [env[id(v)] for v in graph.outputs] if keep_outputs else []
    names = list(graph.input_names) if graph.input_names else [""] * n_in
    if seed_inputs:
        names += [f"cotangent{k}" for k in of]
    return builder.finish(outputs + grads, name=graph.name, input_names=names)


def _check_request(graph: Graph, wrt: Sequence[int], of: Sequence[int], seed_inputs: bool) -> None:
    """IndexError or GradientError when ``wrt`` or ``of`` asks for a derivative that does not exist."""
    n_in = len(graph.inputs)
    for i in wrt:
        if not 0 <= i < n_in:
            raise IndexError(f"wrt index {i} out of range for {n_in} inputs")
        if not differentiable(graph.inputs[i].type):
            name = graph.input_names[i] if graph.input_names and graph.input_names[i] else f"input {i}"
            raise GradientError(
                f"cannot differentiate with respect to {name} of type "
                f"{graph.inputs[i].type}: only floating-point inputs have gradients"
            )
    for k in of:
        t = graph.outputs[k].type
        if not differentiable(t):
            raise GradientError(f"output {k} of type {t} is not floating point; it has no derivative")
        if not seed_inputs and t.shape != ():
            raise GradientError(
                f"output {k} has shape {list(t.shape)}: grad needs a scalar output "
                "(use kn.vjp to supply a cotangent for non-scalar outputs)"
            )


def _activity(graph: Graph, wrt: Sequence[int], of: Sequence[int]) -> tuple[set[int], set[int]]:
    """``(active, needed)``: the ids of the values that depend on a ``wrt`` input (only those
    need cotangents) and of those the differentiated outputs depend on (ops elsewhere need no
    reverse rule)."""
    active: set[int] = {id(graph.inputs[i]) for i in wrt}
    for node in graph.nodes:
        if any(id(v) in active for v in node.inputs):
            active.update(id(o) for o in node.outputs if differentiable(o.type))
    needed: set[int] = {id(graph.outputs[k]) for k in of}
    for node in reversed(graph.nodes):
        if any(id(o) in needed for o in node.outputs):
            needed.update(id(v) for v in node.inputs)
    return active, needed


def _copy_forward(
    graph: Graph, env: dict[int, Value], builder: Builder, active: set[int], needed: set[int]
) -> dict[int, Any]:
    """Copy the forward nodes into ``builder``; ops that declare ``vjp_forward`` and will be
    differentiated emit their residual-saving forward instead. Returns residuals by node id."""
    residuals: dict[int, Any] = {}
    for node in graph.nodes:
        opdef = TABLE[node.op]
        wrt = tuple(id(v) in active for v in node.inputs)
        if opdef.vjp_forward is None or not any(wrt) or not any(id(o) in needed for o in node.outputs):
            fresh = copy_node(node, env)
            builder.append(fresh)
            # recorded also when the node is kept as it is: the reverse sweep looks every value up
            env.update((id(old), new) for old, new in zip(node.outputs, fresh.outputs))
            continue
        inputs = [Tensor(env[id(v)], builder) for v in node.inputs]
        with at(node):
            outs, saved = opdef.vjp_forward(*inputs, wrt=wrt, regions=node.regions, **node.attr_dict)
        for old, fresh in zip(node.outputs, outs):
            if fresh.type != old.type:
                raise GradientError(
                    f"internal: forward rule of {node.op} returned {fresh.type} for {old.type}"
                )
            env[id(old)] = fresh.value
        residuals[id(node)] = saved
    return residuals


def _accumulate(cotangents: dict[int, Tensor], value: Value, ct: Tensor) -> None:
    if ct.shape != value.type.shape or ct.dtype != value.type.dtype:
        raise GradientError(f"internal: cotangent {ct.type} for a value of type {value.type}")
    previous = cotangents.get(id(value))
    cotangents[id(value)] = ct if previous is None else apply("add", previous, ct)


def _apply_vjp(node, cts, env, builder, saved=None) -> list:
    opdef = TABLE[node.op]
    if opdef.vjp is None:
        where = f" at {node.path}" if node.path else ""
        reason = opdef.nondiff or "no VJP rule is declared"
        raise GradientError(f"cannot differentiate through {node.op}{where}: {reason}")
    inputs = [Tensor(env[id(v)], builder) for v in node.inputs]
    outputs = [Tensor(env[id(o)], builder) for o in node.outputs]
    extra: dict[str, Any] = {}
    if opdef.regions:
        extra["regions"] = node.regions
    if opdef.vjp_forward is not None:
        extra["residuals"] = saved
    with at(node, provenance=backward_of(node.op)):
        if len(node.outputs) == 1:
            ct = cts[0]
            result = opdef.vjp(ct, outputs[0], *inputs, **node.attr_dict, **extra)
        else:
            full = [c if c is not None else _zeros(o.type, builder) for c, o in zip(cts, node.outputs)]
            result = opdef.vjp(full, outputs, *inputs, **node.attr_dict, **extra)
    result = list(result)
    if len(result) != len(inputs):
        raise GradientError(
            f"internal: VJP of {node.op} returned {len(result)} cotangents for {len(inputs)} inputs"
        )
    return result


# ----------------------------------------------------------------------------- public API


def _normalize_argnums(argnums, nargs: int) -> tuple[tuple[int, ...], bool]:
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    for a in nums:
        if not -nargs <= a < nargs:
            raise IndexError(f"argnums {a} out of range for {nargs} positional arguments")
    return tuple(a % nargs for a in nums), single


def _traced_gradient(f: Callable, args: tuple, kwargs: dict, argnums, has_aux: bool):
    """Trace ``f``, differentiate, and inline into the active trace; returns (value, aux, grads)."""
    nums, single = _normalize_argnums(argnums, len(args))

    def wrapped(*a, **k):
        out = f(*a, **k)
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError("with has_aux=True the function must return (output, aux)")
            return out
        return out, None

    traced = trace_flat(wrapped, args, kwargs)
    graph = traced.graph
    # flat-leaf positions of each argument, to know which graph inputs are the wrt arguments
    leaf_owner = []
    for i, arg in enumerate(args):
        leaf_owner += [i] * len(tree.flatten(arg)[0])
    input_owner = [leaf_owner[p] if p < len(leaf_owner) else -1 for p in traced.array_positions]
    wrt = [k for k, owner in enumerate(input_owner) if owner in nums]
    for k in wrt:
        if not differentiable(graph.inputs[k].type):
            raise GradientError(
                f"cannot differentiate with respect to argument {input_owner[k]} "
                f"(leaf '{graph.input_names[k]}' of type {graph.inputs[k].type}): only "
                "floating-point arrays have gradients"
            )
    out_leaves = traced.out_treedef
    # output 0 is the value (must be a single leaf), the rest is aux
    value_def, aux_def = out_leaves[1]
    if value_def != tree.LEAF:
        raise GradientError(
            "grad needs a function returning a single scalar array"
            + (
                " as the first element of its (output, aux) pair"
                if has_aux
                else " (has_aux=True to return more)"
            )
        )
    gradient = gradient_graph(graph, wrt=wrt, of=(0,))
    gradient = _rematerialized(gradient)
    builder = current_builder()
    leaves = tree.flatten((args, kwargs))[0]
    operands = [leaves[p] for p in traced.array_positions] + traced.captures

    values = [to_value(builder, x) for x in operands]
    env = {id(old): new for old, new in zip(gradient.inputs, values)}
    # f was traced inside the caller's scopes, so its nodes already carry full layer paths
    outs = copy_nodes(gradient, env, builder.nodes)
    tensors = [Tensor(v, builder) for v in outs]
    n_out = len(graph.outputs)
    value = tensors[0]
    aux = tree.unflatten(aux_def, tensors[1:n_out])
    by_argument: dict[int, list] = {i: [] for i in nums}
    for k, t in zip(wrt, tensors[n_out:]):
        by_argument[input_owner[k]].append(t)
    grads = []
    for i in nums:
        arg_leaves, arg_def = tree.flatten(args[i])
        leaf_grads = iter(by_argument[i])
        grads.append(
            tree.unflatten(
                arg_def, [next(leaf_grads) if is_array_leaf(leaf) else None for leaf in arg_leaves]
            )
        )
    return value, aux, (grads[0] if single else tuple(grads))


def region_gradient_graph(graph: Graph, **kwargs) -> Graph:
    """:func:`gradient_graph` of a loop body or branch (the hook the ops' VJP rules call), with
    the segments ``kn.remat`` marked inside it recomputed in its backward part."""
    return _rematerialized(gradient_graph(graph, **kwargs))


def _rematerialized(gradient: Graph) -> Graph:
    """Segments that ``kn.remat`` marked are recomputed in the backward pass (kaun_ir.transforms.remat)."""
    return rematerialize(gradient) if has_marks(gradient) else gradient


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """``f``'s value and its gradient w.r.t. ``argnums``, by kaun_ir's own reverse mode.

    ``f`` must return a float scalar (or ``(scalar, aux)`` with ``has_aux``). Arguments may be
    trees of arrays; the gradient has the structure of the differentiated argument(s). Returns
    ``(value, grad)`` or ``((value, aux), grad)``. Works on concrete arrays (compiled with
    ``kn.jit``), inside ``kn.jit``, and inside another ``kn.grad``.
    """

    def inner(*args, **kwargs):
        value, aux, grads = _traced_gradient(f, args, kwargs, argnums, has_aux)
        return ((value, aux), grads) if has_aux else (value, grads)

    return _eager_or_traced(inner, f)


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of scalar-valued ``f`` w.r.t. ``argnums`` (see :func:`value_and_grad`)."""

    def inner(*args, **kwargs):
        _, aux, grads = _traced_gradient(f, args, kwargs, argnums, has_aux)
        return (grads, aux) if has_aux else grads

    return _eager_or_traced(inner, f)


def _eager_or_traced(inner: Callable, f: Callable) -> Callable:
    inner.__name__ = f"grad_{getattr(f, '__name__', 'f')}"
    inner.__doc__ = f"Derivative of {getattr(f, '__name__', 'f')} computed by kaun_ir's autodiff."
    return op_function(inner)


def vjp(f: Callable, *primals) -> tuple[Any, Callable]:
    """``(f(*primals), vjp_fn)`` where ``vjp_fn(cotangent)`` returns one cotangent per primal.

    ``f`` may return any tree of float arrays; the cotangent has the same structure. Outside a
    trace, ``vjp_fn`` runs one compiled graph (cached per cotangent signature).
    """
    out = jit(f)(*primals)
    backward_compiled = None

    def backward(cotangent):
        nonlocal backward_compiled
        if current_builder() is not None:
            return _vjp_traced(f, primals, cotangent)
        if backward_compiled is None:
            backward_compiled = jit(lambda p, c: _vjp_traced(f, p, c))
        return backward_compiled(tuple(primals), cotangent)

    return out, backward


def _vjp_traced(f: Callable, primals: tuple, cotangent) -> tuple:
    traced = trace_flat(f, primals, {})
    graph = traced.graph
    ct_leaves, ct_def = tree.flatten(cotangent)
    if ct_def != traced.out_treedef:
        raise ValueError("the cotangent must have the structure of f's output")

    for k, (leaf, out) in enumerate(zip(ct_leaves, graph.outputs)):
        if is_array_leaf(leaf) and type_of(leaf) != out.type:
            raise ValueError(
                f"cotangent {k} has type {type_of(leaf)} but output {k} of f has type "
                f"{out.type}: each cotangent must match its output's shape and dtype"
            )
    gradient = gradient_graph(
        graph, wrt=None, of=tuple(range(len(graph.outputs))), seed_inputs=True, keep_outputs=False
    )
    gradient = _rematerialized(gradient)
    wrt = [k for k, v in enumerate(graph.inputs) if differentiable(v.type)]
    builder = current_builder()
    leaves = tree.flatten((primals, {}))[0]
    operands = [leaves[p] for p in traced.array_positions] + traced.captures + list(ct_leaves)
    values = [to_value(builder, x) for x in operands]
    env = {id(old): new for old, new in zip(gradient.inputs, values)}
    outs = iter(Tensor(v, builder) for v in copy_nodes(gradient, env, builder.nodes))
    by_input = {k: next(outs) for k in wrt}
    position = 0
    result = []
    for primal in primals:
        p_leaves, p_def = tree.flatten(primal)
        rebuilt = []
        for leaf in p_leaves:
            if is_array_leaf(leaf):
                rebuilt.append(by_input.get(position))
                position += 1
            else:
                rebuilt.append(None)
        result.append(tree.unflatten(p_def, rebuilt))
    return tuple(result)

"""Rolling repeated layers of a ``sequential`` into one ``scan``.

A deep model repeats one block many times (a transformer's decoder blocks). Unrolled, the traced
graph holds one copy of the block per layer, and XLA compiles every copy; rolled, the blocks'
parameters are stacked inside the graph and one ``scan`` runs the block's body once per layer, so
the module handed to XLA holds the body once. The parameter tree the user sees is unchanged: the
stacking happens in the graph, and reverse mode sends each block's gradient back through the
stack's own VJP (a slice per block).

Blocks are rolled only when their traced computations are identical up to their inputs: each
candidate block is traced on its own (abstract inputs for its input, parameters, state and rng
key) and the canonical forms of the graphs (ops, attributes, types, how values connect, regions;
not layer paths or source lines) must be equal, and the tensors of the enclosing trace they read
(``ctx`` entries such as an attention mask) must be the same ones. Layer state (batch norm) is
scanned alongside the parameters and its new values come back stacked; the ``ctx["rng"]`` key of
block ``i`` is ``fold_in(key, i)`` exactly as when unrolled, stacked per block. Anything that
differs keeps the blocks unrolled: their traced graphs are copied into the enclosing trace
unchanged, so the result is the same graph the unrolled trace makes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kaun_ir import tree
from kaun_ir.ir.builder import Builder, current_builder, scope
from kaun_ir.ir.clone import copy_nodes, rebind
from kaun_ir.ir.core import Graph
from kaun_ir.surface.shapes import stack
from kaun_ir.surface.tensor import Tensor, apply, to_value, type_of
from kaun_ir.surface.trace import is_array_leaf

__all__ = ["ROLL_ENV", "MIN_ROLL", "resolve_roll", "unrolled", "rolling_allowed"]

#: environment variable giving the default of ``sequential(..., roll=None)``: ``0`` (or unset)
#: never rolls, ``1`` rolls runs of 2 or more, ``auto`` runs of :data:`MIN_ROLL` or more, a
#: number ``N >= 2`` runs of N or more
ROLL_ENV = "KAUN_IR_ROLL"
#: the shortest run ``roll="auto"`` rolls: on XLA CPU the bench transformer's first training
#: step takes less time rolled than unrolled from about 12 blocks on (docs/performance-results.md)
MIN_ROLL = 12


def resolve_roll(roll: Any) -> int:
    """The shortest run of identical blocks to roll for the ``roll`` argument of ``sequential``
    (0: never roll). ``None`` reads :data:`ROLL_ENV` (unset: never)."""
    if roll is None:
        text = os.environ.get(ROLL_ENV, "0").strip().lower()
        if text in ("0", "", "false", "no", "off"):
            return 0
        if text == "auto":
            return MIN_ROLL
        if text in ("1", "true", "yes", "on"):
            return 2
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 2:  # a negative or malformed length is a mistake, not "roll runs of 2"
            raise ValueError(f"{ROLL_ENV}={text!r}: expected 0, 1, auto or a minimum run length >= 2")
        return value
    if roll == "auto":
        return MIN_ROLL
    if isinstance(roll, bool):
        return 2 if roll else 0
    if isinstance(roll, int) and roll >= 2:
        return roll
    raise ValueError(f"sequential: roll must be True, False, 'auto' or an int >= 2, got {roll!r}")


class _Local(threading.local):
    off = False


_LOCAL = _Local()


@contextlib.contextmanager
def unrolled():
    """Inside the block every ``sequential`` traces its layers unrolled, whatever its ``roll``
    (``layer.summary`` uses it to show one row per block)."""
    saved, _LOCAL.off = _LOCAL.off, True
    try:
        yield
    finally:
        _LOCAL.off = saved


def rolling_allowed() -> bool:
    """False inside :func:`unrolled`."""
    return not _LOCAL.off


def _spec(t: Any) -> tuple | None:
    """``(treedef, leaf types)`` of a tree of arrays, None when a leaf is not an array."""
    leaves, treedef = tree.flatten(t)
    if not all(isinstance(leaf, Tensor) or is_array_leaf(leaf) for leaf in leaves):
        return None
    return treedef, tuple(type_of(leaf) for leaf in leaves)


class _Block:
    """One block traced on its own: its graph takes ``(x leaves, params leaves, state leaves,
    [key], captures)`` and returns ``(y leaves, new state leaves)``."""

    def __init__(self, graph: Graph, captures: list, n_in: tuple, y_def, carries: bool, key: tuple):
        self.graph, self.captures = graph, captures
        self.n_x, self.n_p, self.n_s = n_in
        # carries: the output has the input's tree and types, so the block can be a loop body
        self.y_def, self.carries = y_def, carries
        self.has_key, self.uses_key = key
        self.canonical = canonical(graph)

    def same_as(self, other: _Block) -> bool:
        return (
            self.canonical == other.canonical
            and len(self.captures) == len(other.captures)
            and all(a.value is b.value for a, b in zip(self.captures, other.captures))
        )


def canonical(graph: Graph) -> tuple:
    """A hashable form of ``graph`` that two traces of the same computation share: ops,
    attributes, result types, regions and which value feeds which input, but not layer paths
    or source lines."""
    where: dict[int, tuple] = {id(v): ("arg", k) for k, v in enumerate(graph.inputs)}
    out = [tuple(v.type for v in graph.inputs)]
    for n, node in enumerate(graph.nodes):
        refs = tuple(where.get(id(v), ("outer", id(v))) for v in node.inputs)
        attrs = tuple((name, _exact(value)) for name, value in node.attrs)
        out.append((node.op, attrs, refs, tuple(canonical(r) for r in node.regions), node.types))
        for value in node.outputs:
            where[id(value)] = (n, value.index)
    out.append(tuple(where.get(id(v), ("outer", id(v))) for v in graph.outputs))
    return tuple(out)


def _exact(value: Any) -> Any:
    """An attribute value that compares equal only to the same bits: Python's ``0.0 == -0.0``
    (and NaN's inequality) must not decide whether two blocks compute the same thing."""
    if isinstance(value, bool):  # True == 1 in Python; an attribute's kind is part of it
        return ("bool", value)
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, tuple):
        return tuple(_exact(v) for v in value)
    return value


def _trace_block(layer, params, state, x_types, x_def, *, training, ctx, path) -> _Block | None:
    """``layer.apply`` traced on abstract inputs inside a nested trace (tensors of the enclosing
    trace it reads become captures); None when its output does not have its input's types."""
    p_leaves, p_def = tree.flatten(params)
    s_leaves, s_def = tree.flatten(state)
    key = ctx.get("rng")
    has_key = isinstance(key, Tensor)
    with scope(path), Builder() as builder:
        xs = [Tensor(builder.add_input(t), builder) for t in x_types]
        ps = [Tensor(builder.add_input(type_of(v)), builder) for v in p_leaves]
        ss = [Tensor(builder.add_input(type_of(v)), builder) for v in s_leaves]
        inner_ctx = dict(ctx)
        if has_key:
            inner_ctx["rng"] = Tensor(builder.add_input(key.type), builder)
        y, new_state = layer.apply(
            tree.unflatten(p_def, ps),
            tree.unflatten(s_def, ss),
            tree.unflatten(x_def, xs),
            training=training,
            ctx=inner_ctx,
        )
        y_leaves, y_def = tree.flatten(y)
        ns_leaves, ns_def = tree.flatten(new_state)
        if ns_def != s_def:
            raise ValueError(
                f"the apply function of layer {layer.name!r} returned a state whose structure "
                "differs from the state it was given"
            )
        outputs = [to_value(builder, v) for v in y_leaves + ns_leaves]
    graph = builder.finish(outputs, name="body")
    n_in = (len(xs), len(ps), len(ss))
    key_index = sum(n_in)
    uses_key = has_key and _reads(graph, graph.inputs[key_index])
    carries = (
        y_def == x_def
        and tuple(v.type for v in outputs[: len(y_leaves)]) == tuple(x_types)
        and all(o.type == type_of(s) for o, s in zip(outputs[len(y_leaves) :], s_leaves))
    )
    return _Block(graph, list(builder.captures), n_in, y_def, carries, (has_key, uses_key))


def _reads(graph: Graph, value) -> bool:
    return any(value is v for node in graph.nodes for v in node.inputs) or any(
        value is v for v in graph.outputs
    )


def apply_layers(
    layers: Sequence,
    params: Sequence,
    state: Sequence,
    x: Any,
    *,
    training: bool,
    ctx: dict,
    min_run: int,
    path_name: Callable,
    child_ctx: Callable,
) -> tuple[Any, list]:
    """``sequential``'s forward pass with runs of at least ``min_run`` identical consecutive
    blocks rolled into a ``scan``; the other layers are applied as usual."""
    n = len(layers)
    new_state: list = [None] * n
    key = ctx.get("rng")
    if key is not None and not isinstance(key, Tensor):
        if not is_array_leaf(key):
            raise TypeError(f"ctx['rng'] must be a uint32[2] key array, got {type(key).__name__}")
        # a concrete key becomes a constant of the trace, so the blocks' keys can be stacked
        builder = current_builder()
        ctx = {**ctx, "rng": Tensor(to_value(builder, key), builder)}
    i = 0
    while i < n:
        end = _candidate_end(layers, params, state, i)
        if min_run < 2 or end - i < min_run:
            with scope(path_name(str(i), layers[i])):
                x, new_state[i] = layers[i].apply(
                    params[i], state[i], x, training=training, ctx=child_ctx(ctx, i)
                )
            i += 1
            continue
        x = _apply_run(
            layers, params, state, x, i, end, new_state, training, ctx, min_run, path_name, child_ctx
        )
        i = end
    return x, new_state


def _candidate_end(layers, params, state, i: int) -> int:
    """The end of the run of layers from ``i`` that share a name and parameter/state types (a
    cheap filter before tracing)."""
    first = (layers[i].name, _spec(params[i]), _spec(state[i]))
    if first[1] is None or first[2] is None:
        return i + 1
    end = i + 1
    while end < len(layers) and (layers[end].name, _spec(params[end]), _spec(state[end])) == first:
        end += 1
    return end


def _apply_run(layers, params, state, x, start, end, new_state, training, ctx, min_run, path_name, child_ctx):
    """Trace the candidate blocks ``start..end-1`` on their own, roll the runs of identical ones
    and copy the others into the enclosing trace."""
    x_leaves, x_def = tree.flatten(x)
    if not all(isinstance(v, Tensor) or is_array_leaf(v) for v in x_leaves):
        x_types = None
    else:
        x_types = [type_of(v) for v in x_leaves]
    blocks: list[_Block] = []
    types = x_types
    for j in range(start, end):
        if types is None:
            break
        block = _trace_block(
            layers[j],
            params[j],
            state[j],
            types,
            x_def,
            training=training,
            ctx=ctx,
            path=path_name(str(j), layers[j]),
        )
        blocks.append(block)
        if not block.carries:
            break  # a later block's input type is unknown without applying this one
    j = start
    while j < end:
        k = j - start
        if k >= len(blocks):  # not traced on its own: applied as usual
            with scope(path_name(str(j), layers[j])):
                x, new_state[j] = layers[j].apply(
                    params[j], state[j], x, training=training, ctx=child_ctx(ctx, j)
                )
            j += 1
            continue
        run = 1
        if blocks[k].carries:
            while k + run < len(blocks) and blocks[k + run].same_as(blocks[k]):
                run += 1
        if run >= min_run:
            x = _roll(blocks[k], params[j : j + run], state[j : j + run], x, j, new_state, ctx, child_ctx)
        else:
            for m in range(j, j + run):
                x = _inline(blocks[m - start], params[m], state[m], x, m, new_state, ctx, child_ctx)
        j += run
    return x


def _inline(block: _Block, params, state, x, index, new_state, ctx, child_ctx):
    """Copy a block's traced graph into the enclosing trace (what applying it there would make)."""
    builder = current_builder()
    x_leaves = tree.flatten(x)[0]
    s_leaves, s_def = tree.flatten(state)
    args = x_leaves + tree.flatten(params)[0] + s_leaves
    if block.has_key:
        args.append(child_ctx(ctx, index)["rng"] if block.uses_key else ctx["rng"])
    args += block.captures
    env = {id(inner): to_value(builder, a) for inner, a in zip(block.graph.inputs, args)}
    outs = [Tensor(v, builder) for v in copy_nodes(block.graph, env, builder.nodes)]
    n_y = len(outs) - len(s_leaves)
    new_state[index] = tree.unflatten(s_def, outs[n_y:])
    return tree.unflatten(block.y_def, outs[:n_y])


def _roll(block: _Block, params: Sequence, state: Sequence, x, start: int, new_state, ctx, child_ctx):
    """One ``scan`` over ``len(params)`` identical blocks starting at index ``start``."""
    count = len(params)
    x_leaves, x_def = tree.flatten(x)
    s_def = tree.flatten(state[0])[1]
    with scope("roll"):  # the stacking is grouped apart from the blocks' own ops
        stacked = [stack(list(col)) for col in zip(*[tree.flatten(p)[0] for p in params])]
        stacked += [stack(list(col)) for col in zip(*[tree.flatten(s)[0] for s in state])]
        if block.uses_key:
            stacked.append(stack([child_ctx(ctx, start + m)["rng"] for m in range(count)]))
    graph = block.graph
    n_x, n_p, n_s = block.n_x, block.n_p, block.n_s
    key_at = n_x + n_p + n_s
    order = list(range(key_at + block.has_key, len(graph.inputs)))  # captures: loop constants
    order += list(range(key_at))  # carry, then the scanned parameters and state
    if block.uses_key:
        order.append(key_at)
    args = Graph.arguments([graph.inputs[k].type for k in order])
    body = rebind(graph, args, {id(graph.inputs[k]): a for k, a in zip(order, args)})
    outs = apply(
        "scan",
        *block.captures,
        *x_leaves,
        *stacked,
        regions=(body,),
        num_consts=len(block.captures),
        num_carry=n_x,
        length=count,
        reverse=False,
        unroll=1,
    )
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    ys = outs[n_x:]
    for m in range(count):
        new_state[start + m] = tree.unflatten(s_def, [y[m] for y in ys])
    return tree.unflatten(x_def, outs[:n_x])

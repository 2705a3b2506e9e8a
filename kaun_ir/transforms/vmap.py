"""Batching (``kn.vmap``): a transformation of the IR driven by each op's batching rule.

:func:`batch_graph` is the transformation. It walks a graph written for one example and builds
the graph for a batch: a node none of whose operands carries the batch axis is copied as it is
(its result is shared by every example); any other node is replaced by what its op's batching
rule (``OpDef.batch``, declared with the op) builds. Inside the transformation the batch axis is
always axis 0. :func:`vmap` traces a function for one example, applies the transformation and
inlines the result into the surrounding trace (or compiles it with ``kn.jit`` on concrete
arrays), so it composes with ``kn.jit``, ``kn.grad`` and itself.

Random numbers follow their key: a key mapped by ``in_axes`` gives every example its own
stream (split the key first, ``kn.random.split(key, n)``); a key that is not mapped is shared,
so every example draws the same numbers (this is what ``jax.vmap`` does too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kaun_ir import tree
from kaun_ir.errors import BatchingError
from kaun_ir.ir.builder import Builder, current_builder, location
from kaun_ir.ir.clone import copy_nodes
from kaun_ir.ir.core import Graph, TensorType, Value
from kaun_ir.ops import TABLE
from kaun_ir.surface.function import op_function
from kaun_ir.surface.tensor import Tensor, apply, to_value
from kaun_ir.surface.trace import ShapeDtype, is_array_leaf, leaf_type, trace_flat


def _bcast(x: Tensor, size: int) -> Tensor:
    return apply(
        "broadcast_in_dim",
        x,
        shape=(size,) + tuple(x.shape),
        broadcast_dimensions=tuple(range(1, x.ndim + 1)),
    )


def batch_graph(
    graph: Graph, batched: Sequence[bool], size: int, force: Sequence[bool] | bool = False
) -> tuple[Graph, list[bool]]:
    """The batched form of ``graph`` and which of its outputs carry the batch axis.

    - ``batched[i]``: whether input i carries the batch axis (then its type gains a leading axis
      of ``size``; the others keep their type);
    - ``force``: outputs that must carry the batch axis even when they do not depend on a batched
      input (they are broadcast); ``True`` for all of them.
    Every batched value has the batch axis at axis 0.
    """
    if len(batched) != len(graph.inputs):
        raise BatchingError(f"batch_graph: {len(batched)} flags for {len(graph.inputs)} inputs")
    force = [force] * len(graph.outputs) if isinstance(force, bool) else list(force)
    with Builder(record_source=False) as builder:
        env: dict[int, Tensor] = {}
        is_batched: dict[int, bool] = {}
        for value, b in zip(graph.inputs, batched):
            t = TensorType(value.type.dtype, ((size,) if b else ()) + value.type.shape)
            env[id(value)] = Tensor(builder.add_input(t), builder)
            is_batched[id(value)] = b
        for node in graph.nodes:
            flags = [is_batched[id(v)] for v in node.inputs]
            operands = [env[id(v)] for v in node.inputs]
            with location(path=node.path):
                if not any(flags):
                    outs = apply(node.op, *operands, regions=node.regions, **node.attr_dict)
                else:
                    outs = _apply_rule(node, flags, operands, size)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for old, new in zip(node.outputs, outs):
                env[id(old)] = new
                is_batched[id(old)] = any(flags)
        outputs, out_flags = [], []
        for value, must in zip(graph.outputs, force):
            result, b = env[id(value)], is_batched[id(value)]
            if must and not b:
                result, b = _bcast(result, size), True
            outputs.append(to_value(builder, result))
            out_flags.append(b)
    return builder.finish(outputs, name=graph.name, input_names=graph.input_names), out_flags


def _apply_rule(node, flags, operands, size) -> tuple:
    opdef = TABLE[node.op]
    if opdef.batch is None:
        where = f" at {node.path}" if node.path else ""
        reason = opdef.nobatch or "no batching rule is declared"
        raise BatchingError(f"cannot batch {node.op}{where}: {reason}")
    extra = {"regions": node.regions} if opdef.regions else {}
    outs = opdef.batch(tuple(flags), size, *operands, **extra, **node.attr_dict)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if len(outs) != len(node.outputs):
        raise BatchingError(
            f"internal: the batching rule of {node.op} returned {len(outs)} results "
            f"for {len(node.outputs)} outputs"
        )
    for out, old in zip(outs, node.outputs):
        want = TensorType(old.type.dtype, (size,) + old.type.shape)
        if out.type != want:
            raise BatchingError(f"internal: the batching rule of {node.op} gave {out.type}, expected {want}")
    return outs


# ----------------------------------------------------------------------------- kn.vmap


def _axes_for(spec: Any, arg: Any, where: str) -> list:
    """One axis (int or None) per leaf of ``arg``, from ``spec`` (an int/None, or a tree prefix)."""
    if spec is None or isinstance(spec, int):
        return [spec] * len(tree.flatten(arg)[0])
    if isinstance(spec, dict) and isinstance(arg, dict):
        if set(spec) != set(arg):
            raise BatchingError(
                f"vmap in_axes{where} has keys {sorted(spec)} but the argument has keys {sorted(arg)}"
            )
        return [a for key in sorted(arg) for a in _axes_for(spec[key], arg[key], f"{where}[{key!r}]")]
    if isinstance(spec, (list, tuple)) and isinstance(arg, (list, tuple)):
        if len(spec) != len(arg):
            raise BatchingError(
                f"vmap in_axes{where} has {len(spec)} entries but the argument has {len(arg)}"
            )
        return [a for k, (s, x) in enumerate(zip(spec, arg)) for a in _axes_for(s, x, f"{where}[{k}]")]
    raise BatchingError(
        f"vmap in_axes{where} is {spec!r}, which does not match an argument of type "
        f"{type(arg).__name__} (use an int, None, or a tree of them shaped like the "
        "argument)"
    )


def _normalize_axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise BatchingError(f"vmap: {what} has {ndim} axes, so axis {axis} does not exist")
    return axis % ndim


def _vmapped(f: Callable, in_axes, out_axes, axis_size, args: tuple, kwargs: dict):
    """One call of ``kn.vmap(f)``: trace ``f`` for one example, batch the graph, inline it."""
    example_args, moves, sizes = _examples(args, _arg_specs(in_axes, args), isinstance(in_axes, tuple | list))
    size = _batch_size(sizes, axis_size)
    traced = trace_flat(f, tuple(example_args), kwargs)
    # graph inputs: the array leaves of (args, kwargs) in flatten order, then captures
    flags = [axis is not None for _, axis in moves]
    flags += [False] * (len(traced.array_positions) - len(moves) + len(traced.captures))
    batched, out_flags = batch_graph(traced.graph, flags, size)
    outs = _inline(batched, traced, moves, args, kwargs)
    out_specs = _out_axes(out_axes, traced.out_treedef, len(outs))
    results = [
        _placed(k, out, b, axis, size) for k, (out, b, axis) in enumerate(zip(outs, out_flags, out_specs))
    ]
    return tree.unflatten(traced.out_treedef, results)


def _arg_specs(in_axes, args: tuple) -> tuple:
    """One ``in_axes`` entry per positional argument."""
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if isinstance(in_axes, tuple):
        if len(in_axes) != len(args):
            raise BatchingError(
                f"vmap in_axes has {len(in_axes)} entries but the function was called with "
                f"{len(args)} positional argument(s)"
            )
        return in_axes
    if in_axes is None or isinstance(in_axes, int):
        return (in_axes,) * len(args)
    raise BatchingError(
        f"vmap in_axes must be an int, None or a tuple with one entry per positional "
        f"argument, got {in_axes!r}"
    )


def _examples(args: tuple, specs: tuple, per_argument: bool) -> tuple[list, list, dict[str, int]]:
    """The arguments of one example (mapped axes removed), ``(leaf, axis)`` for every array leaf in
    flatten order (axis None when not mapped), and the batch size each mapped leaf implies."""
    sizes: dict[str, int] = {}
    example_args = []
    moves: list[tuple[Any, int | None]] = []
    for i, (arg, spec) in enumerate(zip(args, specs)):
        leaves, treedef = tree.flatten(arg)
        axes = _axes_for(spec, arg, f"[{i}]" if per_argument else "")
        example_leaves = []
        for (path, leaf), axis in zip(tree.paths(arg), axes):
            if not is_array_leaf(leaf) or axis is None:
                example_leaves.append(leaf)
                if is_array_leaf(leaf):
                    moves.append((leaf, None))
                continue
            t = leaf_type(leaf)
            name = f"argument {i}" + (f" leaf {path!r}" if path else "")
            axis = _normalize_axis(axis, t.ndim, f"{name} ({t})")
            sizes[name] = t.shape[axis]
            example_leaves.append(ShapeDtype(t.shape[:axis] + t.shape[axis + 1 :], t.dtype))
            moves.append((leaf, axis))
        example_args.append(tree.unflatten(treedef, example_leaves))
    return example_args, moves, sizes


def _batch_size(sizes: dict[str, int], axis_size: int | None) -> int:
    """The one batch size of the mapped axes and ``axis_size``; BatchingError when they differ."""
    distinct = set(sizes.values()) | ({axis_size} if axis_size is not None else set())
    if len(distinct) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in sizes.items())
        extra = f"; axis_size={axis_size}" if axis_size is not None else ""
        raise BatchingError(
            f"vmap got mismatched batch sizes ({listed}{extra}); every mapped axis must have the same size"
        )
    if not distinct:
        raise BatchingError(
            "vmap needs at least one mapped argument (an in_axes entry that is not None) or axis_size"
        )
    return distinct.pop()


def _inline(batched: Graph, traced, moves: list, args: tuple, kwargs: dict) -> list[Tensor]:
    """Copy the batched graph into the active trace over the call's arrays (each mapped one with
    its batch axis moved to the front); returns its outputs."""
    builder = current_builder()
    operands = []
    for leaf, axis in moves:
        if axis is None:
            operands.append(leaf)
        else:
            value = leaf if isinstance(leaf, Tensor) else Tensor(to_value(builder, leaf), builder)
            operands.append(_move(value, axis, 0))
    all_leaves = tree.flatten((tuple(args), kwargs))[0]
    operands += [all_leaves[p] for p in traced.array_positions[len(moves) :]] + list(traced.captures)
    values = [to_value(builder, x) for x in operands]
    env: dict[int, Value] = {id(old): new for old, new in zip(batched.inputs, values)}
    return [Tensor(v, builder) for v in copy_nodes(batched, env, builder.nodes)]


def _placed(k: int, out: Tensor, batched: bool, axis: int | None, size: int) -> Tensor:
    """Output ``k`` with its batch axis where ``out_axes`` puts it (broadcast if it has none)."""
    if axis is None:
        if batched:
            raise BatchingError(
                f"vmap out_axes is None for output {k}, but it depends on a mapped "
                "argument (it differs per example)"
            )
        return out  # the batched graph carries the unbatched value as it is
    if not batched:
        out = _bcast(out, size)
    axis = _normalize_axis(axis, out.ndim, f"output {k} ({out.type})")
    return _move(out, 0, axis)


def _out_axes(out_axes, treedef, count: int) -> list:
    if out_axes is None or isinstance(out_axes, int):
        return [out_axes] * count
    try:
        flat, spec_def = tree.flatten(out_axes, is_leaf=lambda x: x is None)
    except Exception:  # noqa: BLE001 - reported below
        spec_def = None
    if spec_def != treedef or len(flat) != count:
        raise BatchingError(
            f"vmap out_axes {out_axes!r} must be an int, None, or a tree shaped like the function's output"
        )
    return flat


def _move(x: Tensor, source: int, destination: int) -> Tensor:
    if source == destination:
        return x
    order = [a for a in range(x.ndim) if a != source]
    order.insert(destination, source)
    return apply("transpose", x, permutation=tuple(order))


def vmap(f: Callable, in_axes: Any = 0, out_axes: Any = 0, axis_size: int | None = None) -> Callable:
    """``f`` mapped over a batch axis of its arguments, vectorised by each op's batching rule.

    - ``in_axes``: an int (the mapped axis of every array argument), ``None`` (not mapped: shared
      by every example), or a tuple with one entry per positional argument, each an int, None or
      a tree shaped like that argument (``{"w": 0, "b": None}``). Keyword arguments are not
      mapped. Negative axes count from the end.
    - ``out_axes``: where the batch axis goes in each output (an int, or a tree of ints shaped
      like the output); None for an output that does not depend on a mapped argument.
    - ``axis_size``: the batch size, needed only when no argument is mapped.

    ``f`` is traced once for one example (shapes without the mapped axis). Composes with
    ``kn.jit``, ``kn.grad`` and itself: ``kn.vmap(kn.grad(loss), in_axes=(None, 0, 0))`` gives
    per-example gradients. Random keys: see the module docstring (a mapped key gives each example
    its own numbers, an unmapped key the same numbers).
    """
    if axis_size is not None and (not isinstance(axis_size, int) or axis_size < 0):
        raise BatchingError(f"vmap axis_size must be a non-negative int, got {axis_size!r}")

    def inner(*args, **kwargs):
        return _vmapped(f, in_axes, out_axes, axis_size, args, kwargs)

    inner.__name__ = f"vmap_{getattr(f, '__name__', 'f')}"
    inner.__doc__ = f"{getattr(f, '__name__', 'f')} mapped over a batch axis by kaun_ir's vmap."
    return op_function(inner)

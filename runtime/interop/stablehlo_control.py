"""Importing StableHLO's control flow: ``while`` loops, whose regions become the op's region
graphs (values a loop's regions use from outside become extra loop-carried values), and ``case``
/ ``if``, whose branches become ``case`` regions (values they read from outside become its
operands)."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import TensorType
from kaun_ir.runtime.interop.stablehlo_attrs import ints, region_block
from kaun_ir.transforms.vmap import batch_graph


def free_values(op) -> list:
    """MLIR values used inside ``op``'s regions but defined outside them, in first-use order."""
    defined, free = set(), {}

    def walk(operation):
        for region in operation.regions:
            for block in region.blocks:
                defined.update(block.arguments)
                for inner in block.operations:
                    inner = inner.operation
                    for v in inner.operands:
                        if v not in defined:
                            free.setdefault(v, None)
                    walk(inner)
                    defined.update(inner.results)

    walk(op)
    return [v for v in free if v not in defined]


def while_loop(imp, op, xs, env):
    """``stablehlo.while``: the op table's ``while`` with a cond and a body region graph."""
    # Values captured from outside become extra loop-carried values that the body passes on.
    captured = free_values(op)
    extra = [imp.lookup(env, v, op) for v in captured]
    carried = list(xs) + extra
    types = [v.type for v in carried]
    cond = _with_captures(imp, op, 0, types, len(xs), captured, "cond")
    body = _with_captures(imp, op, 1, types, len(xs), captured, "body")
    outs = imp.add("while", *carried, regions=(cond, body))
    return list(outs[: len(xs)])


def _with_captures(imp, op, index, types, n, captured, name):
    """A region graph whose first ``n`` arguments are the block's and the rest the captures (a
    ``while`` body, named ``body``, passes the captures on as carried values)."""
    block = region_block(op, index)
    saved = imp.builder
    builder = Builder(record_source=False)
    imp.builder = builder
    try:
        args = [builder.add_input(t) for t in types]
        outer = dict(zip(captured, args[n:]))
        outputs = imp.block(block, args[:n], outer)
    finally:
        imp.builder = saved
    if name == "body":
        outputs = list(outputs) + args[n:]
    return builder.finish(outputs, name=name)


def _branch(imp, op, index, captured, types):
    """Branch ``index`` of a ``case`` / ``if`` as a graph taking the captured values."""
    return _with_captures(imp, op, index, types, 0, captured, f"branch{index}")


def _branches(imp, op, env):
    """The values the branches read from outside (they become the operands) and the branches."""
    captured = free_values(op)
    operands = [imp.lookup(env, v, op) for v in captured]
    types = [v.type for v in operands]
    return operands, tuple(_branch(imp, op, k, captured, types) for k in range(len(op.regions)))


def case(imp, op, xs, env):
    """``stablehlo.case``: the op table's ``case``; the values its branches read from outside
    become its operands."""
    (index,) = xs
    operands, branches = _branches(imp, op, env)
    return imp.add("case", index, *operands, regions=branches)


def if_(imp, op, xs, env):
    """``stablehlo.if``: a two-branch ``case`` on ``not pred`` (true: branch 0, false: branch 1)."""
    (pred,) = xs
    index = imp.add1("convert", imp.add1("not", pred), dtype=dtypes.int32)
    operands, branches = _branches(imp, op, env)
    return imp.add("case", index, *operands, regions=branches)


def map_(imp, op, xs, env):
    """``stablehlo.map``: its scalar body applied to every element, as the body's graph batched
    over the flattened operands (kaun_ir's vmap) and copied into the program."""
    shape = tuple(xs[0].type.shape) if xs else ()
    if tuple(ints(op, "dimensions", ())) != tuple(range(len(shape))):
        raise imp.error(op, "map over a subset of the dimensions is not supported (StableHLO maps all)")
    if free_values(op):
        raise imp.error(op, "map with a body that reads values from outside it is not supported")
    scalars = [TensorType(x.dtype, ()) for x in xs]
    block = region_block(op, 0)
    saved = imp.builder
    builder = Builder(record_source=False)
    imp.builder = builder
    try:
        args = [builder.add_input(t) for t in scalars]
        outputs = imp.block(block, args, {})
    finally:
        imp.builder = saved
    body = builder.finish(outputs, name="map_body")
    size = int(np.prod(shape, dtype=np.int64))
    flat = [imp.add1("reshape", x, shape=(size,)) for x in xs]
    batched, _ = batch_graph(body, [True] * len(xs), size, force=True)
    env_values = {id(v): x for v, x in zip(batched.inputs, flat)}
    for node in batched.nodes:
        outs = imp.add(
            node.op, *[env_values[id(v)] for v in node.inputs], regions=node.regions, **node.attr_dict
        )
        env_values.update({id(v): o for v, o in zip(node.outputs, outs)})
    return [imp.add1("reshape", env_values[id(v)], shape=shape) for v in batched.outputs]

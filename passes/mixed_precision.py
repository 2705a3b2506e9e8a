"""``mixed-precision``: matrix products in bfloat16 / float16, everything else float32 (kaun_ir.precision)."""

from __future__ import annotations

from kaun_ir import dtypes
from kaun_ir.ir.builder import Builder, at
from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Value
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.surface.tensor import Tensor, apply

_PRODUCTS = ("dot_general", "convolution")


@register(
    "mixed-precision",
    options={
        "compute": Option(
            str,
            "bfloat16",
            "the dtype of the matrix products: bfloat16 or float16",
            choices=("bfloat16", "float16"),
        ),
    },
)
def mixed_precision(graph: Graph, compute: str) -> Graph:
    """Cast the operands of every float32 ``dot_general`` / ``convolution`` to ``compute``;
    ``dot_general`` keeps a float32 result (``preferred_dtype``), a convolution's result is cast
    back to float32. Layer paths and source lines are kept."""
    low = dtypes.canonical(compute)  # one of the option's choices (checked with the pipeline)
    graph, rewritten = _rewrite(graph, low)
    statistic("products cast", rewritten)
    return graph


def _rewrite(graph: Graph, low) -> tuple[Graph, int]:
    """``graph`` with its products cast, loop bodies (``scan``, ``while`` regions) included: a
    rolled ``sequential``'s blocks are a ``scan`` body. The regions keep their types (products
    come back as float32), so the loop ops around them stay valid."""
    with Builder(record_source=False) as builder:
        env: dict[int, Value] = {id(old): builder.add_input(old.type) for old in graph.inputs}
        rewritten = 0
        for node in graph.nodes:
            inputs = [env[id(v)] for v in node.inputs]
            if node.op in _PRODUCTS and all(
                v.type.dtype == dtypes.float32 for v in list(node.inputs) + list(node.outputs)
            ):
                rewritten += 1
                with at(node):
                    lhs, rhs = (apply("convert", Tensor(v, builder), dtype=low) for v in inputs)
                    attrs = node.attr_dict
                    if node.op == "dot_general":
                        attrs["preferred_dtype"] = dtypes.float32
                        out = apply("dot_general", lhs, rhs, **attrs)
                    else:
                        out = apply("convert", apply("convolution", lhs, rhs, **attrs), dtype=dtypes.float32)
                env[id(node.outputs[0])] = out.value
                continue
            regions = node.regions
            if regions:
                rewritten_regions = [_rewrite(region, low) for region in regions]
                regions = tuple(region for region, _ in rewritten_regions)
                rewritten += sum(count for _, count in rewritten_regions)
            fresh = copy_node(node, env, regions)
            builder.append(fresh)
            env.update((id(old), new) for old, new in zip(node.outputs, fresh.outputs))
        outputs = [env[id(v)] for v in graph.outputs]
    return builder.finish(outputs, name=graph.name, input_names=graph.input_names), rewritten

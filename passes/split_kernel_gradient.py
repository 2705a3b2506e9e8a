"""``split-kernel-gradient``: kernel-gradient convolutions with a large cotangent, split by batch.

Reverse mode computes a convolution's kernel gradient as another convolution: the forward input
convolved with the output cotangent as the "kernel", contracting over the forward batch and the
output positions, with the forward kernel's small window (3x3) as its output. When that
cotangent operand is large, XLA CPU's default convolution kernel (a YNNPACK fusion) slows down
far more than the work grows: the ``cnn`` workload's second kernel gradient (batch 64,
14x14x32 -> 64, a 3.2 MB cotangent) takes 14.0 ms of CPU time, the same at batch 16 1.5 ms.
Split along the contracted batch into chunks whose cotangent is at most ``max_bytes`` (4 chunks
of 0.8 MB there), each chunk's partial gradient is a convolution in the fast regime, and their
sum is the gradient: 5.7 ms (docs/performance-results.md, CNN section).

The rewrite applies to 2-d or n-d convolutions without groups, lhs dilation or negative padding
whose ``rhs`` spatial window is larger than their output (the shape of kernel gradients; forward
convolutions are never touched) and whose ``rhs`` holds more than ``max_bytes``. The contracted
feature axis (``lhs_spec[1]`` / ``rhs_spec[1]``, the forward batch) is cut into ``k`` equal
slices, ``k`` the smallest divisor of its size that brings a slice to ``max_bytes`` or less (at
most ``max_chunks``; otherwise the convolution is left alone). Not bit-exact: the partial sums are
added in another order than one convolution adds them (the tests bound the difference).

Options: ``max_bytes`` (default 1 MiB), ``max_chunks`` (default 16). Statistic:
``kernel gradients split``.
"""

from __future__ import annotations

import math

import numpy as np

from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules


def _slice(rw: Rewriter, x: Value, axis: int, start: int, size: int) -> Value:
    begin, limit = [0] * len(x.shape), list(x.shape)
    begin[axis], limit[axis] = start, start + size
    return rw.emit(
        "slice", x, start_indices=tuple(begin), limit_indices=tuple(limit), strides=(1,) * len(x.shape)
    )


def chunk_count(size: int, nbytes: int, max_bytes: int, max_chunks: int) -> int | None:
    """The smallest divisor ``k`` of ``size`` with ``nbytes / k <= max_bytes`` (None above ``max_chunks``)."""
    wanted = math.ceil(nbytes / max_bytes)
    for k in range(max(wanted, 2), min(size, max_chunks) + 1):
        if size % k == 0:
            return k
    return None


def _split(node: Node, rw: Rewriter, max_bytes: int, max_chunks: int):
    a = node.attr_dict
    lhs, rhs = node.inputs
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    out = node.outputs[0]
    if (
        a["feature_group_count"] != 1
        or a["batch_group_count"] != 1
        or any(d != 1 for d in a["lhs_dilation"])
        or any(lo < 0 or hi < 0 for lo, hi in a["padding"])
        or np.dtype(lhs.dtype).kind != "f"
        or out.type.size == 0
    ):
        return None
    window = math.prod(rhs.shape[axis] for axis in rs[2:])
    if window <= math.prod(out.shape[axis] for axis in os_[2:]):
        return None  # a forward-shaped convolution: the kernel is the small operand
    nbytes = rhs.type.size * np.dtype(rhs.dtype).itemsize
    if nbytes <= max_bytes:
        return None
    size = rhs.shape[rs[1]]
    chunks = chunk_count(size, nbytes, max_bytes, max_chunks)
    if chunks is None:
        return None
    step = size // chunks
    total = None
    for i in range(chunks):
        part = rw.emit(
            "convolution", _slice(rw, lhs, ls[1], i * step, step), _slice(rw, rhs, rs[1], i * step, step), **a
        )
        total = part if total is None else rw.emit("add", total, part)
    statistic("kernel gradients split")
    return total


@register(
    "split-kernel-gradient",
    options={
        "max_bytes": Option(
            int,
            1 << 20,
            "split kernel gradients whose cotangent operand holds more bytes than this",
            min=1,
        ),
        "max_chunks": Option(int, 16, "never cut the batch into more chunks than this", min=2),
    },
)
def split_kernel_gradient(graph: Graph, max_bytes: int, max_chunks: int) -> Graph:
    """Kernel-gradient convolutions with a large cotangent as a sum over batch chunks."""
    if not any(node.op == "convolution" for node in graph.walk()):
        return graph
    table = RuleTable()
    table.rule("split-kernel-gradient", "convolution")(
        lambda node, rw: _split(node, rw, max_bytes, max_chunks)
    )
    return apply_rules(graph, table, label="split-kernel-gradient").graph

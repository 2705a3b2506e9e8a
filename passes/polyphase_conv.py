"""``polyphase-conv``: convolutions with input dilation as one plain convolution per output phase.

Reverse mode computes the input gradient of a strided convolution as a convolution of the output
cotangent spread out by the stride (``lhs_dilation``) with the reversed kernel. Of the products
such a convolution forms, all but one in ``stride`` per spatial axis multiply an inserted zero,
and XLA CPU runs it in its generic convolution kernel (a ``convolution-base-dilated`` thunk)
rather than its fast one: the ResNet's 1x1 stride-2 shortcut's input gradient took 1.9 ms where
the forward 1x1 convolution takes 0.35 ms.

Along an axis with dilation ``d``, the outputs fall into ``d`` phases (their position modulo
``d``); the outputs of one phase see only the kernel taps ``k0, k0 + d, ...`` of one offset
``k0``, each against consecutive (undilated) inputs. So the convolution equals the sum over
phases (the product of the per-axis phases) of a convolution of the undilated input with the
kernel's taps of that phase (a strided ``slice`` of the kernel), each result spread back to its
phase's positions by a ``pad`` with interior padding ``d - 1``. A 1x1 kernel has one phase: one
plain 1x1 convolution and a pad; a 3x3 kernel at stride 2 has four (2x2, 2x1, 1x2 and 1x1 taps).
Every output sums the products of the original that do not multiply an inserted zero; not
bit-exact (the convolution kernels add in their own order; the tests bound the difference
against a float64 reference).

Applies to convolutions without groups, window strides or kernel dilation, with an input
dilation above 1 on some spatial axis. Statistic: ``dilated convolutions split into phases``.
"""

from __future__ import annotations

import itertools

import numpy as np

from kaun_ir.ir.core import Graph, Node
from kaun_ir.passes.registry import register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules


def axis_phases(size: int, dilation: int, low: int, kernel: int, out: int) -> list[tuple]:
    """The phases of one spatial axis: ``(k0, (pad_low, pad_high), (place_low, place_high))``
    for every tap offset ``k0`` that reaches an output: the phase's convolution takes taps
    ``k0::dilation`` with that padding of the undilated input, and its result goes to outputs
    ``place_low, place_low + dilation, ...`` (a pad with interior ``dilation - 1``)."""
    phases = []
    for k0 in range(min(dilation, kernel)):
        taps = -(-(kernel - k0) // dilation)
        first = -((low - k0) // dilation)  # ceil((k0 - low) / dilation): the first input row
        last = (out - 1 - low + k0) // dilation
        count = last - first + 1
        if count <= 0:
            continue
        place = low - k0 + dilation * first
        phases.append(
            (k0, (-first, last + taps - 1 - (size - 1)), (place, out - (place + (count - 1) * dilation + 1)))
        )
    return phases


def _rewrite(node: Node, rw: Rewriter):
    a = node.attr_dict
    lhs, rhs = node.inputs
    ls, rs, os_ = a["lhs_spec"], a["rhs_spec"], a["out_spec"]
    out = node.outputs[0]
    dilation = tuple(a["lhs_dilation"])
    if (
        all(d == 1 for d in dilation)
        or a["feature_group_count"] != 1
        or a["batch_group_count"] != 1
        or any(s != 1 for s in a["window_strides"])
        or any(d != 1 for d in a["rhs_dilation"])
        or np.dtype(lhs.dtype).kind not in "fc"
        or out.type.size == 0
    ):
        return None
    per_axis = [
        axis_phases(lhs.shape[ls[2 + j]], d, a["padding"][j][0], rhs.shape[rs[2 + j]], out.shape[os_[2 + j]])
        for j, d in enumerate(dilation)
    ]
    if any(not phases for phases in per_axis):
        return None  # some axis has no tap reaching an output: left as it is
    zero = rw.constant(np.zeros((), lhs.dtype))
    total = None
    for combo in itertools.product(*per_axis):
        begin, limit, strides = [0] * len(rhs.shape), list(rhs.shape), [1] * len(rhs.shape)
        low, high, interior = [0] * len(out.shape), [0] * len(out.shape), [0] * len(out.shape)
        padding = []
        for j, (k0, pads, (place_low, place_high)) in enumerate(combo):
            begin[rs[2 + j]], strides[rs[2 + j]] = k0, dilation[j]
            low[os_[2 + j]], high[os_[2 + j]], interior[os_[2 + j]] = place_low, place_high, dilation[j] - 1
            padding.append(pads)
        kernel = rhs
        if begin != [0] * len(rhs.shape) or strides != [1] * len(rhs.shape):
            kernel = rw.emit(
                "slice", rhs, start_indices=tuple(begin), limit_indices=tuple(limit), strides=tuple(strides)
            )
        attrs = dict(a, padding=tuple(padding), lhs_dilation=(1,) * len(dilation))
        part = rw.emit("convolution", lhs, kernel, **attrs)
        if any(low) or any(high) or any(interior):
            part = rw.emit("pad", part, zero, low=tuple(low), high=tuple(high), interior=tuple(interior))
        total = part if total is None else rw.emit("add", total, part)
    statistic("dilated convolutions split into phases")
    return total


@register("polyphase-conv")
def polyphase_conv(graph: Graph) -> Graph:
    """Convolutions with input dilation (strided convolutions' input gradients) as a sum of
    plain convolutions, one per output phase."""
    if not any(node.op == "convolution" for node in graph.walk()):
        return graph
    table = RuleTable()
    table.rule("polyphase-conv", "convolution")(_rewrite)
    return apply_rules(graph, table, label="polyphase-conv").graph

"""``check-finite``: find the first op that turns finite values into a NaN or an Inf.

Every floating-point value of the graph (the inputs and each node's results) gets a probe, one
fused reduction: ``m = max(|v|)``, which is NaN when ``v`` holds a NaN (XLA's maximum propagates
NaN), Inf when it holds an Inf and no NaN, and finite otherwise. A node is a *culprit* when one of
its results is not finite while all of its floating-point operands are: that separates the op
that made a NaN from the hundreds that merely pass it on, and it leaves deliberate infinities
alone (a ``-inf`` mask is a ``constant``, which is never a culprit, and the ops that read it have
a non-finite operand). Graph inputs come first: a NaN that arrives as an argument is reported as
such.

The instrumented graph returns two more outputs after the original ones: the index of the first
culprit in :func:`instrument`'s site list (``-1`` when everything was finite) and its probe value
(a float32 NaN or Inf, telling which). Sites are numbered in graph order; ops with regions
(``scan``, ``while``) are checked on their results, so a NaN made inside a loop body names the
loop op.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Value
from kaun_ir.ir.provenance import backward_op, describe
from kaun_ir.passes.registry import register
from kaun_ir.surface.tensor import Tensor, apply

#: ops that are never culprits: their non-finite results are written by the user on purpose
NEVER_CULPRITS = frozenset({"constant"})


@dataclass(frozen=True)
class Site:
    """Where a non-finite value may first appear: a graph input or a node."""

    op: str  # the op name, or "input"
    path: str  # the layer path ("" at top level); for inputs the input's label
    source: str  # the user's file:line ("" when unknown)
    backward_of: str | None  # the forward op whose derivative this node computes, or None

    def describe(self) -> str:
        """Where the first non-finite value appeared, for the error message: the op, forward or
        backward pass, and its layer path."""
        if self.op == "input":
            return f"argument {self.path or '?'} of the compiled function"
        what = (
            f"{self.op} (in the backward pass, derivative of {self.backward_of})"
            if self.backward_of
            else f"{self.op} (in the forward pass)"
        )
        where = f" at layer {self.path}" if self.path else " at the top level (no layer)"
        line = f", {self.source}" if self.source else ""
        return what + where + line


def _probe(value: Tensor) -> Tensor:
    """``max(|v|)`` over every axis, as float32."""
    m = apply("abs", value)
    if value.ndim:
        m = apply("reduce", m, kind="max", dimensions=tuple(range(value.ndim)))
    return m if m.dtype == dtypes.float32 else apply("convert", m, dtype=dtypes.float32)


def _checked(value: Value) -> bool:
    return dtypes.is_float(value.type.dtype) and value.type.size > 0


def instrument(graph: Graph) -> tuple[Graph, list[Site]]:
    """``graph`` with the two check outputs appended, and the list of sites they index."""
    sites: list[Site] = []
    with Builder(record_source=False) as builder:
        args = [builder.add_input(v.type) for v in graph.inputs]
        env: dict[int, Value] = {id(old): new for old, new in zip(graph.inputs, args)}
        finite: dict[int, Tensor] = {}  # id(old value) -> bool[] "all finite"
        first = apply("constant", value=np.asarray(-1, np.int32))
        probe_of_first = apply("constant", value=np.asarray(0.0, np.float32))
        none_yet = apply("constant", value=np.asarray(True))

        def note(bad: Tensor, probe: Tensor, site: Site) -> None:
            nonlocal first, probe_of_first, none_yet
            hit = apply("and", bad, none_yet)
            first = apply("select", hit, apply("constant", value=np.asarray(len(sites), np.int32)), first)
            probe_of_first = apply("select", hit, probe, probe_of_first)
            none_yet = apply("and", none_yet, apply("not", bad))
            sites.append(site)

        names = graph.input_names or [""] * len(graph.inputs)
        for old, new, name in zip(graph.inputs, args, names):
            if _checked(old):
                probe = _probe(Tensor(new, builder))
                finite[id(old)] = apply("is_finite", probe)
                note(apply("not", finite[id(old)]), probe, Site("input", name, "", None))
        for node in graph.nodes:
            fresh = copy_node(node, env)
            builder.append(fresh)
            env.update((id(old), out) for old, out in zip(node.outputs, fresh.outputs))
            outs = [(old, out) for old, out in zip(node.outputs, fresh.outputs) if _checked(old)]
            if not outs:
                continue
            probes = [_probe(Tensor(out, builder)) for _, out in outs]
            for (old, _), probe in zip(outs, probes):
                finite[id(old)] = apply("is_finite", probe)
            if node.op in NEVER_CULPRITS:
                continue
            all_out = finite[id(outs[0][0])]
            probe = probes[0]
            for (old, _), p in zip(outs[1:], probes[1:]):  # the first non-finite result's probe
                probe = apply("select", all_out, p, probe)
                all_out = apply("and", all_out, finite[id(old)])
            bad = apply("not", all_out)
            for value in node.inputs:
                if id(value) in finite:
                    bad = apply("and", bad, finite[id(value)])
            source = node.source if backward_op(node) is not None else describe(node)
            note(bad, probe, Site(node.op, node.path, source, backward_op(node)))
        outputs = [env[id(v)] for v in graph.outputs] + [first.value, probe_of_first.value]
    names = list(graph.input_names) if graph.input_names is not None else None
    return builder.finish(outputs, name=graph.name, input_names=names), sites


def probe_outputs(graph: Graph) -> Graph:
    """``graph`` with one more output: a ``bool[]`` that is true when every floating-point output
    is finite (the cheap check run on every call; :func:`instrument` locates the culprit)."""
    with Builder(record_source=False) as builder:
        args = [builder.add_input(v.type) for v in graph.inputs]
        env: dict[int, Value] = {id(old): new for old, new in zip(graph.inputs, args)}
        for node in graph.nodes:
            fresh = copy_node(node, env)
            builder.append(fresh)
            env.update((id(old), out) for old, out in zip(node.outputs, fresh.outputs))
        ok = apply("constant", value=np.asarray(True))
        for value in graph.outputs:
            if _checked(value):
                ok = apply("and", ok, apply("is_finite", _probe(Tensor(env[id(value)], builder))))
        outputs = [env[id(v)] for v in graph.outputs] + [ok.value]
    names = list(graph.input_names) if graph.input_names is not None else None
    return builder.finish(outputs, name=graph.name, input_names=names)


@register("check-finite")
def check_finite(graph: Graph) -> Graph:
    """Append two outputs locating the first op whose result is NaN/Inf while its operands are
    finite: the site index (-1: none) and that result's max |value| (see kaun_ir.debug)."""
    return instrument(graph)[0]

"""Rematerialisation: recompute forward values in the backward pass instead of keeping them.

A differentiated graph keeps every forward value its backward part reads (the *residuals*)
alive from the moment it is computed until the backward pass reaches it: for a deep network,
all activations at once. :func:`rematerialize` splits the forward values into *segments* (the
layers of a model, by layer path) and, for each segment, recomputes the residuals its policy
does not save from the values that enter the segment, right where the backward pass first
needs them.

Why the recomputation must be tied to the cotangent: XLA is free to compute a value as soon as
its operands exist, and its common-subexpression elimination merges computations with equal
operands. A recomputation whose operands are the forward values is therefore either merged back
into the forward pass or scheduled next to it — no memory is saved (this is what happens to
``jax.checkpoint`` on XLA CPU: its ``optimization_barrier`` is expanded into control
dependencies early in XLA CPU's pipeline, and CSE then merges the recomputation with the
original; the compiled program has the same dot count and the same temporary memory as without
it). Here each value entering a recomputed segment is first passed through
``select(t == t, x, x + t)``, where ``t`` is one element of the cotangent that reaches the
segment: equal to ``x`` bit for bit (the other branch is taken only when ``t`` is NaN, when the
gradient is NaN anyway), but an operand XLA can neither see through nor compute before the
backward pass arrives there.

Policies say which residuals of a segment are saved rather than recomputed:
``"nothing"`` (only the values entering the segment are kept), ``"dots"`` (also the results
of ``dot_general`` and ``convolution``, the expensive ops) and layer-path patterns
(``RematPolicy.save_paths("*.attn.*")``: ``fnmatch`` patterns on the producing node's path).

``kn.remat(f, policy)`` marks the nodes of ``f`` (a layer-path component ``remat:<policy>:<k>``) and
``kn.grad`` rematerialises marked segments; the ``remat`` pass (``remat{policy=dots depth=1}``,
``train.make(..., remat=...)``) makes every layer at the given depth of the layer path a segment.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kaun_ir import dtypes
from kaun_ir.ir.builder import Builder, current_builder, location, scope
from kaun_ir.ir.clone import with_inputs
from kaun_ir.ir.core import Graph, Node, Value, path_components
from kaun_ir.ir.provenance import RECOMPUTE, Provenance, backward_op, is_seed
from kaun_ir.surface.tensor import Tensor, apply

__all__ = ["RematPolicy", "remat", "rematerialize", "MARK"]

#: prefix of the layer-path component with which kn.remat marks a segment
MARK = "remat:"
_SAVEABLE_DOTS = ("dot_general", "convolution")
#: the top-level scopes of a training step that are not layers of the model
_NOT_MODEL = ("loss", "optimizer", "rng")


@dataclass(frozen=True)
class RematPolicy:
    """Which residuals of a rematerialised segment are saved (the rest is recomputed).

    ``spec`` is ``"nothing"``, ``"dots"`` or ``"paths:<pattern>|<pattern>..."``; build the last
    with :meth:`save_paths`. A string of the same form is accepted wherever a policy is.
    """

    spec: str = "nothing"

    def __post_init__(self):
        if self.spec not in ("nothing", "dots") and not (
            self.spec.startswith("paths:") and len(self.spec) > 6
        ):
            raise ValueError(
                f"remat policy must be 'nothing', 'dots' or 'paths:<pattern>|...', got {self.spec!r}"
            )

    @staticmethod
    def save_paths(*patterns: str) -> RematPolicy:
        """Save the values made by nodes whose layer path matches one of the ``fnmatch`` patterns."""
        if not patterns or any(not isinstance(p, str) or not p or "|" in p for p in patterns):
            raise ValueError(f"save_paths needs non-empty patterns without '|', got {patterns!r}")
        return RematPolicy("paths:" + "|".join(patterns))

    def saves(self, node: Node) -> bool:
        """Whether a forward node's results are kept rather than recomputed."""
        if self.spec == "nothing":
            return False
        if self.spec == "dots":
            return node.op in _SAVEABLE_DOTS
        return any(fnmatch.fnmatchcase(node.path, p) for p in self.spec[6:].split("|"))


def as_policy(policy: Any) -> RematPolicy:
    """A :class:`RematPolicy` from a policy, a spec string, or a list of path patterns."""
    if isinstance(policy, RematPolicy):
        return policy
    if policy is None:
        return RematPolicy("nothing")
    if isinstance(policy, str):
        return RematPolicy(policy)
    if isinstance(policy, (list, tuple)):
        return RematPolicy.save_paths(*policy)
    raise TypeError(
        f"a remat policy is 'nothing', 'dots', a list of layer-path patterns or a RematPolicy, got {policy!r}"
    )


def remat(f: Callable, policy: Any = "nothing") -> Callable:
    """``f`` whose forward values are recomputed in the backward pass instead of kept (like
    ``jax.checkpoint``), except those ``policy`` saves (``"nothing"``, ``"dots"``, layer-path
    patterns). Same value and, up to XLA's fusion choices, the same gradients bit for bit.

    The nodes of ``f`` get the layer-path component ``remat:<policy>:<k>`` (the ``k``-th call in
    the trace; the IR shows the segment) and ``kn.grad`` / ``kn.vjp`` recompute the segment's
    residuals where the backward pass first needs them.
    """
    spec = as_policy(policy).spec.replace(".", "/")  # a path component holds no dot

    def rematerialized(*args, **kwargs):
        builder = current_builder()
        if builder is None:  # nothing is differentiated outside a trace
            return f(*args, **kwargs)
        # each call is its own segment: number the calls within the trace
        with scope(f"{MARK}{spec}:{builder.next_count('remat')}"):
            return f(*args, **kwargs)

    rematerialized.__name__ = getattr(f, "__name__", "f")
    rematerialized.__doc__ = getattr(f, "__doc__", None)
    return rematerialized


def has_marks(graph: Graph) -> bool:
    """Whether ``kn.remat`` marked any node of ``graph``."""
    return any(MARK in node.path for node in graph.nodes)


def _marked_segment(path: str) -> tuple[str, RematPolicy] | None:
    tokens = path.split(".")
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i].startswith(MARK):
            spec = tokens[i][len(MARK) :].rsplit(":", 1)[0]
            return ".".join(tokens[: i + 1]), RematPolicy(spec.replace("/", "."))
    return None


def _segment(node: Node, policy: RematPolicy | None, depth: int):
    marked = _marked_segment(node.path)
    if marked is not None:
        return marked
    if policy is not None and depth > 0:
        parts = path_components(node.path)
        if len(parts) >= depth:
            return "/".join(parts[:depth]), policy
    return None


def rematerialize(graph: Graph, policy: Any = None, depth: int = 0, min_bytes: int = 0) -> Graph:
    """``graph`` (forward and backward nodes, as reverse mode builds them) with the residuals of
    each segment recomputed in the backward pass; see the module docstring.

    Segments: the nodes ``kn.remat`` marked, and, when ``policy`` is given and ``depth > 0``,
    every group of nodes sharing the first ``depth`` components of their layer path (``depth=0``
    with a policy: :func:`auto_depth`). With ``min_bytes``, ``graph`` is returned unchanged when
    the residuals to recompute hold fewer bytes in all (what rematerialising could take off the
    peak at most).
    """
    policy = as_policy(policy) if policy is not None else None
    if policy is not None and depth == 0:
        depth = auto_depth(graph)
    parts = _Parts(graph, policy, depth)
    plans: dict[int, list[_Plan]] = {}
    for key, (values, consumer) in _residuals(graph, parts).items():
        plan = _plan(key, values, consumer, parts)
        if plan is not None:
            plans.setdefault(id(consumer), []).append(plan)
    if not plans or residual_bytes(plans) < min_bytes:
        return graph
    return _rebuild(graph, plans, parts)


def auto_depth(graph: Graph) -> int:
    """1 (the model's top-level layers are the segments), or 2 when one top-level layer holds
    most of the model's nodes (the loss and the optimiser left out) and its own layers split it
    further (``kn.models``' decoders: the blocks are the layers of one top-level ``layers``):
    segments of a few blocks' size, not one segment whose recomputation is all live at once."""
    top: dict[str, int] = {}
    inner: dict[str, set[str]] = {}
    for node in graph.nodes:
        parts = path_components(node.path)
        if parts and parts[0] not in _NOT_MODEL:
            top[parts[0]] = top.get(parts[0], 0) + 1
            if len(parts) > 1:
                inner.setdefault(parts[0], set()).add(parts[1])
    if not top:
        return 1
    largest = max(top, key=top.get)
    return 2 if top[largest] * 2 > sum(top.values()) and len(inner.get(largest, ())) >= 4 else 1


def residual_bytes(plans: dict[int, list[_Plan]]) -> int:
    """Bytes of the residuals the plans recompute."""
    return sum(v.type.nbytes for group in plans.values() for plan in group for v in plan.values)


class _Parts:
    """The backward part of a differentiated graph (the *deep* nodes: those downstream of a
    cotangent) and the segment of every forward node."""

    def __init__(self, graph: Graph, policy: RematPolicy | None, depth: int):
        self.position = {id(node): k for k, node in enumerate(graph.nodes)}
        names = graph.input_names or [""] * len(graph.inputs)
        self.deep: set[int] = {id(v) for v, name in zip(graph.inputs, names) if name.startswith("cotangent")}
        self.deep_nodes: set[int] = set()
        for node in graph.nodes:
            if is_seed(node) or any(id(v) in self.deep for v in node.inputs):
                self.deep_nodes.add(id(node))
                self.deep.update(id(o) for o in node.outputs)
        self.segment_of: dict[int, tuple[str, RematPolicy]] = {}
        for node in graph.nodes:
            if id(node) not in self.deep_nodes:
                seg = _segment(node, policy, depth)
                if seg is not None:
                    self.segment_of[id(node)] = seg

    def key_of(self, node: Node | None) -> str | None:
        """The segment of a forward node; None for backward nodes, arguments and unsegmented nodes."""
        if node is None or id(node) in self.deep_nodes or id(node) not in self.segment_of:
            return None
        return self.segment_of[id(node)][0]

    def saved(self, node: Node) -> bool:
        """Whether the policy of ``node``'s segment keeps its results (backward nodes never are)."""
        return backward_op(node) is None and self.segment_of[id(node)][1].saves(node)


@dataclass(frozen=True)
class _Plan:
    """The recomputation of one segment's residuals, placed before their first backward reader."""

    key: str  # the segment
    values: list[Value]  # the residuals recomputed
    clone: list[Node]  # the forward nodes recomputed, in graph order
    boundary: list[Value]  # the values entering the recomputation
    trigger: Value  # the cotangent the recomputation waits for


def _residuals(graph: Graph, parts: _Parts) -> dict[str, tuple[list[Value], Node]]:
    """Per segment: the forward values that backward nodes read and the policy does not save,
    and the first backward node reading one of them."""
    found: dict[str, tuple[list[Value], Node]] = {}
    listed: set[int] = set()
    for node in graph.nodes:
        if id(node) not in parts.deep_nodes:
            continue
        for value in node.inputs:
            key = parts.key_of(value.node)
            if key is None or parts.saved(value.node):
                continue
            values, consumer = found.get(key, ([], node))
            if id(value) not in listed:
                listed.add(id(value))
                values.append(value)
            if parts.position[id(node)] < parts.position[id(consumer)]:
                consumer = node
            found[key] = (values, consumer)
    return found


def _plan(key: str, values: list[Value], consumer: Node, parts: _Parts) -> _Plan | None:
    """The nodes recomputing ``values`` from the values entering segment ``key``; None when the
    first reader has no floating-point cotangent to tie the recomputation to."""
    trigger = next(
        (v for v in consumer.inputs if id(v) in parts.deep and dtypes.is_float(v.type.dtype)), None
    )
    if trigger is None:
        return None
    clone: list[Node] = []
    cloned: set[int] = set()
    boundary: list[Value] = []
    seen: set[int] = set()
    wanted = {id(v) for v in values}
    stack = list(values)
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        producer = value.node
        inside = parts.key_of(producer) == key and (id(value) in wanted or not parts.saved(producer))
        if not inside:
            boundary.append(value)
            continue
        if id(producer) not in cloned:
            cloned.add(id(producer))
            clone.append(producer)
            stack.extend(producer.inputs)
    clone.sort(key=lambda n: parts.position[id(n)])
    return _Plan(key, values, clone, boundary, trigger)


def _rebuild(graph: Graph, plans: dict[int, list[_Plan]], parts: _Parts) -> Graph:
    """``graph`` with each plan's recomputation inserted before its first backward reader, whose
    backward nodes read the recomputed residuals instead of the forward ones."""
    with Builder(record_source=False) as builder:
        env: dict[int, Value] = {id(old): builder.add_input(old.type) for old in graph.inputs}
        recomputed: dict[int, Value] = {}
        for node in graph.nodes:
            for plan in plans.get(id(node), []):
                recomputed.update(_recompute(builder, plan, env))
            if id(node) in parts.deep_nodes:
                inputs = [recomputed.get(id(v), env[id(v)]) for v in node.inputs]
            else:
                inputs = [env[id(v)] for v in node.inputs]
            fresh = with_inputs(node, inputs)
            builder.append(fresh)
            env.update((id(old), new) for old, new in zip(node.outputs, fresh.outputs))
        outputs = [env[id(v)] for v in graph.outputs]
    result = builder.finish(outputs, name=graph.name, input_names=graph.input_names)
    return Graph.from_outputs(result.inputs, result.outputs, graph.name, graph.input_names)


def _recompute(builder: Builder, plan: _Plan, env: dict[int, Value]) -> dict[int, Value]:
    """Append the plan's recomputation; returns the new value of each recomputed residual."""
    local = _tie(builder, plan.key, plan.boundary, env, env[id(plan.trigger)])
    for old in plan.clone:
        fresh = with_inputs(old, [local.get(id(v), env.get(id(v))) for v in old.inputs])
        if fresh is not old:  # a node of constants only is kept as it is, already in the graph
            builder.append(fresh)
        local.update((id(o), n) for o, n in zip(old.outputs, fresh.outputs))
    return {id(value): local[id(value)] for value in plan.values}


def _tie(
    builder: Builder, key: str, boundary: Sequence[Value], env: dict, trigger: Value
) -> dict[int, Value]:
    """Each float value entering the segment, made to depend on one element of ``trigger``."""
    local: dict[int, Value] = {}
    with location(provenance=Provenance(RECOMPUTE, key)):
        t = Tensor(trigger, builder)
        if t.ndim:
            t = apply(
                "slice", t, start_indices=(0,) * t.ndim, limit_indices=(1,) * t.ndim, strides=(1,) * t.ndim
            )
            t = apply("reshape", t, shape=())
        same = apply("compare", t, t, direction="EQ")
        for value in boundary:
            if value.node is None or not dtypes.is_float(value.type.dtype):
                continue  # graph inputs (parameters, data) live anyway; integers are cheap
            x = Tensor(env[id(value)], builder)
            tx = t if t.dtype == x.dtype else apply("convert", t, dtype=x.dtype)
            if x.ndim:
                pred = apply("broadcast_in_dim", same, shape=x.shape, broadcast_dimensions=())
                tx = apply("broadcast_in_dim", tx, shape=x.shape, broadcast_dimensions=())
            else:
                pred = same
            local[id(value)] = apply("select", pred, x, apply("add", x, tx)).value
    return local

"""What the backward body of a differentiated scan reads from the forward scan (the steps of
``scan_plan`` that choose residuals): where the body's operands sit and which carry gradients
(:func:`positions`), which of the gradient graph's values are backward, varying or invariant
(:func:`groups`), the walk that selects the backward body's nodes and residuals
(:class:`Selection`), the residuals a few cheap ops recompute instead
(:meth:`Selection.recompute_cheap`), and the residuals a ``y`` stack already holds
(:func:`shifted_carries`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kaun_ir import dtypes
from kaun_ir.ir import optable
from kaun_ir.ir.core import Graph, TensorType, Value

__all__ = ["Positions", "Selection", "groups", "positions", "shifted_carries", "stacked_anyway"]


@dataclass
class Positions:
    """Where the body's operands and results sit, and which of them are differentiated (all as
    positions among the body's inputs, or its outputs for ``float_ys``)."""

    n_in: int
    n_out: int
    consts: range
    carry: range
    xs: range
    float_carry: list[int]
    diff_consts: list[int]
    diff_xs: list[int]
    float_ys: list[int]


def positions(body: Graph, num_consts: int, num_carry: int, wrt: tuple[bool, ...]) -> Positions:
    """Step 1: the body's operand groups, and which operands and results carry gradients."""
    n_in, n_out = len(body.inputs), len(body.outputs)
    types = body.input_types
    consts = range(num_consts)
    carry = range(num_consts, num_consts + num_carry)
    xs = range(num_consts + num_carry, n_in)
    return Positions(
        n_in=n_in,
        n_out=n_out,
        consts=consts,
        carry=carry,
        xs=xs,
        float_carry=[i for i in carry if _is_float(types[i])],
        diff_consts=[i for i in consts if wrt[i] and _is_float(types[i])],
        diff_xs=[i for i in xs if wrt[i] and _is_float(types[i])],
        float_ys=[k for k in range(num_carry, n_out) if _is_float(body.outputs[k].type)],
    )


def groups(grad: Graph, pos: Positions) -> tuple[set[int], set[int]]:
    """Step 2: the ids of the *backward* values (they read a cotangent) and of the *varying*
    forward values (they depend on the carry or on ``x``); every other value is invariant."""
    backward_ids = {id(v) for v in grad.inputs[pos.n_in :]}
    varying_ids = {id(grad.inputs[i]) for i in list(pos.carry) + list(pos.xs)}
    for node in grad.nodes:
        ins = [id(v) for v in node.inputs]
        if any(i in backward_ids for i in ins):
            backward_ids.update(id(o) for o in node.outputs)
        elif any(i in varying_ids for i in ins):
            varying_ids.update(id(o) for o in node.outputs)
    return backward_ids, varying_ids


#: how many ops (declared "cheap": element-wise work and the broadcasts of its operands) the
#: backward body may recompute for one residual instead of loading it
_CHEAP_NODES = 8


def _cheap(op: str) -> bool:
    """Whether the backward body may recompute ``op`` instead of loading a saved residual."""
    opdef = optable.table().get(op)
    return opdef is not None and opdef.has("cheap")


def _recomputable(
    grad: Graph, residual_ids: set, varying_ids: set, pinned: set, carry_idx: set, free: set = frozenset()
) -> set:
    """Ids of the residuals (and the varying values between them) that the backward body
    recomputes with a few element-wise ops from the residuals it keeps or the ``free`` values
    (stacked anyway: see :func:`stacked_anyway`): ``1 - sigmoid(z)``, ``tanh(c)`` from the
    gates and the carried ``c``, an RNN's ``1 - h * h`` from its ``h``. Later residuals go
    first, so values derived from others are dropped in favour of their sources."""
    kept = set(residual_ids) | set(free)
    recompute: set[int] = set()

    def chain(value: Value, found: list, budget: list) -> bool:
        if id(value) in kept or id(value) in recompute:
            return True
        if value.node is None:
            return value.index not in carry_idx  # a const or an x slice; a carry not kept is not
        if id(value) not in varying_ids:
            return True  # loop-invariant: the backward body recomputes those anyway
        if not _cheap(value.node.op) or budget[0] == 0:
            return False
        budget[0] -= 1
        found.append(id(value))
        return all(chain(v, found, budget) for v in value.node.inputs)

    for node in reversed(grad.nodes):
        for out in node.outputs:
            if id(out) not in residual_ids or id(out) in pinned or not _cheap(node.op):
                continue
            kept.discard(id(out))
            found: list[int] = []
            budget = [_CHEAP_NODES]
            if all(chain(v, found, budget) for v in node.inputs):
                recompute.add(id(out))
                recompute.update(found)
            else:
                kept.add(id(out))
    return recompute


def _is_float(t: TensorType) -> bool:
    return dtypes.is_float(t.dtype)


@dataclass
class Selection:
    """Step 3: what the backward body computes (``nodes``) and what the forward scan must hand
    it (``residuals``: varying values and carries it reads), grown by walking back from the
    values the backward body needs. Varying values in ``recompute`` are computed again instead
    of saved."""

    varying_ids: set[int]
    carry: range
    nodes: set[int] = field(default_factory=set)
    residuals: set[int] = field(default_factory=set)
    recompute: set[int] = field(default_factory=set)
    _seen: set[int] = field(default_factory=set)
    _roots: list[Value] = field(default_factory=list)

    def walk(self, values: Iterable[Value]) -> None:
        """Select what computing ``values`` in the backward body takes."""
        stack: list[Value] = list(values)
        self._roots.extend(stack)
        while stack:
            value = stack.pop()
            if id(value) in self._seen:
                continue
            self._seen.add(id(value))
            if value.node is None:
                if value.index in self.carry:
                    self.residuals.add(id(value))
                continue
            if id(value) in self.varying_ids and id(value) not in self.recompute:
                self.residuals.add(id(value))
                continue
            if id(value.node) not in self.nodes:
                self.nodes.add(id(value.node))
                stack.extend(value.node.inputs)

    def recompute_cheap(self, grad: Graph, pinned: set[int], free: set[int] = frozenset()) -> None:
        """Step 5: drop the residuals a few cheap ops recompute from the others (``pinned`` ones
        stay: hoisted terms read them stacked), and select again with their nodes."""
        recompute = _recomputable(grad, self.residuals, self.varying_ids, pinned, set(self.carry), free)
        if not recompute:
            return
        self.recompute.update(recompute)
        roots = self._roots
        self.nodes, self.residuals, self._seen, self._roots = set(), set(), set(), []
        self.walk(roots)

    def residual_values(self, grad: Graph) -> list[Value]:
        """The residuals in a fixed order: the carried values first, then by node."""
        residuals = [grad.inputs[i] for i in self.carry if id(grad.inputs[i]) in self.residuals]
        residuals += [o for node in grad.nodes for o in node.outputs if id(o) in self.residuals]
        return residuals


def stacked_anyway(grad: Graph, pos: Positions) -> set[int]:
    """Ids of the varying values the forward scan stacks anyway: its ``y`` outputs, and each carry
    entering an iteration whose new value is a ``y`` (see :func:`shifted_carries`)."""
    n_carry = len(pos.carry)
    ys = {id(grad.outputs[y]) for y in range(n_carry, pos.n_out)}
    entering = {id(grad.inputs[i]) for i in pos.carry if id(grad.outputs[i - pos.carry.start]) in ys}
    return ys | entering


def shifted_carries(grad: Graph, pos: Positions, residuals: list[Value]) -> dict[int, tuple[int | None, int]]:
    """The residuals the forward scan need not stack because a ``y`` stack holds them already:
    a value the body returns as a ``y`` (an Elman RNN's ``h``, whose ``tanh`` derivative reads
    it), and a carry as it enters an iteration when the body returns the carry's new value as a
    ``y`` too (an RNN's ``h``, read by the weight gradient ``h_{t-1}^T @ dpre_t``): the stack of
    the entering carry is that y's stack moved by one iteration, the initial carry first. Maps
    residual index -> (carry position or None for the y itself, y position)."""
    n_carry = len(pos.carry)
    ys = {id(grad.outputs[y]): y - n_carry for y in range(pos.n_out - 1, n_carry - 1, -1)}
    found: dict[int, tuple[int | None, int]] = {}
    for j, r in enumerate(residuals):
        if id(r) in ys:
            found[j] = (None, ys[id(r)])
        elif r.node is None and r.index in pos.carry:
            k = r.index - pos.carry.start
            if id(grad.outputs[k]) in ys:
                found[j] = (k, ys[id(grad.outputs[k])])
    return found

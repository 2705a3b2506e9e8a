"""The rewrite rules of the ``layout`` pass: transposes absorbed, sunk, hoisted and cancelled.

The rules read how many users each value has (:data:`USES`), so that a rule never duplicates
work; :func:`run_to_fixpoint` is the driver that keeps those counts fresh, built on the rewrite
driver's sweep (``passes/rewrite.py``). Two tables: :data:`ABSORB` (phase 1 of the pass) and
:data:`SINK` (phase 2: the same without folding transposes into convolution specs, which phase 2
has just assigned). Every rule is exact: a transpose only permutes elements.

- ``dot-absorb-transpose``: ``dot_general(transpose(x, p), y)`` reads ``x`` directly, the
  transpose folded into the batch/contracting dimension numbers. Only when the result's axis
  order is unchanged (the free axes of ``x`` keep their relative order), else it is left.
- ``convolution-absorb-transpose`` (``ABSORB`` only): a transpose feeding either operand of a
  ``convolution`` folds into ``lhs_spec``/``rhs_spec``; a transpose of a convolution's
  (single-use) result folds into ``out_spec``.
- ``transpose-sink``: ``f(transpose(x, p), transpose(y, p), broadcast(b))`` ->
  ``transpose(f(x, y, broadcast'(b)), p)`` (broadcasts and scalars are re-laid out for free).
  Fires only when it does not add transposes (at least one transposed operand has no other
  user, or all its users move it too), so unary ops move a transpose down towards the next
  one, where they meet. Also through ``reduce_window`` and ``select_and_scatter_add`` (the
  window attributes permuted); an operand that is not transposed is transposed the other way
  when it is smaller than the transposes that go away (a max-pool gradient's source, 4x
  smaller than the pooled activation: the pool's gradient then runs in the chosen layout).
- ``reduce-absorb-transpose``: ``reduce(transpose(x, p))`` reduces ``x`` over the permuted
  axes when the kept axes keep their order.
- ``transpose-hoist``: ``transpose(f(transpose(x, p), z), q)`` ->
  ``f(transpose(x, p.q), transpose(z, q))`` when ``f``'s result has no other user and at
  least as many transposes vanish (compose to the identity) as are made; this is how
  gradients (which arrive in the user's layout) meet the transposes of phase 2.
- ``transpose-transpose``, ``transpose-identity`` and the reshape chains re-laid-out
  broadcasts leave behind: reused from ``canonicalize``.

The third table, ``FLATTEN`` (phase 2 with ``flatten=true``), is in ``passes/layout_flatten.py``.
"""

from __future__ import annotations

from kaun_ir.errors import RewriteError
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import with_trait
from kaun_ir.passes.canonicalize import RULES as CANONICAL_RULES
from kaun_ir.passes.rewrite import DEFAULT_MAX_SWEEPS, Rewriter, RuleTable, _sweep

# Shape-preserving ops applied element by element (operands of the result's shape, or scalars):
# a transpose moves through them unchanged (the op table's "elementwise" trait).
ELEMENTWISE = with_trait("elementwise")


# ----------------------------------------------------------------------------- permutations


def inverse(perm) -> tuple[int, ...]:
    """The inverse permutation: ``transpose(transpose(x, perm), inverse(perm)) == x``."""
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def is_identity(perm) -> bool:
    """Whether ``perm`` leaves every axis where it is."""
    return tuple(perm) == tuple(range(len(perm)))


def compose(p1, p2) -> tuple[int, ...]:
    """The permutation of ``transpose(transpose(x, p1), p2)``."""
    return tuple(p1[j] for j in p2)


# ----------------------------------------------------------------------------- driver with use counts


class _Uses:
    """Users per value of the graph being swept; values made during the sweep count as shared."""

    def __init__(self):
        self.counts: dict[int, int] = {}
        self.users: dict[int, list[str]] = {}
        self.nodes: dict[int, list[Node]] = {}

    def reset(self, graph: Graph) -> None:
        counts: dict[int, int] = {}
        users: dict[int, list[str]] = {}
        nodes: dict[int, list[Node]] = {}
        for node in graph.walk():
            for v in node.inputs:
                counts[id(v)] = counts.get(id(v), 0) + 1
                users.setdefault(id(v), []).append(node.op)
                nodes.setdefault(id(v), []).append(node)
        for v in graph.outputs:
            counts[id(v)] = counts.get(id(v), 0) + 1
            users.setdefault(id(v), []).append("return")
        self.counts, self.users, self.nodes = counts, users, nodes

    def single(self, value: Value) -> bool:
        return self.counts.get(id(value), 2) == 1

    def all_users_in(self, value: Value, ops) -> bool:
        """Every user of ``value`` is one of ``ops`` (False for values made in this sweep)."""
        users = self.users.get(id(value))
        return bool(users) and all(op in ops for op in users)

    def user_nodes(self, value: Value) -> list[Node]:
        """The nodes reading ``value`` at the start of the sweep (empty for values made in it)."""
        return self.nodes.get(id(value), [])


USES = _Uses()


def run_to_fixpoint(graph: Graph, rules: RuleTable, counts: dict[str, int], label: str) -> Graph:
    """``graph`` with ``rules`` applied until none fires, :data:`USES` fresh for every sweep;
    adds the number of times each rule fired to ``counts``."""
    # A transpose moves by about one op per sweep (values made in a sweep count as shared until
    # the next), so a long chain needs sweeps in proportion to its length: a ResNet training
    # step of ~1 100 nodes converges after 67. The bound still ends a rule table that cycles.
    limit = max(DEFAULT_MAX_SWEEPS, len(graph.nodes))
    for _ in range(limit):
        USES.reset(graph)
        fired: dict[str, int] = {}
        graph = _sweep(graph, rules, fired, DEFAULT_MAX_SWEEPS, label)
        for name, n in fired.items():
            counts[name] = counts.get(name, 0) + n
        if not fired:
            return graph
    raise RewriteError(f"{label} did not converge after {limit} sweeps over @{graph.name}")


# ----------------------------------------------------------------------------- rules

SINK = RuleTable()  # phase 2: move transposes, never touch convolution specs
ABSORB = RuleTable()  # phase 1: SINK plus absorption into convolutions

# reused from canonicalize: transpose-identity, transpose-transpose, and the reshape chains that
# re-laid-out broadcasts leave behind (reshape-identity, reshape-reshape)
for _rule in CANONICAL_RULES.for_op("transpose") + CANONICAL_RULES.for_op("reshape"):
    SINK.add(_rule)


def transpose_of(value: Value):
    """The transpose node that produces ``value``, or None."""
    node = value.node
    return node if node is not None and node.op == "transpose" else None


@SINK.rule("dot-absorb-transpose", "dot_general")
def _dot_absorb(node: Node, rw: Rewriter):
    """dot_general(transpose(x, p), ...) -> dot_general(x, ...) with permuted dimension numbers."""
    attrs = node.attr_dict
    operands = list(node.inputs)
    changed = False
    for side, pos in (("lhs", 0), ("rhs", 1)):
        t = transpose_of(operands[pos])
        if t is None:
            continue
        p = t.attr("permutation")
        batch, contracting = attrs[f"{side}_batch"], attrs[f"{side}_contracting"]
        free = [a for a in range(len(p)) if a not in batch and a not in contracting]
        mapped = [p[a] for a in free]
        if mapped != sorted(mapped):
            continue  # the result's axis order would change
        attrs[f"{side}_batch"] = tuple(p[a] for a in batch)
        attrs[f"{side}_contracting"] = tuple(p[a] for a in contracting)
        operands[pos] = t.inputs[0]
        changed = True
    return rw.emit("dot_general", *operands, **attrs) if changed else None


@ABSORB.rule("convolution-absorb-transpose", "convolution")
def _conv_absorb(node: Node, rw: Rewriter):
    """convolution(transpose(x, p), transpose(w, q)) -> convolution(x, w) with permuted specs."""
    attrs = node.attr_dict
    operands = list(node.inputs)
    changed = False
    for spec, pos in (("lhs_spec", 0), ("rhs_spec", 1)):
        t = transpose_of(operands[pos])
        if t is None:
            continue
        p = t.attr("permutation")
        # role k was read from the transposed axis spec[k], which is x's axis p[spec[k]]
        attrs[spec] = tuple(p[a] for a in attrs[spec])
        operands[pos] = t.inputs[0]
        changed = True
    return rw.emit("convolution", *operands, **attrs) if changed else None


@ABSORB.rule("convolution-absorb-transpose", "transpose")
def _conv_absorb_result(node: Node, rw: Rewriter):
    """transpose(convolution(x, w), q) -> convolution(x, w) with out_spec permuted (single use)."""
    conv = node.inputs[0].node
    if conv is None or conv.op != "convolution" or not USES.single(node.inputs[0]):
        return None
    attrs = conv.attr_dict
    inv = inverse(node.attr("permutation"))
    # role k sat at conv axis out_spec[k], which the transpose moves to axis inv[out_spec[k]]
    attrs["out_spec"] = tuple(inv[a] for a in attrs["out_spec"])
    return rw.emit("convolution", *conv.inputs, **attrs)


def _relaid_broadcast(value: Value, p, rw: Rewriter):
    """A builder of ``b'`` with ``transpose(b', p) == value`` for a broadcast_in_dim ``value``, or None.

    Size-1 axes of the broadcast operand are dropped first (a reshape), so that a bias
    ``reshape(b, [C,1,1])`` broadcast into NCHW re-lays out into NHWC.
    """
    node = value.node
    if node is None or node.op != "broadcast_in_dim":
        return None
    x = node.inputs[0]
    kept = [i for i, n in enumerate(x.shape) if n != 1]
    dims = tuple(p[node.attr("broadcast_dimensions")[i]] for i in kept)
    if list(dims) != sorted(dims):
        return None
    shape = tuple(value.shape[j] for j in inverse(p))

    def build():
        source = x
        if len(kept) != len(x.shape):
            source = rw.emit("reshape", x, shape=tuple(x.shape[i] for i in kept))
        return rw.emit("broadcast_in_dim", source, shape=shape, broadcast_dimensions=dims)

    return build


# ops that work the same in any axis order, as (operand positions that follow the layout,
# attributes holding one entry per axis); other operands are scalars
_WINDOW_ATTRS = ("window_dimensions", "window_strides", "base_dilations", "window_dilations", "padding")
MOVABLE = {op: (None, ()) for op in ELEMENTWISE}  # None: every non-scalar operand
MOVABLE["reduce_window"] = ((0,), _WINDOW_ATTRS)
MOVABLE["select_and_scatter_add"] = ((0, 1), ("window_dimensions", "window_strides", "padding"))


_MOVES_TRANSPOSES = set(MOVABLE) | {"transpose"}


def _laid_out(node: Node) -> list[int]:
    """Positions of ``node``'s operands that share the result's axis order."""
    positions, _ = MOVABLE[node.op]
    if positions is not None:
        return list(positions)
    rank = len(node.outputs[0].shape)
    return [i for i, v in enumerate(node.inputs) if len(v.shape) == rank and rank > 0]


def _permuted_attrs(node: Node, p) -> dict:
    """``node``'s attributes for operands ``x`` instead of ``transpose(x, p)``."""
    attrs = node.attr_dict
    inv = inverse(p)
    for name in MOVABLE[node.op][1]:
        # the transposed axis j is x's axis p[j]: x's axis a takes the entry of axis inv[a]
        attrs[name] = tuple(attrs[name][inv[a]] for a in range(len(p)))
    return attrs


@SINK.rule("transpose-sink", *sorted(MOVABLE))
def _sink(node: Node, rw: Rewriter):
    """f(transpose(x, p), transpose(y, p), broadcast) -> transpose(f(x, y, broadcast'), p).

    For elementwise ops, reduce_window and select_and_scatter_add (window attributes permuted);
    only where no transpose is added (one of the transposed operands has no other user).
    """
    if len(node.outputs) != 1:
        return None
    laid = _laid_out(node)
    perm = None
    for i in laid:
        t = transpose_of(node.inputs[i])
        if t is not None:
            perm = t.attr("permutation")
            break
    if perm is None:
        return None
    builders, single, removed, added = [], 0, 0, 0
    for i, v in enumerate(node.inputs):
        t = transpose_of(v)
        if i not in laid:
            builders.append(lambda v=v: v)
        elif t is not None and t.attr("permutation") == perm:
            # a transpose shared by ops that all move it down goes away once they all have
            gone = USES.single(v) or USES.all_users_in(v, _MOVES_TRANSPOSES)
            single += gone
            removed += v.type.size if gone else 0
            builders.append(lambda t=t: t.inputs[0])
        else:
            build = _relaid_broadcast(v, perm, rw)
            if build is None:
                if node.op != "select_and_scatter_add" or i != 1:
                    return None
                # the pool gradient's source (4x smaller than its operand under a 2x2 pool) is
                # transposed the other way, where that moves fewer elements than go away;
                # transpose-hoist leaves this shape alone (it would undo it)
                added += v.type.size
                build = lambda v=v: rw.emit("transpose", v, permutation=inverse(perm))  # noqa: E731
            builders.append(build)
    if single == 0 or added >= removed:  # no transpose goes away, or a larger one is made
        return None
    inner = rw.emit(node.op, *(b() for b in builders), **_permuted_attrs(node, perm))
    return rw.emit("transpose", inner, permutation=perm)


@SINK.rule("transpose-hoist", "transpose")
def _hoist(node: Node, rw: Rewriter):
    """transpose(f(transpose(x, p), z), q) -> f(transpose(x, p.q), transpose(z, q)) when transposes meet.

    Only when ``f``'s result has no other user, an operand's transposes cancel, and no more
    transposes result. This is how gradients (which arrive in the user's layout) meet the
    transposes around re-laid-out convolutions.
    """
    f = node.inputs[0].node
    if f is None or f.op not in MOVABLE or len(f.outputs) != 1 or not USES.single(node.inputs[0]):
        return None
    q = node.attr("permutation")
    laid = _laid_out(f)
    builders, meet, dead, made = [], 0, 0, 0
    for i, v in enumerate(f.inputs):
        t = transpose_of(v)
        if i not in laid:
            builders.append(lambda v=v: v)
            continue
        if t is not None and is_identity(compose(t.attr("permutation"), q)):
            if f.op == "select_and_scatter_add" and i == 1:
                return None  # the shape transpose-sink makes for a pool gradient: keep it
            meet += 1
            dead += USES.single(v)  # an inner transpose without other users goes away
            builders.append(lambda t=t: t.inputs[0])
            continue
        build = _relaid_broadcast(v, inverse(q), rw)
        if build is not None:
            builders.append(build)
            continue
        made += 1
        builders.append(lambda v=v: rw.emit("transpose", v, permutation=q))
    # transposes: -1 (the outer one) - dead + made; never more, and only where two meet
    if meet == 0 or made > 1 + dead:
        return None
    # f's attributes were for its operands in f's order; they are now transposed by q
    return rw.emit(f.op, *(b() for b in builders), **_permuted_attrs(f, inverse(q)))


@SINK.rule("reduce-absorb-transpose", "reduce")
def _reduce_absorb(node: Node, rw: Rewriter):
    """reduce(transpose(x, p), dims) -> reduce(x, p[dims]) when the kept axes keep their order."""
    t = transpose_of(node.inputs[0])
    if t is None:
        return None
    p = t.attr("permutation")
    dims = node.attr("dimensions")
    kept = [p[a] for a in range(len(p)) if a not in dims]
    if kept != sorted(kept):
        return None
    return rw.emit(
        "reduce", t.inputs[0], **{**node.attr_dict, "dimensions": tuple(sorted(p[a] for a in dims))}
    )


for _rule in SINK.rules():
    ABSORB.add(_rule)

"""The rewrite driver: tables of small declarative rules, applied to a fixpoint.

A rule matches one op and returns the values that replace the node's results, or None::

    RULES = RuleTable()

    @RULES.rule("negate-negate", "negate")
    def _negate_negate(node, rw):
        \"\"\"neg(neg(x)) -> x.\"\"\"
        inner = rw.producer(node.inputs[0], "negate")
        return inner.inputs[0] if inner is not None else None

    graph = apply_rules(graph, RULES, label="canonicalize").graph

``node`` is the node being looked at, its operands already rewritten; ``rw`` (a
:class:`Rewriter`) recognises constants (:meth:`Rewriter.splat`, :meth:`Rewriter.constant_array`)
and builds replacement nodes (:meth:`Rewriter.emit`, :meth:`Rewriter.constant`). New nodes get
their types from the op table's rules (``OpDef.infer_types``) and the layer path and source
line of the node they replace. A replacement must have exactly the types of the results it
replaces; the driver checks this.

The driver sweeps the nodes in order: operands are read through the substitutions made so far,
the rules of the node's op are tried in table order and the first that returns something wins.
Nodes a rule creates are looked at again in the next sweep; sweeps repeat until one changes
nothing (the fixpoint) or ``max_sweeps`` is reached, which raises :class:`RewriteError` naming
the rules that kept firing. Regions (``while`` bodies) are rewritten with the same rules. Dead
nodes are removed after every sweep. The input graph is never modified: nodes are immutable,
and a node whose operands changed is rebuilt.

Statistics: :func:`last_statistics` returns ``{rule name: rewrites applied}`` of the latest
top-level :func:`apply_rules` in this thread, and every run reports the counters
``"rewrites applied"`` and ``"rewrites applied by <rule>"`` through
:func:`kaun_ir.passes.statistic` (shown by ``kaun-ir opt --stats``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import KaunError, RewriteError
from kaun_ir.ir.builder import infer_or_raise
from kaun_ir.ir.clone import copy_node
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import get
from kaun_ir.passes.registry import statistic

#: Sweeps before :func:`apply_rules` gives up. A sweep collapses whole chains (each node sees
#: its operands' rewritten producers), so real graphs converge in a handful.
DEFAULT_MAX_SWEEPS = 64


@dataclass(frozen=True)
class Rule:
    """One rewrite: ``match(node, rw)`` for nodes of ``op`` returns replacement values or None.

    ``name`` (kebab-case) is what statistics count; ``doc`` says what it does (the docstring of
    ``match`` by default).
    """

    name: str
    op: str
    match: Callable[[Node, Rewriter], Any]
    doc: str = ""


@dataclass
class RuleTable:
    """An ordered table of rules keyed by op name (the rules of one op are tried in order)."""

    by_op: dict[str, list[Rule]] = field(default_factory=dict)

    def add(self, rule: Rule) -> Rule:
        """Register ``rule`` for its op; returns it."""
        self.by_op.setdefault(rule.op, []).append(rule)
        return rule

    def rule(self, name: str, *ops: str, doc: str | None = None):
        """Decorator: register ``fn(node, rw)`` as rule ``name`` for each op in ``ops``."""
        if not ops:
            raise ValueError(f"rule {name!r} must name at least one op")

        def wrap(fn):
            text = doc if doc is not None else " ".join((fn.__doc__ or "").split())
            for op in ops:
                self.add(Rule(name, op, fn, text))
            return fn

        return wrap

    def for_op(self, op: str) -> list[Rule]:
        """The rules registered for ``op``, in registration order (empty if none)."""
        return self.by_op.get(op, [])

    def rules(self) -> list[Rule]:
        """Every rule once (a rule registered for several ops appears once per op)."""
        return [r for rules in self.by_op.values() for r in rules]

    def names(self) -> list[str]:
        """The rule names, each once, in registration order."""
        seen: dict[str, None] = {}
        for r in self.rules():
            seen.setdefault(r.name)
        return list(seen)


# ----------------------------------------------------------------------------- the rewriter


def _bits(array: np.ndarray) -> np.ndarray:
    """The raw bits of an array (so -0.0 and +0.0, or two NaNs, are told apart exactly)."""
    arr = np.ascontiguousarray(array)
    if arr.dtype == dtypes.bool_:
        return arr.view(np.uint8)
    return arr.view(f"u{arr.dtype.itemsize}")


def splat_of(array: np.ndarray) -> np.ndarray | None:
    """The single value (a 0-d array) of a non-empty array whose elements are bit-identical."""
    arr = np.asarray(array)
    if arr.size == 0:
        return None
    flat = _bits(arr).reshape(-1)
    if not np.all(flat == flat[0]):
        return None
    return arr.reshape(-1)[0:1].reshape(())


class Rewriter:
    """What a rule sees besides the node: constant recognition and a builder for new nodes.

    Nodes made by :meth:`emit` are staged; the driver keeps them only if the rule returns a
    replacement (a rule that builds something and then returns None leaves no trace).
    """

    def __init__(self, node: Node):
        self.node = node
        self.staged: list[Node] = []

    # -- looking at operands

    @staticmethod
    def producer(value: Value, op: str | None = None) -> Node | None:
        """The node defining ``value`` (None for graph inputs), if its op is ``op`` (when given)."""
        node = value.node
        if node is None or (op is not None and node.op != op):
            return None
        return node

    @staticmethod
    def constant_array(value: Value) -> np.ndarray | None:
        """The array of ``value`` if a ``constant`` node defines it (read-only), else None."""
        node = value.node
        if node is None or node.op != "constant":
            return None
        return node.attr("value").array

    def splat(self, value: Value) -> np.ndarray | None:
        """The one value (0-d array, ``value``'s dtype) of a constant whose elements are all equal.

        Recognised: a ``constant`` node (non-empty, every element bit-identical) and a
        ``broadcast_in_dim`` of such a constant (a broadcast of a scalar constant is how traced
        graphs spell ``zeros``/``ones``). Returns None otherwise, and for empty results.
        """
        if value.type.size == 0:
            return None
        node = value.node
        if node is not None and node.op == "broadcast_in_dim":
            value = node.inputs[0]
            node = value.node
        array = self.constant_array(value)
        return None if array is None else splat_of(array)

    def splat_equals(self, value: Value, number: float, *, negative_zero: bool | None = None) -> bool:
        """True if ``value`` is a splat constant equal to ``number`` in its own dtype.

        ``number`` must be exactly representable (0, 1, True ...). ``negative_zero`` also
        demands the sign bit of a float zero: True for -0.0, False for +0.0, None for either.
        """
        scalar = self.splat(value)
        if scalar is None:
            return False
        if not bool(scalar == np.asarray(number).astype(scalar.dtype)):
            return False
        if negative_zero is not None and dtypes.is_float(scalar.dtype):
            return bool(np.signbit(scalar.astype(np.float64))) == negative_zero
        return True

    # -- building replacements

    def emit(self, op: str, *inputs: Value, **attrs: Any) -> Value | tuple[Value, ...]:
        """A new node ``op(*inputs, **attrs)`` typed by the op table; returns its result(s).

        It gets the layer path and source line of the node being replaced. Ops with regions
        cannot be built here.
        """
        opdef = get(op)
        if opdef.regions:
            raise RewriteError(f"rules cannot build {op} nodes (ops with regions)")
        attrs = opdef.check_attrs(attrs)
        types = infer_or_raise(opdef, [v.type for v in inputs], attrs, self.node.path)
        node = Node(
            op,
            inputs,
            attrs,
            types,
            path=self.node.path,
            source=self.node.source,
            provenance=self.node.provenance,
        )
        self.staged.append(node)
        return node.outputs[0] if len(node.outputs) == 1 else node.outputs

    def constant(self, array: np.ndarray) -> Value:
        """A new ``constant`` node holding ``array`` (dtype and shape as given)."""
        return self.emit("constant", value=np.asarray(array))


# ----------------------------------------------------------------------------- the driver


@dataclass
class RewriteResult:
    """What :func:`apply_rules` returns: the new graph, rewrites per rule, sweeps taken."""

    graph: Graph
    counts: dict[str, int]
    sweeps: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())


_LAST = threading.local()


def last_statistics() -> dict[str, int]:
    """``{rule name: rewrites applied}`` of the latest top-level :func:`apply_rules` in this thread.

    Only rules that fired appear. Empty before any run.
    """
    return dict(getattr(_LAST, "counts", {}))


def apply_rules(
    graph: Graph, rules: RuleTable, *, max_sweeps: int = DEFAULT_MAX_SWEEPS, label: str = "rewrite"
) -> RewriteResult:
    """Rewrite ``graph`` with ``rules`` to a fixpoint (see the module docstring).

    ``label`` names the pass in errors. Raises :class:`RewriteError` if a sweep still rewrites
    after ``max_sweeps`` sweeps. ``graph`` is not modified.
    """
    if max_sweeps < 1:
        raise ValueError(f"max_sweeps must be at least 1, got {max_sweeps}")
    counts: dict[str, int] = {}
    result, sweeps = _fixpoint(graph, rules, counts, max_sweeps, label)
    _LAST.counts = dict(counts)
    total = sum(counts.values())
    if total:
        statistic("rewrites applied", total)
        for name, n in counts.items():
            statistic(f"rewrites applied by {name}", n)
    return RewriteResult(result, counts, sweeps)


def _fixpoint(
    graph: Graph, rules: RuleTable, counts: dict[str, int], max_sweeps: int, label: str
) -> tuple[Graph, int]:
    for sweep in range(1, max_sweeps + 1):
        fired: dict[str, int] = {}
        graph = _sweep(graph, rules, fired, max_sweeps, label)
        for name, n in fired.items():
            counts[name] = counts.get(name, 0) + n
        if not fired:
            return graph, sweep
    firing = ", ".join(f"{name} ({n})" for name, n in sorted(fired.items()))
    raise RewriteError(
        f"{label} did not converge after {max_sweeps} sweeps over @{graph.name}; rules still "
        f"rewriting in the last sweep: {firing} (a rule undoes another's rewrite or keeps "
        "rewriting its own result)"
    )


def _sweep(graph: Graph, rules: RuleTable, fired: dict[str, int], max_sweeps: int, label: str) -> Graph:
    """One pass over the nodes; returns the rewritten graph with dead nodes removed."""
    env: dict[int, Value] = {}  # id(old value) -> value replacing it
    nodes: list[Node] = []
    for node in graph.nodes:
        regions = tuple(_region(r, rules, fired, max_sweeps, label) for r in node.regions)
        current = copy_node(node, env, regions)
        replacement = _try_rules(current, rules, nodes, label)
        if replacement is None:
            nodes.append(current)
            replacement = current.outputs
        else:
            fired[replacement[0]] = fired.get(replacement[0], 0) + 1
            replacement = replacement[1]
        for old, new in zip(node.outputs, replacement):
            if old is not new:
                env[id(old)] = new
    outputs = [env.get(id(v), v) for v in graph.outputs]
    live = {id(n) for n in Graph.from_outputs(graph.inputs, outputs).nodes}
    return Graph(graph.inputs, outputs, [n for n in nodes if id(n) in live], graph.name, graph.input_names)


def _region(region: Graph, rules: RuleTable, fired: dict[str, int], max_sweeps: int, label: str) -> Graph:
    counts: dict[str, int] = {}
    result, _ = _fixpoint(region, rules, counts, max_sweeps, label)
    for name, n in counts.items():
        fired[name] = fired.get(name, 0) + n
    return result if counts else region


def _try_rules(node: Node, rules: RuleTable, sink: list[Node], label: str):
    """``(rule name, replacement values)`` of the first rule that fires on ``node``, else None."""
    for rule in rules.for_op(node.op):
        rw = Rewriter(node)
        try:
            result = rule.match(node, rw)
        except RewriteError:  # already names the rule that misbehaved
            raise
        except (KaunError, TypeError, ValueError) as err:  # e.g. it built an ill-typed node
            where = f"{label}: rule {rule.name!r} on {node.op}{' at ' + node.path if node.path else ''}"
            raise RewriteError(f"{where} failed: {err}") from err
        if result is None:
            continue
        values = (result,) if isinstance(result, Value) else tuple(result)
        _check_replacement(node, rule, values, label)
        sink.extend(rw.staged)
        return rule.name, values
    return None


def _check_replacement(node: Node, rule: Rule, values: Sequence[Value], label: str) -> None:
    where = f"{label}: rule {rule.name!r} on {node.op}{' at ' + node.path if node.path else ''}"
    if len(values) != len(node.outputs):
        raise RewriteError(f"{where} returned {len(values)} value(s) for {len(node.outputs)} result(s)")
    for i, (old, new) in enumerate(zip(node.outputs, values)):
        if not isinstance(new, Value):
            raise RewriteError(f"{where} returned a {type(new).__name__} for result {i}, not a Value")
        if new.type != old.type:
            raise RewriteError(
                f"{where} replaced result {i} of type {old.type} by a value of type {new.type}"
            )
        if new is old:
            raise RewriteError(f"{where} returned the node's own result {i} (return None for 'no change')")


def rule_docs(rules: RuleTable) -> dict[str, str]:
    """``{rule name: description}``, for documentation and ``--help`` texts."""
    out: dict[str, str] = {}
    for r in rules.rules():
        out.setdefault(r.name, r.doc)
    return out


__all__ = [
    "DEFAULT_MAX_SWEEPS",
    "RewriteError",
    "RewriteResult",
    "Rewriter",
    "Rule",
    "RuleTable",
    "apply_rules",
    "last_statistics",
    "rule_docs",
    "splat_of",
]

"""Why a node exists when no line of user code wrote it: the provenance of transformation-made nodes.

Reverse mode adds nodes the user never wrote (each op's backward rule, the cotangent seed) and
rematerialisation adds the nodes that tie a recomputation to the backward pass. Passes need to
tell these apart from forward nodes (``remat`` recomputes only forward values; ``check-finite``
names the forward op whose backward rule overflowed), so each such node records a
:class:`Provenance` beside its layer path and source line. The record is data on the node,
declared here in the IR, so the transformation that writes it and the passes that read it do
not import each other.

A node's ``source`` stays the user's ``file:line`` (for a backward node: the line of the forward
op it differentiates); :func:`describe` joins the two for messages and viewers.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a node of an op's reverse (VJP) rule; ``detail`` is the forward op differentiated
BACKWARD = "backward"
#: the cotangent seed (``1.0`` for a loss): where the backward pass starts
SEED = "seed"
#: a node tying a rematerialised segment to the cotangent; ``detail`` is the segment
RECOMPUTE = "recompute"

KINDS = (BACKWARD, SEED, RECOMPUTE)


@dataclass(frozen=True, slots=True)
class Provenance:
    """The transformation that made a node: ``kind`` (one of :data:`KINDS`) and a ``detail``
    whose meaning depends on the kind (the forward op for ``backward``, the segment for
    ``recompute``, empty for ``seed``)."""

    kind: str
    detail: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"provenance kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.detail, str):
            raise TypeError(f"provenance detail must be a string, got {self.detail!r}")


def backward_of(op: str) -> Provenance:
    """The provenance of the nodes that ``op``'s reverse rule builds."""
    return Provenance(BACKWARD, op)


def backward_op(node) -> str | None:
    """The forward op whose reverse rule made ``node``; None for any other node."""
    provenance = node.provenance
    return provenance.detail if provenance is not None and provenance.kind == BACKWARD else None


def is_seed(node) -> bool:
    """Whether ``node`` is a cotangent seed made by reverse mode."""
    return node.provenance is not None and node.provenance.kind == SEED


def describe(node) -> str:
    """``node``'s source line with its provenance, for messages and viewers:
    ``"model.py:12 (backward of sqrt)"``, ``"(cotangent seed)"``, or just ``"model.py:12"``."""
    provenance = node.provenance
    if provenance is None:
        return node.source
    if provenance.kind == BACKWARD:
        return f"{node.source or '?'} (backward of {provenance.detail})"
    if provenance.kind == SEED:
        return "(cotangent seed)"
    return f"(remat: recomputation of {provenance.detail} waits for the cotangent)"

"""The op declaration record: one :class:`OpDef` per primitive.

Every primitive is declared once, as one :class:`OpDef` holding all of its rules:

- ``infer(*types, **attrs)``: the type rule, returning the output ``TensorType`` (or a tuple of
  them); it raises ``ShapeError`` / ``TypeError`` with the reason, and the tracer adds the op,
  the operand types and the layer path to the message;
- ``reference(*arrays, **attrs)``: a NumPy implementation, the semantics the tests hold the XLA
  result to and what ``kn.ir.interpret`` runs;
- ``emit(em, node, *operands)``: the StableHLO, written through ``ops.emit.Emitter``;
- ``samples(rng)``: example inputs and attributes from which the tests are generated;
- ``vjp`` (autodiff) or ``nondiff`` (why the op has no derivative); an op whose derivative needs
  values computed inside its forward pass (``scan``: per-iteration residuals) also declares
  ``vjp_forward``, which emits the forward computation and returns ``(outputs, residuals)``;
  reverse mode then calls ``vjp`` with ``residuals=``;
- ``batch`` (``kn.vmap``) or ``nobatch`` (why the op has no batching rule).

Forward mode (``kn.jvp``) has no rule of its own: it is derived from the VJP rules (see
``kaun_ir/transforms/jvp.py``), so ``vjp`` / ``nondiff`` covers it too.

A batching rule is ``batch(batched, size, *operands, **attrs) -> outputs`` (``regions=`` is
passed too when the op carries sub-graphs). ``batched[i]`` says whether operand i carries the
batch axis, always at axis 0 (an operand that does not carry it has its per-example shape);
at least one operand is batched. The rule returns the op's outputs for the whole batch, every
one with the batch axis at axis 0 (size ``size``). The helpers in ``ops/batching.py`` cover the
common cases.

Every rule builds its result with other ops through :mod:`.rules` (``apply``, ``where``,
``compare``, ``astype`` ..., on the table's own floor) and the arithmetic operators of the
tensors it is handed; nothing in the op table imports the tracing surface above it.
An op that cannot have a rule says why in ``nobatch`` (a test checks that every op declares
exactly one of the two).

The StableHLO text helpers the ``emit`` rules write with live in :mod:`.emit`.

Besides its rules, a declaration states facts that passes and the cost model query instead of
keeping their own lists of op names:

- ``traits``: a set of names from :data:`TRAITS` (``{"elementwise", "commutative", "cheap"}``);
  every built-in op declares it, ``traits=()`` included (a test checks that none is left out);
- ``stablehlo``: the StableHLO (or CHLO, Shardy) op this op is, one to one, which is also what
  the StableHLO importer turns back into it; ``"stablehlo." + name`` unless stated; None where
  the op lowers to several ops or to an op that another entry owns (``argmax``: a ``reduce``);
- ``flops(inputs, outputs, **attrs) -> int``: the arithmetic the op does, from its operand and
  result types (``kaun-ir dump --stats``); None for ops that do none (data movement).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kaun_ir.ir.core import TensorType, freeze_attr


@dataclass(frozen=True)
class Sample:
    """One generated test case of an op: input arrays, attributes and a comparison tolerance."""

    inputs: tuple[np.ndarray, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    rtol: float | None = None
    atol: float | None = None
    name: str = ""
    regions: tuple = ()  # sub-graphs, for ops that carry them


#: The trait vocabulary: name -> what an op declaring it promises.
TRAITS: dict[str, str] = {
    "elementwise": (
        "every output element is computed from the operands' elements at the same index only; "
        "the operands have the result's shape or are 0-d (broadcast), so the result has their "
        "broadcast shape and the op commutes with any rearrangement of the elements (transpose, "
        "reshape, slice, concatenation): the layout pass moves transposes through it, "
        "fuse-optimizer hoists it onto scalars and fuses chains of it"
    ),
    "commutative": "two operands whose order does not change the result: f(a, b) == f(b, a)",
    "cheap": (
        "cheap enough to recompute rather than to store: scan's VJP recomputes short chains of "
        "these ops in the backward body instead of saving their results as residuals"
    ),
}

#: ``OpDef.regions`` of an op that carries any number (at least one) of regions (``case``)
VARIADIC = -1

#: The default of ``OpDef.stablehlo``: the StableHLO op of the op's own name.
SAME_NAME = "stablehlo.<name>"


def per_output_element(inputs: Sequence[TensorType], outputs: Sequence[TensorType], **attrs: Any) -> int:
    """A FLOP rule: one operation per result element (elementwise arithmetic)."""
    return sum(t.size for t in outputs)


def per_input_element(inputs: Sequence[TensorType], outputs: Sequence[TensorType], **attrs: Any) -> int:
    """A FLOP rule: one operation per element of the first operand (reductions)."""
    return inputs[0].size


@dataclass(frozen=True)
class OpDef:
    """The single declaration of a primitive (see the module docstring)."""

    name: str
    arity: int | None  # None: variadic
    infer: Callable[..., TensorType | tuple[TensorType, ...]]
    reference: Callable[..., Any]
    emit: Callable[..., str | list[str]]
    samples: Callable[[np.random.Generator], Iterable[Sample]]
    attrs: tuple[str, ...] = ()  # required attribute names
    # number of sub-graphs the op carries (``while``: cond and body); VARIADIC: one or more
    regions: int = 0
    optional: dict[str, Any] = field(default_factory=dict)  # optional attribute -> default
    doc: str = ""
    vjp: Callable[..., Any] | None = None
    nondiff: str | None = None  # why the op has no derivative, when it has none
    batch: Callable[..., Any] | None = None  # the batching rule (kn.vmap)
    nobatch: str | None = None  # why the op has no batching rule, when it has none
    # forward pass that also returns residuals for ``vjp`` (ops with regions: see the docstring)
    vjp_forward: Callable[..., Any] | None = None
    # names from TRAITS; None: not declared (user primitives may leave it so: no trait)
    traits: frozenset[str] | None = None
    stablehlo: str | None = SAME_NAME  # the one StableHLO op this op is, or None
    flops: Callable[..., int] | None = None  # (inputs, outputs, **attrs) -> FLOPs; None: no arithmetic

    def __post_init__(self) -> None:
        if self.traits is not None:
            unknown = sorted(set(self.traits) - set(TRAITS))
            if unknown:
                raise ValueError(
                    f"{self.name}: unknown trait(s) {', '.join(unknown)} (known: {', '.join(TRAITS)})"
                )
            # declarations write a set or a tuple; stored frozen (a dataclass field conversion)
            object.__setattr__(self, "traits", frozenset(self.traits))
        if self.stablehlo == SAME_NAME:
            object.__setattr__(self, "stablehlo", "stablehlo." + self.name)

    def has(self, trait: str) -> bool:
        """Whether this op declares ``trait`` (a name from :data:`TRAITS`; ValueError otherwise)."""
        if trait not in TRAITS:
            raise ValueError(f"unknown trait {trait!r} (known: {', '.join(TRAITS)})")
        return self.traits is not None and trait in self.traits

    def count_flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType], attrs: dict) -> int:
        """The FLOPs of one application to operands of types ``inputs`` (0 without a FLOP rule)."""
        return 0 if self.flops is None else int(self.flops(tuple(inputs), tuple(outputs), **attrs))

    def check_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults and reject unknown or missing attributes (TypeError)."""
        missing = [a for a in self.attrs if a not in attrs]
        unknown = [a for a in attrs if a not in self.attrs and a not in self.optional]
        if missing or unknown:
            parts = []
            if missing:
                parts.append(f"missing attribute(s) {', '.join(missing)}")
            if unknown:
                known = ", ".join(self.attrs + tuple(self.optional)) or "none"
                parts.append(f"unknown attribute(s) {', '.join(unknown)} (known: {known})")
            raise TypeError(f"{self.name}: {'; '.join(parts)}")
        full = dict(self.optional)
        full.update(attrs)
        return {k: freeze_attr(v) for k, v in full.items()}

    def infer_types(
        self, types: Sequence[TensorType], attrs: dict[str, Any], regions: Sequence[Any] = ()
    ) -> tuple[TensorType, ...]:
        """The result types of this op for operand ``types``, ``attrs`` and ``regions``; ``TypeError``
        for a wrong operand or region count, the op's own errors for bad types or attributes."""
        if self.arity is not None and len(types) != self.arity:
            raise TypeError(f"{self.name} takes {self.arity} operand(s), got {len(types)}")
        if self.regions == VARIADIC:
            if not regions:
                raise TypeError(f"{self.name} carries one or more regions, got none")
        elif len(regions) != self.regions:
            raise TypeError(f"{self.name} carries {self.regions} region(s), got {len(regions)}")
        out = (
            self.infer(*types, regions=tuple(regions), **attrs)
            if self.regions
            else self.infer(*types, **attrs)
        )
        return (out,) if isinstance(out, TensorType) else tuple(out)

    def run_reference(
        self, arrays: Sequence[np.ndarray], attrs: dict[str, Any], regions: Sequence[Any] = ()
    ) -> tuple[np.ndarray, ...]:
        """Run the op's NumPy reference implementation; returns its results as a tuple of arrays."""
        out = (
            self.reference(*arrays, regions=tuple(regions), **attrs)
            if self.regions
            else self.reference(*arrays, **attrs)
        )
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

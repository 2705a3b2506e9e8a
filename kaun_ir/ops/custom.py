"""Functions with user-defined derivatives: ``custom_vjp`` and ``custom_jvp``.

Both are region-carrying ops, so a function with a custom derivative stays one node in the IR:
the text form prints its regions, passes and viewers see it, and it round-trips.

``custom_vjp`` (attributes ``name``, ``num_outputs``) carries three regions:

- ``primal``: operands -> outputs, what runs when nothing is differentiated (the emission
  inlines it);
- ``fwd``: operands -> (outputs, residuals), what runs instead when reverse mode needs the
  derivative;
- ``bwd``: (residuals, one cotangent per output) -> one cotangent per operand.

``custom_jvp`` (attribute ``name``) carries two: ``primal`` and ``jvp``, (operands, one tangent
per operand) -> (outputs, one tangent per output). Its reverse mode is the transpose of the
``jvp`` region in its tangents (built by reverse mode itself), and forward mode, derived from
reverse mode (``kaun_ir/transforms/jvp.py``), transposes once more, giving the rule's tangents back.
The user-facing decorators are in ``kaun_ir/transforms/custom.py``.
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.interp import interpret
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.batching import materialize
from kaun_ir.ops.rules import apply, batch_graph, binary, gradient_graph, inline, trace, zeros


def _types(values) -> str:
    return "(" + ", ".join(map(str, values)) + ")"


def _expect(what: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ShapeError(f"{what} has types {_types(got)}, expected {_types(want)}")


def _vjp_infer(*operands: TensorType, regions, name, num_outputs):
    primal, fwd, bwd = regions
    _expect("the primal region's inputs", primal.input_types, operands)
    _expect("the fwd region's inputs", fwd.input_types, operands)
    outs = primal.output_types
    if len(outs) != num_outputs:
        raise ShapeError(f"num_outputs is {num_outputs} but the primal region returns {len(outs)} values")
    _expect("the fwd region's outputs (before the residuals)", fwd.output_types[:num_outputs], outs)
    residuals = fwd.output_types[num_outputs:]
    _expect(
        "the bwd region's inputs (residuals, then one cotangent per output)",
        bwd.input_types,
        tuple(residuals) + tuple(outs),
    )
    _expect("the bwd region's outputs (one cotangent per operand)", bwd.output_types, operands)
    return outs


def _jvp_infer(*operands: TensorType, regions, name):
    primal, rule = regions
    _expect("the primal region's inputs", primal.input_types, operands)
    _expect(
        "the jvp region's inputs (operands, then one tangent per operand)",
        rule.input_types,
        operands + operands,
    )
    outs = primal.output_types
    _expect("the jvp region's outputs (outputs, then one tangent per output)", rule.output_types, outs + outs)
    return outs


def _reference(*operands, regions, **attrs):
    return tuple(interpret(regions[0], *operands))


def _emit(em, node, *operands):
    return em.emit_graph(node.regions[0], list(operands))  # the primal, inline


def _vjp_forward(*operands, wrt, regions, name, num_outputs):
    results = inline(regions[1], operands)
    return results[:num_outputs], results[num_outputs:]


def _vjp(cts, outs, *operands, regions, residuals, name, num_outputs):
    if num_outputs == 1:
        cts, outs = [cts], [outs]
    cts = [c if c is not None else zeros(o.type) for c, o in zip(cts, outs)]
    results = inline(regions[2], list(residuals) + list(cts))
    return tuple(r if dtypes.is_float(x.dtype) else None for r, x in zip(results, operands))


def _jvp_vjp(cts, outs, *operands, regions, name):
    if not isinstance(outs, (list, tuple)):  # one output: reverse mode passes it alone
        cts, outs = [cts], [outs]
    rule = regions[1]
    n_in, n_out = len(operands), len(outs)
    wrt = [n_in + i for i, x in enumerate(operands) if dtypes.is_float(x.dtype)]
    of = [n_out + k for k, o in enumerate(outs) if dtypes.is_float(o.dtype)]
    if not wrt or not of:
        return (None,) * n_in
    # the rule is linear in the tangents: its transpose at tangent zero maps output cotangents
    # to operand cotangents
    transposed = gradient_graph(rule, wrt=wrt, of=of, seed_inputs=True, keep_outputs=False)
    tangents = [zeros(x.type) for x in operands]
    seeds = [cts[k - n_out] if cts[k - n_out] is not None else zeros(outs[k - n_out].type) for k in of]
    results = iter(inline(transposed, list(operands) + tangents + seeds))
    return tuple(next(results) if dtypes.is_float(x.dtype) else None for x in operands)


def _batch(op: str):
    def rule(batched, size, *operands, regions, **attrs):
        operands = materialize(operands, batched, size)
        new_regions = tuple(batch_graph(r, [True] * len(r.inputs), size, force=True)[0] for r in regions)
        return apply(op, *operands, regions=new_regions, **attrs)

    rule.__doc__ = (
        f"Batching rule of {op}: every region batched; every operand and result carries the batch axis."
    )
    return rule


def _softplus(v):
    return apply("log_plus_one", apply("exponential", -apply("abs", v))) + binary("maximum", v, 0.0)


def _sample_regions(kind: str, x: np.ndarray) -> tuple:
    """Regions of the samples: softplus with a custom VJP (twice the true one), or with a custom JVP."""
    t = TensorType(x.dtype, x.shape)
    if kind == "vjp":
        primal = trace(_softplus, [t], "primal", record_source=False)
        fwd = trace(lambda v: [_softplus(v), apply("logistic", v)], [t], "fwd", record_source=False)
        # a rule that differs from the true derivative (twice it), linear in the cotangent
        bwd = trace(lambda s, g: [g * s * 2.0], [t, t], "bwd", record_source=False)
        return primal, fwd, bwd
    primal = trace(_softplus, [t], "primal", record_source=False)
    rule = trace(lambda v, dv: [_softplus(v), apply("logistic", v) * dv], [t, t], "jvp", record_source=False)
    return primal, rule


def _samples_vjp(rng):
    x = rng.uniform(-2, 2, (3, 4)).astype(np.float64)
    yield Sample((x,), {"name": "softplus_scaled", "num_outputs": 1}, regions=_sample_regions("vjp", x))


def _samples_jvp(rng):
    x = rng.uniform(-2, 2, (2, 3)).astype(np.float64)
    yield Sample((x,), {"name": "softplus"}, regions=_sample_regions("jvp", x))


OPS = [
    OpDef(
        name="custom_vjp",
        traits=(),
        stablehlo=None,  # its primal region, inlined
        arity=None,
        regions=3,
        attrs=("name", "num_outputs"),
        infer=_vjp_infer,
        reference=_reference,
        emit=_emit,
        samples=_samples_vjp,
        vjp=_vjp,
        vjp_forward=_vjp_forward,
        batch=_batch("custom_vjp"),
        doc="A function with a user-defined VJP (``kn.custom_vjp``): regions primal, fwd (outputs "
        "and residuals) and bwd (residuals and output cotangents -> operand cotangents).",
    ),
    OpDef(
        name="custom_jvp",
        traits=(),
        stablehlo=None,  # its primal region, inlined
        arity=None,
        regions=2,
        attrs=("name",),
        infer=_jvp_infer,
        reference=_reference,
        emit=_emit,
        samples=_samples_jvp,
        vjp=_jvp_vjp,
        batch=_batch("custom_jvp"),
        doc="A function with a user-defined JVP (``kn.custom_jvp``): regions primal and jvp "
        "(operands and tangents -> outputs and tangents); reverse mode transposes the jvp region.",
    ),
]

"""``layout``: move transposes out of the way, and pick a data layout for convolution chains.

Two phases, both exact up to the order in which a reduction reading another layout adds (a
transpose only permutes elements; XLA may sum a re-laid-out reduction in another order):

1. **Transpose absorption** (always). The rules of ``passes/layout_rules.py`` applied to a
   fixpoint: transposes are folded into ``dot_general`` dimension numbers, ``convolution``
   specs and ``reduce`` dimensions, sunk through elementwise ops and pools, hoisted where they
   meet another transpose, and cancelled (``dot-absorb-transpose``,
   ``convolution-absorb-transpose``, ``transpose-sink``, ``reduce-absorb-transpose``,
   ``transpose-hoist``, and ``transpose-transpose``/``transpose-identity`` from
   ``canonicalize``). A rule never duplicates work: it reads how many users each value has.

2. **Layout assignment** (``prefer``): every 2-d ``convolution`` is rewritten to read and write
   the chosen activation layout (NCHW: lhs/out ``[N,C,H,W]``, kernel ``[O,I,H,W]``; NHWC:
   ``[N,H,W,C]`` and kernel ``[H,W,I,O]``), transposes inserted around it, then the phase-1 rules
   (without convolution absorption) push the transposes to the chain's boundaries, where they
   cancel or remain once: weights are transposed once, elementwise ops, bias broadcasts and
   pools run in the chosen layout.

``prefer``: ``auto`` (what is fastest on ``target``, for inference or for gradient graphs:
``AUTO_LAYOUT``), ``nchw``, ``nhwc``, or ``none`` (phase 1
only). ``target``: ``cpu``, ``gpu`` or ``auto``; a pass is ``Graph -> Graph`` and does not know
where the graph will run, so ``target=auto`` asks the runtime's backend
(``kaun_ir.runtime.backend_name()``, through :func:`kaun_ir.passes.target.backend`; only when
``prefer=auto``). The choice for auto is measured, see ``AUTO_LAYOUT``.

A pass result with more transposes than its input would be a pessimisation: the pass then
returns its input unchanged (phase 1) or the phase-1 result (phase 2 must not add transposes
inside a chain; transposes at the boundaries are what it is for, so phase 2 is not guarded).

3. **Flatten** (``flatten=true``, phase 2 only; the rules of ``passes/layout_flatten.py``):
   ``dot_general(reshape(transpose(x, p)), w)`` where the reshape merges the axes ``p`` moves
   (a chain re-laid out to NHWC, transposed back to NCHW order and flattened into a dense layer)
   reads ``reshape(x)`` and ``w`` with its rows permuted; a dot keeping the flattened axis free
   (the weight gradient) permutes its result; ``transpose(reshape(dot(g, w)))`` (the input
   gradient) permutes ``w`` instead (``dot-absorb-flatten-transpose``). Only where every user of
   the flatten is such a dot and the permuted weights/results hold fewer elements than the
   activation. The gradient dots sum the same products in the same order; the forward dot sums
   them in the permuted order.

Statistics: ``transposes before``, ``transposes after``, ``convolutions re-laid out`` and the
rewrite counters ``rewrites applied by <rule>``.
"""

from __future__ import annotations

from kaun_ir.ir.core import Graph, Node
from kaun_ir.passes.layout_flatten import FLATTEN
from kaun_ir.passes.layout_rules import ABSORB, SINK, inverse, run_to_fixpoint
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable
from kaun_ir.passes.target import backend

# What prefer=auto picks per target, for (inference graphs, graphs with gradient convolutions).
# Measured on the ``cnn`` workload (batch 64, 1x28x28, conv3x3 32 + relu + maxpool 2, conv3x3 64 +
# relu + maxpool 2, dense 10, f32), XLA CPU on 2 cores, ``kn.jit`` with pipeline
# ``canonicalize,fold,cse,dce,layout{prefer=X},cse,dce``, median of 9 x 30 steps:
#   forward            nchw 13.5 ms/step   nhwc 3.8 ms/step   (no layout pass 10.3)
#   forward+backward   nchw 70.8 ms/step   nhwc 80.6 ms/step  (kn.grad of a mean-square loss)
# so on CPU NHWC wins inference ~3x and NCHW wins training ~12% (the gradient graph keeps 11
# transposes in NHWC: the max-pool gradients mix NCHW cotangents with NHWC activations).
# GPU: not measured here; XLA GPU's usual answer is NHWC for f16/bf16 and about neutral for f32.
AUTO_LAYOUT = {"cpu": ("nhwc", "nchw"), "gpu": ("nhwc", "nhwc"), "tpu": ("nhwc", "nhwc")}


# ----------------------------------------------------------------------------- layout assignment


# physical axis order of every 4-d tensor a convolution touches: channels-first (NCHW for
# activations, OIHW for kernels) or channels-last (NHWC, and OHWI kernels: one permutation for
# all, so a kernel and the kernel gradient written by a backward convolution agree)
_TO_LAST = (0, 2, 3, 1)  # channels-first -> channels-last
_TO_FIRST = inverse(_TO_LAST)
_SPATIAL = {"nchw": (2, 3), "nhwc": (1, 2)}


def _assign(node: Node, rw: Rewriter, layout: str):
    """A 2-d convolution in the other layout rewritten to ``layout``, transposes around it, or None.

    "In the other layout": every operand and the result have their spatial axes where the other
    layout has them (the batch/feature roles may be swapped, as in backward convolutions).
    """
    if node.op != "convolution" or len(node.inputs[0].shape) != 4:
        return None
    a = node.attr_dict
    other = "nhwc" if layout == "nchw" else "nchw"
    specs = ("lhs_spec", "rhs_spec", "out_spec")
    if any(tuple(sorted(a[s][2:])) != _SPATIAL[other] for s in specs):
        return None
    p = _TO_LAST if layout == "nhwc" else _TO_FIRST
    inv = inverse(p)
    # a role at axis k of x sits at axis inv[k] of transpose(x, p)
    new = {s: tuple(inv[k] for k in a[s]) for s in specs}
    x, w = (rw.emit("transpose", v, permutation=p) for v in node.inputs)
    conv = rw.emit("convolution", x, w, **{**a, **new})
    return rw.emit("transpose", conv, permutation=inv)


def _assign_table(layout: str) -> RuleTable:
    table = RuleTable()
    table.rule("assign-layout", "convolution")(lambda node, rw: _assign(node, rw, layout))
    return table


def _transposes(graph: Graph) -> int:
    return graph.op_counts().get("transpose", 0)


def has_gradient_convolutions(graph: Graph) -> bool:
    """Whether ``graph`` holds a backward convolution (batch and feature roles swapped somewhere)."""
    return any(
        n.op == "convolution" and any(n.attr(s)[0] > n.attr(s)[1] for s in ("lhs_spec", "rhs_spec"))
        for n in graph.walk()
    )


def resolve(prefer: str, target: str, training: bool = False) -> str:
    """The layout ``prefer`` stands for on ``target`` (reads the runtime's backend only for auto/auto)."""
    if prefer != "auto":
        return prefer
    if target == "auto":
        target = backend()
    return AUTO_LAYOUT.get(target, ("none", "none"))[1 if training else 0]


@register(
    "layout",
    options={
        "prefer": Option(
            str,
            "auto",
            "layout of convolution chains: auto (fastest measured on target), nchw, nhwc, "
            "none (only absorb and cancel transposes)",
            choices=("auto", "nchw", "nhwc", "none"),
        ),
        "target": Option(
            str,
            "auto",
            "backend to choose for when prefer=auto: cpu, gpu, tpu, or auto (the runtime's)",
            choices=("auto", "cpu", "gpu", "tpu"),
        ),
        "flatten": (
            bool,
            True,
            "move a re-laid-out chain's last transpose, before a flatten into a dense layer, onto the "
            "dense weight (phase 2)",
        ),
    },
)
def layout(graph: Graph, prefer: str, target: str, flatten: bool = True) -> Graph:
    """Absorb and cancel transposes; put convolution chains in one layout (NCHW/NHWC)."""
    before = _transposes(graph)
    counts: dict[str, int] = {}
    result = run_to_fixpoint(graph, ABSORB, counts, "layout")
    if _transposes(result) > before:
        result, counts = graph, {}
    convolutions = any(n.op == "convolution" for n in graph.walk())
    chosen = resolve(prefer, target, has_gradient_convolutions(graph)) if convolutions else "none"
    if chosen != "none":
        assigned: dict[str, int] = {}
        staged = run_to_fixpoint(result, _assign_table(chosen), assigned, "layout")
        if assigned:
            statistic("convolutions re-laid out", assigned.get("assign-layout", 0))
            result = run_to_fixpoint(staged, FLATTEN if flatten else SINK, counts, "layout")
    for name, n in counts.items():
        statistic(f"rewrites applied by {name}", n)
    statistic("transposes before", before)
    statistic("transposes after", _transposes(result))
    return result

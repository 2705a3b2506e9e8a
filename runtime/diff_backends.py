"""Differential runs: one program compiled by two backends (XLA and IREE by default), run on the
same inputs, its outputs compared, and the first op whose value diverges named.

:func:`diff_graph` compiles one graph (already optimised: both compilers get the same StableHLO)
on each backend and compares every output. When an output differs beyond the tolerance it looks
for the first op responsible, the way the NaN finder does: the graph is compiled again with the
values of its nodes as extra outputs (in node order, a chunk of nodes per program, stopping at
the first chunk that holds a divergence), and the first node whose value differs beyond the
tolerance is named with its layer path and source line. ``kn.debug.diff_backends`` is the
function-level entry (``kn.jit``'s trace and pipeline), ``kaun-ir diff-backends`` the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kaun_ir.ir.core import Graph
from kaun_ir.runtime import backends
from kaun_ir.runtime.compilation import compile_graph

__all__ = ["BackendDiff", "OutputDiff", "diff_graph", "random_inputs"]

#: node values per program while looking for the first divergence
CHUNK = 256


@dataclass(frozen=True)
class OutputDiff:
    """How one output (or node value) differs between the two backends."""

    name: str  # "output 0", or the op's description
    shape: tuple
    dtype: str
    max_abs: float  # max |a - b|
    max_rel: float  # max |a - b| / max(|a|, tiny)
    ok: bool  # within the tolerance: |a - b| <= atol + rtol * |a| everywhere (NaNs in the same places)


@dataclass
class BackendDiff:
    """The result of a differential run: ``outputs`` (one :class:`OutputDiff` each),
    ``first_divergence`` (the first op whose value differs beyond the tolerance, None when every
    output agrees or no single op was found), ``backends``, ``rtol``, ``atol``."""

    backends: tuple[str, str]
    rtol: float
    atol: float
    outputs: list[OutputDiff] = field(default_factory=list)
    first_divergence: OutputDiff | None = None

    @property
    def ok(self) -> bool:
        """Whether every output agrees within the tolerance."""
        return all(o.ok for o in self.outputs)

    def table(self) -> str:
        """The comparison as a text table, the first divergence (if any) below it."""
        a, b = self.backends
        lines = [f"{a} vs {b} (rtol {self.rtol:g}, atol {self.atol:g})"]
        lines.append(f"{'output':<10} {'shape':<16} {'dtype':<9} {'max abs':>10} {'max rel':>10}  ok")
        for o in self.outputs:
            shape = "x".join(map(str, o.shape)) or "scalar"
            lines.append(
                f"{o.name:<10} {shape:<16} {o.dtype:<9} {o.max_abs:>10.3g} {o.max_rel:>10.3g}  "
                f"{'yes' if o.ok else 'NO'}"
            )
        if self.first_divergence is not None:
            d = self.first_divergence
            lines.append(f"first divergence: {d.name} (max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g})")
        elif not self.ok:
            lines.append("first divergence: no single op found (the outputs differ only where combined)")
        return "\n".join(lines)


def compare(name: str, a, b, rtol: float, atol: float) -> OutputDiff:
    """:class:`OutputDiff` of two arrays (``a``: the reference backend's)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "biu":
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        ok = bool(np.array_equal(a, b))
    else:
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        same_nan = np.isnan(a64) == np.isnan(b64)
        with np.errstate(invalid="ignore"):  # inf - inf: equal infinities are zeroed below
            diff = np.where(np.isnan(a64) | np.isnan(b64), 0.0, np.abs(a64 - b64))
        diff = np.where(np.isinf(a64) & (a64 == b64), 0.0, diff)
        ok = bool(same_nan.all() and (diff <= atol + rtol * np.abs(np.nan_to_num(a64))).all())
        a = a64
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = np.maximum(np.abs(np.nan_to_num(np.asarray(a, np.float64))), np.finfo(np.float32).tiny)
    max_rel = float((diff / scale).max()) if diff.size else 0.0
    return OutputDiff(name, tuple(a.shape), str(b.dtype), max_abs, max_rel, ok)


def _run(graph: Graph, backend: str, inputs: Sequence) -> list:
    return [np.asarray(x) for x in compile_graph(graph, backend=backend)(*inputs)]


def diff_graph(
    graph: Graph,
    inputs: Sequence,
    backends_: Sequence[str] = ("xla", "iree"),
    rtol: float = 1e-4,
    atol: float = 1e-5,
    locate: bool = True,
) -> BackendDiff:
    """Compile ``graph`` on both ``backends_``, run it on ``inputs`` (one array per graph input)
    and compare its outputs; with ``locate`` and a divergence, name the first op that diverges."""
    names = tuple(backends.resolve(b, "backends") for b in backends_)
    if len(names) != 2:
        raise ValueError(f"backends={tuple(backends_)!r}: give two backends to compare")
    inputs = [np.asarray(x) for x in inputs]
    report = BackendDiff(names, rtol, atol)
    first, second = (_run(graph, b, inputs) for b in names)
    report.outputs = [compare(f"output {i}", a, b, rtol, atol) for i, (a, b) in enumerate(zip(first, second))]
    if locate and not report.ok:
        report.first_divergence = first_divergence(graph, inputs, names, rtol, atol)
    return report


def first_divergence(graph: Graph, inputs: list, names: tuple, rtol: float, atol: float):
    """The :class:`OutputDiff` of the first node value that differs beyond the tolerance."""
    from kaun_ir.runtime.iree.executable import describe_node  # noqa: PLC0415 - IREE's module, on demand

    values = [(node, v) for node in graph.nodes if not node.regions for v in node.outputs]
    for start in range(0, len(values), CHUNK):
        chunk = values[start : start + CHUNK]
        probe = Graph(graph.inputs, [v for _, v in chunk], graph.nodes, name=graph.name)
        first, second = (_run(probe, b, inputs) for b in names)
        for (node, _), a, b in zip(chunk, first, second):
            found = compare(describe_node(node), a, b, rtol, atol)
            if not found.ok:
                return found
    return None


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """One seeded array per input of ``graph``: floats from N(0, 0.5), integers in [0, 2)
    (valid labels and indices for any model), booleans at random."""
    rng = np.random.default_rng(seed)
    out = []
    for v in graph.inputs:
        dtype, shape = np.dtype(v.type.dtype), v.type.shape
        if dtype.kind == "f" or dtype.name == "bfloat16":
            out.append((rng.standard_normal(shape) * 0.5).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(0, 2, shape).astype(dtype))
    return out

"""``lower-pool``: non-overlapping pooling windows as strided slices and elementwise ops.

Pooling with windows that tile the input (every window dimension equals its stride, no
padding, no dilation: ``max_pool2d(x, 2)``) needs no window machinery at all. For a window of
``K`` elements, the element at window offset ``k`` of every window is one strided ``slice`` of
the input (a "tap", shaped like the pooled result), and:

- ``reduce_window`` (forward pooling) becomes ``f(...f(f(init, tap_0), tap_1)..., tap_K-1)``
  with ``f`` = ``maximum`` / ``minimum`` / ``add``: the same operations in the same order
  (row-major over the window) as XLA's reduce_window loop, so the result is bit-identical,
  signed zeros and NaNs included (sums too: the order is the same).
- ``select_and_scatter_add`` (max pooling's gradient) becomes a scan over the taps that
  replays the op's ``select`` exactly: the choice starts at tap 0 and moves to tap ``j`` when
  ``not (chosen >= tap_j)`` (so ties keep the earlier element, and NaNs behave as in the op's
  ``GE`` comparison), giving the chosen window offset per window; the result, laid out as
  ``[..., windows, window offset, ...]`` and reshaped back, is ``init + source`` where the
  offset was chosen and ``init`` elsewhere. A trailing remainder that no window covers
  (``7 x 7`` pooled by 2) is padded with ``init``. Bit-identical to the op.

Everything is elementwise work that XLA fuses into a loop or two, where XLA's CPU backend
expands ``select_and_scatter`` into a variadic reduce_window with index operands and a scatter.
Measured on XLA CPU (2 cores), ``select_and_scatter_add`` of the ``cnn`` workload's pools:
``[64,32,28,28]`` 26.0 ms -> 5.5 ms, ``[64,64,14,14]`` 5.9 ms -> 0.5 ms; the 2x2 max pool
forward 1.07 -> 0.41 ms and 0.61 -> 0.22 ms; the whole training step 70 -> 32 ms, 19 ms with
``layout{prefer=nhwc}`` (docs/passes.md, section 9).

Options: ``forward`` / ``gradient`` turn the two rewrites on or off; ``max_window`` bounds the
window size ``K`` (the rewrite unrolls one slice per window element). Statistics:
``reduce_window lowered``, ``select_and_scatter_add lowered``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.passes.registry import Option, register, statistic
from kaun_ir.passes.rewrite import Rewriter, RuleTable, apply_rules

_COMBINE = {"max": "maximum", "min": "minimum", "sum": "add"}


def tiling_windows(
    shape, window, strides, padding, base_dilations=None, window_dilations=None, max_window: int = 0
) -> tuple[int, ...] | None:
    """The number of windows per axis when the windows tile ``shape`` (window == stride, no
    padding, no dilation, at least one window per axis, more than one element per window and
    at most ``max_window`` of them when it is positive); None otherwise."""
    if any(w != s for w, s in zip(window, strides)) or any(tuple(p) != (0, 0) for p in padding):
        return None
    if any(d != 1 for d in (base_dilations or ())) or any(d != 1 for d in (window_dilations or ())):
        return None
    size = math.prod(window)
    if size < 2 or (max_window > 0 and size > max_window):
        return None
    counts = tuple(n // w for n, w in zip(shape, window))
    return counts if min(counts, default=1) >= 1 else None


def _taps(rw: Rewriter, x: Value, window, counts) -> list[Value]:
    """For every window offset (row-major), that element of every window: a strided slice."""
    taps = []
    for offset in itertools.product(*(range(w) for w in window)):
        limit = tuple(k + (m - 1) * w + 1 for k, m, w in zip(offset, counts, window))
        taps.append(
            rw.emit("slice", x, start_indices=tuple(offset), limit_indices=limit, strides=tuple(window))
        )
    return taps


def _full(rw: Rewriter, scalar: Value, shape) -> Value:
    return rw.emit("broadcast_in_dim", scalar, shape=tuple(shape), broadcast_dimensions=())


def _lower_reduce_window(node: Node, rw: Rewriter, max_window: int):
    """reduce_window over tiling windows -> f(...f(init, tap_0)..., tap_K-1)."""
    x, init = node.inputs
    a = node.attr_dict
    counts = tiling_windows(
        x.shape,
        a["window_dimensions"],
        a["window_strides"],
        a["padding"],
        a["base_dilations"],
        a["window_dilations"],
        max_window,
    )
    if counts is None:
        return None
    combine = _COMBINE[a["kind"]]
    # the op's loop starts from init and combines in window order; a sum's first step is written
    # with _plus_init, because XLA folds `+0.0 + tap` to `tap` (wrong for tap = -0.0)
    if a["kind"] == "sum":
        taps = _taps(rw, x, a["window_dimensions"], counts)
        acc, taps = _plus_init(rw, init, taps[0], counts), taps[1:]
    else:
        acc = _full(rw, init, counts)
        taps = _taps(rw, x, a["window_dimensions"], counts)
    for tap in taps:
        acc = rw.emit(combine, acc, tap)
    statistic("reduce_window lowered")
    return acc


def _plus_init(rw: Rewriter, init: Value, source: Value, shape) -> Value:
    """``init + source``, exactly. XLA simplifies ``x + 0.0`` to ``x``, which is wrong for
    ``x = -0.0`` (``0.0 + -0.0`` is ``+0.0``); for the usual init of +0.0 the sum is written as
    ``select(source == 0, +0.0, source)``, which XLA leaves alone."""
    zero = rw.splat_equals(init, 0, negative_zero=False) and dtypes.is_float(init.dtype)
    if not zero:
        return rw.emit("add", _full(rw, init, shape), source)
    positive_zero = _full(rw, init, shape)
    is_zero = rw.emit("compare", source, positive_zero, direction="EQ")
    return rw.emit("select", is_zero, positive_zero, source)


def _lower_select_and_scatter(node: Node, rw: Rewriter, max_window: int):
    """select_and_scatter_add over tiling windows -> a select scan over the taps + one select."""
    x, source, init = node.inputs
    window = node.attr("window_dimensions")
    counts = tiling_windows(
        x.shape, window, node.attr("window_strides"), node.attr("padding"), max_window=max_window
    )
    if counts is None:
        return None
    taps = _taps(rw, x, window, counts)

    def index(j):
        return _full(rw, rw.constant(np.array(j, np.int32)), counts)

    # replay select(chosen, candidate) = chosen >= candidate over the window, in window order
    chosen_value, chosen = taps[0], index(0)
    for j, tap in enumerate(taps[1:], start=1):
        move = rw.emit("not", rw.emit("compare", chosen_value, tap, direction="GE"))
        chosen = rw.emit("select", move, index(j), chosen)
        if j < len(taps) - 1:
            chosen_value = rw.emit("select", move, tap, chosen_value)

    # the result as [..., windows_i, offset_i, ...] (only axes with a window > 1 are split)
    split, window_axes, count_axes = [], [], []
    for m, w in zip(counts, window):
        count_axes.append(len(split))
        split.append(m)
        if w > 1:
            window_axes.append(len(split))
            split.append(w)
    split = tuple(split)
    offsets = np.arange(math.prod(window), dtype=np.int32).reshape([w for w in window if w > 1])
    at_offset = rw.emit(
        "broadcast_in_dim", rw.constant(offsets), shape=split, broadcast_dimensions=tuple(window_axes)
    )
    hit = rw.emit(
        "compare",
        rw.emit("broadcast_in_dim", chosen, shape=split, broadcast_dimensions=tuple(count_axes)),
        at_offset,
        direction="EQ",
    )
    # the op adds each window's source to init at the chosen element (windows never overlap here)
    added = _plus_init(rw, init, source, counts)
    spread = rw.emit("broadcast_in_dim", added, shape=split, broadcast_dimensions=tuple(count_axes))
    out = rw.emit("select", hit, spread, _full(rw, init, split))
    covered = tuple(m * w for m, w in zip(counts, window))
    out = rw.emit("reshape", out, shape=covered)
    if covered != x.shape:  # elements after the last whole window are never chosen
        rank = len(x.shape)
        out = rw.emit(
            "pad",
            out,
            init,
            low=(0,) * rank,
            high=tuple(n - c for n, c in zip(x.shape, covered)),
            interior=(0,) * rank,
        )
    statistic("select_and_scatter_add lowered")
    return out


def _rules(forward: bool, gradient: bool, max_window: int) -> RuleTable:
    table = RuleTable()
    if forward:
        table.rule("lower-reduce-window", "reduce_window")(
            lambda node, rw: _lower_reduce_window(node, rw, max_window)
        )
    if gradient:
        table.rule("lower-select-and-scatter", "select_and_scatter_add")(
            lambda node, rw: _lower_select_and_scatter(node, rw, max_window)
        )
    return table


@register(
    "lower-pool",
    options={
        "forward": (bool, True, "lower reduce_window (pooling) over tiling windows to strided slices"),
        "gradient": (bool, True, "lower select_and_scatter_add (max-pool gradient) over tiling windows"),
        "max_window": Option(int, 16, "largest window (in elements) to unroll; 0: no limit", min=0),
    },
)
def lower_pool(graph: Graph, forward: bool, gradient: bool, max_window: int) -> Graph:
    """Pooling over non-overlapping windows as strided slices and fusable elementwise ops (bit-exact)."""
    rules = _rules(forward, gradient, max_window)
    if not any(rules.for_op(node.op) for node in graph.walk()):
        return graph  # nothing to lower: not even a sweep (which would also drop dead nodes)
    return apply_rules(graph, rules, label="lower-pool").graph

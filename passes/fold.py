"""``fold``: constant folding through the op table's NumPy references.

A node whose operands are all constants is replaced by a constant computed with its op's
NumPy reference (``OpDef.run_reference``, what ``kn.ir.interpret`` runs), when

- the op is in :data:`FOLDABLE`: ops whose reference gives bit-for-bit what XLA computes (the
  op table's "elementwise" ops less :data:`ELEMENTWISE_NOT_FOLDED`, data movement, and the
  reductions and products listed with a guard), and the op's guard accepts these particular
  operands (see below);
- the results have at most ``max_elements`` elements in all (large constants are not
  materialised; operands that are broadcasts are materialised only up to that size too).

Operands count as constants when a ``constant`` node defines them, or a ``broadcast_in_dim`` of
one. A result whose elements are all equal ("splat") and which is larger than
``max_splat_elements`` is emitted as a scalar constant plus a ``broadcast_in_dim`` rather than a
dense array, and a broadcast of a splat is only folded into a dense constant up to that size:
a large ``zeros``/``ones`` stays compact. An elementwise op whose operands are all splats, one
of them a broadcast, folds at any size: it is computed once on the scalars and emitted as a
broadcast (``ones * 2.0`` becomes a broadcast of ``2.0``).

Not folded (:data:`NOT_FOLDED`), because XLA's results differ from NumPy's in the last bits or
because folding gains nothing:

- transcendental and approximated functions: exponential, exponential_minus_one, log,
  log_plus_one, tanh, logistic, sine, cosine, erf, atan2, power of floats, and sqrt/rsqrt
  (approximations on some backends);
- floating-point sums and products whose association order is XLA's choice: ``reduce`` sum/prod,
  ``dot_general``, ``convolution``, ``reduce_window`` sum, ``scatter_add``,
  ``select_and_scatter_add`` (all folded for integer dtypes, where wrap-around sums are exact);
- ``iota`` (a leaf like ``constant``: compact unmaterialised; it does not count as a constant
  operand either), ``constant`` itself, and ops with regions (``while``).

Guards for exactness on particular operands (the fold is skipped otherwise):

- floating-point subnormals: XLA:CPU flushes them to zero in arithmetic and comparisons, NumPy
  does not, so arithmetic ops do not fold when an operand or result holds a subnormal
  (data movement ops move them unchanged and always fold);
- ``-0.0`` in maximum/minimum/clamp and max/min reductions (which of +-0 wins differs) and in
  sign (NumPy's sign(-0.0) is +0.0, XLA's is -0.0);
- integer divide/remainder by zero or of the minimum by -1; integer power with exponents
  outside [0, 64) (XLA's differs there); shifts by negative amounts (the references do not
  model those);
- convert: float -> integer only of finite values in the target's range; to f16/bf16 only from
  f32/f16/bf16/bool (no double rounding through f32).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import IRError
from kaun_ir.ir.core import Graph, Node, Value
from kaun_ir.ops import TABLE, with_trait
from kaun_ir.passes.registry import Option, register
from kaun_ir.passes.rewrite import Rewriter, Rule, RuleTable, apply_rules, splat_of

DEFAULT_MAX_ELEMENTS = 1 << 16
DEFAULT_MAX_SPLAT_ELEMENTS = 8  # larger zeros/ones stay broadcasts of a scalar: compact and readable

Guard = Callable[[list, dict], bool]


def _always(arrays, attrs) -> bool:
    return True


def _floats(arrays) -> list[np.ndarray]:
    return [a for a in arrays if dtypes.is_float(a.dtype)]


def _has_subnormal(arrays) -> bool:
    for a in _floats(arrays):
        magnitude = np.abs(a.astype(np.float64))
        if np.any((magnitude > 0) & (magnitude < float(ml_dtypes.finfo(a.dtype).smallest_normal))):
            return True
    return False


def _has_negative_zero(arrays) -> bool:
    return any(np.any((a == 0) & np.signbit(a.astype(np.float64))) for a in _floats(arrays))


def _no_negative_zero(arrays, attrs) -> bool:
    return not _has_negative_zero(arrays)


def _integer_division_ok(arrays, attrs) -> bool:
    a, b = arrays
    if not dtypes.is_integer(a.dtype):
        return True
    if np.any(b == 0):
        return False
    if not dtypes.is_unsigned(a.dtype):
        smallest = np.iinfo(a.dtype).min
        if np.any((a == smallest) & (b == -1)):
            return False
    return True


def _integer_power_ok(arrays, attrs) -> bool:
    # XLA's integer power looks at the low 6 bits of the exponent only (2**64 is not 0 there)
    a, b = arrays
    return dtypes.is_integer(a.dtype) and bool(np.all((b >= 0) & (b < 64)))


def _shift_ok(arrays, attrs) -> bool:
    return bool(np.all(arrays[1] >= 0))


def _integers_only(arrays, attrs) -> bool:
    return all(dtypes.is_integer(a.dtype) or dtypes.is_bool(a.dtype) for a in arrays)


def _reduce_ok(arrays, attrs) -> bool:
    (x,) = arrays
    if attrs["kind"] in ("sum", "prod"):
        return not dtypes.is_float(x.dtype)
    if attrs["kind"] in ("max", "min"):
        return not _has_negative_zero(arrays)
    return True


def _reduce_window_ok(arrays, attrs) -> bool:
    if attrs["kind"] == "sum":
        return not dtypes.is_float(arrays[0].dtype)
    return not _has_negative_zero(arrays)


def _dot_ok(arrays, attrs) -> bool:
    preferred = attrs.get("preferred_dtype")
    return _integers_only(arrays, attrs) and (preferred is None or not dtypes.is_float(preferred))


def _reduce_precision_ok(arrays, attrs) -> bool:
    # NaN without mantissa bits: the spec (and the reference, and XLA's own constant folding) give
    # +inf, XLA's CPU kernels keep the NaN; the program is left to XLA
    return attrs["mantissa_bits"] > 0 or not any(np.any(np.isnan(a)) for a in _floats(arrays))


def _convert_ok(arrays, attrs) -> bool:
    (x,) = arrays
    dst = np.dtype(attrs["dtype"])
    if dtypes.is_float(x.dtype) and dtypes.is_integer(dst):
        wide = x.astype(np.float64)
        if not np.all(np.isfinite(wide)):
            return False
        info = np.iinfo(dst)
        truncated = np.trunc(wide)
        return bool(np.all((truncated >= info.min) & (truncated <= info.max)))
    if dst in (dtypes.float16, dtypes.bfloat16):
        return x.dtype in (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.bool_)
    return True


# Data movement: bits are copied, never computed on (subnormals and NaN payloads pass unchanged).
_DATA_MOVEMENT: dict[str, Guard] = {
    op: _always
    for op in (
        "broadcast_in_dim",
        "reshape",
        "transpose",
        "slice",
        "concatenate",
        "pad",
        "reverse",
        "dynamic_slice",
        "dynamic_update_slice",
        "gather",
        "select",
        "bitcast_convert",
        "stop_gradient",
    )
}

#: Elementwise ops (the op table's "elementwise" trait) that are never folded, with the reason.
# Every other elementwise op folds: its reference is exact (IEEE correctly rounded, or integer
# wrap-around), given the guard ``_GUARDS`` may name for it. A new elementwise op of the table
# therefore folds unless it is listed here (test_fold checks each folded op against XLA).
ELEMENTWISE_NOT_FOLDED: dict[str, str] = {
    **{
        op: "transcendental: XLA's approximation differs from NumPy's in the last bits"
        for op in (
            "exponential",
            "exponential_minus_one",
            "log",
            "log_plus_one",
            "tanh",
            "logistic",
            "sine",
            "cosine",
            "erf",
            "atan2",
            "cbrt",
            "tan",
        )
    },
    "sqrt": "correctly rounded on XLA:CPU, but GPU backends may use an approximation",
    "rsqrt": "an approximation on XLA's backends",
    "is_finite": "a check on data: constant operands are rare and folding it buys nothing",
}

#: elementwise ops: on splat operands they fold on one scalar, at any size.
ELEMENTWISE: frozenset[str] = frozenset(with_trait("elementwise") - ELEMENTWISE_NOT_FOLDED.keys())

# Ops whose fold needs a guard on the particular operands (the fold is skipped where it refuses).
_GUARDS: dict[str, Guard] = {
    "divide": _integer_division_ok,
    "remainder": _integer_division_ok,
    "power": _integer_power_ok,
    "shift_left": _shift_ok,
    "shift_right_logical": _shift_ok,
    "shift_right_arithmetic": _shift_ok,
    "sign": _no_negative_zero,  # NumPy's sign(-0.0) is +0.0, XLA's -0.0
    "maximum": _no_negative_zero,
    "minimum": _no_negative_zero,
    "clamp": _no_negative_zero,
    "convert": _convert_ok,
    "reduce_precision": _reduce_precision_ok,
    "reduce": _reduce_ok,
    "reduce_window": _reduce_window_ok,
    "dot_general": _dot_ok,
    "convolution": _integers_only,
    "scatter_add": _integers_only,
    "select_and_scatter_add": _integers_only,
}

# Arithmetic whose reference is exact given the guard: the elementwise ops that are not data
# movement, the guarded ops, and two reductions to an index (exact: they compare, never round).
_ARITHMETIC: dict[str, Guard] = {
    **{op: _always for op in sorted(ELEMENTWISE - _DATA_MOVEMENT.keys())},
    "argmax": _always,
    "argmin": _always,
    **_GUARDS,
}

#: op -> guard(operand arrays, attributes): the ops ``fold`` evaluates, and when.
FOLDABLE: dict[str, Guard] = {**_DATA_MOVEMENT, **_ARITHMETIC}

#: ops never folded, with the reason (every op of the table is in FOLDABLE or here).
NOT_FOLDED: dict[str, str] = {
    **ELEMENTWISE_NOT_FOLDED,
    "constant": "already a constant",
    "iota": "a leaf like constant: compact unmaterialised",
    "while": "an op with regions",
    "case": "an op with regions",
    "triangular_solve": "a solve: XLA's substitution and NumPy's LAPACK solve round differently",
    "scan": "an op with regions",
    "custom_vjp": "an op with regions",
    "custom_jvp": "an op with regions",
    "scatter": "out-of-range updates are dropped by XLA's rules, which the reference would have to mirror",
    "sharding_constraint": "a placement annotation for XLA's partitioner, never folded away",
    "sort": "NaN placement and stability follow XLA's comparator, which the reference would have to mirror",
}


def _guard_ok(op: str, arrays: list[np.ndarray], outputs: list[np.ndarray], attrs: dict) -> bool:
    """The subnormal guard, for everything but data movement (the per-op guards run before)."""
    return op in _DATA_MOVEMENT or not _has_subnormal(arrays + outputs)


class _Folder:
    """The fold rules of one run (they close over the size limits)."""

    def __init__(self, max_elements: int, max_splat_elements: int):
        self.max_elements = max_elements
        self.max_splat_elements = max_splat_elements

    # -- operands

    def operand(self, rw: Rewriter, value: Value) -> np.ndarray | None:
        """The array of a constant operand (a broadcast of a constant is materialised if small)."""
        array = rw.constant_array(value)
        if array is not None:
            return array
        node = rw.producer(value, "broadcast_in_dim")
        if node is None or value.type.size > self.max_elements:
            return None
        inner = rw.constant_array(node.inputs[0])
        if inner is None:
            return None
        return _evaluate(node, [inner])[0]

    # -- results

    def materialise(self, rw: Rewriter, array: np.ndarray) -> Value:
        """A dense constant, or a scalar constant broadcast when ``array`` is a large splat."""
        small = array.size <= min(self.max_splat_elements, self.max_elements)
        scalar = None if small or array.ndim == 0 else splat_of(array)
        if scalar is None:
            return rw.constant(array)
        return rw.emit("broadcast_in_dim", rw.constant(scalar), shape=array.shape, broadcast_dimensions=())

    # -- the rules

    def fold_splats(self, node: Node, rw: Rewriter):
        """An elementwise op whose operands are all splats: evaluate once on scalars."""
        if node.op not in ELEMENTWISE or not node.inputs:
            return None
        scalars = [rw.splat(v) for v in node.inputs]
        if any(s is None for s in scalars):
            return None
        if all(v.node is not None and v.node.op == "constant" for v in node.inputs):
            return None  # plain constants: the general rule folds them (within max_elements)
        attrs = node.attr_dict
        outs = _evaluate(node, scalars, scalar_outputs=True)
        if not FOLDABLE[node.op](scalars, attrs) or not _guard_ok(node.op, scalars, outs, attrs):
            return None
        return tuple(
            self.materialise(rw, np.broadcast_to(o, v.shape).copy()) for o, v in zip(outs, node.outputs)
        )

    def fold(self, node: Node, rw: Rewriter):
        """Every operand constant and the results small: evaluate with the reference."""
        if sum(v.type.size for v in node.outputs) > self.max_elements:
            return None
        if (
            node.op == "broadcast_in_dim"
            and node.outputs[0].type.size > self.max_splat_elements
            and rw.splat(node.inputs[0]) is not None
        ):
            return None  # a large splat stays a broadcast (what materialise would make again)
        arrays = [self.operand(rw, v) for v in node.inputs]
        if any(a is None for a in arrays):
            return None
        attrs = node.attr_dict
        if not FOLDABLE[node.op](arrays, attrs):
            return None
        outs = _evaluate(node, arrays)
        if not _guard_ok(node.op, arrays, outs, attrs):
            return None
        return tuple(self.materialise(rw, o) for o in outs)

    def rules(self) -> RuleTable:
        table = RuleTable()
        for op in FOLDABLE:
            name = "fold-" + op.replace("_", "-")
            if op in ELEMENTWISE:
                table.add(Rule(name + "-splat", op, self.fold_splats, "elementwise op on splat constants"))
            table.add(Rule(name, op, self.fold, f"evaluate {op} of constants with its NumPy reference"))
        return table


def _evaluate(node: Node, arrays: list[np.ndarray], scalar_outputs: bool = False) -> list[np.ndarray]:
    """The node's results by its op's reference, in the result dtypes (as ``interpret`` does)."""
    with np.errstate(all="ignore"):
        outs = TABLE[node.op].run_reference(arrays, node.attr_dict)
    results = []
    for value, out in zip(node.outputs, outs):
        arr = np.asarray(out).astype(value.dtype, copy=False)
        want = () if scalar_outputs else value.shape
        if arr.shape != want:
            raise IRError(f"fold: reference of {node.op} gave shape {arr.shape}, expected {want}")
        results.append(arr)
    return results


@register(
    "fold",
    options={
        "max_elements": Option(
            int,
            DEFAULT_MAX_ELEMENTS,
            "fold only when the results have at most this many elements",
            min=0,
        ),
        "max_splat_elements": Option(
            int,
            DEFAULT_MAX_SPLAT_ELEMENTS,
            "larger all-equal results stay a broadcast of a scalar constant",
            min=0,
        ),
    },
)
def fold(
    graph: Graph,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    max_splat_elements: int = DEFAULT_MAX_SPLAT_ELEMENTS,
) -> Graph:
    """Constant folding with the NumPy references, for ops whose results match XLA's bit for bit."""
    for name, value in (("max_elements", max_elements), ("max_splat_elements", max_splat_elements)):
        if value < 0:
            raise ValueError(f"fold: {name} must be non-negative, got {value}")
    return apply_rules(graph, _Folder(max_elements, max_splat_elements).rules(), label="fold").graph

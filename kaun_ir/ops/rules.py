"""The vocabulary that op rules (``vjp``, ``vjp_forward``, ``batch``) are written in.

Rules live in the op table, below the tracing surface, yet they build graphs of other ops on the
symbolic tensors they are handed. The helpers here give them that vocabulary on the table's own
floor: they are built on ``kaun_ir.ir`` and the op table only, and follow the NumPy-style
semantics of the surface (broadcasting, dtype promotion with weak Python scalars) node for node,
so a rule written with them builds the graph it would build with ``kn.where`` and friends.

Three things belong to the layers above, and reach the table through hooks those layers install
when they are imported (``install``), never through an import from here:

- ``apply`` / ``tensor`` / ``to_value``: the tracer (``kaun_ir.surface.tensor``): one node appended to
  the active trace, the symbolic ``Tensor`` class, and an operand's value in a trace;
- ``batch_graph``: the batching transformation (``kaun_ir.transforms.vmap``), which the rules of ops
  with regions apply to their sub-graphs;
- ``gradient_graph``: reverse mode (``kaun_ir.transforms.autodiff``), likewise.

Rules may also use the arithmetic operators (``ct * y``, ``-ct``) and the metadata (``.shape``,
``.dtype``, ``.type``) of the tensors they are handed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes, hooks
from kaun_ir.ir.builder import Builder, current_builder
from kaun_ir.ir.clone import copy_nodes
from kaun_ir.ir.core import Graph, TensorType

# ------------------------------------------------------------------------------------- hooks

_HOOK_OWNERS = {
    "apply": "kaun_ir.surface.tensor",
    "tensor": "kaun_ir.surface.tensor",
    "to_value": "kaun_ir.surface.tensor",
    "batch_graph": "kaun_ir.transforms.vmap",
    "gradient_graph": "kaun_ir.transforms.autodiff",
}
_HOOKS: dict[str, Callable] = {}


def install(**hooks: Callable) -> None:
    """Called by the layers above the table at import time: ``install(apply=apply, ...)``."""
    unknown = sorted(set(hooks) - set(_HOOK_OWNERS))
    if unknown:
        raise TypeError(f"unknown op-rule hook(s) {', '.join(unknown)}; known: {', '.join(_HOOK_OWNERS)}")
    _HOOKS.update(hooks)


def _hook(name: str) -> Callable:
    hook = _HOOKS.get(name)
    if hook is None:
        hooks.ensure_installed()
        hook = _HOOKS.get(name)
        if hook is None:
            raise RuntimeError(
                f"op rules need {name!r} from {_HOOK_OWNERS[name]}, which the composition root "
                "(kaun_ir.wiring) installs; it was removed"
            )
    return hook


def apply(op: str, *operands: Any, regions: tuple[Graph, ...] = (), **attrs: Any):
    """Append op ``op`` to the active trace: one output -> Tensor, several -> a tuple."""
    return _hook("apply")(op, *operands, regions=regions, **attrs)


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a symbolic tensor of a trace."""
    return isinstance(x, _hook("tensor"))


def batch_graph(graph: Graph, batched: Sequence[bool], size: int, force: Sequence[bool] | bool = False):
    """``kaun_ir.transforms.vmap.batch_graph``: the batched form of a region and its output flags."""
    return _hook("batch_graph")(graph, batched, size, force=force)


def gradient_graph(graph: Graph, **kwargs: Any) -> Graph:
    """``kaun_ir.transforms.autodiff.gradient_graph`` applied to a region."""
    return _hook("gradient_graph")(graph, **kwargs)


# ------------------------------------------------------------------------- graphs and regions


def inline(graph: Graph, args: Sequence[Any]) -> list:
    """``graph``'s nodes copied into the active trace with ``args`` as its inputs; its outputs."""
    builder = current_builder()
    to_value, tensor = _hook("to_value"), _hook("tensor")
    env = {id(old): to_value(builder, a) for old, a in zip(graph.inputs, args)}
    return [tensor(v, builder) for v in copy_nodes(graph, env, builder.nodes)]


def trace(fn: Callable, types: Sequence[TensorType], name: str, record_source: bool = True) -> Graph:
    """The graph of ``fn(*tensors) -> tensor or sequence of tensors`` over inputs of ``types``.

    ``fn`` must not read tensors of an enclosing trace (a region takes everything it uses as
    an input); the rules pass such values in explicitly."""
    to_value, tensor = _hook("to_value"), _hook("tensor")
    with Builder(record_source=record_source) as builder:
        args = [tensor(builder.add_input(t), builder) for t in types]
        out = fn(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        values = [to_value(builder, x) for x in outs]
    if builder.captures:
        raise RuntimeError(f"internal: region {name!r} of an op rule reads values of the enclosing trace")
    return builder.finish(values, name=name)


# ------------------------------------------------------------------ types, dtypes and shapes


def type_of(x: Any) -> TensorType:
    """The type of a Tensor, a NumPy array or a Python scalar (which gets its default dtype)."""
    if is_tensor(x):
        return x.type
    if dtypes.is_weak(x):
        return TensorType(dtypes.dtype_of_scalar(x), ())
    arr = np.asarray(x)
    return TensorType(arr.dtype, arr.shape)


def astype(x: Any, dtype) -> Any:
    """``x`` as ``dtype``: a ``convert`` node for a Tensor of another dtype, a NumPy array for a
    constant, ``x`` itself when it has the dtype already."""
    dtype = dtypes.canonical(dtype)
    if is_tensor(x):
        return x if x.dtype == dtype else apply("convert", x, dtype=dtype)
    return np.asarray(x, dtype=dtype)


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes`` (the type rules of the ops report shapes that disagree)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0} - {1}
        out.append(max(sizes) if sizes else 1)
    return tuple(out)


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    """``x`` broadcast to ``shape`` (NumPy rules, trailing axes aligned); ``x`` when it has it."""
    shape = tuple(int(d) for d in shape)
    src = type_of(x).shape
    if src == shape:
        return x
    offset = len(shape) - len(src)
    return apply("broadcast_in_dim", x, shape=shape, broadcast_dimensions=tuple(range(offset, len(shape))))


def promote(*xs: Any) -> list:
    """Operands converted to one dtype and broadcast to one shape; Python scalars are weak
    (``dtypes.weak_result_type``)."""
    strong = [type_of(x).dtype for x in xs if not dtypes.is_weak(x)]
    dtype = dtypes.weak_result_type(strong, [x for x in xs if dtypes.is_weak(x)])
    shape = broadcast_shapes(*[type_of(x).shape for x in xs])
    return [broadcast_to(astype(x, dtype), shape) for x in xs]


# ------------------------------------------------------------------------------- elementwise


def binary(op: str, a: Any, b: Any):
    """Elementwise ``op`` (``add``, ``maximum``, ``and`` ...) of promoted, broadcast operands."""
    return apply(op, *promote(a, b))


def compare(direction: str, a: Any, b: Any):
    """``a <direction> b`` (``EQ``, ``GT``, ``LT`` ...) of promoted, broadcast operands; bool."""
    return apply("compare", *promote(a, b), direction=direction)


def where(condition: Any, x: Any, y: Any):
    """``x`` where ``condition`` holds, else ``y``; all three broadcast together."""
    x, y = promote(x, y)
    shape = broadcast_shapes(type_of(condition).shape, type_of(x).shape)
    condition = astype(condition, dtypes.bool_)
    return apply("select", broadcast_to(condition, shape), broadcast_to(x, shape), broadcast_to(y, shape))


def full_like(x: Any, value) -> Any:
    """``value`` with the shape and dtype of ``x``: a constant scalar, broadcast (reshaped when
    ``x`` is a scalar)."""
    t = type_of(x)
    scalar = np.asarray(value, dtype=t.dtype)
    if t.shape:
        return apply("broadcast_in_dim", scalar, shape=t.shape, broadcast_dimensions=())
    return apply("reshape", scalar, shape=())


def zeros(t: TensorType):
    """Zeros of type ``t``: one ``constant`` scalar, broadcast when ``t`` has a shape."""
    zero = apply("constant", value=np.zeros((), t.dtype))
    return apply("broadcast_in_dim", zero, shape=t.shape, broadcast_dimensions=()) if t.shape else zero


_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)


def sum_all(x: Any):
    """The sum of every element of ``x``, accumulated as ``kn.sum`` does (float16 / bfloat16 in
    float32, bool and narrow integers in (u)int32) and returned in the same dtype."""
    t = type_of(x)
    dt = t.dtype
    if dtypes.is_bool(dt) or (dtypes.is_integer(dt) and dt.itemsize < 4):
        acc = dtypes.uint32 if dtypes.is_unsigned(dt) else dtypes.int32
    else:
        acc = dtypes.float32 if dt in _LOW_PRECISION else dt
    out = astype(x, acc)
    if t.shape:
        out = apply("reduce", out, kind="sum", dimensions=tuple(range(len(t.shape))))
    return astype(out, dt) if dt in _LOW_PRECISION else out


__all__ = [
    "install",
    "apply",
    "is_tensor",
    "batch_graph",
    "gradient_graph",
    "inline",
    "trace",
    "type_of",
    "astype",
    "broadcast_shapes",
    "broadcast_to",
    "promote",
    "binary",
    "compare",
    "where",
    "full_like",
    "zeros",
    "sum_all",
]

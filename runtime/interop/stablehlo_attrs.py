"""Reading a StableHLO op while importing it: its attributes as Python values, its result types,
dense constants, and the one op a two-argument combiner region applies (the regions of reduce,
reduce_window and scatter). MLIR objects are read through the jaxlib adapter
(:mod:`kaun_ir.runtime.xla.mlir`)."""

from __future__ import annotations

import re

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import StableHLOImportError
from kaun_ir.ir.core import TensorType
from kaun_ir.runtime.interop.stablehlo_import import tensor_type
from kaun_ir.runtime.xla import mlir


def ints(op, name: str, default=None) -> tuple[int, ...]:
    """A DenseI64ArrayAttr / dense integer elements attribute as a tuple (``default`` if absent)."""
    if name not in op.attributes:
        if default is None:
            raise StableHLOImportError(f"{op.name}: missing attribute {name}")
        return tuple(default)
    attr = op.attributes[name]
    try:
        return tuple(int(v) for v in attr)
    except TypeError:
        return tuple(int(v) for v in np.asarray(attr).reshape(-1))


def integer(op, name: str, default: int | None = None) -> int:
    """An integer attribute's value (``default`` if absent; an error if absent without one)."""
    if name not in op.attributes:
        if default is None:
            raise StableHLOImportError(f"{op.name}: missing attribute {name}")
        return default
    return mlir.integer_value(op.attributes[name])


def flag(op, name: str) -> bool:
    """A boolean attribute's value (False if absent)."""
    if name not in op.attributes:
        return False
    return mlir.bool_value(op.attributes[name])


def pairs(op, name: str, rank: int) -> tuple[tuple[int, int], ...]:
    """A ``rank x 2`` padding attribute as ``((low, high), ...)`` (no padding if absent)."""
    if name not in op.attributes:
        return ((0, 0),) * rank
    flat = np.asarray(op.attributes[name]).reshape(-1, 2)
    return tuple((int(lo), int(hi)) for lo, hi in flat)


def enum(op, name: str) -> str:
    """``#stablehlo<comparison_direction LT>`` -> ``"LT"``."""
    match = re.search(r"(\w+)>\s*$", str(op.attributes[name]))
    return match.group(1) if match else str(op.attributes[name])


def result_type(op, index: int = 0) -> TensorType:
    """kaun_ir's type of the op's result ``index``."""
    return tensor_type(op.results[index].type)


def dense_array(attr, t: TensorType) -> np.ndarray:
    """The value of a dense elements attribute as a NumPy array of ``t``."""
    if t.dtype not in (dtypes.bfloat16, dtypes.float16):
        try:
            array = np.array(attr)
            return np.broadcast_to(array.astype(t.dtype), t.shape).copy()
        except (TypeError, ValueError, RuntimeError):
            pass
    text = str(attr)
    hex_match = re.search(r'dense<"0x([0-9A-Fa-f]*)">', text)
    if hex_match:
        raw = np.frombuffer(bytes.fromhex(hex_match.group(1)), dtype=t.dtype.newbyteorder("<"))
        return np.broadcast_to(raw.astype(t.dtype), t.shape).copy()
    # dense<[1.0, 2.5]> / dense<1.0> / dense<0x7FC0>: the numbers between "dense<" and the last ">"
    body = text[text.index("dense<") + len("dense<") : text.rindex(">", 0, text.rindex(":"))]
    words = [w for w in re.split(r"[\s,\[\]]+", body) if w]
    if any(w.startswith("0x") for w in words):
        array = np.array([int(w, 16) for w in words], dtype=f"u{t.dtype.itemsize}").view(t.dtype)
    else:
        array = np.array([float(w) for w in words], dtype=np.float64).astype(t.dtype)
    if array.size not in (1, t.size):
        raise StableHLOImportError(f"cannot read the constant {text[:80]}")
    return np.broadcast_to(
        array.reshape(t.shape) if array.size == t.size else array.reshape(()), t.shape
    ).copy()


# --------------------------------------------------------------------------- region patterns


def region_block(op, index: int):
    """The single block of the op's region ``index``."""
    return op.regions[index].blocks[0]


def combiner(op, index: int = 0) -> str | None:
    """The op a two-argument combiner region applies to its arguments (``"stablehlo.add"``), or
    ``"set"`` when it returns its second argument; None for anything else."""
    block = region_block(op, index)
    body = [o.operation for o in block.operations]
    args = list(block.arguments)
    if len(args) != 2:
        return None
    if len(body) == 1 and body[0].name == "stablehlo.return" and list(body[0].operands) == [args[1]]:
        return "set"
    if len(body) != 2 or body[1].name != "stablehlo.return":
        return None
    inner, ret = body
    if (
        list(ret.operands) != [inner.results[0]]
        or set(inner.operands) != set(args)
        or len(inner.operands) != 2
    ):
        return None
    return inner.name

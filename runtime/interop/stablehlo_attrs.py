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
from kaun_ir.runtime.xla import mlir

_MLIR_DTYPES = {
    "f16": dtypes.float16,
    "bf16": dtypes.bfloat16,
    "f32": dtypes.float32,
    "f64": dtypes.float64,
    "i1": dtypes.bool_,
    "i8": dtypes.int8,
    "i16": dtypes.int16,
    "i32": dtypes.int32,
    "i64": dtypes.int64,
    "ui8": dtypes.uint8,
    "ui16": dtypes.uint16,
    "ui32": dtypes.uint32,
    "ui64": dtypes.uint64,
}


#: element types kaun_ir leaves out, by prefix, and why (docs/interop.md, "What stays out")
OUT_OF_SCOPE = {
    "complex": "complex numbers are not a kaun_ir dtype (complex tensors and real/imag/complex are refused)",
    "f8": "8-bit floats are not kaun_ir dtypes",
    "f6": "6-bit floats are not kaun_ir dtypes",
    "f4": "4-bit floats are not kaun_ir dtypes",
    "!quant": "quantized types are not kaun_ir dtypes (dequantize before exporting)",
    "i2": "sub-byte integers are not kaun_ir dtypes",
    "i4": "sub-byte integers are not kaun_ir dtypes",
    "ui2": "sub-byte integers are not kaun_ir dtypes",
    "ui4": "sub-byte integers are not kaun_ir dtypes",
}


def tensor_type(mlir_type) -> TensorType:
    """kaun_ir's type of a ranked, static MLIR tensor type (ValueError otherwise)."""
    if str(mlir_type).startswith("!stablehlo.token"):
        raise ValueError("tokens (side-effect ordering: infeed, outfeed, send, recv) are not supported")
    try:
        element, shape = mlir.ranked_tensor(mlir_type)
    except ValueError as err:
        if "dynamic shape" in str(err):
            raise ValueError(
                f"{err}: only static shapes are supported (export with concrete shapes)"
            ) from None
        raise
    if element not in _MLIR_DTYPES:
        reason = next((why for prefix, why in OUT_OF_SCOPE.items() if element.startswith(prefix)), "")
        raise ValueError(f"element type {element} is not supported" + (f": {reason}" if reason else ""))
    return TensorType(_MLIR_DTYPES[element], shape)


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


# The largest constant the importer materialises as an array (a splat of any size stays a
# scalar and a broadcast).
MAX_CONSTANT_BYTES = 1 << 31
# A number of a dense literal: decimal (1.5, -2, 1.000000e+00, inf, nan), hexadecimal bits
# (0x7C00: how MLIR writes a float's NaN, infinities and denormals) or a boolean.
_WORD = re.compile(r"[-+]?0[xX][0-9A-Fa-f]+|[-+]?[0-9A-Za-z_.+-]+")


def dense_array(attr, t: TensorType) -> np.ndarray:
    """The value of a dense elements attribute as a NumPy array of ``t``; a splat (one value for
    every element) is returned as a 0-d array, whatever ``t``'s size. Raises
    :class:`StableHLOImportError` for a constant larger than ``MAX_CONSTANT_BYTES``."""
    splat = mlir.is_splat(attr)
    if not splat and t.size * t.dtype.itemsize > MAX_CONSTANT_BYTES:
        raise StableHLOImportError(
            f"a constant of {t} ({t.size * t.dtype.itemsize} bytes) is larger than the importer's "
            f"limit of {MAX_CONSTANT_BYTES} bytes"
        )
    shape = () if splat else t.shape
    size = 1 if splat else t.size
    if t.dtype not in (dtypes.bfloat16, dtypes.float16) and not splat:
        try:
            array = np.array(attr)
            if array.size == size:
                return array.astype(t.dtype).reshape(shape)
        except (TypeError, ValueError, RuntimeError):
            pass
    text = str(attr)
    hex_match = re.search(r'dense<"0x([0-9A-Fa-f]*)">', text)
    if hex_match:
        raw = np.frombuffer(bytes.fromhex(hex_match.group(1)), dtype=t.dtype.newbyteorder("<"))
        if raw.size not in (1, size):
            raise StableHLOImportError(f"cannot read the constant {text[:80]}: {raw.size} values for {t}")
        return np.broadcast_to(raw.astype(t.dtype), (size,)).reshape(shape).copy()
    # dense<[1.0, 0x7C00]> / dense<1.0>: the numbers between "dense<" and the last ">" before ":"
    try:
        body = text[text.index("dense<") + len("dense<") : text.rindex(">", 0, text.rindex(":"))]
    except ValueError:
        raise StableHLOImportError(f"cannot read the constant {text[:80]}") from None
    words = [w for w in re.split(r"[\s,\[\]()]+", body) if w]
    if len(words) not in (1, size):
        raise StableHLOImportError(f"cannot read the constant {text[:80]}: {len(words)} values for {t}")
    array = np.array([_number(w, t, text) for w in words], dtype=t.dtype)
    return np.broadcast_to(array, (size,)).reshape(shape).copy()


def _number(word: str, t: TensorType, text: str):
    """One literal of a dense constant of ``t`` as a NumPy scalar of its dtype."""
    dtype = t.dtype
    try:
        if word in ("true", "false"):
            return np.array(word == "true").astype(dtype)[()]
        if word.lstrip("+-")[:2] in ("0x", "0X"):
            bits = int(word, 16)
            if dtypes.is_float(dtype):  # the float's bit pattern
                if word.startswith("-") or bits >= 1 << (8 * dtype.itemsize):
                    raise ValueError("bit pattern out of range")
                return np.array(bits, dtype=f"u{dtype.itemsize}").view(dtype)[()]
            return _integer(bits, dtype)
        if dtypes.is_float(dtype):
            return np.array(float(word)).astype(dtype)[()]
        if dtypes.is_bool(dtype):
            return np.array(int(word) != 0)[()]
        return _integer(int(word), dtype)
    except (ValueError, OverflowError) as err:
        raise StableHLOImportError(
            f"cannot read {word!r} in the constant {text[:80]} of {t}: {err}"
        ) from None


def _integer(value: int, dtype: np.dtype):
    info = np.iinfo(dtype)
    if info.min <= value <= info.max:
        return np.array(value, dtype=dtype)[()]
    if 0 <= value < 1 << info.bits:  # a signed integer written as its unsigned bit pattern
        return np.array(value, dtype=f"u{dtype.itemsize}").view(dtype)[()]
    raise ValueError(f"out of range for {dtype}")


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

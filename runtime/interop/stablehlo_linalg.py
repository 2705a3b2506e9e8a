"""Importing StableHLO's contractions: ``dot_general``, ``dot`` and ``convolution``, whose
dimension numbers become the op table's attributes."""

from __future__ import annotations

from kaun_ir import dtypes
from kaun_ir.errors import StableHLOImportError
from kaun_ir.runtime.interop.stablehlo_attrs import enum, flag, integer, ints, pairs, result_type
from kaun_ir.runtime.xla import mlir


def dot_general(imp, op, xs, env):
    """``stablehlo.dot_general``: the same op, a result dtype other than the operands' kept as
    ``preferred_dtype``."""
    dims = mlir.dimension_numbers("dot", op.attributes["dot_dimension_numbers"])
    out = result_type(op).dtype
    return imp.add(
        "dot_general",
        *xs,
        lhs_batch=tuple(dims.lhs_batching_dimensions),
        rhs_batch=tuple(dims.rhs_batching_dimensions),
        lhs_contracting=tuple(dims.lhs_contracting_dimensions),
        rhs_contracting=tuple(dims.rhs_contracting_dimensions),
        preferred_dtype=None if out == xs[0].dtype else out,
    )


def dot(imp, op, xs, env):
    """``stablehlo.dot``: a ``dot_general`` contracting the last axis of the left operand with
    the first of the right."""
    lhs, rhs = xs
    out = result_type(op).dtype
    return imp.add(
        "dot_general",
        lhs,
        rhs,
        lhs_batch=(),
        rhs_batch=(),
        lhs_contracting=(lhs.type.ndim - 1,),
        rhs_contracting=(0,),
        preferred_dtype=None if out == lhs.dtype else out,
    )


def convolution(imp, op, xs, env):
    """``stablehlo.convolution`` (without window reversal), its dimension numbers as layout specs.

    A result dtype other than the operands' (``i8 x i8 -> i32``, ``bf16 x bf16 -> f32``: the
    producer's preferred element type) is the same convolution on operands converted to the
    result dtype first: every product and partial sum is then exact in, or wraps like, the
    accumulator."""
    if "window_reversal" in op.attributes and any(bool(v) for v in op.attributes["window_reversal"]):
        raise StableHLOImportError("convolution with window_reversal is not supported")
    out = result_type(op).dtype
    if any(x.dtype != out for x in xs):
        kinds = {dtypes.is_float(x.dtype) for x in xs} | {dtypes.is_float(out)}
        if len(kinds) != 1 or any(x.dtype.itemsize > out.itemsize for x in xs):
            raise imp.error(
                op,
                "convolution of "
                + " x ".join(dtypes.short_name(x.dtype) for x in xs)
                + f" -> {dtypes.short_name(out)}: only a result of the operands' kind at least as "
                "wide as they are (a wider accumulator) is supported",
            )
        xs = [x if x.dtype == out else imp.add1("convert", x, dtype=out) for x in xs]
    d = mlir.dimension_numbers("conv", op.attributes["dimension_numbers"])
    spatial = len(d.input_spatial_dimensions)
    ones = (1,) * spatial
    return imp.add(
        "convolution",
        *xs,
        window_strides=ints(op, "window_strides", ones),
        padding=pairs(op, "padding", spatial),
        lhs_dilation=ints(op, "lhs_dilation", ones),
        rhs_dilation=ints(op, "rhs_dilation", ones),
        lhs_spec=(d.input_batch_dimension, d.input_feature_dimension, *d.input_spatial_dimensions),
        rhs_spec=(
            d.kernel_output_feature_dimension,
            d.kernel_input_feature_dimension,
            *d.kernel_spatial_dimensions,
        ),
        out_spec=(d.output_batch_dimension, d.output_feature_dimension, *d.output_spatial_dimensions),
        feature_group_count=integer(op, "feature_group_count", 1),
        batch_group_count=integer(op, "batch_group_count", 1),
    )


def triangular_solve(imp, op, xs, env):
    """``stablehlo.triangular_solve``: the op of the same name (real dtypes, where ADJOINT is
    TRANSPOSE)."""
    return imp.add(
        "triangular_solve",
        *xs,
        left_side=flag(op, "left_side"),
        lower=flag(op, "lower"),
        unit_diagonal=flag(op, "unit_diagonal"),
        transpose_a=enum(op, "transpose_a"),
    )


#: the LAPACK triangular solves JAX's CPU lowering calls (``?trsm``), real dtypes
LAPACK_TRSM = ("lapack_strsm_ffi", "lapack_dtrsm_ffi")


def lapack_trsm(imp, op, xs, env):
    """JAX's ``lax.linalg.triangular_solve`` on CPU: a custom call to LAPACK ``?trsm`` whose
    ``side`` / ``uplo`` / ``trans_x`` / ``diag`` attributes are the characters ``L``/``R``,
    ``L``/``U``, ``N``/``T``/``C`` and ``U``/``N``; it is the op table's ``triangular_solve``."""
    config = op.attributes["mhlo.backend_config"]
    chars = {name: chr(mlir.integer_value(config[name])) for name in ("side", "uplo", "trans_x", "diag")}
    transpose = {"N": "NO_TRANSPOSE", "T": "TRANSPOSE", "C": "ADJOINT"}[chars["trans_x"]]
    return imp.add(
        "triangular_solve",
        *xs,
        left_side=chars["side"] == "L",
        lower=chars["uplo"] == "L",
        unit_diagonal=chars["diag"] == "U",
        transpose_a=transpose,
    )

"""User-facing errors: each names the op, the operand types or shapes, and the layer path, and
says what to do instead."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.surface.tensor import apply

F32 = np.float32


# ------------------------------------------------------------------------ shapes


def test_non_broadcastable_shapes_in_jit_name_the_op_and_both_shapes():
    f = kn.jit(lambda x, y: x + y)
    with pytest.raises(kn.ShapeError) as info:
        f(np.ones((2, 3), F32), np.ones(4, F32))
    assert str(info.value) == "add: shapes [2,3] and [4] do not broadcast"
    assert isinstance(info.value, ValueError)  # ShapeError is also a ValueError


def test_shape_error_inside_a_scope_names_the_layer_path():
    def f(x, y):
        with kn.ir.scope("encoder"):
            with kn.ir.scope("1.linear"):
                return x * y

    with pytest.raises(kn.ShapeError) as info:
        kn.jit(f)(np.ones((2, 3), F32), np.ones((3, 2), F32))
    assert str(info.value) == "encoder.1.linear: multiply: shapes [2,3] and [3,2] do not broadcast"


def test_shape_error_outside_a_trace_too():
    with pytest.raises(kn.ShapeError, match=r"^subtract: shapes \[3\] and \[2\] do not broadcast$"):
        kn.subtract(np.ones(3, F32), np.ones(2, F32))


def test_primitive_shape_mismatch_names_op_and_operand_types():
    def f(x, y):
        with kn.ir.scope("head"):
            return apply("add", x, y)

    with pytest.raises(kn.ShapeError) as info:
        kn.trace(f, np.ones(2, F32), np.ones(3, F32))
    assert str(info.value).startswith("head: add of f32[2] and f32[3]: ")
    assert "same shape" in str(info.value)


# ------------------------------------------------------------------------ dtypes


def test_wrong_dtype_to_a_primitive_is_a_type_error_naming_op_and_types():
    a, b = np.ones(2, F32), np.ones(2, np.int32)
    with pytest.raises(TypeError) as eager:
        apply("add", a, b)  # outside a trace: the op runs eagerly and checks first
    with pytest.raises(TypeError) as traced:
        kn.trace(lambda x, y: apply("add", x, y), a, b)
    for info in (eager, traced):
        assert not isinstance(info.value, kn.ShapeError)
        assert str(info.value).startswith("add of f32[2] and i32[2]: ")
        assert "dtype" in str(info.value)


def test_wrong_dtype_inside_a_scope_names_the_layer_path():
    def f(x, y):
        with kn.ir.scope("0.norm"):
            return apply("multiply", x, y)

    with pytest.raises(TypeError, match=r"^0\.norm: multiply of f16\[3\] and bf16\[3\]: "):
        kn.trace(f, np.ones(3, np.float16), np.ones(3, kn.bfloat16))


def test_unknown_or_missing_attributes_are_type_errors():
    x = np.ones(6, F32)
    with pytest.raises(TypeError, match=r"reshape: unknown attribute\(s\) colour \(known: shape\)"):
        kn.trace(lambda v: apply("reshape", v, shape=(6,), colour=1), x)
    with pytest.raises(TypeError, match=r"reshape: missing attribute\(s\) shape"):
        kn.trace(lambda v: apply("reshape", v), x)


def test_unsupported_dtype_is_a_clear_type_error():
    with pytest.raises(TypeError, match="complex64 is not supported by kaun_ir"):
        kn.jit(lambda v: v + 1)(np.ones(2, np.complex64))


# ------------------------------------------------------------------------ tracer misuse


def test_bool_of_a_tensor_inside_a_trace_is_a_tracer_error():
    def f(x):
        if x[0] > 0:  # Python control flow on a traced value
            return x
        return -x

    with pytest.raises(kn.TracerError) as info:
        kn.jit(f)(np.ones(3, F32))
    message = str(info.value)
    assert message.startswith("bool() of a traced bool[] needs a concrete value")
    assert "kn.where" in message  # says what to do instead
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "convert,what",
    [
        (int, "int()"),
        (float, "float()"),
        (np.asarray, "np.asarray()"),
        (lambda t: [0, 1, 2][t], "using as an index"),
    ],
)
def test_other_concrete_conversions_are_tracer_errors(convert, what):
    with pytest.raises(kn.TracerError, match=rf"^{re.escape(what)} of a traced f32\[\]"):
        kn.trace(lambda x: convert(x[0]), np.ones(3, F32))


def test_tensor_used_in_another_trace_after_its_own_finished():
    leaked = []
    kn.trace(lambda x: leaked.append(x) or x, np.ones(2, F32))
    with pytest.raises(kn.TracerError, match=r"a f32\[2\] tensor from a trace that has already finished"):
        kn.trace(lambda y: y + leaked[0], np.ones(2, F32))
    with pytest.raises(kn.TracerError, match="already finished"):
        kn.jit(lambda y: leaked[0] * y)(np.ones(2, F32))


def test_tensor_used_eagerly_after_its_trace_finished():
    leaked = []
    kn.trace(lambda x: leaked.append(x) or x, np.ones(2, F32))
    with pytest.raises(kn.TracerError, match="already finished"):
        kn.exp(leaked[0])


# ------------------------------------------------------------------------ reshape


def test_reshape_to_an_incompatible_size():
    x = np.ones((2, 3), F32)
    pattern = r"^reshape of f32\[2,3\]: cannot reshape 6 elements into \[4, 2\]$"
    with pytest.raises(kn.ShapeError, match=pattern):
        kn.jit(lambda v: v.reshape(4, 2))(x)
    with pytest.raises(kn.ShapeError, match=r"^reshape of f32\[2,3\]: cannot reshape 6 elements into \[5\]$"):
        kn.reshape(x, (5,))  # eager
    with pytest.raises(kn.ShapeError, match=r"more than one -1"):
        kn.reshape(x, (-1, -1))


def test_reshape_error_inside_a_scope_names_the_layer_path():
    def f(v):
        with kn.ir.scope("3.flatten"):
            return v.reshape(7)

    with pytest.raises(kn.ShapeError, match=r"^3\.flatten: reshape of f32\[2,3\]: cannot reshape 6 elements"):
        kn.trace(f, np.ones((2, 3), F32))


def test_reshape_with_bad_minus_one_names_layer_path_and_type():
    def f(v):
        with kn.ir.scope("3.flatten"):
            return v.reshape(-1, 4)

    with pytest.raises(kn.ShapeError, match=r"^3\.flatten: reshape of f32\[2,3\]: cannot infer -1"):
        kn.trace(f, np.ones((2, 3), F32))


# ------------------------------------------------------------------------ unknown ops


def test_unknown_op_in_parsed_text():
    text = "graph @main(%0: f32[2]) -> (f32[2]) {\n  %1 = frobnicate %0 : f32[2]\n  return %1\n}\n"
    with pytest.raises(kn.ParseError) as info:
        kn.ir.parse(text)
    assert (info.value.line, info.value.column) == (2, 8)
    assert "unknown op 'frobnicate'" in str(info.value)


def test_unknown_op_in_apply():
    with pytest.raises(KeyError, match="frobnicate"):
        apply("frobnicate", np.ones(2, F32))


def test_bad_scope_names():
    with pytest.raises(ValueError, match="non-empty string"):
        with kn.ir.scope(""):
            pass
    with pytest.raises(ValueError, match="non-empty string"):
        with kn.ir.scope(3):
            pass
    assert kn.ir.current_path() == ""  # nothing left pushed


# ------------------------------------------------------------------------ the error classes

# Exceptions that are signals, not errors: raised and caught by kaun_ir's own code (or raised by
# the user to stop ``fit``), never reported as a failure, so they stay beside the code they steer.
SIGNALS = {
    "kaun_ir.train.loop.EarlyStop": "raised by the user's report callback to end train.fit",
    "kaun_ir.train.closure_key.Opaque": "the closure inspection gives up on a value; caught in capture",
    "kaun_ir.train.capture.Unlifted": "a traced loss baked an array in; caught by train.loop",
    "kaun_ir.runtime.xla.mlir_bytecode_refs._Truncated": "the cycle check ran off a truncated table; "
    "caught there (MLIR's own reader then names the damage)",
}


def _package_modules():
    """Every module of the package (kaun_ir, passes, runtime, tools), imported."""
    import importlib
    import pkgutil

    roots = ["kaun_ir", "kaun_ir.passes", "kaun_ir.runtime", "kaun_ir.tools"]
    modules = {name: importlib.import_module(name) for name in roots}
    for root in roots:
        for info in pkgutil.walk_packages(modules[root].__path__, root + "."):
            if info.name in modules:
                continue
            try:
                modules[info.name] = importlib.import_module(info.name)
            except ImportError as err:  # an optional extra (PyTorch, transformers) is missing
                assert not (err.name or "").startswith("kaun_ir"), err
    return modules


def _exception_classes():
    """``{qualified name: class}`` of every exception class defined in a package module."""
    found = {}
    for name, module in _package_modules().items():
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def test_every_error_class_is_defined_in_errors_and_is_a_kaun_error():
    from kaun_ir import errors

    classes = _exception_classes()
    outside = sorted(name for name, cls in classes.items() if cls.__module__ != errors.__name__)
    assert outside == sorted(SIGNALS), f"exception classes outside kaun_ir.errors: {outside}"
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.KaunError), f"{name} is not a KaunError"
        assert cls.__doc__ and cls.__doc__.strip(), f"{name} has no docstring"
    defined = [name for name, cls in vars(errors).items() if isinstance(cls, type)]
    assert sorted(errors.__all__) == sorted(defined)


def test_error_class_names_are_unique():
    classes = _exception_classes()
    short = [cls.__name__ for cls in classes.values()]
    assert len(short) == len(set(short)), sorted(n for n in short if short.count(n) > 1)


def test_moved_errors_keep_their_builtin_bases_and_old_spellings():
    # code written before the classes moved catches them by their builtin base or old spelling
    assert issubclass(kn.TracerError, TypeError)
    assert issubclass(kn.rng.NoScopeError, RuntimeError)
    assert issubclass(kn.passes.PipelineError, ValueError)
    assert issubclass(kn.primitives.PrimitiveError, TypeError)
    assert issubclass(kn.errors.RewriteError, RuntimeError)
    assert kn.runtime.stablehlo_import.StableHLOImportError is kn.errors.StableHLOImportError
    assert kn.passes.PassCrash is kn.errors.PassCrash
    with pytest.raises(kn.KaunError):
        kn.rng.next_key()

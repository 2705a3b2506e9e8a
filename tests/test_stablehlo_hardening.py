"""Untrusted StableHLO: damaged bytecode never ends the process, recursion and deep call chains
are import errors or work, splat constants stay small, every float width's hex literals import,
and the CLI names the file in one line. Values are checked against JAX and NumPy."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.errors import StableHLOImportError
from kaun_ir.runtime.interop import stablehlo_attrs
from kaun_ir.runtime.xla import mlir


def _portable() -> bytes:
    graph = kn.trace(lambda x: kn.tanh(x) + 1.0, np.ones(3, np.float32))
    return mlir.serialize_portable(kn.runtime.lower(graph))


def _in_child(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: a process death is a failed test, not a dead worker."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


# ---------------------------------------------------------------- damaged bytecode


def test_non_utf8_string_table_is_an_import_error_not_an_abort():
    result = _in_child(
        """
        import numpy as np, kaun_ir as kn
        from kaun_ir.runtime.xla import mlir
        graph = kn.trace(lambda x: kn.tanh(x) + 1.0, np.ones(3, np.float32))
        data = bytearray(mlir.serialize_portable(kn.runtime.lower(graph)))
        data[data.index(b"builtin") + 1] = 0xFF  # a string of the string table is no longer UTF-8
        try:
            kn.ir.from_stablehlo(bytes(data))
        except kn.errors.StableHLOImportError as err:
            print("raised:", err)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised:" in result.stdout and "not UTF-8" in result.stdout, result.stdout


def test_portable_artifact_with_bad_strings_past_the_frame_check_does_not_abort():
    # straight into the deserialiser (the frame check skipped): its diagnostics are not UTF-8
    result = _in_child(
        """
        import numpy as np, kaun_ir as kn
        from kaun_ir.runtime.xla import mlir
        graph = kn.trace(lambda x: kn.tanh(x) + 1.0, np.ones(3, np.float32))
        data = bytearray(mlir.serialize_portable(kn.runtime.lower(graph)))
        data[data.index(b"builtin") + 1] = 0xFF
        with mlir.mlir_context() as ctx:
            try:
                mlir._deserialize_quietly(ctx, bytes(data), "x.mlirbc")
            except ValueError as err:
                print("raised:", err)
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised: x.mlirbc is not a valid portable StableHLO artifact" in result.stdout


def test_a_reader_crash_in_the_helper_is_an_error_and_the_helper_restarts():
    # found by tests/fuzz_stablehlo.py: one changed byte of this artifact crashes MLIR's bytecode
    # reader (SIGSEGV); only the helper process may die of it
    result = _in_child(
        """
        import jax, numpy as np, kaun_ir as kn
        from kaun_ir.runtime.xla import mlir
        f = jax.jit(lambda a: jax.lax.fori_loop(0, 4, lambda i, c: c + a, a))
        text = f.lower(np.ones((2, 3), np.float32)).as_text()
        data = bytearray(mlir.serialize_portable(text))
        mlir._TRUSTED.clear()  # read as a stranger's file
        data[322] = 7
        try:
            kn.ir.from_stablehlo(bytes(data))
            print("imported")
        except kn.errors.StableHLOImportError as err:
            print("raised:", err)
        kn.ir.from_stablehlo(text)  # a new helper answers
        print("again")
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised: the StableHLO module (844 bytes)" in result.stdout and "again" in result.stdout, (
        result.stdout
    )


def test_a_read_over_the_cpu_budget_is_an_error(monkeypatch):
    # found by tests/fuzz_stablehlo.py: two changed bytes of this artifact send MLIR's reader into
    # a loop; the helper is killed once it has spent its CPU budget on it
    def mlp(x, w):
        return kn.sum(kn.fn.gelu(x @ w) ** 2)

    graph = kn.trace(mlp, np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    data = bytearray(mlir.serialize_portable(kn.runtime.lower(graph)))
    if len(data) != 1593 or (data[592], data[1350]) != (7, 114):
        pytest.skip("the lowering changed: the artifact is not the one the fuzzer damaged")
    data[592], data[1350] = 5, 127
    from kaun_ir.runtime.xla import mlir_helper

    monkeypatch.setattr(mlir_helper, "HELPER_CPU_S", 1.0)
    with pytest.raises(
        ValueError, match=r"x\.mlirbc cannot be read as StableHLO: reading it took longer than 1 s of CPU"
    ):
        mlir.read_in_helper(bytes(data), "x.mlirbc")
    monkeypatch.undo()
    text = _module("    %r = stablehlo.negate %a : tensor<2xf32>", "tensor<2xf32>", "%a: tensor<2xf32>")
    assert "stablehlo.negate" in mlir.read_in_helper(text, "m.mlir")  # a new helper answers


def test_an_attribute_that_names_itself_is_refused_before_mlir_reads_it():
    # the fuzzer's remaining hang, minimal: one byte of this artifact makes a location attribute
    # (a NameLoc) name itself as its name; MLIR's bytecode reader then defers resolving it forever.
    # The frame check finds the cycle in the attribute table, before any MLIR reader runs.
    def mlp(x, w):
        return kn.sum(kn.fn.gelu(x @ w) ** 2)

    graph = kn.trace(mlp, np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
    data = bytearray(mlir.serialize_portable(kn.runtime.lower(graph)))
    if len(data) != 1593 or data[163:166] != bytes.fromhex("1d4f07"):
        pytest.skip("the lowering changed: the artifact is not the one the fuzzer damaged")
    data[164] = 0x01  # NameLoc #0: name = attribute #0 (itself), was #39
    with pytest.raises(StableHLOImportError, match=r"refers to itself \(attribute #0 -> attribute #0\)"):
        kn.ir.from_stablehlo(bytes(data))
    data[164], data[165] = 0x4F, 0x01  # its name again, its child location itself
    with pytest.raises(ValueError, match=r"x\.mlirbc: damaged MLIR bytecode: an entry refers to itself"):
        mlir.read_in_helper(bytes(data), "x.mlirbc")
    assert kn.ir.from_stablehlo(bytes(mlir.serialize_portable(kn.runtime.lower(graph)))).nodes


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:3],  # no magic
        lambda d: d[:40],  # truncated in a section
        lambda d: d[:-5],
        lambda d: d[:4] + b"\x7f" + d[5:],  # an unknown bytecode version
        lambda d: d.replace(b"StableHLO_v", b"StableHLO_\xff"),  # producer not UTF-8
        lambda d: d + b"\x00",
    ],
)
def test_damaged_bytecode_is_an_import_error(damage):
    with pytest.raises(StableHLOImportError, match=r"StableHLO module \(\d+ bytes\)"):
        kn.ir.from_stablehlo(damage(_portable()))


def test_plain_mlir_bytecode_imports_and_damaged_plain_bytecode_is_an_error():
    plain = mlir.deserialize_portable(_portable())  # plain MLIR bytecode (not versioned)
    graph = kn.ir.from_stablehlo(plain)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    (got,) = kn.runtime.compile(graph)(x)
    np.testing.assert_allclose(np.asarray(got), np.tanh(x) + 1.0, rtol=1e-6)
    with pytest.raises(StableHLOImportError):
        kn.ir.from_stablehlo(plain[: len(plain) // 2])


def test_text_whose_diagnostics_are_not_utf8_is_an_error():
    text = jax.jit(jnp.sin).lower(jnp.ones(2)).as_text()
    bad = text.replace("func.func public @main", 'func.func public @"ma\\ffin"')
    with pytest.raises(StableHLOImportError):
        kn.ir.from_stablehlo(bad, name="nope")


# ---------------------------------------------------------------- calls

_FUNC = """  func.func {vis}@{name}(%a: tensor<2xf32>) -> tensor<2xf32> {{
    %0 = stablehlo.negate %a : tensor<2xf32>
    %1 = func.call @{callee}(%0) : (tensor<2xf32>) -> tensor<2xf32>
    return %1 : tensor<2xf32>
  }}
"""
_LEAF = """  func.func private @{name}(%a: tensor<2xf32>) -> tensor<2xf32> {{
    return %a : tensor<2xf32>
  }}
"""


def _chain(names: list[str], leaf: str | None) -> str:
    """``@main`` calls names[0], which calls names[1], ...; the last calls ``leaf`` (or names[0]...)."""
    funcs = []
    everyone = ["main", *names]
    for i, name in enumerate(everyone):
        callee = everyone[i + 1] if i + 1 < len(everyone) else (leaf or names[0])
        funcs.append(_FUNC.format(vis="" if name == "main" else "private ", name=name, callee=callee))
    if leaf:
        funcs.append(_LEAF.format(name=leaf))
    return "module {\n" + "".join(funcs) + "}\n"


def test_self_recursion_is_an_import_error_naming_the_function():
    with pytest.raises(StableHLOImportError, match=r"recursive call of @f \(@f -> @f\)"):
        kn.ir.from_stablehlo(_chain(["f"], None))


def test_mutual_recursion_is_an_import_error_naming_the_cycle():
    with pytest.raises(StableHLOImportError, match=r"recursive call of @f \(@f -> @g -> @h -> @f\)"):
        kn.ir.from_stablehlo(_chain(["f", "g", "h"], None))


def test_a_deep_call_chain_imports_and_computes():
    depth = 60
    graph = kn.ir.from_stablehlo(_chain([f"f{i}" for i in range(depth)], "leaf"))
    x = np.array([1.5, -2.0], np.float32)
    (got,) = kn.runtime.compile(graph)(x)
    np.testing.assert_array_equal(np.asarray(got), (-1.0) ** (depth + 1) * x)  # main negates too


def test_a_too_deep_call_chain_is_a_clear_error():
    from kaun_ir.runtime.interop.stablehlo_import import MAX_CALL_DEPTH

    with pytest.raises(StableHLOImportError, match=rf"inlines at most {MAX_CALL_DEPTH}"):
        kn.ir.from_stablehlo(_chain([f"f{i}" for i in range(MAX_CALL_DEPTH + 5)], "leaf"))


# ---------------------------------------------------------------- constants


def _module(body: str, result: str, args: str = "") -> str:
    return (
        f"module {{\n  func.func @main({args}) -> {result} {{\n{body}\n    return %r : {result}\n  }}\n}}\n"
    )


def test_a_huge_splat_stays_a_scalar_and_a_broadcast():
    t = "tensor<1000000x1000000xf32>"  # 4 TB if materialised
    graph = kn.ir.from_stablehlo(_module(f"    %r = stablehlo.constant dense<1.0> : {t}", t))
    (broadcast,) = [n for n in graph.nodes if n.op == "broadcast_in_dim"]
    (constant,) = [n for n in graph.nodes if n.op == "constant"]
    assert broadcast.outputs[0].type.shape == (1000000, 1000000)
    assert constant.outputs[0].type.shape == ()


def test_a_splat_computes_its_value():
    t = "tensor<64x32xf16>"
    text = _module(
        f"    %c = stablehlo.constant dense<0x7C00> : {t}\n    %r = stablehlo.add %a, %c : {t}",
        t,
        f"%a: {t}",
    )
    x = np.linspace(-2, 2, 64 * 32).reshape(64, 32).astype(np.float16)
    (got,) = kn.runtime.compile(kn.ir.from_stablehlo(text))(x)
    np.testing.assert_array_equal(np.asarray(got), x + np.float16(np.inf))


def test_a_constant_over_the_size_limit_is_an_import_error(monkeypatch):
    monkeypatch.setattr(stablehlo_attrs, "MAX_CONSTANT_BYTES", 16)
    t = "tensor<8xf32>"
    text = _module(f"    %r = stablehlo.constant dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]> : {t}", t)
    with pytest.raises(StableHLOImportError, match=r"32 bytes\) is larger than the importer's limit of 16"):
        kn.ir.from_stablehlo(text)


_SPECIAL = [1.5, np.inf, -np.inf, np.nan, -0.0, 1e-7, 6e-8, 3e-39, 5e-324, -2.5e30, 65504.0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_float_constants_mixing_hex_and_decimal_literals_import(dtype):
    with jax.enable_x64(dtype == "float64"):
        dt = jnp.dtype(dtype)
        with np.errstate(over="ignore"):  # -2.5e30 is -inf in float16
            const = np.array(_SPECIAL, np.float64).astype(dt)

        def f(x):
            return x * 2 + const

        x = np.arange(len(_SPECIAL)).astype(dt)
        text = jax.jit(f).lower(x).as_text()
        assert "0x" in text.split("stablehlo.constant")[1].split("\n")[0]  # hex literals are there
        expected = np.asarray(jax.jit(f)(x))
    (got,) = kn.runtime.compile(kn.ir.from_stablehlo(text))(x)
    assert np.asarray(got).dtype == expected.dtype
    # compared as float64 (NumPy's NaN-aware equality does not know bfloat16); every value is exact
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        ("int8", [-128, 127, 0, -1]),
        ("uint8", [0, 255, 128, 1]),
        ("int64", [-(2**63), 2**63 - 1, 0, -7]),
        ("uint64", [0, 2**64 - 1, 2**63, 9]),
        ("bool", [True, False, True, True]),
    ],
)
def test_integer_and_boolean_constants_import(dtype, values):
    with jax.enable_x64(True):
        const = np.array(values, dtype)

        def f(x):
            return x ^ const if dtype == "bool" else x + const

        x = np.zeros(4, dtype)
        text = jax.jit(f).lower(x).as_text()
        expected = np.asarray(jax.jit(f)(x))
    (got,) = kn.runtime.compile(kn.ir.from_stablehlo(text))(x)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize(
    ("literal", "t"),
    [
        ("dense<[1.0, 0x1FFFF]>", "tensor<2xf16>"),  # a bit pattern too wide for f16
        ("dense<[1, 300]>", "tensor<2xi8>"),
        ("dense<[1.0, 2.0, 3.0]>", "tensor<2xf32>"),
    ],
)
def test_malformed_literals_are_import_errors(literal, t):
    # MLIR rejects most of these itself; what reaches the reader is an import error either way
    with pytest.raises(StableHLOImportError):
        kn.ir.from_stablehlo(_module(f"    %r = stablehlo.constant {literal} : {t}", t))


# ---------------------------------------------------------------- the command line


def _cli(capfd, *argv) -> tuple[int, str]:
    from kaun_ir.tools.cli import main

    code = main(list(argv))
    return code, capfd.readouterr().err


@pytest.mark.parametrize("command", ["import", "opt"])
def test_cli_on_a_bad_module_names_the_file_in_one_line(tmp_path, capfd, command):
    bad = tmp_path / "bad.mlir"
    bad.write_text(
        _module("    %r = stablehlo.frobnicate %a : tensor<2xf32>", "tensor<2xf32>", "%a: tensor<2xf32>")
    )
    argv = [command, str(bad)] + (["-o", str(tmp_path / "out.kir")] if command == "import" else [])
    code, err = _cli(capfd, *argv)
    assert code == 1
    assert err.count("\n") == 1, err  # one line: no MLIR diagnostics printed beside it
    assert err.startswith(f"kaun-ir {command}: error: {bad}") and "frobnicate" in err, err


@pytest.mark.parametrize("command", ["import", "opt"])
def test_cli_on_damaged_bytecode_names_the_file_in_one_line(tmp_path, capfd, command):
    data = bytearray(_portable())
    data[data.index(b"builtin") + 1] = 0xFF
    bad = tmp_path / "bad.mlirbc"
    bad.write_bytes(bytes(data))
    argv = [command, str(bad)] + (["-o", str(tmp_path / "out.kir")] if command == "import" else [])
    code, err = _cli(capfd, *argv)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith(f"kaun-ir {command}: error: {bad}: "), err


# ---------------------------------------------------------------- textual IR


@pytest.mark.parametrize("value", [None, 3, b"graph @g() -> () {\n  return\n}"])
def test_parse_of_a_non_string_is_a_type_error_naming_the_type(value):
    with pytest.raises(TypeError, match=f"takes the textual IR as a str, got {type(value).__name__}"):
        kn.ir.parse(value)

"""The StableHLO interpreter's test suite through the importer, raw and after the default pipeline.

The runner (``tests/stablehlo_interpret_suite.py``) is checked here on small cases written in the
suite's form; the suite's own cases run when ``KAUN_IR_STABLEHLO_SUITE`` names a checkout of
openxla/stablehlo (``make test-interop``), one test per case, and skip otherwise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import stablehlo_interpret_suite as suite

# ------------------------------------------------------------------ the runner itself

EXAMPLE = """// RUN: stablehlo-translate --interpret -split-input-file %s

func.func @add_op_test_si64() {
  %0 = stablehlo.constant dense<[1, -2]> : tensor<2xi64>
  %1 = stablehlo.add %0, %0 : tensor<2xi64>
  check.expect_eq_const %1, dense<[2, -4]> : tensor<2xi64>
  func.return
}

// -----

func.func @negate_op_test_f32() {
  %0 = stablehlo.constant dense<[0x7F800000, 1.5]> : tensor<2xf32>
  %1 = stablehlo.negate %0 : tensor<2xf32>
  check.expect_almost_eq_const %1,
      dense<[0xFF800000, -1.500010e+00]> : tensor<2xf32>
  check.expect_eq %1, %1 : tensor<2xf32>
  func.return
}

func.func @second_function_in_the_same_piece() {
  %0 = stablehlo.constant dense<true> : tensor<2xi1>
  %1 = stablehlo.not %0 : tensor<2xi1>
  check.expect_eq_const %1, dense<false> : tensor<2xi1>
  func.return
}

// -----

func.func @add_op_test_si4() {
  %0 = stablehlo.constant dense<[1]> : tensor<1xi4>
  check.expect_eq_const %0, dense<[1]> : tensor<1xi4>
  func.return
}
"""


def test_the_runner_splits_pieces_into_test_functions_and_excludes_with_a_reason():
    cases = suite.split_file("example.mlir", EXAMPLE)
    assert [c.id for c in cases] == [
        "example.mlir:0:add_op_test_si64",
        "example.mlir:1:negate_op_test_f32",
        "example.mlir:1:second_function_in_the_same_piece",
        "example.mlir:2:add_op_test_si4",
    ]
    assert [c.exclusion is None for c in cases] == [True, True, True, False]
    assert "sub-byte integers" in cases[3].exclusion
    negate = cases[1]
    assert [c.kind for c in negate.checks] == ["expect_almost_eq_const", "expect_eq"]
    assert "check." not in negate.module and "second_function" not in negate.module
    assert "func.return %1, %1, %1 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>" in negate.module


@pytest.mark.parametrize(
    "literal, type_text, want",
    [
        ("dense<[[1, 2], [3, 4]]>", "tensor<2x2xi32>", np.array([[1, 2], [3, 4]], np.int32)),
        ("dense<7>", "tensor<3xui8>", np.full(3, 7, np.uint8)),
        ("dense<0xFF>", "tensor<i8>", np.array(-1, np.int8)),
        ("dense<[true, false]>", "tensor<2xi1>", np.array([True, False])),
        ("dense<[0x7FC0, -2.5]>", "tensor<2xbf16>", np.array([np.nan, -2.5], ml_dtypes.bfloat16)),
        ("dense<0x0000000000000001>", "tensor<f64>", np.array(5e-324)),
        ('dense<"0x0100000002000000">', "tensor<2xi32>", np.array([1, 2], np.int32)),
        ("dense<>", "tensor<2x0xf32>", np.zeros((2, 0), np.float32)),
    ],
)
def test_expected_constants_are_read_as_the_suite_writes_them(literal, type_text, want):
    got = suite.parse_dense(literal, type_text)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_the_runner_passes_right_results_and_fails_wrong_ones():
    right = suite.split_file("example.mlir", EXAMPLE)[1]
    assert suite.run_case(right, optimised=False) is None
    assert suite.run_case(right, optimised=True) is None
    # the same program checked against a value off by more than the tolerance (1e-4) must fail
    wrong = suite.split_file("example.mlir", EXAMPLE.replace("-1.500010e+00", "-1.5002"))[1]
    problem = suite.run_case(wrong, optimised=False)
    assert problem is not None and "1 of 2 elements differ, first at [1]" in problem
    # a scalar that differs is found too (a 0-d result has one element)
    scalar = suite.Check("expect_eq_const", ["%0"], ["tensor<f64>"], np.array(np.inf))
    assert "differ" in suite.mismatch(scalar, [np.array(np.nan)])


def test_almost_equal_follows_the_interpreters_rule():
    check = suite.Check("expect_almost_eq_const", ["%0"], ["tensor<4xf32>"])
    check.expected = np.array([np.nan, np.inf, 0.0, 1.0], np.float32)
    assert suite.mismatch(check, [np.array([np.nan, np.inf, 1e-5, 1.00005], np.float32)]) is None
    assert suite.mismatch(check, [np.array([np.nan, -np.inf, 0.0, 1.0], np.float32)]) is not None
    assert suite.mismatch(check, [np.array([np.nan, np.inf, 0.0, 1.0], np.float64)]) is not None  # dtype


# ------------------------------------------------------------------ the suite's own cases

_FOLDER = suite.suite_dir()
_CASES = suite.load_cases(_FOLDER) if _FOLDER else []
_IN_SCOPE = [c for c in _CASES if c.exclusion is None]


@pytest.mark.long
@pytest.mark.skipif(not _FOLDER, reason=f"set {suite.SUITE_ENV} to a checkout of openxla/stablehlo")
@pytest.mark.parametrize("case", _IN_SCOPE or [None], ids=[c.id for c in _IN_SCOPE] or ["none"])
def test_interpreter_suite_case(case):
    """One case of the suite: every check holds, as imported and after the default pipeline."""
    assert suite.run_case(case, optimised=False) is None, suite.run_case(case, optimised=False)
    problem = suite.run_case(case, optimised=True)
    assert problem is None, problem


@pytest.mark.long
@pytest.mark.skipif(not _FOLDER, reason=f"set {suite.SUITE_ENV} to a checkout of openxla/stablehlo")
def test_interpreter_suite_exclusions_each_have_a_reason():
    assert _IN_SCOPE, "no case of the suite is in scope: is the folder right?"
    assert all(c.exclusion for c in _CASES if c not in _IN_SCOPE)
    assert not [c.id for c in _CASES if c.exclusion and c.exclusion.startswith("not understood")]

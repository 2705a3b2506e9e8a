"""Entries of the PyTorch importer's ATen table that need no PyTorch to check: each is traced
with kaun_ir tensors and compared with NumPy's semantics of the PyTorch op."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.runtime.interop.torch_ops import ATEN


def test_div_trunc_of_integers_stays_integer_and_exact():
    a = np.array([7, -7, 7, -7, 6, -6, 2**30 + 1, -(2**30) - 3], np.int32)
    b = np.array([2, 2, -2, -2, 3, 3, 3, 7], np.int32)
    got = np.asarray(kn.jit(lambda a, b: ATEN["aten.div.Tensor_mode"](a, b, rounding_mode="trunc"))(a, b))
    want = np.trunc(a.astype(np.float64) / b).astype(np.int64)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_div_trunc_of_floats():
    a = np.array([7.5, -7.5, 1.0, -0.5], np.float32)
    got = np.asarray(kn.jit(lambda a: ATEN["aten.div.Tensor_mode"](a, 2.0, rounding_mode="trunc"))(a))
    np.testing.assert_array_equal(got, np.trunc(a / 2))


def test_cumsum_of_integers_is_exact_beyond_float32():
    x = np.array([[2**24, 1, 1, 3], [2**30, -5, 7, 1]], np.int32)
    for dim in (1, -1, 0):
        got = np.asarray(kn.jit(lambda x, dim=dim: ATEN["aten.cumsum.default"](x, dim))(x))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.cumsum(x.astype(np.int64), axis=dim))


def test_cumsum_of_booleans_counts():
    x = np.array([True, False, True, True])
    got = np.asarray(kn.jit(lambda x: ATEN["aten.cumsum.default"](x, 0))(x))
    np.testing.assert_array_equal(got, np.cumsum(x))


def test_64_bit_integer_inputs_that_do_not_fit_32_bits_are_refused(monkeypatch):
    from kaun_ir.errors import TorchImportError
    from kaun_ir.runtime.interop import torch_import

    # arrays need no PyTorch: stand in for the module so the tensor check finds no tensor class
    monkeypatch.setattr(torch_import, "_torch", lambda: type("torch", (), {"Tensor": type("T", (), {})}))
    ok = torch_import._to_numpy(np.array([-(2**31), 5, 2**31 - 1], np.int64))
    assert ok.dtype == np.int32 and ok.tolist() == [-(2**31), 5, 2**31 - 1]
    with pytest.raises(TorchImportError, match=r"int64 .*would wrap"):
        torch_import._to_numpy(np.array([1, 2**31], np.int64))
    with pytest.raises(TorchImportError, match=r"uint64 .*would wrap"):
        torch_import._to_numpy(np.array([2**40], np.uint64))

"""``kn.checkpoint``: SafeTensors round trips (structure, dtypes incl. bfloat16, scalars, Python
numbers), template loading (casts, errors), interoperability with ``safetensors.numpy``, and
atomic writes under a simulated crash."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import kaun_ir as kn
from kaun_ir import ptree
from kaun_ir.checkpoint import core as checkpoint


def params(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {
        "layers": [
            {
                "weight": rng.standard_normal((4, 3)).astype(dtype),
                "bias": rng.standard_normal(3).astype(dtype),
            },
            {},  # a layer without parameters (an activation)
            {
                "weight": rng.standard_normal((3, 2)).astype(dtype),
                "bias": rng.standard_normal(2).astype(dtype),
            },
        ],
        "norm": {"scale": np.ones(2, dtype)},
    }


def train_state(seed=0):
    p = params(seed)
    rng = np.random.default_rng(seed + 100)
    return {
        "params": p,
        "opt": (
            {
                "mu": ptree.map(lambda a: rng.standard_normal(a.shape).astype(a.dtype), p),
                "nu": ptree.map(lambda a: rng.random(a.shape).astype(a.dtype), p),
                "count": np.array(12, np.int32),
            },
            None,
        ),
        "step": 12,
        "lr": 0.001,
        "done": False,
    }


def assert_same_tree(actual, expected):
    """Same containers (list/tuple/dict kinds and keys), same leaf types, dtypes and values."""
    assert type(actual) is type(expected) or (
        isinstance(actual, np.ndarray) and isinstance(expected, np.ndarray)
    ), (actual, expected)
    if isinstance(expected, dict):
        assert list(sorted(actual)) == list(sorted(expected))
        for k in expected:
            assert_same_tree(actual[k], expected[k])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_tree(a, e)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        np.testing.assert_array_equal(
            actual.astype(np.float64) if actual.dtype == ml_dtypes.bfloat16 else actual,
            expected.astype(np.float64) if expected.dtype == ml_dtypes.bfloat16 else expected,
        )
    else:
        assert actual == expected


def test_round_trip_without_template(tmp_path):
    path = tmp_path / "state.safetensors"
    state = train_state()
    assert checkpoint.save(path, state) == str(path)
    loaded = checkpoint.load(path)
    assert_same_tree(loaded, state)
    assert isinstance(loaded["opt"], tuple) and loaded["opt"][1] is None
    assert loaded["params"]["layers"][1] == {}
    assert type(loaded["step"]) is int and type(loaded["lr"]) is float
    assert type(loaded["done"]) is bool


def test_file_is_plain_safetensors_with_dotted_keys(tmp_path):
    path = tmp_path / "p.safetensors"
    p = params()
    checkpoint.save(path, p)
    with safe_open(str(path), framework="np") as f:
        keys = sorted(f.keys())
        meta = f.metadata()
        weight = f.get_tensor("layers.2.weight")
    assert keys == ["layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight", "norm.scale"]
    np.testing.assert_array_equal(weight, p["layers"][2]["weight"])
    structure = json.loads(meta[checkpoint.STRUCTURE_KEY])
    assert structure[0] == "dict" and structure[1]["layers"][0] == "list"
    raw = checkpoint.load_raw(path)
    assert sorted(raw) == keys
    np.testing.assert_array_equal(raw["norm.scale"], p["norm"]["scale"])


@pytest.mark.parametrize(
    "dtype",
    [
        np.float32,
        np.float64,
        np.float16,
        ml_dtypes.bfloat16,
        np.int8,
        np.uint8,
        np.int32,
        np.int64,
        np.uint32,
        np.bool_,
    ],
)
def test_dtypes_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(5)
    arr = (rng.standard_normal((3, 5)) * 50).astype(dtype)
    scalar = np.asarray(arr[0, 0])  # 0-d
    path = tmp_path / "d.safetensors"
    checkpoint.save(path, {"a": arr, "s": scalar})
    out = checkpoint.load(path)
    assert out["a"].dtype == np.dtype(dtype) and out["s"].dtype == np.dtype(dtype)
    assert out["s"].shape == ()
    assert out["a"].tobytes() == arr.tobytes()  # bit-exact
    assert out["s"].tobytes() == scalar.tobytes()


def test_root_leaf_numpy_scalar_and_empty_tree(tmp_path):
    path = tmp_path / "x.safetensors"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    checkpoint.save(path, x)
    np.testing.assert_array_equal(checkpoint.load(path), x)
    assert list(checkpoint.load_raw(path)) == [""]
    np.testing.assert_array_equal(checkpoint.load(path, like=np.zeros((2, 3), np.float32)), x)
    checkpoint.save(path, {"s": np.float32(2.5)})
    out = checkpoint.load(path, like={"s": np.float32(0)})
    assert isinstance(out["s"], np.float32) and out["s"] == 2.5
    checkpoint.save(path, {})
    assert checkpoint.load(path) == {}


def test_device_arrays_are_saved(tmp_path):
    path = tmp_path / "j.safetensors"
    tree = {"w": jnp.arange(4.0).astype(jnp.bfloat16), "i": jnp.array([1, 2], jnp.int32)}
    checkpoint.save(path, tree)
    out = checkpoint.load(path)
    assert out["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out["w"].astype(np.float32), [0, 1, 2, 3])
    np.testing.assert_array_equal(out["i"], [1, 2])


def test_load_like_restores_a_training_state(tmp_path):
    path = tmp_path / "state.safetensors"
    saved = train_state(seed=1)
    checkpoint.save(path, saved)
    template = train_state(seed=2)  # same structure, other values
    template["step"] = 0
    loaded = checkpoint.load(path, like=template)
    assert_same_tree(loaded, saved)


def test_load_like_casts_and_follows_template_types(tmp_path):
    path = tmp_path / "p.safetensors"
    p = params(3)
    checkpoint.save(path, p)
    like = ptree.map(lambda a: a.astype(ml_dtypes.bfloat16), params(4))
    like["norm"]["scale"] = jnp.zeros(2, jnp.float16)  # a device template leaf
    like["layers"][0]["weight"] = kn.ShapeDtype((4, 3), np.float64)
    out = checkpoint.load(path, like=like)
    assert out["layers"][2]["bias"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out["layers"][2]["bias"], p["layers"][2]["bias"].astype(ml_dtypes.bfloat16))
    assert isinstance(out["norm"]["scale"], jax.Array)
    assert out["norm"]["scale"].dtype == jnp.float16
    assert out["layers"][0]["weight"].dtype == np.float64
    np.testing.assert_allclose(out["layers"][0]["weight"], p["layers"][0]["weight"])


def test_load_like_ignores_extra_keys(tmp_path):
    path = tmp_path / "s.safetensors"
    state = train_state()
    checkpoint.save(path, state)
    only_params = checkpoint.load(path, like={"params": params(9)})
    assert_same_tree(only_params, {"params": state["params"]})


def test_load_like_missing_key_names_it(tmp_path):
    path = tmp_path / "p.safetensors"
    p = params()
    checkpoint.save(path, p)
    like = params()
    like["layers"][1] = {"weight": np.zeros((3, 3), np.float32)}
    with pytest.raises(ValueError, match=r"no tensor 'layers\.1\.weight'.*'layers\.0\.bias'"):
        checkpoint.load(path, like=like)


def test_load_like_shape_mismatch_names_it(tmp_path):
    path = tmp_path / "p.safetensors"
    checkpoint.save(path, params())
    like = params()
    like["layers"][2]["weight"] = np.zeros((2, 3), np.float32)
    with pytest.raises(
        ValueError,
        match=r"'layers\.2\.weight' has shape \(3, 2\).*\(2, 3\) in the "
        "template",
    ):
        checkpoint.load(path, like=like)
    checkpoint.save(path, {"step": np.zeros(3)})
    with pytest.raises(ValueError, match="'step' holds shape"):
        checkpoint.load(path, like={"step": 0})


def test_files_from_safetensors_numpy_load(tmp_path):
    path = tmp_path / "foreign.safetensors"
    p = params(6)
    flat = {k: v for k, v in ptree.flatten_with_paths(p)}
    flat["unrelated.buffer"] = np.zeros(7, np.float32)
    save_file(flat, str(path), metadata={"format": "pt"})
    loaded = checkpoint.load(path, like=params(7))
    assert_same_tree(loaded, p)
    # without a template the tree is rebuilt from the names (keys 0..n-1 -> lists)
    raw_tree = checkpoint.load(path)
    assert set(raw_tree) == {"layers", "norm", "unrelated"}
    assert isinstance(raw_tree["layers"], dict) and sorted(raw_tree["layers"]) == ["0", "2"]
    np.testing.assert_array_equal(raw_tree["layers"]["2"]["bias"], p["layers"][2]["bias"])
    save_file({"blocks.0.w": np.ones(1, np.float32), "blocks.1.w": np.zeros(1, np.float32)}, str(path))
    tree = checkpoint.load(path)
    assert isinstance(tree["blocks"], list) and len(tree["blocks"]) == 2


def test_save_rejects_bad_trees(tmp_path):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="contains '.'"):
        checkpoint.save(path, {"a.b": np.zeros(1)})
    with pytest.raises(TypeError, match="leaf 'name' is a str"):
        checkpoint.save(path, {"name": "resnet"})
    with pytest.raises(TypeError, match="symbolic Tensor"):
        kn.trace(lambda x: checkpoint.save(path, {"x": x}) and x, np.zeros(2, np.float32))
    assert not path.exists()


class Crash(RuntimeError):
    pass


def crash_half_way(handle, data):
    handle.write(memoryview(data)[: len(data) // 2])
    raise Crash("simulated crash in the middle of the write")


def test_crash_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    old = params(0)
    checkpoint.save(path, old)
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint, "_write_bytes", crash_half_way)
    with pytest.raises(Crash):
        checkpoint.save(path, params(1))
    assert path.read_bytes() == before
    assert_same_tree(checkpoint.load(path), old)
    assert os.listdir(tmp_path) == ["model.safetensors"]  # the temporary file is gone


def test_crash_on_first_save_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "new.safetensors"
    monkeypatch.setattr(checkpoint, "_write_bytes", crash_half_way)
    with pytest.raises(Crash):
        checkpoint.save(path, params())
    assert os.listdir(tmp_path) == []


def test_overwrite_replaces_and_fsyncs(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    checkpoint.save(path, {"a": np.zeros(2)})
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    checkpoint.save(path, {"a": np.ones(3)})
    assert len(synced) >= 1  # the data file (and, on POSIX, the directory)
    np.testing.assert_array_equal(checkpoint.load(path)["a"], np.ones(3))
    assert os.listdir(tmp_path) == ["m.safetensors"]

"""kn.sharding and placement: meshes, partition specs, constraints in the IR, kn.jit on a mesh.

Multi-device checks run in one child process with 8 virtual CPU devices (sharding_worker.py);
this process has one device and checks what one device can show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.sharding import Spec

HERE = os.path.dirname(os.path.abspath(__file__))


def run_worker(*groups: str, timeout: float = 300) -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "sharding_worker.py"), *groups],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jit_checks():
    return run_worker("jit")


def ok(result: dict) -> dict:
    assert "error" not in result, result["error"]
    return result


def test_device_placement(jit_checks):
    r = ok(jit_checks["placement"])
    assert r["on1"] == [1] and r["moved"] == [0] and r["on2"] == [2]
    assert r["diff"] == 0.0


def test_mesh_jit_gradients_match_one_device(jit_checks):
    r = ok(jit_checks["mesh_grad"])
    assert r["diff"] < 1e-4
    assert r["grad_spec"] == "P(None, 'model')" and r["value_spec"] == "P()"
    assert r["constraints"] == 2  # forward and backward: autodiff carries the constraint
    assert r["sdy"] and r["roundtrip"]


def test_sharded_arrays_accepted(jit_checks):
    r = ok(jit_checks["sharded_inputs"])
    assert r["shards"] == [[4, 16]]
    assert r["same_trace"]
    assert r["diff"] < 1e-5
    assert r["own_spec"] == "P('data',)"


def test_bad_sharding_errors(jit_checks):
    r = ok(jit_checks["errors"])
    assert "ShapeError" in r["unknown_axis"]
    assert "'batch'" in r["unknown_axis"] and "'model'" in r["unknown_axis"]
    assert "ShapeError" in r["indivisible"] and "not divisible by 8" in r["indivisible"]
    assert "needs 16 devices" in r["too_big"] and "has 8" in r["too_big"]
    assert "in_shardings[0]" in r["tree_mismatch"] and "'a'" in r["tree_mismatch"]


def test_data_parallel_gradient_is_one_all_reduce(jit_checks):
    r = ok(jit_checks["all_reduce_only"])
    assert r["all_reduce"] >= 1 and r["all_gather"] == 0
    assert r["diff"] < 1e-5


# ------------------------------------------------------------------------ one device, this process


def test_constraint_in_text_ir_and_stablehlo():
    mesh = kn.sharding.mesh((1,), ("data",))
    graph = kn.trace(lambda x: kn.sharding.constrain(x * 2.0, Spec("data"), mesh=mesh),
                     kn.ShapeDtype((4, 3), kn.float32))
    text = graph.text()
    assert 'sharding_constraint' in text and '"data"' in text
    assert kn.ir.parse(text).text() == text
    mlir = kn.runtime.lower(graph)
    assert '"sdy.sharding_constraint"' in mlir and 'mesh<["data"=1]>' in mlir
    kn.runtime.parse_mlir(mlir)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(np.asarray(kn.runtime.compile(graph)(x)[0]), 2 * x)


def test_constraint_shown_by_viz():
    from kaun_ir.tools import viz

    mesh = kn.sharding.mesh((1,), ("data",))
    graph = kn.trace(lambda x: kn.sharding.constrain(kn.tanh(x), "data", mesh=mesh),
                     kn.ShapeDtype((4, 3), kn.float32))
    dot = viz.to_dot(graph)
    assert "sharding_constraint" in dot and "data" in dot


def test_errors_without_devices():
    with pytest.raises(ValueError, match="needs 2 devices"):
        kn.sharding.mesh((2,), ("data",))
    with pytest.raises(ValueError, match="needs a mesh"):
        kn.trace(lambda x: kn.sharding.constrain(x, Spec("data")), kn.ShapeDtype((4,), kn.float32))
    with pytest.raises(ValueError, match="need a mesh"):
        kn.jit(lambda x: x, in_shardings=(Spec("data"),))
    with pytest.raises(ValueError, match="distinct"):
        kn.sharding.mesh((1, 1), ("data", "data"))
    with pytest.raises(TypeError, match="partition spec entry"):
        Spec(3)
    mesh = kn.sharding.mesh((1,), ("data",))
    with pytest.raises(kn.ShapeError, match="twice"):
        kn.trace(lambda x: kn.sharding.constrain(x, Spec("data", "data"), mesh=mesh),
                 kn.ShapeDtype((4, 4), kn.float32))
    with pytest.raises(kn.ShapeError, match="rank 1"):
        kn.trace(lambda x: kn.sharding.constrain(x, Spec(None, "data"), mesh=mesh),
                 kn.ShapeDtype((4,), kn.float32))


def test_spec_forms():
    assert Spec("data", None) == Spec("data")
    from kaun_ir.runtime.mesh import as_spec
    from jax.sharding import PartitionSpec

    assert as_spec(PartitionSpec("data", None)) == Spec("data")
    assert as_spec(("data", ("a", "b"))).dims == (("data",), ("a", "b"))
    assert as_spec(None) == Spec()

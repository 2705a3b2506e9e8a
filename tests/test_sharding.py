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
from kaun_ir.sharding.placement import Spec

HERE = os.path.dirname(os.path.abspath(__file__))


def run_worker(*groups: str, timeout: float = 600) -> dict:
    # the worker's 8 devices are virtual CPU devices, also on a machine whose default is a GPU
    env = dict(os.environ, KAUN_IR_BACKEND="cpu", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "sharding_worker.py"), *groups],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jit_checks():
    return run_worker("jit", "tools", "train", "tp", "docs")


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


def test_data_parallel_training_equals_one_device(jit_checks):
    r = ok(jit_checks["data_parallel"])
    # 10 Adam steps, batch of 16 split over 8 devices vs one device
    assert r["params"] < 1e-5 and r["loss"] < 1e-5
    assert r["param_spec"] == "P()"
    assert r["all_reduce"] >= 1 and r["all_gather"] == 0


def test_fsdp_parameters_are_sharded(jit_checks):
    r = ok(jit_checks["fsdp"])
    assert r["params"] < 1e-5 and r["loss"] < 1e-5
    assert r["spec"] == "P(None, 'data')"
    assert r["devices"] == 8 and r["shards"] == [[12, 4]]  # each device holds 1/8 of the [12, 32] weight
    assert r["moment_shards"] == [[12, 4]]  # and of its Adam moment
    assert ok({"v": jit_checks["fused_steps"]})["v"] < 1e-5  # steps_per_call=5, sharded


def test_tensor_parallel_block_equals_one_device(jit_checks):
    r = ok(jit_checks["tensor_parallel"])
    assert r["params"] < 1e-5 and r["loss"] < 1e-5
    assert r["query"] == "P(None, 'model')" and r["out"] == "P('model',)"
    assert r["fc1"] == [[32, 32]]  # [32, 128] split over 4 model devices, replicated over data
    assert r["all_reduce"] >= 1
    layout = ok(jit_checks["fsdp_tensor_parallel_layout"])
    assert layout == {
        "fc1": "Spec('data', 'model')",
        "fc2": "Spec('model', 'data')",
        "ln1": "Spec('data')",
        "out_bias": "Spec('data')",
    }


def test_training_layout_errors(jit_checks):
    r = ok(jit_checks["bad_rules"])
    assert "'0.fc1.weight'" in r["axis"] and "'tensor'" in r["axis"]
    assert "param_sharding" in r["policy"] and "'zero'" in r["policy"]
    assert "data_axis 'batch'" in r["data_axis"]
    assert "batch of 3 rows" in r["batch"] and "multiple of 2" in r["batch"]


def test_distributed_docs_examples_run(jit_checks):
    r = ok(jit_checks["docs_examples"])
    assert r["blocks"] >= 8
    assert "names mesh axis 'batch'" in r["output"] and "needs 16 devices" in r["output"]


def test_scale_table_help(capsys):
    from kaun_ir.tools.bench import scale_table

    with pytest.raises(SystemExit) as exit_:
        scale_table.main(["--help"])
    assert exit_.value.code == 0 and "GPT-2-medium" in capsys.readouterr().out


def test_sharded_checkpoint_loads_onto_another_mesh(jit_checks):
    r = ok(jit_checks["sharded_checkpoint"])
    assert r["files"] == ["index.json", "shards-00000-of-00001.safetensors"]
    assert r["leftovers"] == []  # no staging or old directories left behind
    assert r["diff"] == 0.0
    assert r["a_spec"] == "P(None, 'data')" and r["a_shards"] == [[8, 2]]
    assert r["host"] == [0, 1, 2] and r["step"] == 7
    assert "'a'" in r["bad"] and "(8, 13)" in r["bad"]


def test_dump_stats_shows_shardings_and_collectives(jit_checks):
    r = ok(jit_checks["dump_stats"])
    assert r["code"] == 0
    text = r["text"]
    assert "shardings (sharding_constraint):" in text
    assert "f32[784,256] [{}, {model}] mesh {'data': 4, 'model': 2}" in text
    counts = {
        line.split()[0]: int(line.split()[1])
        for line in text.splitlines()
        if line.strip().startswith(("all-reduce", "all-gather"))
    }
    assert counts["all-reduce"] >= 1


# ------------------------------------------------------------------------ one device, this process


def test_constraint_in_text_ir_and_stablehlo():
    mesh = kn.sharding.mesh((1,), ("data",))
    graph = kn.trace(
        lambda x: kn.sharding.constrain(x * 2.0, Spec("data"), mesh=mesh), kn.ShapeDtype((4, 3), kn.float32)
    )
    text = graph.text()
    assert "sharding_constraint" in text and '"data"' in text
    assert kn.ir.parse(text).text() == text
    mlir = kn.runtime.lower(graph)
    assert '"sdy.sharding_constraint"' in mlir and 'mesh<["data"=1]>' in mlir
    kn.runtime.parse_mlir(mlir)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(np.asarray(kn.runtime.compile(graph)(x)[0]), 2 * x)


def test_constraint_shown_by_viz():
    from kaun_ir.tools.viz import command as viz

    mesh = kn.sharding.mesh((1,), ("data",))
    graph = kn.trace(
        lambda x: kn.sharding.constrain(kn.tanh(x), "data", mesh=mesh), kn.ShapeDtype((4, 3), kn.float32)
    )
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
        kn.trace(
            lambda x: kn.sharding.constrain(x, Spec("data", "data"), mesh=mesh),
            kn.ShapeDtype((4, 4), kn.float32),
        )
    with pytest.raises(kn.ShapeError, match="rank 1"):
        kn.trace(
            lambda x: kn.sharding.constrain(x, Spec(None, "data"), mesh=mesh), kn.ShapeDtype((4,), kn.float32)
        )


def test_spec_forms():
    assert Spec("data", None) == Spec("data")
    from jax.sharding import PartitionSpec

    from kaun_ir.runtime.mesh import as_spec

    assert as_spec(PartitionSpec("data", None)) == Spec("data")
    assert as_spec(("data", ("a", "b"))).dims == (("data",), ("a", "b"))
    assert as_spec(None) == Spec()


def test_data_shard():
    from kaun_ir import data

    items = list(range(11))
    parts = [data.to_array(data.shard(i, 3, data.of_array(items))) for i in range(3)]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # 11 // 3 each: the processes stay in step
    assert len(data.shard(1, 3, data.of_array(items))) == 3
    unknown = data.shard(1, 2, data.of_iterable(iter_again(items)))
    assert data.to_array(unknown) == [1, 3, 5, 7, 9]
    unknown.reset()
    assert data.to_array(unknown) == [1, 3, 5, 7, 9]
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    batches = data.to_array(data.shard(1, 2, data.prepare((x, x[:, 0]), 4)))
    assert len(batches) == 2
    assert np.array_equal(batches[0][0], x[4:8]) and np.array_equal(batches[1][0], x[12:16])
    with pytest.raises(ValueError, match="not in"):
        data.shard(2, 2, data.of_array(items))
    with pytest.raises(ValueError, match=">= 1"):
        data.shard(0, 0, data.of_array(items))


class iter_again:
    """A re-iterable without a length."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)

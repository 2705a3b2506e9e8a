"""The partitioned stage: sharded types in the textual IR, the layouts XLA's propagation gives
every value, the collectives per layer with their bytes and time, ``dump --stage partitioned``
and ``viz --overlay comm``.

Multi-device checks run in one child process with 8 virtual CPU devices (partitioned_worker.py);
this process checks the syntax and the communication model on their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kaun_ir.errors import IRError, ParseError
from kaun_ir.ir.core import TensorType
from kaun_ir.ir.text import parse
from kaun_ir.ir.tokens import parse_type
from kaun_ir.runtime import collectives

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def worker():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "partitioned_worker.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ok(result: dict) -> dict:
    assert "error" not in result, result["error"]
    return result


# ------------------------------------------------------------------ the syntax, in this process


def test_sharded_type_syntax():
    t = parse_type("f32[8@data,16@model]")
    assert t.shape == (8, 16) and t.sharding == (("data",), ("model",))
    assert str(t) == "f32[8@data,16@model]"
    both = parse_type("bf16[8@(data,model), 4]")
    assert both.shape == (8, 4) and both.sharding == (("data", "model"), ())
    assert str(both) == "bf16[8@(data,model),4]"
    # a layout is an annotation: equal to (and hashed like) the plain type
    assert t == TensorType(t.dtype, (8, 16)) and hash(t) == hash(TensorType(t.dtype, (8, 16)))
    # all dimensions whole: no annotation at all
    assert TensorType(t.dtype, (2, 3), ((), ())).sharding is None
    assert str(TensorType(t.dtype, (2, 3), ((), ()))) == "f32[2,3]"


@pytest.mark.parametrize(
    "text, message",
    [
        ("f32[8@x,8@x]", "more than one dimension"),
        ("f32[8@(a,,b)]", "malformed mesh axes"),
        ("f32[@x]", "malformed dimension"),
    ],
)
def test_malformed_sharded_types(text, message):
    with pytest.raises(ValueError, match=message):
        parse_type(text)


def test_sharding_rank_must_match():
    with pytest.raises(IRError, match="entries for shape"):
        TensorType(parse_type("f32[2]").dtype, (2, 3), (("x",),))


def test_sharded_graph_round_trips_and_verifies():
    text = (
        'graph @main(%0: f32[8@data,16@model] "w", %1: f32[16@model]) -> (f32[8@data,16@model]) {\n'
        "  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1], shape = [8, 16]} : f32[8@data,16@model]\n"
        '  %3 = add %0, %2 : f32[8@data,16@model] loc("0.linear")\n'
        "  return %3\n"
        "}\n"
    )
    graph = parse(text)
    assert graph.text() == text
    assert graph.inputs[1].type.sharding == (("model",),)
    with pytest.raises(ParseError):
        parse(text.replace("16@model]) ->", "16@]) ->"))


# ------------------------------------------------------------------ the communication model


HLO = "\n".join(
    [
        "  %ar = f32[1024]{0} all-reduce(%p), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add, "
        'metadata={op_name="2.linear/dot_general"}',
        "  %ag = f32[12,8]{1,0} all-gather(%q), channel_id=2, "
        "replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, dimensions={0}, "
        'metadata={op_name="0.linear/dot_general"}',
        "  %t = (f32[], f32[4]{0}) all-reduce(%a, %b), channel_id=3, replica_groups={{0,1},{2,3}}, "
        'to_apply=%add, metadata={op_name="(loss/reduce:2.linear/reduce)"}',
        "  %cp = f32[16]{0} collective-permute(%c), channel_id=4, source_target_pairs={{0,1},{1,0}}, "
        'metadata={op_name="stage/copy"}',
    ]
)


def test_group_sizes_and_wire_bytes():
    lines = [line for line in HLO.splitlines() if line.strip()]
    assert [collectives.group_size(line) for line in lines] == [4, 2, 2, 2]
    # ring algorithms: all-reduce sends 2 (n-1)/n of the buffer, all-gather (n-1)/n of the result
    assert collectives.wire_bytes("all-reduce", 4096, 4) == 2 * 3 / 4 * 4096
    assert collectives.wire_bytes("all-gather", 384, 2) == 192
    assert collectives.wire_bytes("reduce-scatter", 100, 8) == 700
    assert collectives.wire_bytes("collective-permute", 64, 2) == 64


def test_collectives_by_layer_split_combined():
    rows = {(r["layer"], r["kind"]): r for r in collectives.collectives_by_layer(HLO)}
    assert rows[("2.linear", "all-reduce")]["bytes"] == 4096 + 16  # its own and its share of the tuple
    assert rows[("2.linear", "all-reduce")]["count"] == 1.5
    assert rows[("loss", "all-reduce")]["bytes"] == 4 and rows[("loss", "all-reduce")]["count"] == 0.5
    assert rows[("0.linear", "all-gather")]["wire_bytes"] == 192
    assert rows[("stage", "collective-permute")]["bytes"] == 64
    total = sum(e["bytes"] for e in collectives.collective_stats(HLO).values())
    assert sum(r["bytes"] for r in rows.values()) == total


def test_comm_time_and_table():
    assert collectives.comm_seconds(1.25e9, 10) == pytest.approx(1.0)  # 10 Gbit/s = 1.25 GB/s
    with pytest.raises(ValueError, match="positive"):
        collectives.comm_seconds(1, 0)
    table = collectives.format_comm_table(collectives.collectives_by_layer(HLO), link_gbps=100)
    assert "time @ 100 Gbit/s" in table.splitlines()[0]
    assert table.splitlines()[-1].startswith("total")


# ------------------------------------------------------------------ on 8 virtual devices


def test_jit_partitioned_graph_matches_xla_and_jax(worker):
    r = ok(worker["jit_partitioned"])
    assert r["roundtrip"] and r["same_graph"] and r["unsharded_equal"]
    assert r["inputs"] == [[[], ["model"]], [["data"], []]]
    assert r["first_dot"] == [["data"], ["model"]]  # x split by rows times w split by columns
    assert r["output"] == r["xla_output"] == r["jax_output"] == [[], ["model"]]
    assert "f32[8@data,16@model]" in r["text"]


def test_training_step_partitioned(worker):
    r = ok(worker["train_partitioned"])
    for name, spec in r["specs"].items():  # every parameter, state and batch input as laid out
        assert (r["types"][name] or [[]] * len(spec)) == spec, name
    for got, spec in zip(r["out_types"], r["out_specs"]):  # results: as the executable reports
        assert (got or [[]] * len(spec)) == spec
    assert r["sharded_values"] > 50
    assert r["row_bytes"] == r["stats_bytes"] > 0
    assert r["row_count"] == r["stats_count"]
    layers = {row["layer"] for row in r["rows"]}
    assert layers <= {"0.linear", "2.linear", "loss", "(top)", "(combined)"}
    # the row-split second linear all-reduces its partial products
    assert any(row["layer"] == "2.linear" and row["kind"] == "all-reduce" for row in r["rows"])
    assert "time @ 100 Gbit/s" in r["table"]


def test_dump_stage_partitioned(worker):
    r = ok(worker["cli_partitioned"])
    assert r["code"] == 0, r["stderr"]
    assert r["parses"]  # the output, comments and all, is a graph the parser reads back
    assert "// partitioned over mesh data=4, model=2" in r["text"]
    assert "f32[64@data,256@model]" in r["text"] and "time @ 10 Gbit/s" in r["text"]
    assert r["one_device_code"] == 1 and "needs a graph partitioned over a mesh" in r["one_device_error"]
    # --stats lists the same collectives per layer, with the same total
    total = [line for line in r["text"].splitlines() if line.startswith("// total")][0].split()[2:5]
    assert "collectives per layer" in r["stats"]
    assert [line for line in r["stats"].splitlines() if line.strip().startswith("total")][0].split()[
        1:4
    ] == total


def test_viz_comm_overlay(worker):
    r = ok(worker["viz_comm"])
    assert r["code"] == 0, r["stderr"]
    assert r["overlay"] == "comm" and r["comm_total"] > 0 and r["sharded_types"] > 0


def test_partitioned_stage_needs_a_mesh():
    import numpy as np

    import kaun_ir as kn

    f = kn.jit(lambda a: a * 2.0)
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="compiled for one device"):
        f.graph(x, stage="partitioned")
    with pytest.raises(ValueError, match="'optimized' or 'partitioned'"):
        f.graph(x, stage="hlo")
    assert f.graph(x).text() == f.graph(x, stage="optimized").text()

"""``kaun-ir dump``, ``export`` and ``viz`` on the shipped examples and on a .kir file."""

import json
import os
import re
import stat
import xml.etree.ElementTree as ET
from collections import Counter

import numpy as np
import pytest

from kaun_ir.ir.core import path_components
from kaun_ir.tools import cli, dump, spec
from kaun_ir.tools.subject import GRAPH_STAGES
from kaun_ir.tools.viz import command as viz
from kaun_ir.tools.viz import html as viz_html
from kaun_ir.tools.viz import svg as viz_svg

EXAMPLES = ["mlp", "cnn", "transformer_block", "train_step_mlp", "transformer_train_step"]
KIR = os.path.join(os.path.dirname(__file__), "kir", "autodiff_mlp.kir")
SPECS = [f"kaun_ir.tools.examples:{name}" for name in EXAMPLES] + [KIR]
# the viz options on all but the largest example (which the browser test loads, at 12 blocks)
SMALL_SPECS = [target for target in SPECS if "transformer_train_step" not in target]


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ --help, errors


@pytest.mark.parametrize("command", ["dump", "export", "viz"])
def test_help(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "SPEC" in out and "--input" in out


def test_errors_are_messages_not_tracebacks(capsys, tmp_path):
    rc, _, err = run_cli(capsys, "dump", "no_such_module_xyz:f")
    assert rc == 1 and "cannot import" in err
    rc, _, err = run_cli(capsys, "dump", "kaun_ir.tools.examples:nope")
    assert rc == 1 and "no attribute 'nope'" in err
    rc, _, err = run_cli(capsys, "dump", "kaun_ir.tools.examples:mlp", "--input", "f32[32,x]")
    assert rc == 1 and "--input" in err
    rc, _, err = run_cli(capsys, "dump", "kaun_ir.tools.examples:mlp", "--input", "f32[32,100]")
    assert rc == 1 and "error" in err  # a shape error from the first linear layer
    rc, _, err = run_cli(capsys, "viz", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "g.gif"))
    assert rc == 1 and "extension" in err
    rc, _, err = run_cli(capsys, "export", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "g.txt"))
    assert rc == 1 and ".mlirbc" in err


def test_bare_layer_needs_input(tmp_path, capsys):
    module = tmp_path / "my_models.py"
    module.write_text(
        "from kaun_ir import layer\n"
        "def dense():\n    return layer.sequential([layer.linear(8, 4), layer.tanh()])\n"
        "def function():\n    import kaun_ir as kn\n"
        "    return (lambda x, y: kn.tanh(x) @ y), (kn.ShapeDtype((2, 3)), kn.ShapeDtype((3, 5)))\n"
    )
    rc, _, err = run_cli(capsys, "dump", f"{module}:dense")
    assert rc == 1 and "--input" in err
    rc, out, _ = run_cli(capsys, "dump", f"{module}:dense", "--input", "f32[5,8]")
    assert rc == 0 and "tanh" in out and "f32[5,8]" in out
    rc, out, _ = run_cli(capsys, "dump", f"{module}:function", "--stage", "autodiff")
    assert rc == 0 and "-> (f32[], f32[2,3], f32[3,5])" in out
    rc, out, _ = run_cli(capsys, "dump", f"{module}:function", "--input", "f32[4,3]", "--input", "f32[3,1]")
    assert rc == 0 and "f32[4,1]" in out


def test_path_components():
    assert path_components("") == []
    assert path_components("1.linear") == ["1.linear"]
    assert path_components("1.residual.body.mlp.0.linear") == ["1.residual", "body.mlp", "0.linear"]
    assert path_components("left.embedding") == ["left.embedding"]
    assert path_components("encoder.0.attn") == ["encoder", "0.attn"]


# ------------------------------------------------------------------ dump


@pytest.mark.parametrize("target", SPECS)
def test_dump_ir_stages(capsys, target):
    from kaun_ir.ir import parse

    texts = {}
    for stage in GRAPH_STAGES:
        rc, out, err = run_cli(capsys, "dump", target, "--stage", stage)
        assert rc == 0, err
        graph = parse(out)  # every IR stage prints valid textual IR
        graph.verify()
        texts[stage] = graph
    # autodiff adds the gradients as outputs (a training step returns new params and state)
    assert len(texts["autodiff"].outputs) > len(texts["traced"].outputs)
    # the optimized stage is the pipeline run on this stage (see tools/subject.py): same signature.
    # (Not fewer nodes: lowering passes may expand an op, e.g. a convolution into several.)
    optimized_from = "autodiff" if "train_step" in target else "traced"
    assert texts["optimized"].output_types == texts[optimized_from].output_types
    assert [v.type for v in texts["optimized"].inputs] == [v.type for v in texts[optimized_from].inputs]


@pytest.mark.parametrize("target", ["kaun_ir.tools.examples:mlp", KIR])
def test_dump_stablehlo_and_hlo(capsys, target):
    from kaun_ir.runtime import parse_mlir

    rc, out, _ = run_cli(capsys, "dump", target, "--stage", "stablehlo")
    assert rc == 0 and "stablehlo." in out
    parse_mlir(out)
    rc, out, _ = run_cli(capsys, "dump", target, "--stage", "hlo")
    assert rc == 0 and "HloModule" in out


def test_dump_all_writes_every_stage(capsys, tmp_path):
    target = tmp_path / "new" / "stages"
    rc, out, err = run_cli(capsys, "dump", "kaun_ir.tools.examples:train_step_mlp", "--all", str(target))
    assert rc == 0, err
    names = sorted(os.listdir(target))
    assert names == sorted(f"train_step_mlp.{suffix}" for suffix in dump.STAGE_FILES.values())
    assert "train_step" in (target / "train_step_mlp.autodiff.kir").read_text()
    assert "HloModule" in (target / "train_step_mlp.hlo.txt").read_text()
    # an existing directory: files replaced, nothing left behind
    (target / "other.txt").write_text("kept")
    rc, _, _ = run_cli(capsys, "dump", KIR, "--all", str(target))
    assert rc == 0
    assert len(os.listdir(target)) == len(names) + 1 + len(dump.STAGE_FILES)
    assert not [n for n in os.listdir(target) if ".tmp" in n]
    assert not [n for n in os.listdir(tmp_path / "new") if n.startswith(".")]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(target / "autodiff_mlp.traced.kir").st_mode) == 0o666 & ~umask


def test_dump_all_failure_writes_nothing(capsys, tmp_path):
    bad = tmp_path / "bad.kir"
    bad.write_text("graph @f(%0: i32[2]) -> (i32[2]) {\n  %1 = add %0, %0 : i32[2]\n  return %1\n}\n")
    rc, _, err = run_cli(capsys, "dump", str(bad), "--all", str(tmp_path / "out"))
    assert rc == 1 and "error" in err  # output 0 is not a float scalar: no autodiff stage
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", SPECS)
def test_dump_stats(capsys, target):
    rc, out, err = run_cli(capsys, "dump", target, "--stats")
    assert rc == 0, err
    assert "estimated FLOPs" in out and "ops:" in out and "layers (top-level):" in out
    if target.endswith("mlp") and "train" not in target:
        assert "0.linear" in out and "parameters: 4 arrays, 203,530 elements, 814,120 bytes" in out


def test_stats_of_mlp_by_hand():
    subject = spec.resolve("kaun_ir.tools.examples:mlp")
    stats = dump.statistics(subject, subject.stage_graph("traced"))
    matmuls = 2 * 32 * 784 * 256 + 2 * 32 * 256 * 10
    # the rest: bias adds and the ReLU's compare and select, one per element
    assert stats["flops"] == matmuls + 32 * 256 * 3 + 32 * 10
    assert stats["per_op"]["dot_general"] == 2
    assert stats["per_layer"]["0.linear"]["flops"] == 2 * 32 * 784 * 256 + 32 * 256


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_flop_estimate_matches_xla(name):
    """Our estimate vs XLA's HloCostAnalysis on the compiled optimized graph.

    Both count 2*M*N*K for matmuls and 2*out*window*C_in for convolutions, which dominate these
    models (> 95% of the FLOPs). The rest differs in detail: XLA rewrites ReLU's compare+select
    into one maximum, folds broadcasts into fusions and counts max-pool windows its own way, so
    the element-wise share may differ by up to about half; a factor 1.3 bounds that with room
    and still fails if a matmul or convolution were miscounted (that is a factor 2 or more).
    """
    from kaun_ir import runtime

    subject = spec.resolve(f"kaun_ir.tools.examples:{name}")
    graph = subject.stage_graph("optimized")
    ours = dump.statistics(subject, graph)["flops"]
    xla = runtime.compile(graph).cost_analysis()["flops"]
    assert xla > 0
    assert 1 / 1.3 <= ours / xla <= 1.3, (ours, xla)


def test_node_cost_convolution_with_groups():
    from kaun_ir.ir.core import Graph, Node, TensorType

    x, w = Graph.arguments([TensorType(np.float32, (2, 4, 10, 10)), TensorType(np.float32, (6, 2, 3, 3))])
    node = Node(
        "convolution",
        [x, w],
        {
            "window_strides": (1, 1),
            "padding": ((0, 0), (0, 0)),
            "lhs_dilation": (1, 1),
            "rhs_dilation": (1, 1),
            "feature_group_count": 2,
            "batch_group_count": 1,
            "lhs_spec": (0, 1, 2, 3),
            "rhs_spec": (0, 1, 2, 3),
            "out_spec": (0, 1, 2, 3),
        },
        [TensorType(np.float32, (2, 6, 8, 8))],
    )
    flops, nbytes = dump.node_cost(node)
    assert flops == 2 * (2 * 6 * 8 * 8) * 9 * (4 // 2)
    assert nbytes == 4 * (2 * 4 * 100 + 6 * 2 * 9 + 2 * 6 * 64)


# ------------------------------------------------------------------ export


@pytest.mark.parametrize("target", SPECS)
def test_export_mlir(capsys, tmp_path, target):
    from kaun_ir.runtime import parse_mlir

    path = tmp_path / "model.mlir"
    rc, _, err = run_cli(capsys, "export", target, "-o", str(path))
    assert rc == 0, err
    parse_mlir(path.read_text())


def test_export_mlirbc_runs_like_jit(capsys, tmp_path):
    """The portable artifact deserialises with jaxlib's StableHLO bindings, compiles and gives
    kn.jit's result on concrete parameters."""
    import kaun_ir as kn
    from kaun_ir import layer, rng, tree
    from kaun_ir.runtime.xla import backend, compiler, mlir, transfer

    path = tmp_path / "mlp.mlirbc"
    rc, out, err = run_cli(capsys, "export", "kaun_ir.tools.examples:mlp", "-o", str(path), "--list-inputs")
    assert rc == 0, err
    assert "%arg4: f32[32,784]" in out
    data = path.read_bytes()
    assert not data.startswith(b"module")  # bytecode, not text
    module = mlir.deserialize_portable(data)
    device = backend.default_device()
    loaded = compiler.compile(module, device)

    subject = spec.resolve("kaun_ir.tools.examples:mlp")
    with rng.scope(3):
        v = layer.init(_model_of(subject))
    x = np.random.default_rng(0).standard_normal((32, 784)).astype(np.float32)
    expected = np.asarray(kn.jit(subject.fn)(v.params, v.state, x))
    leaves = tree.flatten((v.params, v.state, x))[0]
    got = compiler.execute(loaded, [transfer.to_device(a, np.dtype(np.float32), device) for a in leaves])
    np.testing.assert_allclose(np.asarray(got[0]), expected, rtol=1e-5, atol=1e-5)


def _model_of(subject):
    # the Layer that the subject's forward function closes over
    cells = dict(zip(subject.fn.__code__.co_freevars, subject.fn.__closure__))
    return cells["model"].cell_contents


# ------------------------------------------------------------------ viz


def check_model_explorer(doc: dict, graph) -> None:
    assert set(doc) >= {"label", "graphs"} and len(doc["graphs"]) == 1
    g = doc["graphs"][0]
    assert isinstance(g["id"], str) and g["id"]
    ids = [n["id"] for n in g["nodes"]]
    assert len(ids) == len(set(ids)), "node ids must be unique"
    assert len(ids) == len(graph.inputs) + len(graph.nodes) + len(graph.outputs)
    by_id = {n["id"]: n for n in g["nodes"]}
    for n in g["nodes"]:
        assert set(n) >= {"id", "label", "namespace", "attrs", "incomingEdges", "outputsMetadata"}
        for kv in n["attrs"]:
            assert set(kv) == {"key", "value"} and isinstance(kv["value"], str)
        for e in n["incomingEdges"]:
            assert e["sourceNodeId"] in by_id, "every edge's source exists"
            outputs = {m["id"] for m in by_id[e["sourceNodeId"]]["outputsMetadata"]}
            assert e["sourceNodeOutputId"] in outputs
        for m in n["outputsMetadata"]:
            assert [a["key"] for a in m["attrs"]] == ["tensor_shape"]
    for k, node in enumerate(graph.nodes):  # namespaces are the layer paths, "/" between layers
        me = by_id[f"n{k}"]
        assert me["namespace"] == "/".join(path_components(node.path))
        assert me["namespace"].replace("/", ".") == node.path
        assert len(me["incomingEdges"]) == len(node.inputs)
        assert me["outputsMetadata"][0]["attrs"][0]["value"].endswith(
            str(node.types[0])[str(node.types[0]).index("[") :]
        )


def check_dot(text: str, graph) -> None:
    assert text.startswith("digraph ") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    declared = set(re.findall(r'^\s*"([^"]+)" \[label=', text, re.M))
    edges = re.findall(r'^\s*"([^"]+)" -> "([^"]+)" \[label="([^"]*)"\];', text, re.M)
    assert declared == {f"arg{i}" for i in range(len(graph.inputs))} | {
        f"n{k}" for k in range(len(graph.nodes))
    } | {f"out{i}" for i in range(len(graph.outputs))}
    assert len(edges) == sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs)
    assert all(a in declared and b in declared and re.fullmatch(r"\w+\[[\d,]*\]", t) for a, b, t in edges)
    groups = {path_components(n.path)[0] for n in graph.nodes if n.path}
    clusters = re.findall(r'^  subgraph "cluster_\d+" \{\n    label="([^"]*)"', text, re.M)
    assert set(clusters) == groups  # one top-level cluster per top-level layer


def check_svg(text: str, graph) -> None:
    root = ET.fromstring(text)  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg"
    nodes = [g for g in root.iter(f"{ns}g") if g.get("class") == "node"]
    assert len(nodes) == len(graph.inputs) + len(graph.nodes) + len(graph.outputs)
    edges = [p for p in root.iter(f"{ns}path") if p.get("class") == "edge"]
    assert len(edges) == sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs)


def check_html(text: str, graphs: list) -> dict:
    """The interactive page: self-contained (no network address anywhere), the controls the
    browser test uses, and the embedded graph data."""
    assert not re.search(r"https?://", text), "the page must not reach the network"
    assert "<script src" not in text and '<link rel="stylesheet"' not in text  # everything inline
    for control in ("search", "details", "expand-all", "collapse-all", "zoom-in", "zoom-out", "fit"):
        assert f'id="{control}"' in text
    data = re.search(r'<script type="application/json" id="kir-data">(.*?)</script>', text, re.S)
    payload = json.loads(data.group(1))
    assert len(payload["graphs"]) == len(graphs)
    for shown, graph in zip(payload["graphs"], graphs):
        assert len(shown["nodes"]) == len(graph.inputs) + len(graph.nodes) + len(graph.outputs)
        assert len(shown["edges"]) == sum(len(n.inputs) for n in graph.nodes) + len(graph.outputs)
        for k, node in enumerate(graph.nodes):  # each node's group chain spells its layer path
            entry, parts, g = shown["nodes"][len(graph.inputs) + k], [], None
            g = entry["g"]
            while g >= 0:
                parts.insert(0, shown["groups"][g][1])
                g = shown["groups"][g][0]
            assert parts == path_components(node.path)
            assert entry["cost"] == list(dump.node_cost(node))
    return payload


@pytest.mark.parametrize("target", SPECS)
def test_viz_all_formats(capsys, tmp_path, monkeypatch, target):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)  # no Graphviz: the built-in renderer
    subject = spec.resolve(target)
    graph = subject.stage_graph(subject.default_stage)
    for ext in (".dot", ".svg", ".json", ".html"):
        path = tmp_path / f"g{ext}"
        rc, _, err = run_cli(capsys, "viz", target, "-o", str(path))
        assert rc == 0, err
        text = path.read_text()
        if ext == ".dot":
            check_dot(text, graph)
        elif ext == ".svg":
            check_svg(text, graph)
        elif ext == ".json":
            check_model_explorer(json.loads(text), graph)
        else:
            payload = check_html(text, [graph])
            assert payload["mode"] == "single" and payload["overlay"] is None
            assert payload["graphs"][0]["stage"] == subject.default_stage


@pytest.mark.parametrize("target", SMALL_SPECS)
def test_viz_overlay(capsys, tmp_path, monkeypatch, target):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    subject = spec.resolve(target)
    graph = subject.stage_graph(subject.default_stage)
    flops = [dump.node_cost(n)[0] for n in graph.nodes]
    for ext in (".dot", ".svg", ".html"):
        path = tmp_path / f"g{ext}"
        rc, _, err = run_cli(capsys, "viz", target, "--overlay", "flops", "-o", str(path))
        assert rc == 0, err
        text = path.read_text()
        if ext == ".dot":
            check_dot(text, graph)
            assert "estimated FLOPs (log scale)" in text
            fills = dict(re.findall(r'^\s*"(n\d+)" \[label=.*?fillcolor="(#[0-9a-f]{6})"', text, re.M))
        elif ext == ".svg":
            check_svg(text, graph)
            assert 'class="legend"' in text and "estimated FLOPs (log scale)" in text
            node_rect = r'<g class="node" id="node-(n\d+)".*?<rect [^>]*fill="(#[0-9a-f]{6})"'
            fills = dict(re.findall(node_rect, text))
        else:
            assert check_html(text, [graph])["overlay"] == "flops"
            continue
        assert len(fills) == len(graph.nodes)
        # equal cost, equal colour; zero cost, the zero colour; costlier, never lighter
        by_cost = sorted((flops[int(i[1:])], colour) for i, colour in fills.items())
        assert all(colour == viz_svg.ZERO_COLOR for cost, colour in by_cost if cost == 0)
        lum = [
            sum(int(c[i : i + 2], 16) * w for i, w in ((1, 0.299), (3, 0.587), (5, 0.114)))
            for _, c in by_cost
        ]
        assert all(a >= b - 1e-9 for a, b in zip(lum, lum[1:]))
    rc, _, err = run_cli(capsys, "viz", target, "--overlay", "bytes", "-o", str(tmp_path / "b.html"))
    assert rc == 0, err


@pytest.mark.parametrize("target", SMALL_SPECS)
def test_viz_diff(capsys, tmp_path, target):
    subject = spec.resolve(target)
    for stage_a, stage_b in (("traced", "optimized"), ("autodiff", "optimized")):
        path = tmp_path / f"{stage_a}_{stage_b}.html"
        rc, _, err = run_cli(capsys, "viz", target, "--diff", stage_a, stage_b, "-o", str(path))
        assert rc == 0, err
        a, b = subject.stage_graph(stage_a), subject.stage_graph(stage_b)
        payload = check_html(path.read_text(), [a, b])
        summary = payload["diff"]
        marks = [Counter(n.get("diff") for n in g["nodes"]) for g in payload["graphs"]]
        assert marks[0]["removed"] == summary["removed"] and marks[0]["added"] == 0
        assert marks[1]["added"] == summary["added"] and marks[1]["removed"] == 0
        # whatever is not marked is matched one to one
        assert summary["a"] - summary["removed"] == summary["b"] - summary["added"]


def test_viz_diff_marks():
    """``diff_nodes`` on a case worked out by hand: the optimizer folds the ReLU's two scalar
    zeros and their broadcasts into one (CSE), nothing else changes."""
    subject = spec.resolve("kaun_ir.tools.examples:mlp")
    traced, optimized = subject.stage_graph("traced"), subject.stage_graph("optimized")
    removed, added = viz_html.diff_nodes(traced, optimized)
    assert added == {}
    assert sorted(traced.nodes[int(i[1:])].op for i in removed) == ["broadcast_in_dim", "constant"]
    assert {traced.nodes[int(i[1:])].path for i in removed} == {"1.relu"}
    assert viz_html.diff_nodes(traced, traced) == ({}, {})
    # autodiff keeps the forward pass and adds the backward pass; its only output that is new is
    # a scalar (the summed result) and the gradients, the traced f32[32,10] output is gone
    autodiff = subject.stage_graph("autodiff")
    removed, added = viz_html.diff_nodes(traced, autodiff)
    assert removed == {"out0": "removed"}
    assert len(added) == (len(autodiff.nodes) - len(traced.nodes)) + len(autodiff.outputs)


def test_viz_option_errors(capsys, tmp_path):
    rc, _, err = run_cli(
        capsys,
        "viz",
        "kaun_ir.tools.examples:mlp",
        "--diff",
        "traced",
        "optimized",
        "-o",
        str(tmp_path / "d.svg"),
    )
    assert rc == 1 and "--diff needs an .html output" in err
    rc, _, err = run_cli(
        capsys,
        "viz",
        "kaun_ir.tools.examples:mlp",
        "--diff",
        "traced",
        "optimized",
        "--stage",
        "traced",
        "-o",
        str(tmp_path / "d.html"),
    )
    assert rc == 1 and "leave out --stage" in err
    rc, _, err = run_cli(
        capsys, "viz", "kaun_ir.tools.examples:mlp", "--overlay", "flops", "-o", str(tmp_path / "d.json")
    )
    assert rc == 1 and "--overlay is not available for .json" in err
    with pytest.raises(SystemExit):
        cli.main(
            ["viz", "kaun_ir.tools.examples:mlp", "--diff", "traced", "hlo", "-o", str(tmp_path / "d.html")]
        )
    with pytest.raises(SystemExit):
        cli.main(["viz", "kaun_ir.tools.examples:mlp", "--overlay", "time", "-o", str(tmp_path / "d.html")])
    assert not list(tmp_path.iterdir())


def test_viz_html_data_cannot_end_its_script(tmp_path):
    """An attribute holding "</script>" or "<!--" stays inside the JSON block."""
    from kaun_ir.ir.core import Graph, Node, TensorType

    (x,) = Graph.arguments([TensorType(np.float32, (2,))])
    node = Node("negate", [x], {"note": "</script><!-- x"}, [TensorType(np.float32, (2,))], path="a</script>")
    graph = Graph([x], [node.outputs[0]], [node], name="f")
    text = viz_html.render_html(graph, "traced")
    assert text.count("</script>") == 2  # the data block's and the script's
    data = re.search(r'<script type="application/json" id="kir-data">(.*?)</script>', text, re.S).group(1)
    assert "<!--" not in data
    payload = json.loads(data)
    assert payload["graphs"][0]["nodes"][1]["attrs"]["note"] == "</script><!-- x"
    assert payload["graphs"][0]["nodes"][1]["path"] == "a</script>"


def test_viz_png_without_graphviz_writes_svg(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    rc, _, err = run_cli(capsys, "viz", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "m.png"))
    assert rc == 1 and "needs Graphviz" in err and "m.svg" in err
    assert not (tmp_path / "m.png").exists()
    ET.parse(tmp_path / "m.svg")
    rc, _, err = run_cli(
        capsys, "viz", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "m.svg"), "--renderer", "graphviz"
    )
    assert rc == 1 and "not installed" in err


def test_viz_uses_graphviz_when_installed(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "dot"  # a stand-in for Graphviz: records its input, prints a marker
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\ncat > {tmp_path}/dot_input.txt\necho "fake $1 output"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    rc, _, err = run_cli(capsys, "viz", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "m.png"))
    assert rc == 0, err
    assert (tmp_path / "m.png").read_text() == "fake -Tpng output\n"
    assert (tmp_path / "dot_input.txt").read_text().startswith("digraph")
    rc, _, _ = run_cli(
        capsys, "viz", "kaun_ir.tools.examples:mlp", "-o", str(tmp_path / "m.svg"), "--renderer", "builtin"
    )
    assert rc == 0 and (tmp_path / "m.svg").read_text().startswith("<svg")


def test_graph_repr_svg():
    subject = spec.resolve("kaun_ir.tools.examples:cnn")
    graph = subject.stage_graph("traced")
    check_svg(graph._repr_svg_(), graph)

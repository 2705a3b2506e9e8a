"""``repr`` / ``_repr_html_`` of layers and variables, and ``layer.summary``.

Oracles: NumPy shapes of the forward pass, parameter counts from the layer formulas, and the
documented cost model (2*M*N*K per matmul, one FLOP per element-wise output)."""

from __future__ import annotations

import numpy as np

import kaun_ir as kn
from kaun_ir import layer, rng


def _mlp():
    return layer.sequential([layer.linear(6, 16), layer.relu(), layer.linear(16, 4)])


def test_layer_repr_shows_structure_and_settings_not_functions():
    model = layer.sequential(
        [
            layer.linear(6, 16),
            layer.relu(),
            layer.residual(layer.linear(16, 16)),
            layer.linear(out_features=4),
        ]
    )
    text = repr(model)
    assert "0x" not in text and "function" not in text and "lambda" not in text
    assert text.startswith("sequential(") and "linear(in_features=6, out_features=16" in text
    assert "block: linear(in_features=16, out_features=16" in text
    assert "3: linear(out_features=4" in text
    html = model._repr_html_()
    assert "<ul" in html and "linear" in html and "0x" not in html


def test_vars_repr_shows_shapes_and_counts_never_the_arrays():
    with rng.scope(0):
        v = layer.init(_mlp())
    text = repr(v)
    assert "f32[6, 16]" in text and "f32[16]" in text
    assert f"{6 * 16 + 16 + 16 * 4 + 4:,} parameters" in text
    assert "array" not in text.lower() and len(text) < 400
    html = v._repr_html_()
    assert "<table>" in html and "0.weight" in html and "2.bias" in html
    with rng.scope(0):
        bn = layer.init(layer.batch_norm(3))
    assert "state={" in repr(bn) and "running_var" in repr(bn)


def test_summary_rows_match_the_forward_pass_and_the_cost_model():
    x = np.zeros((5, 6), np.float32)
    printed = []
    rows = layer.summary(_mlp(), x, print_fn=printed.append)
    by_path = {r["path"]: r for r in rows}
    assert list(by_path) == ["0.linear", "1.relu", "2.linear", "total"]
    assert by_path["0.linear"]["output"] == (5, 16) and by_path["2.linear"]["output"] == (5, 4)
    assert by_path["1.relu"]["output"] == (5, 16)
    assert by_path["0.linear"]["params"] == 6 * 16 + 16 and by_path["0.linear"]["bytes"] == 4 * (6 * 16 + 16)
    assert by_path["1.relu"]["params"] == 0
    # matmul 2*B*in*out, bias add one per output element
    assert by_path["0.linear"]["flops"] == 2 * 5 * 6 * 16 + 5 * 16
    assert by_path["1.relu"]["flops"] == 2 * 5 * 16  # relu is compare + select: one FLOP each per element
    assert by_path["2.linear"]["flops"] == 2 * 5 * 16 * 4 + 5 * 4
    total = by_path["total"]
    with rng.scope(0):
        assert total["params"] == kn.ptree.count_parameters(layer.init(_mlp()).params)
    assert total["flops"] == sum(r["flops"] for r in rows[:-1]) and total["output"] == (5, 4)
    assert len(printed) == 1 and "0.linear" in printed[0] and "total" in printed[0]


def test_summary_infers_sizes_and_handles_conv_and_pooling():
    model = layer.sequential(
        [
            layer.conv2d(out_channels=4, kernel_size=3),
            layer.relu(),
            layer.global_avg_pool(),
            layer.linear(out_features=2),
        ]
    )
    rows = layer.summary(model, kn.ShapeDtype((2, 3, 5, 5)), print_fn=None)
    by_path = {r["path"]: r for r in rows}
    assert by_path["0.conv2d"]["output"] == (2, 4, 5, 5)
    assert by_path["0.conv2d"]["params"] == 4 * 3 * 3 * 3 + 4
    assert by_path["2.global_avg_pool"]["output"] == (2, 4)
    assert by_path["3.linear"]["params"] == 4 * 2 + 2

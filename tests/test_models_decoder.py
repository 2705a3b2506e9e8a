"""kn.models without PyTorch: the decoder's KV-cache path against its own uncached forward pass,
generation's executable count, and checkpoint renaming / transposing of safetensors files."""

from __future__ import annotations

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir.models import DecoderConfig
from kaun_ir.models.generate import top_k_threshold

LLAMA = DecoderConfig(
    vocab_size=23,
    dim=16,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    hidden_dim=24,
    max_positions=32,
    norm="rms",
    mlp="swiglu",
    positions="rope",
    attn_bias=False,
    mlp_bias=False,
    tie_embeddings=False,
)
GPT2 = DecoderConfig(
    vocab_size=23, dim=16, num_layers=1, num_heads=2, num_kv_heads=2, hidden_dim=32, max_positions=32
)


def _random_params(cfg):
    """Random parameters drawn with NumPy on the model's parameter tree (cheaper than kn.init here)."""
    r = np.random.default_rng(0)
    return kn.ptree.map(
        lambda spec: (0.3 * r.standard_normal(spec.shape)).astype(np.float32),
        kn.models.init_params(cfg, abstract=True),
    )


@pytest.mark.parametrize("cfg", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_cached_greedy_generation_equals_recomputing_the_whole_sequence(cfg):
    params = _random_params(cfg)
    full = kn.jit(lambda p, ids: kn.models.forward(cfg, p, ids))
    prompt = np.array([[3, 7, 1], [5, 5, 2]], np.int32)
    out = kn.models.generate(cfg, prompt, 5, params=params)
    ids = np.zeros((2, 8), np.int32)  # the oracle: no cache, the whole (causal) sequence every step
    ids[:, :3] = prompt
    for t in range(3, 8):
        ids[:, t] = np.asarray(full(params, ids))[:, t - 1].argmax(-1)
    np.testing.assert_array_equal(out, ids)
    before = kn.models.executables(cfg)
    kn.models.generate(cfg, prompt[:, :2], 7, params=params)  # another prompt length, same cache size
    assert kn.models.executables(cfg) == before


def test_top_k_threshold_counts_ties():
    logits = np.array([[1.0, 5.0, 5.0, 2.0, 0.0]], np.float32)
    got = kn.jit(lambda x: top_k_threshold(x, 3))(logits)
    assert float(np.asarray(got)[0, 0]) == 2.0  # 5, 5, then 2


def test_generate_rejects_bad_arguments():
    params = _random_params(GPT2)
    with pytest.raises(ValueError, match="max_positions"):
        kn.models.generate(GPT2, np.zeros((1, 30), np.int32), 10, params=params)
    with pytest.raises(ValueError, match="top_k"):
        kn.models.generate(GPT2, np.zeros((1, 3), np.int32), 1, top_k=0, params=params)


def test_checkpoint_rename_and_transpose(tmp_path):
    from safetensors.numpy import save_file

    r = np.random.default_rng(0)
    torch_style = {
        "fc1.weight": r.standard_normal((8, 4), np.float32),
        "fc1.bias": r.standard_normal(8, np.float32),
        "norm.weight": r.standard_normal(8, np.float32),
        "norm.num_batches_tracked": np.zeros((), np.int64),
    }
    save_file(torch_style, str(tmp_path / "m.safetensors"))
    like = [
        {"weight": np.zeros((4, 8), np.float32), "bias": np.zeros(8, np.float32)},
        {"scale": np.zeros(8, np.float32)},
    ]
    rename = [(r"fc1\.(.*)", r"0.\1"), (r"norm\.weight", "1.scale"), (r".*num_batches_tracked", None)]
    got = kn.checkpoint.load(tmp_path / "m.safetensors", like=like, rename=rename, transpose=[r"0\.weight"])
    np.testing.assert_array_equal(got[0]["weight"], torch_style["fc1.weight"].T)
    np.testing.assert_array_equal(got[1]["scale"], torch_style["norm.weight"])
    tree = kn.checkpoint.load(tmp_path / "m.safetensors", rename=rename)  # no template: from the names
    assert isinstance(tree, list) and len(tree) == 2 and tree[1].keys() == {"scale"}
    with pytest.raises(ValueError, match="both renamed"):
        kn.checkpoint.load(tmp_path / "m.safetensors", rename=[(r"fc1\..*", "x")])
    same = kn.checkpoint.from_state_dict(torch_style, like=like, rename=rename, transpose=[r"0\.weight"])
    np.testing.assert_array_equal(same[0]["weight"], got[0]["weight"])

"""PyTorch and Hugging Face interop (the `interop` extra; `make test-interop`): tensors through
DLPack, state_dicts, and GPT-2 / Llama checkpoints written by `transformers` compared with
`transformers` itself (logits, gradients, generation). Skipped when the extra is not installed."""

from __future__ import annotations

import os

# never reach the network: everything below is built locally
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[interop]')")

import kaun_ir as kn  # noqa: E402
from kaun_ir.models.pretrained import NAME_TABLE, _convert  # noqa: E402

# ------------------------------------------------------------------------------ DLPack


def test_torch_tensors_are_accepted_and_results_convert_back():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    y = kn.jit(lambda x: kn.exp(x) * 2.0)(t)
    np.testing.assert_allclose(np.asarray(y), np.exp(t.numpy()) * 2.0, rtol=1e-6)
    back = torch.from_dlpack(y)
    assert back.dtype == torch.float32 and back.shape == (2, 3)
    np.testing.assert_allclose(back.cpu().numpy(), np.exp(t.numpy()) * 2.0, rtol=1e-6)  # on the device of y
    np.testing.assert_allclose(np.asarray(kn.exp(torch.ones(3))), np.e, rtol=1e-6)  # eager ops too
    grads = kn.grad(lambda x: (x * x).sum())(torch.tensor([1.0, -2.0], requires_grad=True))
    np.testing.assert_allclose(np.asarray(grads), [2.0, -4.0])
    transposed = torch.arange(12.0).reshape(3, 4).T  # not contiguous
    np.testing.assert_allclose(np.asarray(kn.jit(lambda x: x + 0.0)(transposed)), transposed.numpy())
    np.testing.assert_allclose(
        np.asarray(kn.exp(transposed[1:, ::2])), np.exp(transposed[1:, ::2].numpy()), rtol=1e-6
    )
    for dtype, expected in (
        (torch.float64, np.float64),
        (torch.bfloat16, kn.bfloat16),
        (torch.int64, np.int64),
    ):
        out = kn.jit(lambda x: x + x)(torch.ones(4, dtype=dtype))
        assert np.asarray(out).dtype == expected


def test_dlpack_shares_cpu_memory():
    from kaun_ir.runtime.xla import transfer

    t = torch.arange(1024, dtype=torch.float32)
    assert transfer.from_dlpack(t).unsafe_buffer_pointer() == t.data_ptr()


# ------------------------------------------------------------------------------ state_dicts


def test_state_dict_of_a_torch_model_loads_without_a_converter(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3), torch.nn.LayerNorm(3)
    )
    model = kn.layer.sequential(
        [kn.layer.linear(4, 8), kn.layer.relu(), kn.layer.linear(8, 3), kn.layer.layer_norm(3)]
    )
    with kn.rng.scope(0):
        template = kn.layer.init(model)
    rename = [(r"3\.weight", "3.scale")]
    transpose = [r"[02]\.weight"]
    params = kn.checkpoint.from_state_dict(
        net.state_dict(), like=kn.layer.params(template), rename=rename, transpose=transpose
    )
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    got, _ = kn.layer.apply(model, kn.layer.with_params(template, params), x)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    # the same through a safetensors file written by PyTorch
    from safetensors.torch import save_file

    save_file(net.state_dict(), str(tmp_path / "net.safetensors"))
    loaded = kn.checkpoint.load(
        tmp_path / "net.safetensors", like=kn.layer.params(template), rename=rename, transpose=transpose
    )
    np.testing.assert_array_equal(np.asarray(loaded[2]["weight"]), net[2].weight.detach().numpy().T)
    with pytest.raises(ValueError, match="no tensor for .0.bias"):
        kn.checkpoint.from_state_dict({"0.weight": net[0].weight}, like=kn.layer.params(template))


# ------------------------------------------------------------------------------ Hugging Face models

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install -e '.[interop]')"
)

VOCAB = 61


def _hf_model(family: str):
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
        )
        return transformers.GPT2LMHeadModel(cfg).eval()
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        rope_theta=500.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    hf = _hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    # sharded for Llama (several files + index), one file for GPT-2
    hf.save_pretrained(directory, max_shard_size="20KB" if request.param == "llama" else "1GB")
    return request.param, hf, kn.models.from_pretrained(directory), directory


def _ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


def test_checkpoint_layout(pair):
    family, _, _, directory = pair
    names = set(os.listdir(directory))
    assert ("model.safetensors.index.json" in names) == (family == "llama")


def test_logits_match_transformers(pair):
    _, hf, loaded, _ = pair
    ids = _ids((2, 11))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids.astype(np.int64))).logits.numpy()
    got, _ = kn.layer.apply(loaded.model, loaded.vars, ids)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=2e-5)


def test_gradients_match_transformers(pair):
    family, hf, loaded, _ = pair
    ids, labels = _ids((2, 7), 1), _ids((2, 7), 2)

    def loss(params):
        logits, _ = kn.layer.apply(loaded.model, kn.layer.with_params(loaded.vars, params), ids)
        return kn.loss.cross_entropy_sparse(logits, labels)

    value, grads = kn.value_and_grad(loss)(loaded.params)
    hf.zero_grad()
    logits = hf(torch.from_numpy(ids.astype(np.int64))).logits
    torch_loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), torch.from_numpy(labels.astype(np.int64)).reshape(-1)
    )
    torch_loss.backward()
    np.testing.assert_allclose(float(value), float(torch_loss.detach()), rtol=1e-5)
    hf_grads = {name: p.grad.numpy() for name, p in hf.named_parameters() if p.grad is not None}
    flat = dict(kn.ptree.flatten_with_paths(grads))
    checked = 0
    for ours, theirs, transform in NAME_TABLE[family]:
        for i in range(loaded.config.num_layers) if "{i}" in ours else [None]:
            path, key = ours.format(i=i), theirs.format(i=i)
            if path not in flat or key not in hf_grads:
                continue
            np.testing.assert_allclose(
                np.asarray(flat[path]), _convert(hf_grads[key], transform), rtol=2e-3, atol=2e-6, err_msg=path
            )
            checked += 1
    assert checked >= len(flat) - 1  # every parameter (GPT-2's tied head is the embedding)


def test_greedy_generation_matches_transformers_with_bounded_executables(pair):
    _, hf, loaded, _ = pair
    before = kn.models.executables(loaded)
    for length in (5, 9):
        prompt = _ids((1, length), length)
        want = hf.generate(
            torch.from_numpy(prompt.astype(np.int64)), max_new_tokens=6, do_sample=False, pad_token_id=0
        ).numpy()
        np.testing.assert_array_equal(kn.models.generate(loaded, prompt, 6), want)
    assert kn.models.executables(loaded) - before <= 2  # one prefill + one decode for both prompts


def test_sampling_respects_top_k_and_seed(pair):
    _, hf, loaded, _ = pair
    prompt = _ids((2, 4), 3)
    out = kn.models.generate(loaded, prompt, 5, temperature=0.8, top_k=3, seed=7)
    again = kn.models.generate(loaded, prompt, 5, temperature=0.8, top_k=3, seed=7)
    np.testing.assert_array_equal(out, again)
    with torch.no_grad():
        logits = hf(torch.from_numpy(out.astype(np.int64))).logits.numpy()
    for row in range(2):
        for t in range(4, 9):  # token t was drawn from the logits at t - 1
            top3 = np.argsort(logits[row, t - 1])[-3:]
            assert out[row, t] in top3
    greedy = kn.models.generate(loaded, prompt, 5)
    np.testing.assert_array_equal(
        kn.models.generate(loaded, prompt, 5, temperature=1.0, top_k=1, seed=1), greedy
    )


def test_docs_torch_examples_run(tmp_path, monkeypatch):
    """The ```python torch blocks of docs/interop.md run as written, in order, in one namespace."""
    import re

    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "interop.md")
    with open(page, encoding="utf-8") as handle:
        blocks = re.findall(r"^```python torch\n(.*?)^```", handle.read(), re.S | re.M)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs_interop_torch__"}
    for k, code in enumerate(blocks):
        exec(compile(code, f"docs/interop.md torch example {k + 1}", "exec"), namespace)

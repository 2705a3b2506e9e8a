"""Hugging Face checkpoints from a local directory: ``config.json`` + ``model.safetensors`` (or a
sharded ``model.safetensors.index.json``), read without network access and without running any
code from the directory.

``NAME_TABLE[family]`` is the one table that maps kaun_ir parameter paths onto Hugging Face
tensor names (``{i}`` is the layer index), with the layout change each needs:

- ``"T"``: the tensor is stored transposed (``nn.Linear``'s ``[out, in]`` -> kaun_ir's ``[in, out]``);
- ``"split3:k"``: GPT-2's fused ``c_attn`` holds query, key and value side by side along its last
  axis; part ``k`` (0, 1, 2) of three equal parts is taken;
- ``""``: the same array.

GPT-2's ``Conv1D`` already stores ``[in, out]``, so its weights need no transpose.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from kaun_ir import dtypes, ptree
from kaun_ir.checkpoint.reader import IndexFile, decoding, read_json
from kaun_ir.errors import CheckpointError
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.models.decoder import DecoderConfig, decoder, init_params

_GPT2_LAYER = "transformer.h.{i}"
_LLAMA_LAYER = "model.layers.{i}"

NAME_TABLE: dict[str, list[tuple[str, str, str]]] = {
    "gpt2": [
        ("embed.weight", "transformer.wte.weight", ""),
        ("positions.weight", "transformer.wpe.weight", ""),
        ("layers.{i}.norm1.scale", f"{_GPT2_LAYER}.ln_1.weight", ""),
        ("layers.{i}.norm1.bias", f"{_GPT2_LAYER}.ln_1.bias", ""),
        ("layers.{i}.attn.query.weight", f"{_GPT2_LAYER}.attn.c_attn.weight", "split3:0"),
        ("layers.{i}.attn.key.weight", f"{_GPT2_LAYER}.attn.c_attn.weight", "split3:1"),
        ("layers.{i}.attn.value.weight", f"{_GPT2_LAYER}.attn.c_attn.weight", "split3:2"),
        ("layers.{i}.attn.query.bias", f"{_GPT2_LAYER}.attn.c_attn.bias", "split3:0"),
        ("layers.{i}.attn.key.bias", f"{_GPT2_LAYER}.attn.c_attn.bias", "split3:1"),
        ("layers.{i}.attn.value.bias", f"{_GPT2_LAYER}.attn.c_attn.bias", "split3:2"),
        ("layers.{i}.attn.out.weight", f"{_GPT2_LAYER}.attn.c_proj.weight", ""),
        ("layers.{i}.attn.out.bias", f"{_GPT2_LAYER}.attn.c_proj.bias", ""),
        ("layers.{i}.norm2.scale", f"{_GPT2_LAYER}.ln_2.weight", ""),
        ("layers.{i}.norm2.bias", f"{_GPT2_LAYER}.ln_2.bias", ""),
        ("layers.{i}.mlp.fc.weight", f"{_GPT2_LAYER}.mlp.c_fc.weight", ""),
        ("layers.{i}.mlp.fc.bias", f"{_GPT2_LAYER}.mlp.c_fc.bias", ""),
        ("layers.{i}.mlp.proj.weight", f"{_GPT2_LAYER}.mlp.c_proj.weight", ""),
        ("layers.{i}.mlp.proj.bias", f"{_GPT2_LAYER}.mlp.c_proj.bias", ""),
        ("norm.scale", "transformer.ln_f.weight", ""),
        ("norm.bias", "transformer.ln_f.bias", ""),
        ("lm_head.weight", "lm_head.weight", "T"),  # only when the embeddings are not tied
    ],
    "llama": [
        ("embed.weight", "model.embed_tokens.weight", ""),
        ("layers.{i}.norm1.scale", f"{_LLAMA_LAYER}.input_layernorm.weight", ""),
        ("layers.{i}.attn.query.weight", f"{_LLAMA_LAYER}.self_attn.q_proj.weight", "T"),
        ("layers.{i}.attn.key.weight", f"{_LLAMA_LAYER}.self_attn.k_proj.weight", "T"),
        ("layers.{i}.attn.value.weight", f"{_LLAMA_LAYER}.self_attn.v_proj.weight", "T"),
        ("layers.{i}.attn.out.weight", f"{_LLAMA_LAYER}.self_attn.o_proj.weight", "T"),
        ("layers.{i}.attn.query.bias", f"{_LLAMA_LAYER}.self_attn.q_proj.bias", ""),
        ("layers.{i}.attn.key.bias", f"{_LLAMA_LAYER}.self_attn.k_proj.bias", ""),
        ("layers.{i}.attn.value.bias", f"{_LLAMA_LAYER}.self_attn.v_proj.bias", ""),
        ("layers.{i}.attn.out.bias", f"{_LLAMA_LAYER}.self_attn.o_proj.bias", ""),
        ("layers.{i}.norm2.scale", f"{_LLAMA_LAYER}.post_attention_layernorm.weight", ""),
        ("layers.{i}.mlp.gate.weight", f"{_LLAMA_LAYER}.mlp.gate_proj.weight", "T"),
        ("layers.{i}.mlp.up.weight", f"{_LLAMA_LAYER}.mlp.up_proj.weight", "T"),
        ("layers.{i}.mlp.down.weight", f"{_LLAMA_LAYER}.mlp.down_proj.weight", "T"),
        ("layers.{i}.mlp.gate.bias", f"{_LLAMA_LAYER}.mlp.gate_proj.bias", ""),
        ("layers.{i}.mlp.up.bias", f"{_LLAMA_LAYER}.mlp.up_proj.bias", ""),
        ("layers.{i}.mlp.down.bias", f"{_LLAMA_LAYER}.mlp.down_proj.bias", ""),
        ("norm.scale", "model.norm.weight", ""),
        ("lm_head.weight", "lm_head.weight", "T"),
    ],
}


@dataclass(frozen=True)
class Pretrained:
    """A loaded model: ``model`` (a ``kn.layer.Layer``: ids ``[B, T]`` -> logits), its ``vars``,
    the ``config`` and the ``family`` (``"gpt2"`` / ``"llama"``)."""

    model: Layer
    vars: Vars
    config: DecoderConfig
    family: str

    @property
    def params(self) -> Any:
        return self.vars.params


def config_from_hf(hf: dict) -> tuple[str, DecoderConfig]:
    """``(family, DecoderConfig)`` of a Hugging Face ``config.json`` (GPT-2 or Llama)."""
    kind = hf.get("model_type")
    if kind == "gpt2":
        activation = hf.get("activation_function", "gelu_new")
        mlp = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}.get(activation)
        if mlp is None:
            raise ValueError(f"GPT-2 activation_function {activation!r} is not supported")
        dim = hf["n_embd"]
        return "gpt2", DecoderConfig(
            vocab_size=hf["vocab_size"],
            dim=dim,
            num_layers=hf["n_layer"],
            num_heads=hf["n_head"],
            num_kv_heads=hf["n_head"],
            hidden_dim=hf.get("n_inner") or 4 * dim,
            max_positions=hf["n_positions"],
            norm="layer",
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            mlp=mlp,
            positions="learned",
            attn_bias=True,
            mlp_bias=True,
            tie_embeddings=hf.get("tie_word_embeddings", True),
        )
    if kind == "llama":
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"Llama hidden_act {hf['hidden_act']!r} is not supported (silu only)")
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or rope
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ValueError(f"rope scaling {scaling!r} is not supported (default RoPE only)")
        heads = hf["num_attention_heads"]
        return "llama", DecoderConfig(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            hidden_dim=hf["intermediate_size"],
            max_positions=hf.get("max_position_embeddings", 2048),
            norm="rms",
            norm_eps=hf.get("rms_norm_eps", 1e-6),
            mlp="swiglu",
            positions="rope",
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            attn_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            head_dim=hf.get("head_dim"),
        )
    raise ValueError(f"model_type {kind!r} is not supported (gpt2, llama)")


class _Tensors:
    """The safetensors of a checkpoint directory (one file or a sharded index), read lazily."""

    def __init__(self, directory: str):
        # imported here: safetensors loads only when a file is read or written
        from safetensors import safe_open  # noqa: PLC0415

        index = os.path.join(directory, "model.safetensors.index.json")
        single = os.path.join(directory, "model.safetensors")
        if os.path.exists(index):
            # every file the index names is checked to be a file inside the directory
            reader = IndexFile(index, "from_pretrained", links_into=_cache_blobs(directory))
            weight_map = reader.field(reader.check_object(), "weight_map", dict)
            paths = {f: reader.file(f, f"weight_map[{k!r}]") for k, f in weight_map.items()}
        elif os.path.exists(single):
            paths, weight_map = {"model.safetensors": single}, None
        else:
            raise FileNotFoundError(
                f"{directory}: neither model.safetensors nor model.safetensors.index.json"
            )
        self.paths, self.handles, self.where = paths, {}, {}
        for name in sorted(paths):
            with decoding(paths[name], "from_pretrained", everything=True):
                handle = self.handles[name] = safe_open(paths[name], framework="np")
                for key in handle.keys():
                    self.where[key] = name
        if weight_map is not None:
            missing = [k for k, f in weight_map.items() if self.where.get(k) != f]
            if missing:
                raise CheckpointError(
                    f"from_pretrained: {index}: tensors listed but not found in their shard: {missing[:5]}"
                )

    def find(self, key: str) -> str | None:
        """The stored name of ``key``: as given, or without its ``transformer.`` / ``model.``
        prefix (checkpoints saved from the base model lack it)."""
        if key in self.where:
            return key
        short = key.split(".", 1)[1] if key.startswith(("transformer.", "model.")) else None
        return short if short in self.where else None

    def get(self, key: str) -> np.ndarray:
        name = self.where[key]
        with decoding(self.paths[name], "from_pretrained", f"cannot read tensor {key!r}: ", everything=True):
            return self.handles[name].get_tensor(key)


def _cache_blobs(directory: str) -> tuple[str, ...]:
    """A Hugging Face download cache keeps a model as ``<repo>/snapshots/<revision>/<file>``,
    each file a link into ``<repo>/blobs``: the one folder outside ``directory`` its links may
    lead into."""
    snapshots = os.path.dirname(os.path.realpath(directory))
    if os.path.basename(snapshots) != "snapshots":
        return ()
    return (os.path.join(os.path.dirname(snapshots), "blobs"),)


def _convert(array: np.ndarray, transform: str) -> np.ndarray:
    if transform == "T":
        return np.ascontiguousarray(array.T)
    if transform.startswith("split3:"):
        part = int(transform.split(":")[1])
        size = array.shape[-1] // 3
        return np.ascontiguousarray(array[..., part * size : (part + 1) * size])
    return array


def from_pretrained(directory: str | os.PathLike, dtype=dtypes.float32) -> Pretrained:
    """Load a Hugging Face GPT-2 or Llama checkpoint from a local ``directory``.

    Reads ``config.json`` and ``model.safetensors`` (or the shards named by
    ``model.safetensors.index.json``), maps every tensor through :data:`NAME_TABLE` and casts to
    ``dtype``. Raises ``ValueError`` naming the missing tensor or the shape that disagrees, and
    ``CheckpointError`` (a ``ValueError``) naming the file when ``config.json``, the index or a
    SafeTensors file is damaged or the index names a file outside ``directory``.
    """
    directory = os.fspath(directory)
    config = os.path.join(directory, "config.json")
    if not os.path.exists(config):
        raise FileNotFoundError(f"{directory}: no config.json (a Hugging Face model directory is expected)")
    hf_config = read_json(config, "from_pretrained")
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"from_pretrained: {config}: not a JSON object")
    with decoding(config, "from_pretrained"):  # a missing or mistyped entry, an unsupported model
        family, cfg = config_from_hf(hf_config)
    tensors = _Tensors(directory)
    dtype = dtypes.canonical(dtype)
    shapes = init_params(cfg, dtype, abstract=True)
    rows = NAME_TABLE[family]
    flat = {}
    for path, shape in ptree.flatten_with_paths(shapes):
        flat[path] = _read(tensors, rows, path, shape.shape, directory).astype(dtype)
    params = ptree.unflatten_from_paths(flat)
    name = "gpt2" if family == "gpt2" else "llama"
    return Pretrained(decoder(cfg, name), Vars(params, [], dtype), cfg, family)


def _read(tensors: _Tensors, rows, path: str, shape, directory: str) -> np.ndarray:
    parts = path.split(".")
    index = parts[1] if parts[0] == "layers" else None
    template = ".".join(["layers", "{i}", *parts[2:]]) if index is not None else path
    for ours, theirs, transform in rows:
        if ours != template:
            continue
        key = tensors.find(theirs.format(i=index))
        if key is None:
            raise ValueError(
                f"from_pretrained: {directory} has no tensor {theirs.format(i=index)!r} (needed for {path})"
            )
        array = _convert(tensors.get(key), transform)
        if tuple(array.shape) != tuple(shape):
            raise ValueError(
                f"from_pretrained: {key} gives shape {array.shape} for {path}, expected {tuple(shape)}"
            )
        return array
    raise ValueError(f"from_pretrained: no entry of the name table for {path}")

"""Checkpoint directories from untrusted sources and saves that die midway.

- every file an index names (a sharded checkpoint's ``index.json``, Hugging Face's
  ``model.safetensors.index.json``) must lie inside its directory: no ``..``, no absolute path, no
  link leading out;
- the pieces of a sharded array must cover each element exactly once (overlaps and gaps are
  errors, never uninitialised memory);
- damaged files raise ``CheckpointError`` naming the file, never a raw ``JSONDecodeError``,
  ``KeyError``, ``UnicodeDecodeError`` or ``SafetensorError``;
- ``save_sharded`` replaces the directory at its path atomically (``fileio.AtomicDirectory``),
  refuses to replace what it did not write, and the next save removes what killed saves left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from kill_sharded_saves import campaign, leftovers
from safetensors.numpy import save_file

import kaun_ir as kn
from kaun_ir import fileio
from kaun_ir.checkpoint import CheckpointError

F32 = np.float32
SHARD = "shards-00000-of-00001.safetensors"


# ------------------------------------------------------------------ hand-made sharded checkpoints


def _sharded(root, pieces, shape=(8,), tensors=None, index=None):
    """A sharded checkpoint of one array ``a`` with the given pieces ``[(file, bounds)]``; the
    stored values of a piece are its global element numbers, so a correct load is ``arange``."""
    os.makedirs(root, exist_ok=True)
    whole = np.arange(int(np.prod(shape)), dtype=F32).reshape(shape)
    stored: dict[str, dict] = {}
    for name, bounds in pieces:
        key = "a|" + ",".join(f"{a}:{b}" for a, b in bounds)
        stored.setdefault(name, {})[key] = np.ascontiguousarray(whole[tuple(slice(a, b) for a, b in bounds)])
    for name, content in (tensors or stored).items():
        save_file(content, os.path.join(root, name))
    document = index or {
        "format": "kaun_ir-sharded-1",
        "processes": 1,
        "arrays": {
            "a": {
                "shape": list(shape),
                "dtype": "float32",
                "pieces": [{"file": f, "bounds": [list(b) for b in bounds]} for f, bounds in pieces],
            }
        },
    }
    with open(os.path.join(root, "index.json"), "w") as handle:
        handle.write(document if isinstance(document, str) else json.dumps(document))
    return str(root)


def _load(root, shape=(8,)):
    return kn.checkpoint.load_sharded(root, {"a": np.zeros(shape, F32)})


def test_pieces_that_tile_the_array_load_exactly(tmp_path):
    root = _sharded(tmp_path / "c", [(SHARD, [(0, 2), (0, 3)]), (SHARD, [(2, 4), (0, 3)])], shape=(4, 3))
    np.testing.assert_array_equal(_load(root, (4, 3))["a"], np.arange(12, dtype=F32).reshape(4, 3))


@pytest.mark.parametrize(
    "pieces, pattern",
    [
        ([[(0, 4)], [(0, 4)]], r"pieces 0 \[\[0, 4\]\] and 1 \[\[0, 4\]\] overlap"),
        ([[(0, 6)], [(2, 8)]], r"overlap"),
        ([[(0, 4)]], r"cover 4 of the 8 elements"),
        ([[(0, 4)], [(5, 8)]], r"cover 7 of the 8 elements"),
        ([[(0, 4)], [(4, 9)]], r"not a region of shape \[8\]"),
        ([[(4, 0)], [(0, 8)]], r"not a region"),
    ],
)
def test_overlapping_or_missing_pieces_are_errors_never_garbage(tmp_path, pieces, pattern):
    root = _sharded(tmp_path / "c", [(SHARD, p) for p in pieces if p[0][1] <= 8 and p[0][0] <= p[0][1]])
    if any(p[0][1] > 8 or p[0][0] > p[0][1] for p in pieces):  # write the impossible bounds as given
        index = json.load(open(os.path.join(root, "index.json")))
        index["arrays"]["a"]["pieces"] = [{"file": SHARD, "bounds": [list(b) for b in p]} for p in pieces]
        _sharded(tmp_path / "c", [], index=index, tensors={})
    with pytest.raises(CheckpointError, match=pattern) as info:
        _load(root)
    assert os.path.join(root, "index.json") in str(info.value)


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("../outside.safetensors", r"outside the directory"),
        ("/etc/passwd", r"outside the directory"),
        ("sub/../../outside.safetensors", r"outside the directory"),
        ("link.safetensors", r"a link leading outside"),
        ("missing.safetensors", r"'missing\.safetensors', which does not exist"),
        ("", r"expected a file name"),
    ],
)
def test_an_index_never_opens_a_file_outside_its_directory(tmp_path, name, pattern):
    save_file({"a|0:8": np.arange(8, dtype=F32)}, str(tmp_path / "outside.safetensors"))
    root = _sharded(tmp_path / "c", [(SHARD, [(0, 8)])])
    os.symlink(tmp_path / "outside.safetensors", tmp_path / "c" / "link.safetensors")
    index = json.load(open(os.path.join(root, "index.json")))
    index["arrays"]["a"]["pieces"][0]["file"] = name
    _sharded(root, [], index=index, tensors={})
    with pytest.raises(CheckpointError, match=pattern) as info:
        _load(root)
    assert "index.json" in str(info.value) and "['pieces'][0]['file']" in str(info.value)


def _index_of(entry: dict) -> str:
    return json.dumps({"format": "kaun_ir-sharded-1", "arrays": {"a": entry}})


@pytest.mark.parametrize(
    "document, pattern",
    [
        ("{not json", r"not valid JSON \(line 1, column 2"),
        ("[1, 2]", r"the document is an array, expected an object"),
        ('{"format": "kaun_ir-sharded-1"}', r"missing entry 'arrays'"),
        ('{"format": "kaun_ir-sharded-1", "arrays": []}', r"'arrays' is an array, expected an object"),
        ('{"format": "kaun_ir-sharded-1", "arrays": {"a": 3}}', r"arrays\['a'\] is not an object"),
        (_index_of({"shape": "8", "dtype": "float32", "pieces": []}), r"\['shape'\] is a string"),
        (_index_of({"shape": [8], "dtype": "floaty", "pieces": []}), r"'floaty', not a dtype"),
        (
            _index_of({"shape": [8], "dtype": "float32", "pieces": [{"file": SHARD}]}),
            r"missing entry .*'bounds'",
        ),
        ('{"format": "kaun_ir-sharded-1", "arrays": {"a": {"number": "int", "value": "x"}}}', r"'value'"),
        ('{"format": "other"}', r"format 'other'"),
    ],
)
def test_a_damaged_index_names_the_file_and_the_entry(tmp_path, document, pattern):
    root = _sharded(tmp_path / "c", [(SHARD, [(0, 8)])], index=document)
    with pytest.raises(CheckpointError, match=pattern) as info:
        _load(root)
    assert os.path.join(root, "index.json") in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, kn.KaunError)


def test_an_index_that_is_not_text_names_the_file(tmp_path):
    root = _sharded(tmp_path / "c", [(SHARD, [(0, 8)])])
    (tmp_path / "c" / "index.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match=r"index\.json: not UTF-8 text"):
        _load(root)


def test_damaged_pieces_name_the_shard_file(tmp_path):
    # the index promises a piece the file does not hold
    root = _sharded(tmp_path / "a", [(SHARD, [(0, 8)])], tensors={SHARD: {"other": np.zeros(8, F32)}})
    with pytest.raises(CheckpointError, match=rf"{SHARD}: piece 'a\|0:8'") as info:
        _load(root)
    assert not type(info.value.__cause__).__module__.startswith("kaun_ir")
    # a piece of another shape than its bounds (the old loader broadcast it silently)
    root = _sharded(tmp_path / "b", [(SHARD, [(0, 8)])], tensors={SHARD: {"a|0:8": np.ones((8, 2), F32)}})
    with pytest.raises(CheckpointError, match=r"piece 'a\|0:8' gives shape \(8, 2\) for its region"):
        _load(root)
    # not a SafeTensors file at all
    root = _sharded(tmp_path / "c", [(SHARD, [(0, 8)])])
    (tmp_path / "c" / SHARD).write_bytes(b"garbage" * 10)
    with pytest.raises(CheckpointError, match=rf"{SHARD}: .*not a SafeTensors file"):
        _load(root)


# ------------------------------------------------------------------ saving: atomic, refusing, tidy


def test_save_sharded_refuses_to_replace_a_regular_file(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        kn.checkpoint.save_sharded(target, {"a": np.ones(2, F32)})
    assert target.read_text() == "keep me" and sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_save_sharded_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(FileExistsError, match="without index.json.*photos"):
        kn.checkpoint.save_sharded(tmp_path / "photos", {"a": np.ones(2, F32)})
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"meow"
    assert sorted(os.listdir(tmp_path)) == ["photos"]  # no staging directory left behind


@pytest.mark.parametrize("exchange", [True, False])
def test_a_checkpoint_directory_of_an_earlier_release_is_replaced(tmp_path, monkeypatch, exchange):
    """Before the link scheme, ``path`` was a plain directory: the first save over it swaps it
    with the link in one step (Linux) or renames it aside first (elsewhere)."""
    if not exchange:
        monkeypatch.setattr(fileio, "_exchange", lambda a, b: False)
    old = _sharded(tmp_path / "ckpt", [(SHARD, [(0, 8)])])
    kn.checkpoint.save_sharded(old, {"a": np.full(8, 5, F32)})
    assert os.path.islink(old)
    np.testing.assert_array_equal(_load(old)["a"], np.full(8, 5, F32))
    assert leftovers(old) == []


def test_while_a_plain_directory_is_set_aside_the_loader_finds_it(tmp_path):
    """The one intermediate state without anything at ``path`` (no exchange: between renaming the
    old directory aside and renaming the link into place) still loads."""
    aside = f".ckpt.{_dead_pid()}.abc.old"
    _sharded(tmp_path / aside, [(SHARD, [(0, 8)])])
    path = str(tmp_path / "ckpt")
    np.testing.assert_array_equal(_load(path)["a"], np.arange(8, dtype=F32))
    assert fileio.remove_stale_directories(path) == []  # it is the checkpoint until one is at path
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 3, F32)})
    np.testing.assert_array_equal(_load(path)["a"], np.full(8, 3, F32))
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 4, F32)})  # now the next save removes it
    assert leftovers(path) == []


def test_saves_replace_the_link_and_leave_one_directory(tmp_path):
    path = str(tmp_path / "ckpt")
    for value in (1, 2, 3):
        kn.checkpoint.save_sharded(path, {"a": np.full(8, value, F32), "n": value})
        back = kn.checkpoint.load_sharded(path, {"a": np.zeros(8, F32), "n": 0})
        np.testing.assert_array_equal(back["a"], np.full(8, value, F32))
        assert back["n"] == value
        assert sorted(os.listdir(path)) == ["index.json", SHARD]
        assert leftovers(path) == []  # the replaced directory is gone


def test_a_save_that_fails_leaves_the_old_checkpoint_and_no_staging(tmp_path):
    path = str(tmp_path / "ckpt")
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 1, F32)})
    with pytest.raises(TypeError, match=r"leaf 'bad' has dtype complex128"):
        kn.checkpoint.save_sharded(path, {"a": np.full(8, 2, F32), "bad": np.ones(2, np.complex128)})
    np.testing.assert_array_equal(_load(path)["a"], np.full(8, 1, F32))
    assert leftovers(path) == []


def test_the_next_save_removes_what_killed_saves_left(tmp_path):
    path = str(tmp_path / "ckpt")
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 1, F32)})
    dead = _dead_pid()
    for token, kind in (("a0ff", "dir"), ("b0ff", "old")):
        stale = tmp_path / f".ckpt.{dead}.{token}.{kind}"
        stale.mkdir()
        (stale / SHARD).write_bytes(b"x" * 100)
    os.symlink(".ckpt.1.ab.dir", tmp_path / f".ckpt.{dead}.abc.link")
    live = tmp_path / f".ckpt.{os.getppid()}.beef.dir"  # a save still running elsewhere
    live.mkdir()
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 2, F32)})
    assert leftovers(path) == [live.name]


def test_the_next_save_removes_staging_named_with_a_pid_now_reused(tmp_path):
    # A job killed mid-save and restarted often gets the same pid (a container's first process),
    # and a pid may also pass to an unrelated process: neither makes a staging directory live.
    path = str(tmp_path / "ckpt")
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 1, F32)})
    ours = tmp_path / f".ckpt.{os.getpid()}.a0ff.dir"  # this pid, no save of this process running
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reused = tmp_path / f".ckpt.{sleeper.pid}.b0ff.dir"  # older than the process with its pid
        running = tmp_path / f".ckpt.{sleeper.pid}.c0ff.dir"  # made since: a save still running
        for stale in (ours, reused, running):
            stale.mkdir()
            (stale / SHARD).write_bytes(b"x" * 100)
        an_hour_ago = time.time() - 3600
        os.utime(reused, (an_hour_ago, an_hour_ago))
        kn.checkpoint.save_sharded(path, {"a": np.full(8, 2, F32)})
        assert leftovers(path) == [running.name]
    finally:
        sleeper.kill()
        sleeper.wait()
    np.testing.assert_array_equal(kn.checkpoint.load_sharded(path, {"a": np.zeros(8, F32)})["a"], 2)


def test_a_save_under_way_in_this_process_is_never_stale(tmp_path):
    path = str(tmp_path / "ckpt")
    kn.checkpoint.save_sharded(path, {"a": np.full(8, 1, F32)})
    under_way = fileio.AtomicDirectory(path, "index.json")
    staging = under_way.create()  # another thread's save, between create and commit
    assert fileio.remove_stale_directories(path) == [] and os.path.isdir(staging)
    under_way.abort()
    assert leftovers(path) == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_save_sharded_killed_at_random_moments_leaves_a_checkpoint_at_the_path(tmp_path):
    """A few rounds of ``python tests/kill_sharded_saves.py --kills 50``."""
    figures = campaign(str(tmp_path), kills=int(os.environ.get("KAUN_IR_SHARDED_KILLS", "5")), seed=1)
    assert figures["kills"] == figures["old_or_first"] + figures["second"]


# ------------------------------------------------------------------ single files and pretrained models


def test_saving_an_unsupported_dtype_names_the_leaf(tmp_path):
    with pytest.raises(TypeError, match=r"checkpoint\.save: leaf 'x\.z' has dtype complex128"):
        kn.checkpoint.save(
            tmp_path / "m.safetensors", {"x": {"y": np.ones(2, F32), "z": np.ones(2, np.complex128)}}
        )
    with pytest.raises(TypeError, match=r"leaf 's' has dtype <U3"):
        kn.checkpoint.save(tmp_path / "m.safetensors", {"s": np.array(["abc"])})
    assert not os.path.exists(tmp_path / "m.safetensors")


@pytest.mark.parametrize("structure", ["{not json", '["dict"]', '["dict", 3]', "[1, 2, 3]"])
def test_damaged_structure_metadata_names_the_file(tmp_path, structure):
    path = str(tmp_path / "m.safetensors")
    save_file({"a": np.ones(2, F32)}, path, metadata={"kaun_ir.tree": structure})
    with pytest.raises(CheckpointError, match=r"m\.safetensors: damaged tree structure in the metadata"):
        kn.checkpoint.load(path)


GPT2 = {"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 16, "n_positions": 8}


def _hf_dir(root, weight_map=None, config=GPT2, index_text=None):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "config.json"), "w") as handle:
        handle.write(config if isinstance(config, str) else json.dumps(config))
    save_file({"transformer.wte.weight": np.ones((16, 8), F32)}, os.path.join(root, "part-1.safetensors"))
    if index_text is None:
        index_text = json.dumps(
            {"weight_map": weight_map or {"transformer.wte.weight": "part-1.safetensors"}}
        )
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as handle:
        handle.write(index_text)
    return str(root)


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("../outside.safetensors", r"outside the directory"),
        ("/etc/passwd", r"outside the directory"),
        ("link.safetensors", r"a link leading outside"),
        (7, r"names a file by 7"),
    ],
)
def test_from_pretrained_never_opens_a_file_outside_the_model_directory(tmp_path, name, pattern):
    save_file({"transformer.wte.weight": np.ones((16, 8), F32)}, str(tmp_path / "outside.safetensors"))
    root = _hf_dir(tmp_path / "model", {"transformer.wte.weight": name})
    os.symlink(tmp_path / "outside.safetensors", tmp_path / "model" / "link.safetensors")
    with pytest.raises(CheckpointError, match=pattern) as info:
        kn.models.from_pretrained(root)
    assert "model.safetensors.index.json" in str(
        info.value
    ) and "weight_map['transformer.wte.weight']" in str(info.value)


def test_from_pretrained_follows_links_of_a_download_cache_into_its_blobs(tmp_path):
    """Hugging Face's cache: ``repo/snapshots/<rev>/<file>`` are links into ``repo/blobs``."""
    (tmp_path / "repo" / "blobs").mkdir(parents=True)
    save_file({"transformer.wte.weight": np.ones((16, 8), F32)}, str(tmp_path / "repo" / "blobs" / "1f2e"))
    root = _hf_dir(tmp_path / "repo" / "snapshots" / "abc123")
    os.unlink(os.path.join(root, "part-1.safetensors"))
    os.symlink("../../blobs/1f2e", os.path.join(root, "part-1.safetensors"))
    # past the index: the checkpoint is read until the first tensor this tiny file lacks
    with pytest.raises(ValueError, match=r"abc123 has no tensor 'transformer\."):
        kn.models.from_pretrained(root)
    os.symlink(tmp_path / "outside.safetensors", os.path.join(root, "elsewhere.safetensors"))
    save_file({"transformer.wte.weight": np.ones((16, 8), F32)}, str(tmp_path / "outside.safetensors"))
    with open(os.path.join(root, "model.safetensors.index.json"), "w") as handle:
        json.dump({"weight_map": {"transformer.wte.weight": "elsewhere.safetensors"}}, handle)
    with pytest.raises(CheckpointError, match="a link leading outside"):
        kn.models.from_pretrained(root)


@pytest.mark.parametrize(
    "what, config, index_text, pattern",
    [
        ("config not json", "{oops", None, r"config\.json: not valid JSON"),
        ("config not text", "\udcff", None, r"config\.json: not UTF-8"),
        ("config a list", "[]", None, r"config\.json: not a JSON object"),
        ("config missing key", {"model_type": "gpt2"}, None, r"config\.json: missing entry 'n_embd'"),
        ("config unknown model", {"model_type": "bert"}, None, r"config\.json: .*'bert' is not supported"),
        ("index not json", GPT2, "{", r"model\.safetensors\.index\.json: not valid JSON"),
        ("index no weight_map", GPT2, "{}", r"index\.json: missing entry 'weight_map'"),
        ("weight_map a list", GPT2, '{"weight_map": []}', r"'weight_map' is an array, expected an object"),
    ],
)
def test_from_pretrained_damaged_json_names_the_file(tmp_path, what, config, index_text, pattern):
    root = _hf_dir(tmp_path / "model", config=config if config != "\udcff" else "{}", index_text=index_text)
    if config == "\udcff":
        (tmp_path / "model" / "config.json").write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(CheckpointError, match=pattern):
        kn.models.from_pretrained(root)


def test_from_pretrained_damaged_safetensors_names_the_file(tmp_path):
    root = _hf_dir(tmp_path / "model")
    (tmp_path / "model" / "part-1.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"{}")
    with pytest.raises(
        CheckpointError, match=r"part-1\.safetensors: .*truncated|part-1\.safetensors: .*SafeTensors"
    ):
        kn.models.from_pretrained(root)


def test_from_pretrained_reads_a_sharded_directory_through_the_index(tmp_path):
    """A well-formed two-file GPT-2 checkpoint still loads (the checks refuse only bad indexes):
    values compared with the Hugging Face tensors, sliced here by hand."""
    rng = np.random.default_rng(0)
    d, inner, vocab, positions = 8, 32, 16, 8
    shapes = {
        "transformer.wte.weight": (vocab, d),
        "transformer.wpe.weight": (positions, d),
        "transformer.ln_f.weight": (d,),
        "transformer.ln_f.bias": (d,),
    }
    layer = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "mlp.c_fc.weight": (d, inner),
        "mlp.c_fc.bias": (inner,),
        "mlp.c_proj.weight": (inner, d),
        "mlp.c_proj.bias": (d,),
    }
    shapes.update({f"transformer.h.0.{k}": v for k, v in layer.items()})
    tensors = {k: rng.standard_normal(v).astype(F32) for k, v in shapes.items()}
    names = sorted(tensors)
    parts = {"model-1.safetensors": names[: len(names) // 2], "model-2.safetensors": names[len(names) // 2 :]}
    root = tmp_path / "gpt2"
    root.mkdir()
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, str(root / file))
    weight_map = {k: file for file, keys in parts.items() for k in keys}
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(GPT2))
    params = kn.models.from_pretrained(root).params
    np.testing.assert_array_equal(params["embed"]["weight"], tensors["transformer.wte.weight"])
    c_attn = tensors["transformer.h.0.attn.c_attn.weight"]
    np.testing.assert_array_equal(params["layers"][0]["attn"]["key"]["weight"], c_attn[:, d : 2 * d])
    np.testing.assert_array_equal(
        params["layers"][0]["mlp"]["fc"]["weight"], tensors["transformer.h.0.mlp.c_fc.weight"]
    )

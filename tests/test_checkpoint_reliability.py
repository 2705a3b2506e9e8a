"""Checkpoint files that survive anything: load errors name the file and what is wrong, a save
removes the temporary files of killed saves of the same path, and saves killed at random moments
never leave a file that loads as anything but the old or the new content."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import fileio
from kaun_ir.checkpoint import core as checkpoint

TREE = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.zeros(4, np.float32), "step": 7}


@pytest.fixture()
def good(tmp_path):
    return checkpoint.save(tmp_path / "good.safetensors", TREE)


def _write(path, data: bytes) -> str:
    with open(path, "wb") as handle:
        handle.write(data)
    return str(path)


def _bad_files(tmp_path, good):
    data = open(good, "rb").read()
    os.mkdir(tmp_path / "dir.safetensors")
    np.save(tmp_path / "array.npy", np.ones(3))
    return {
        "truncated data": (_write(tmp_path / "t1.safetensors", data[: len(data) - 10]), r"truncated"),
        "truncated header": (_write(tmp_path / "t2.safetensors", data[:40]), r"truncated|not a SafeTensors"),
        "empty": (_write(tmp_path / "empty.safetensors", b""), r"empty"),
        "too short": (_write(tmp_path / "short.safetensors", b"abc"), r"too short"),
        "text": (_write(tmp_path / "notes.txt", b"hello, this is not a checkpoint\n"), r"not a SafeTensors"),
        "numpy file": (str(tmp_path / "array.npy"), r"not a SafeTensors"),
        "bad json": (
            _write(tmp_path / "json.safetensors", (12).to_bytes(8, "little") + b"{not json!!}"),
            r"not a SafeTensors|damaged",
        ),
        "directory": (str(tmp_path / "dir.safetensors"), r"is a directory"),
    }


@pytest.mark.parametrize("reader", ["load", "load_like", "load_raw"])
def test_every_bad_file_gets_an_error_naming_the_file(tmp_path, good, reader):
    for what, (path, pattern) in _bad_files(tmp_path, good).items():
        call = {
            "load": lambda path=path: checkpoint.load(path),
            "load_raw": lambda path=path: checkpoint.load_raw(path),
            "load_like": lambda path=path: checkpoint.load(path, like=TREE),
        }[reader]
        with pytest.raises(checkpoint.CheckpointError) as info:
            call()
        message = str(info.value)
        assert path in message, (what, message)
        assert __import__("re").search(pattern, message), (what, message)
        assert isinstance(info.value, ValueError) and isinstance(info.value, kn.KaunError)


def test_missing_file_is_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        checkpoint.load(tmp_path / "nothing.safetensors")


def test_a_save_removes_temporaries_of_dead_writers_only(tmp_path):
    path = tmp_path / "model.safetensors"
    dead_pid = _dead_pid()
    stale = tmp_path / f".model.safetensors.{dead_pid}.{'a' * 32}.tmp"
    live = tmp_path / f".model.safetensors.{os.getppid()}.{'b' * 32}.tmp"
    other = tmp_path / f".other.safetensors.{dead_pid}.{'c' * 32}.tmp"
    for p in (stale, live, other):
        p.write_bytes(b"partial")
    checkpoint.save(path, TREE)
    assert not stale.exists()  # its writer is gone
    assert live.exists()  # a running process may still be writing it
    assert other.exists()  # another file's temporary
    np.testing.assert_array_equal(checkpoint.load(path)["w"], TREE["w"])


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _saver(path: str, trees: list) -> None:
    """Child process: save the two contents in turn as fast as possible, until killed."""
    try:
        i = 0
        while True:
            checkpoint.save(path, trees[i % 2])
            i += 1
    finally:
        os._exit(1)


@pytest.mark.parametrize("trials", [int(os.environ.get("KAUN_IR_CRASH_TRIALS", "25"))])
def test_saves_killed_at_random_moments_leave_old_or_new_content(tmp_path, trials):
    path = str(tmp_path / "ckpt.safetensors")
    rng = np.random.default_rng(0)
    old = {"w": rng.standard_normal((512, 512)).astype(np.float32), "step": 1}
    new = {"w": rng.standard_normal((512, 512)).astype(np.float32), "step": 2}
    checkpoint.save(path, old)
    chooser = random.Random(1234)
    torn = 0
    for _ in range(trials):
        pid = os.fork()
        if pid == 0:
            _saver(path, [new, old])
        time.sleep(chooser.uniform(0.0, 0.03))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = checkpoint.load(path)
        assert loaded["step"] in (1, 2)
        np.testing.assert_array_equal(loaded["w"], (old if loaded["step"] == 1 else new)["w"])
        torn += any(name.endswith(".tmp") for name in os.listdir(tmp_path))
    assert torn > 0, "no kill landed mid-write: the test would not catch a torn file"
    checkpoint.save(path, old)  # the next save cleans up after every killed one
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert fileio.remove_stale_temporaries(path) == []


def test_atomic_write_writes_through_a_pipe_and_never_replaces_it(tmp_path):
    """``-o /dev/null`` and friends: renaming a file over a device or a pipe would replace it (as
    root, /dev/null would become a plain file), so special files are written to directly."""
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo, "rb").read()))
    reader.start()
    fileio.atomic_write(fifo, b"through the pipe")
    reader.join(timeout=30)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]  # no temporary left beside it

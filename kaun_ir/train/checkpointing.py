"""``train.fit``'s checkpoints: every N steps into a directory, the last K kept, written from a
background thread, with the data pipeline's position so a resumed run reads the batches that
would have come.

A checkpoint is ``DIR/step_00000120.safetensors``, the same file :func:`kaun_ir.train.save`
writes (``train.load`` and ``checkpoint.load`` read it), with two more header entries:
``"kaun_ir.data_position"`` (the pipeline's :meth:`~kaun_ir.data.Data.position` as JSON) and
``"kaun_ir.fit_epoch"`` (the passes over the data the run had finished).

Saving copies the state to host memory on the calling thread (the next step donates the
device buffers, so the copy cannot wait) and writes the file on a background thread, atomically
as every checkpoint is; at most one write is in flight (a save waits for the previous one). A
failed write is raised as :class:`~kaun_ir.errors.CheckpointError` at the next save or at the
end of ``fit``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.checkpoint import core as checkpoint
from kaun_ir.errors import CheckpointError
from kaun_ir.train.io import state_to_tree
from kaun_ir.train.state import State

__all__ = ["Checkpointer", "latest_checkpoint", "checkpoint_steps", "POSITION_KEY", "EPOCH_KEY"]

POSITION_KEY = checkpoint.POSITION_KEY
EPOCH_KEY = checkpoint.EPOCH_KEY
_NAME = re.compile(r"^step_(\d+)\.safetensors$")


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the checkpoints ``fit`` wrote in ``directory``, in increasing order."""
    if not os.path.isdir(directory):
        return []
    found = (_NAME.match(name) for name in os.listdir(directory))
    return sorted(int(match.group(1)) for match in found if match)


def checkpoint_path(directory: str | os.PathLike, step: int) -> str:
    """The file of the checkpoint of ``step`` in ``directory``."""
    return os.path.join(os.fspath(directory), f"step_{step:08d}.safetensors")


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The newest checkpoint ``fit(..., checkpoint_dir=directory)`` wrote, or None."""
    steps = checkpoint_steps(directory)
    return checkpoint_path(directory, steps[-1]) if steps else None


def host_copy(st: State) -> dict:
    """The state's tree with every array copied to host memory (NumPy)."""
    leaves, treedef = tree.flatten(state_to_tree(st))
    return tree.unflatten(treedef, [np.array(leaf) if hasattr(leaf, "shape") else leaf for leaf in leaves])


class Checkpointer:
    """Writes the checkpoints of one ``fit`` run into ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, keep_last: int | None):
        self.directory = os.fspath(directory)
        self.keep_last = keep_last
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        os.makedirs(self.directory, exist_ok=True)

    def save(self, st: State, position: dict | None, epoch: int) -> str:
        """Copy ``st`` to the host now and write it in the background; returns the file's path."""
        self.wait()
        header = {EPOCH_KEY: str(int(epoch))}
        if position is not None:
            header[POSITION_KEY] = json.dumps(position)
        if st.optimizer:
            header[checkpoint.OPTIMIZER_KEY] = st.optimizer
        step = int(st.step)
        path = checkpoint_path(self.directory, step)
        host = host_copy(st)
        self._thread = threading.Thread(
            target=self._write, args=(path, host, header, step), name="kaun_ir-checkpoint", daemon=False
        )
        self._thread.start()
        return path

    def _write(self, path: str, host: dict, header: dict, step: int) -> None:
        try:
            checkpoint.save(path, host, metadata=header)
            self._prune(step)
        except BaseException as error:  # noqa: BLE001 - raised on the training thread by wait()
            self._error = error

    def _prune(self, written: int) -> None:
        """Keep the last ``keep_last`` checkpoints up to the one just ``written``; later steps
        (left by another run in the same directory) are not this run's to remove, and must
        not push out the file just written."""
        if not self.keep_last:
            return
        steps = [step for step in checkpoint_steps(self.directory) if step <= written]
        for step in steps[: -self.keep_last]:
            try:
                os.unlink(checkpoint_path(self.directory, step))
            except FileNotFoundError:
                pass

    def wait(self) -> None:
        """Wait for the write in flight; raise ``CheckpointError`` if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointError(
                f"train.fit: writing a checkpoint in {self.directory} failed: {error}"
            ) from error


def read_resume_info(path: str) -> tuple[dict | None, int]:
    """The data position and finished passes stored in a checkpoint ``fit`` wrote."""
    meta = checkpoint.metadata(path)
    position = json.loads(meta[POSITION_KEY]) if POSITION_KEY in meta else None
    return position, int(meta.get(EPOCH_KEY, "0"))


def resolve(resume: Any, directory: str | None) -> str | None:
    """The checkpoint file ``fit(resume=...)`` names: True (the latest in ``directory``), a
    file, or a directory (its latest); None when there is none yet (a fresh start)."""
    if resume is False or resume is None:
        return None
    if resume is True:
        if directory is None:
            raise ValueError(
                "train.fit: resume=True needs checkpoint_dir= (where to find the latest checkpoint)"
            )
        return latest_checkpoint(directory)
    resume = os.fspath(resume)
    if os.path.isdir(resume):
        return latest_checkpoint(resume)
    if not os.path.exists(resume):
        raise FileNotFoundError(f"train.fit: resume={resume!r}: no such checkpoint")
    return resume

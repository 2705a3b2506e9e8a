"""What ``train.fit`` tells the outside world while it runs: :class:`Callback` and the metric
writers for JSON lines, CSV and TensorBoard event files.

``fit`` calls ``on_fit_start(trainer, state)`` once, ``on_log(step, logs, state)`` every
``report_every`` steps (and after the last step and after each evaluation) with ``logs`` a dict
of Python floats — ``loss``, ``lr``, ``steps_per_s``, ``examples_per_s``, ``tokens_per_s``
(when the inputs are integer token ids), ``epoch`` and, after an evaluation, ``eval/<name>`` —
and ``on_fit_end(step, state)`` when it returns or fails. ``step`` is the training state's
global step (``state.step``), so the logs of a resumed run continue where the first stopped.

The writers append (a resumed run adds to the same files) and flush after every line, so a
crash loses nothing written; they open their file on the first write and close it in
``on_fit_end`` (calling ``fit`` once per epoch keeps appending).
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

from kaun_ir.fileio import atomic_write
from kaun_ir.train.tfevents import EventFile

__all__ = ["Callback", "MetricWriter", "JsonlWriter", "CsvWriter", "TensorBoardWriter"]


class Callback:
    """Hooks ``train.fit(..., callbacks=[...])`` calls; override the ones you need (each does
    nothing by default). Raising ``train.EarlyStop`` in ``on_log`` ends training as it does in
    ``report``."""

    def on_fit_start(self, trainer: Any, state: Any) -> None:
        """Called once before the first step."""

    def on_log(self, step: int, logs: dict[str, float], state: Any) -> None:
        """Called with the logged values (Python floats) of global step ``step``."""

    def on_fit_end(self, step: int, state: Any) -> None:
        """Called once when ``fit`` returns or raises."""


class MetricWriter(Callback):
    """A callback that writes each ``on_log`` call as one record: subclasses implement
    :meth:`write` (and :meth:`close`)."""

    def on_log(self, step: int, logs: dict[str, float], state: Any) -> None:
        """Write ``logs`` at ``step``."""
        self.write(step, logs)

    def on_fit_end(self, step: int, state: Any) -> None:
        """Close the file (the next write reopens it and appends)."""
        self.close()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Write one record of ``scalars`` at ``step``."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and close the file."""


class JsonlWriter(MetricWriter):
    """One JSON object per line, appended to ``path`` (NaN and infinities are written as ``NaN``
    / ``Infinity``, as Python's ``json`` reads them). Two kinds of rows, told apart by ``kind``:

    * ``{"step": 10, "kind": "train", "loss": 0.52, "lr": 0.001, "steps_per_s": ...,
      "examples_per_s": ..., "epoch": ...}`` (and ``tokens_per_s`` for token inputs) on every
      step ``report`` is due;
    * ``{"step": 12, "kind": "eval", "eval/loss": 0.61, "eval/<metric>": ...}`` after every
      evaluation (``eval_data=``).

    So the last training loss is ``[r for r in rows if r["kind"] == "train"][-1]["loss"]``."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._handle = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one line."""
        if self._handle is None:
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        kind = "eval" if scalars and all(key.startswith("eval/") for key in scalars) else "train"
        row = {"step": int(step), "kind": kind, **{key: float(value) for key, value in scalars.items()}}
        self._handle.write(json.dumps(row) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class CsvWriter(MetricWriter):
    """A CSV table with a ``step`` column and one column per logged name, appended to ``path``.

    Names first seen after the header was written (``eval/accuracy`` after the first
    evaluation) extend the header: the file is rewritten once, atomically, with the new column
    (empty in the earlier rows).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._columns: list[str] | None = None
        self._handle = None

    def _read_columns(self) -> list[str] | None:
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return None
        with open(self.path, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), None)

    def _widen(self, columns: list[str]) -> None:
        """Rewrite the file with ``columns`` as its header."""
        self.close()
        with open(self.path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        text = io.StringIO()
        writer = csv.DictWriter(text, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.path, text.getvalue())
        self._columns = columns

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one row (widening the header first if ``scalars`` has new names)."""
        if self._columns is None:
            self._columns = self._read_columns()
        if self._columns is None:
            self._columns = ["step", *scalars]
            atomic_write(self.path, ",".join(self._columns) + "\n")
        new = [key for key in scalars if key not in self._columns]
        if new:
            self._widen([*self._columns, *new])
        if self._handle is None:
            self._handle = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed by close()
        row = {"step": int(step), **{key: repr(float(value)) for key, value in scalars.items()}}
        csv.DictWriter(self._handle, self._columns, lineterminator="\n").writerow(row)
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class TensorBoardWriter(MetricWriter):
    """TensorBoard scalars: an ``events.out.tfevents.*`` file in ``logdir`` (one per writer
    opened), with one scalar series per logged name. Written directly in TensorBoard's event
    format (no TensorFlow or ``tensorboard`` package needed to write; ``tensorboard --logdir
    LOGDIR`` shows them)."""

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = os.fspath(logdir)
        self._file: EventFile | None = None
        #: the event file written last (None before the first write)
        self.path: str | None = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one event holding every scalar of ``scalars``."""
        if self._file is None:
            self._file = EventFile(self.logdir)
            self.path = self._file.path
        self._file.write(step, scalars)

    def close(self) -> None:
        """Close the event file (the next write starts a new one in the same directory)."""
        if self._file is not None:
            self._file.close()
            self._file = None

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
import numbers
import os
from typing import Any

import numpy as np

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

    def checked(self, step: Any, scalars: Any) -> tuple[int, dict[str, float]]:
        """``(step, {name: float})`` or an error naming the writer and the bad value: ``step`` an
        int in ``[0, 2**63)`` (what TensorBoard's int64 holds), names non-empty strings, values
        real numbers (0-d arrays too)."""
        who = type(self).__name__
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or not 0 <= step < 2**63:
            raise ValueError(f"{who}: step must be an int in [0, 2**63), got {step!r}")
        if not isinstance(scalars, dict):
            raise TypeError(
                f"{who}: the metrics must be a dict {{name: number}}, got {type(scalars).__name__}"
            )
        out = {}
        for name, value in scalars.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"{who}: metric name must be a non-empty str, got {name!r}")
            if hasattr(value, "dtype") and np.ndim(value) == 0 and np.dtype(value.dtype).kind in "biuf":
                value = np.asarray(value).item()  # a 0-d NumPy or device array
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"{who}: metric {name!r} must be a number, got {type(value).__name__} {value!r}"
                )
            out[name] = float(value)
        return int(step), out

    def close(self) -> None:
        """Flush and close the file."""


def _file_path(who: str, path: Any) -> str:
    """``path`` as a str, or an error if it cannot be a file this writer appends to."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"{who}: path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{who}: {path!r} is a directory; give the path of the file to write")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{who}: no such directory {parent!r} for {path!r}; create it first")
    return path


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
        self.path = _file_path("JsonlWriter", path)
        self._handle = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one line."""
        step, scalars = self.checked(step, scalars)
        if self._handle is None:
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        kind = "eval" if scalars and all(key.startswith("eval/") for key in scalars) else "train"
        row = {"step": step, "kind": kind, **scalars}
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
        self.path = _file_path("CsvWriter", path)
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
        step, scalars = self.checked(step, scalars)
        if self._columns is None:
            self._columns = self._read_columns()
        if self._columns is None:
            self._columns = ["step", *scalars]
            header = io.StringIO()
            csv.writer(header, lineterminator="\n").writerow(self._columns)  # quotes a name with a comma
            atomic_write(self.path, header.getvalue())
        new = [key for key in scalars if key not in self._columns]
        if new:
            self._widen([*self._columns, *new])
        if self._handle is None:
            self._handle = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - closed by close()
        row = {"step": step, **{key: repr(value) for key, value in scalars.items()}}
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
        if not isinstance(logdir, str | os.PathLike):
            raise TypeError(
                f"TensorBoardWriter: logdir must be a str or os.PathLike, got {type(logdir).__name__}"
            )
        self.logdir = os.fspath(logdir)
        if os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise NotADirectoryError(
                f"TensorBoardWriter: logdir {self.logdir!r} exists and is not a directory"
            )
        self._file: EventFile | None = None
        #: the event file written last (None before the first write)
        self.path: str | None = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Append one event holding every scalar of ``scalars``."""
        step, scalars = self.checked(step, scalars)
        if self._file is None:
            self._file = EventFile(self.logdir)
            self.path = self._file.path
        self._file.write(step, scalars)

    def close(self) -> None:
        """Close the event file (the next write starts a new one in the same directory)."""
        if self._file is not None:
            self._file.close()
            self._file = None

"""``train.fit``: :func:`~kaun_ir.train.step` (or blocks of ``K`` steps) run over a pipeline,
with reports, early stopping and a progress bar.

:func:`fit` is a thin function over :class:`_FitRun`, which holds one run's state (the training
state, the step count, the last loss and what has been reported) and names its steps: start,
one single step, one block of steps, the pass over the data, and finish.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir.train.state import State, Trainer, check_state
from kaun_ir.train.stepping import block_step, step

__all__ = ["EarlyStop", "fit"]


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` callback to end training; ``fit`` returns the state."""


class _Progress:
    """A one-line progress bar on a terminal (stderr); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.perf_counter()

    def update(self, count: int, loss_value: Callable[[], float], final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.1:
            return
        self.last = now
        rate = count / max(now - self.start, 1e-9)
        if self.total:
            width = 24
            filled = int(width * count / self.total)
            bar = f"[{'#' * filled}{'.' * (width - filled)}] {count}/{self.total}"
        else:
            bar = f"step {count}"
        sys.stderr.write(f"\r{bar}  loss {loss_value():.4f}  {rate:.1f} steps/s")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _checked_batch(trainer: Trainer, item: Any) -> tuple:
    """``item`` when it is what the trainer's form expects: ``(x, *targets)`` or ``(x, loss_fn)``."""
    if trainer.loss is not None:
        if not isinstance(item, tuple) or not item:
            raise TypeError(
                "train.fit: data must yield (x, *targets) tuples (this trainer has loss=), got "
                f"{type(item).__name__}"
            )
        return item
    if not (isinstance(item, tuple) and len(item) == 2 and callable(item[1])):
        raise TypeError(
            "train.fit: data must yield (x, loss_fn) pairs (or make the trainer with "
            "train.make(model, optimizer, loss=fn) and yield (x, *targets) tuples)"
        )
    return item


def _check_count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"train.fit: {name} must be an int >= 1, got {value!r}")
    return value


def _length(data: Iterable) -> int | None:
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None


class _FitRun:
    """One call of :func:`fit`: the state being trained and what the run has done so far."""

    def __init__(
        self, trainer: Trainer, st: State, report: Callable | None, report_every: int, ctx, bar: _Progress
    ):
        self.trainer, self.st, self.ctx, self.bar = trainer, st, ctx, bar
        self.report, self.report_every = report, report_every
        self.count = 0  # steps run by this call
        self.reported = 0  # the last step passed to report
        self.last_loss: Any = None
        self.stopped = False  # report raised EarlyStop

    @classmethod
    def start(
        cls,
        trainer: Trainer,
        st: State,
        data: Iterable,
        report: Callable | None,
        report_every: int,
        ctx: dict | None,
        progress: bool | None,
    ) -> _FitRun:
        """Rewind a ``kn.data`` pipeline (so a call per epoch works) and set up the progress bar."""
        if hasattr(data, "reset"):
            data.reset()
        bar = _Progress(_length(data), sys.stderr.isatty() if progress is None else progress)
        return cls(trainer, st, report, report_every, ctx, bar)

    def _report(self, loss: Any) -> bool:
        """Call ``report`` when step ``count`` is due one; ``False`` when it raised EarlyStop."""
        if self.report is None or self.count % self.report_every:
            return True
        self.reported = self.count
        try:
            self.report(step=self.count, loss=loss, state=self.st)
        except EarlyStop:
            return False
        return True

    def single(self, batch: tuple) -> bool:
        """One step; ``False`` when ``report`` asked to stop."""
        self.last_loss, self.st = step(self.trainer, self.st, batch[0], *batch[1:], ctx=self.ctx)
        self.count += 1
        if not self._report(self.last_loss):
            return False
        self.bar.update(self.count, lambda: float(self.last_loss))
        return True

    def block(self, batches: list) -> bool:
        """``len(batches)`` steps in one executable (single steps when the batches cannot share
        one); every step of the block runs even when ``report`` asks to stop part-way."""
        result = block_step(self.trainer, self.st, batches, self.ctx)
        if result is None:
            return all(self.single(batch) for batch in batches)
        losses, self.st = result
        host = np.asarray(losses)
        self.last_loss, start = host[-1], self.count
        for value in host:
            self.count += 1
            if not self._report(value):
                self.count = start + len(host)
                return False
        self.bar.update(self.count, lambda: float(self.last_loss))
        return True

    def epoch(self, data: Iterable, steps_per_call: int) -> None:
        """One pass over ``data``: single steps, or blocks of ``steps_per_call`` batches with the
        final partial block run as single steps."""
        pending: list = []
        for item in data:
            item = _checked_batch(self.trainer, item)
            if steps_per_call == 1:
                if not self.single(item):
                    self.stopped = True
                    return
                continue
            pending.append(item)
            if len(pending) == steps_per_call:
                batches, pending = pending, []
                if not self.block(batches):
                    self.stopped = True
                    return
        for item in pending:
            if not self.single(item):
                self.stopped = True
                return

    def finish(self) -> State:
        """Report the last step unless it was reported already, close the progress bar, and
        return the final state."""
        if self.report is not None and not self.stopped and self.count and self.reported != self.count:
            try:
                self.report(step=self.count, loss=self.last_loss, state=self.st)
            except EarlyStop:
                pass
        if self.count:
            self.bar.update(self.count, lambda: float(self.last_loss), final=True)
        return self.st


def fit(
    trainer: Trainer,
    st: State,
    data: Iterable,
    report: Callable | None = None,
    ctx: dict | None = None,
    progress: bool | None = None,
    steps_per_call: int = 1,
    report_every: int = 1,
) -> State:
    """Run :func:`step` over ``data`` and return the final state. ``data`` is an iterable (e.g. a
    ``kn.data`` pipeline) of ``(x, *targets)`` tuples for a trainer made with ``loss=``, or of
    ``(x, loss_fn)`` pairs in the closure form.

    A ``kn.data`` pipeline is ``reset()`` first, so calling ``fit`` once per epoch works.
    ``report(step=, loss=, state=)`` is called after every ``report_every``-th step and after
    the last one (1-based ``step`` counts the steps of this call). ``loss`` is the step's loss
    as a 0-d device array: nothing waits for the device until the report reads it
    (``float(loss)``, formatting, a comparison), so a report that logs every 100th step does
    not stall the other 99. Raising :class:`EarlyStop` inside it ends training and returns the
    state at that point. A progress bar with the running loss is shown when stderr is a terminal
    (``progress=`` forces it on or off; it reads the loss at most ten times a second).

    ``steps_per_call=K > 1`` fuses training: ``K`` consecutive batches with the same shapes (and
    in the closure form the same loss code) are stacked and ``K`` steps run inside ONE
    executable (:func:`steps`), giving the same result as ``K`` single steps. ``report`` is then
    called for each of the ``K`` steps afterwards, in order, with that step's loss and the
    state *after the whole block*; :class:`EarlyStop` is honoured at block granularity: the
    steps of the block already ran and stay applied (no roll-back), and the remaining reports
    of the block are skipped. A final partial block (fewer than ``K`` batches left), or a
    block whose batches differ, runs as single steps. (A block's losses arrive on the host
    together, as NumPy scalars.)
    """
    check_state(st, "fit")
    steps_per_call = _check_count(steps_per_call, "steps_per_call")
    report_every = _check_count(report_every, "report_every")
    run = _FitRun.start(trainer, st, data, report, report_every, ctx, progress)
    run.epoch(data, steps_per_call)
    return run.finish()

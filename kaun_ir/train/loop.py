"""``train.fit``: :func:`~kaun_ir.train.step` (or blocks of ``K`` steps) run over a pipeline,
with reports, callbacks and metric logs, evaluation, checkpoints and resuming, a profiled range
of steps, early stopping and a progress bar.

:func:`fit` is a thin function over :class:`_FitRun`, which holds one run's state (the training
state, the step count, the last loss and what has been reported) and names its steps: start,
one single step, one block of steps, the pass over the data, and finish.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kaun_ir.train import checkpointing
from kaun_ir.train.evaluation import evaluate
from kaun_ir.train.fit_options import FitOptions
from kaun_ir.train.io import load
from kaun_ir.train.progress import Progress, batch_sizes, learning_rate, length
from kaun_ir.train.state import State, Trainer, check_state
from kaun_ir.train.stepping import block_step, step

__all__ = ["EarlyStop", "fit"]


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` (or a callback's ``on_log``) to end training; ``fit``
    returns the state."""


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


class _FitRun:
    """One call of :func:`fit`: the state being trained and what the run has done so far."""

    def __init__(self, trainer: Trainer, st: State, options: FitOptions, bar: Progress):
        self.trainer, self.st, self.bar, self.o = trainer, st, bar, options
        self.ctx = options.ctx
        self.count = 0  # steps run by this call
        self.reported = 0  # the last step passed to report
        self.logged = 0  # the last step passed to the callbacks
        self.last_loss: Any = None
        self.stopped = False  # report or a callback raised EarlyStop
        self.epoch = 0  # passes over the data finished (counting those of a resumed run)
        self.saved_step: int | None = None
        self.checkpointer = (
            checkpointing.Checkpointer(options.checkpoint_dir, options.keep_last)
            if options.checkpoint_dir
            else None
        )
        self.last_eval: dict[str, float] = {}
        self.profiler = None
        if options.profile_steps is not None:
            # loads the profiler only when asked
            from kaun_ir.train.profiling import StepProfiler  # noqa: PLC0415

            self.profiler = StepProfiler(options.profile_steps, options.profile_dir)
        self.resumed = False  # the pipeline was placed by a checkpoint: do not reset it first
        self.pass_index: int | None = None  # batches of this pass run (data without position())
        self._just_ran = 0  # steps run by the last single step or block
        # throughput since the last log
        self.mark_time = time.perf_counter()
        self.mark_count = 0
        self.examples = 0
        self.tokens: int | None = 0
        self.all_tokens: int | None = 0  # tokens since the start (for the progress bar)

    @classmethod
    def start(cls, trainer: Trainer, st: State, data: Iterable, options: FitOptions) -> tuple[_FitRun, int]:
        """Set up the run: resume from a checkpoint when asked (the state, the finished passes and
        the data's position), and the progress bar. Returns the run and the number of leading
        elements of the first pass to skip (for data that is not a ``kn.data`` pipeline)."""
        passes = length(data)
        total = None if passes is None else passes * options.epochs
        bar = Progress(total, sys.stderr.isatty() if options.progress is None else options.progress)
        path = checkpointing.resolve(options.resume, options.checkpoint_dir)
        skip = 0
        epoch = 0
        resumed = False
        if path is not None:
            st = load(path, trainer, like=st)
            position, epoch = checkpointing.read_resume_info(path)
            if position is not None:
                if hasattr(data, "seek"):
                    data.seek(position)
                else:
                    skip = int(position["index"])
                resumed = True
        run = cls(trainer, st, options, bar)
        run.epoch = epoch
        run.saved_step = st.step if path is not None else None
        run.resumed = resumed
        return run, skip

    # -- what happens after steps ---------------------------------------------------------------

    def _report(self, loss: Any) -> bool:
        """Call ``report`` when step ``count`` is due one; ``False`` when it raised EarlyStop."""
        if self.report_due():
            self.reported = self.count
            try:
                if self.o.report is not None:
                    self.o.report(step=self.count, loss=loss, state=self.st)
                if self.o.callbacks:
                    self._log(loss, self.st.step)
            except EarlyStop:
                return False
        return True

    def report_due(self) -> bool:
        return bool(self.o.report is not None or self.o.callbacks) and self.count % self.o.report_every == 0

    def _log(self, loss: Any, global_step: int) -> None:
        """Call every callback's ``on_log`` with the loss, learning rate and throughput."""
        logs = {"loss": float(loss)}  # reading the loss waits for the device: time after it
        now = time.perf_counter()
        lr = learning_rate(self.trainer.optimizer, global_step)
        if lr is not None:
            logs["lr"] = lr
        elapsed, steps = now - self.mark_time, self.count - self.mark_count
        if steps > 0 and elapsed > 0:
            logs["steps_per_s"] = steps / elapsed
            logs["examples_per_s"] = self.examples / elapsed
            if self.tokens:
                logs["tokens_per_s"] = self.tokens / elapsed
        logs["epoch"] = float(self.epoch)
        self.mark_time, self.mark_count, self.examples = now, self.count, 0
        self.tokens = 0 if self.tokens is not None else None
        self.logged = self.count
        for callback in self.o.callbacks:
            callback.on_log(global_step, logs, self.st)

    def _count_batch(self, batch: tuple) -> None:
        examples, tokens = batch_sizes(batch[0])
        self.examples += examples
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        self.all_tokens = None if tokens is None or self.all_tokens is None else self.all_tokens + tokens

    def _after_steps(self, data: Iterable) -> bool:
        """Checkpoint, evaluate and profile after the steps that just ran; ``False`` to stop."""
        step_now = self.st.step
        if self.profiler is not None:
            self.profiler.after(step_now, self.st)
        every = self.o.checkpoint_every
        if (
            self.checkpointer is not None
            and every
            and step_now // every > (step_now - self._just_ran) // every
        ):
            self._save(data)
        if self.o.eval_data is not None and self.o.eval_every and self.count % self.o.eval_every == 0:
            return self._evaluate()
        return True

    def _save(self, data: Iterable) -> None:
        position = data.position() if hasattr(data, "position") else None
        if position is None and self.pass_index is not None:
            position = {"pass": 0, "index": self.pass_index}
        self.checkpointer.save(self.st, position, self.epoch)
        self.saved_step = self.st.step

    def _evaluate(self) -> bool:
        began = time.perf_counter()
        results = evaluate(self.trainer, self.st, self.o.eval_data, self.o.eval_metrics, ctx=self.ctx)
        self.mark_time += time.perf_counter() - began  # evaluation time is not training throughput
        self.last_eval = {f"eval/{name}": value for name, value in results.items()}
        try:
            for callback in self.o.callbacks:
                callback.on_log(self.st.step, dict(self.last_eval), self.st)
        except EarlyStop:
            return False
        return True

    def _bar_text(self) -> str:
        """What the progress bar shows after the loss and steps/s: learning rate, tokens/s (since
        the start, for token inputs) and the last evaluation."""
        parts = []
        lr = learning_rate(self.trainer.optimizer, max(self.st.step, 1))
        if lr is not None:
            parts.append(f"  lr {lr:.3g}")
        if self.all_tokens:
            elapsed = max(time.perf_counter() - self.bar.start, 1e-9)
            parts.append(f"  {self.all_tokens / elapsed:.0f} tokens/s")
        for name, value in self.last_eval.items():
            parts.append(f"  {name} {value:.4f}")
        return "".join(parts)

    # -- steps ----------------------------------------------------------------------------------

    def single(self, batch: tuple, data: Iterable) -> bool:
        """One step; ``False`` when ``report`` or a callback asked to stop."""
        if self.profiler is not None:
            self.profiler.before(self.st.step + 1)
        self._count_batch(batch)
        self.last_loss, self.st = step(self.trainer, self.st, batch[0], *batch[1:], ctx=self.ctx)
        self.count += 1
        self.pass_index = (self.pass_index or 0) + 1
        self._just_ran = 1
        if not self._report(self.last_loss):
            return False
        if not self._after_steps(data):
            return False
        self.bar.update(self.count, lambda: float(self.last_loss), extra=self._bar_text)
        return True

    def block(self, batches: list, data: Iterable) -> bool:
        """``len(batches)`` steps in one executable (single steps when the batches cannot share
        one); every step of the block runs even when ``report`` asks to stop part-way."""
        if self.profiler is not None:
            self.profiler.before(self.st.step + 1)
        result = block_step(self.trainer, self.st, batches, self.ctx)
        if result is None:
            return all(self.single(batch, data) for batch in batches)
        for batch in batches:
            self._count_batch(batch)
        losses, self.st = result
        host = np.asarray(losses)
        self.last_loss, start = host[-1], self.count
        first_step = self.st.step - len(host)
        self.pass_index = (self.pass_index or 0) + len(host)
        self._just_ran = len(host)
        for i, value in enumerate(host):
            self.count += 1
            if self.report_due():
                self.reported = self.count
                try:
                    if self.o.report is not None:
                        self.o.report(step=self.count, loss=value, state=self.st)
                    if self.o.callbacks:
                        self._log(value, first_step + i + 1)
                except EarlyStop:
                    self.count = start + len(host)
                    self._after_steps(data)
                    return False
        if not self._after_steps(data):
            return False
        self.bar.update(self.count, lambda: float(self.last_loss), extra=self._bar_text)
        return True

    def epoch_pass(self, data: Iterable, steps_per_call: int, skip: int) -> None:
        """One pass over ``data``: single steps, or blocks of ``steps_per_call`` batches with the
        final partial block run as single steps. ``skip``: leading elements to drop (resuming
        an iterable that is not a ``kn.data`` pipeline)."""
        pending: list = []
        self.pass_index = skip if not hasattr(data, "position") else None
        for item in data:
            if skip:
                skip -= 1
                continue
            item = _checked_batch(self.trainer, item)
            if steps_per_call == 1:
                if not self.single(item, data):
                    self.stopped = True
                    return
                continue
            pending.append(item)
            if len(pending) == steps_per_call:
                batches, pending = pending, []
                if not self.block(batches, data):
                    self.stopped = True
                    return
        for item in pending:
            if not self.single(item, data):
                self.stopped = True
                return

    def run(self, data: Iterable, skip: int) -> None:
        """The passes over ``data`` up to ``epochs`` (a resumed run continues its pass)."""
        while self.epoch < self.o.epochs and not self.stopped:
            if not self.resumed and hasattr(data, "reset"):
                data.reset()
            self.resumed = False
            self.epoch_pass(data, self.o.steps_per_call, skip)
            skip = 0
            if self.stopped:
                return
            self.epoch += 1
            if self.o.eval_data is not None and not self.o.eval_every and not self._evaluate():
                self.stopped = True

    def finish(self, data: Iterable) -> State:
        """Report the last step unless it was reported already, write the last checkpoint, close
        the progress bar, and return the final state."""
        due = self.o.report is not None or self.o.callbacks
        if due and not self.stopped and self.count and self.reported != self.count:
            try:
                if self.o.report is not None:
                    self.o.report(step=self.count, loss=self.last_loss, state=self.st)
                if self.o.callbacks and self.logged != self.count:
                    self._log(self.last_loss, self.st.step)
            except EarlyStop:
                pass
        if self.checkpointer is not None and self.count and self.saved_step != self.st.step:
            self._save(data)
        if self.count:
            self.bar.update(self.count, lambda: float(self.last_loss), final=True, extra=self._bar_text)
        return self.st

    def close(self, failed: bool) -> None:
        """Wait for the checkpoint in flight, stop a profile and tell the callbacks the run ended
        (also when it failed). After a failure, an error of these (a checkpoint write that failed
        too) is a warning: the exception on its way out is the one the user sees."""
        if not failed:
            self._close(failed)
            return
        try:
            self._close(failed)
        except Exception as err:  # noqa: BLE001 - the run's own exception is already propagating
            warnings.warn(f"train.fit: while ending a failed run: {type(err).__name__}: {err}", stacklevel=3)

    def _close(self, failed: bool) -> None:
        try:
            if self.checkpointer is not None:
                self.checkpointer.wait()
        finally:
            if self.profiler is not None:
                self.profiler.close(self.st if not failed else None)
            for callback in self.o.callbacks:
                callback.on_fit_end(self.st.step, self.st)


def fit(
    trainer: Trainer,
    st: State,
    data: Iterable,
    report: Callable | None = None,
    ctx: dict | None = None,
    options: FitOptions | None = None,
    **keywords: Any,
) -> State:
    """Run :func:`step` over ``data`` and return the final state. ``data`` is an iterable (e.g. a
    ``kn.data`` pipeline) of ``(x, *targets)`` tuples for a trainer made with ``loss=``, or of
    ``(x, loss_fn)`` pairs in the closure form.

    What else the run does is one :class:`~kaun_ir.train.FitOptions` record: ``options=``, or
    its fields as keyword arguments (``epochs=3``, ``callbacks=[...]``, ``checkpoint_dir=``,
    ``resume=True``, ``profile_steps=(a, b)`` ...), laid over ``options`` when both are given;
    ``report`` and ``ctx`` are its first two fields, also accepted in position. Everything is
    checked before the first step.

    A ``kn.data`` pipeline is ``reset()`` before each pass, so calling ``fit`` once per epoch
    works. ``report(step=, loss=, state=)`` gets the step's loss as a 0-d device array: nothing
    waits for the device until the report reads it. Raising :class:`EarlyStop` inside it (or in
    a callback's ``on_log``) ends training and returns the state at that point. Callbacks get
    ``on_log(state.step, logs, state)`` with ``loss``, ``lr`` (schedules evaluated),
    ``steps_per_s``, ``examples_per_s``, ``tokens_per_s`` (when ``x`` holds integer token ids
    ``[batch, time]``), ``epoch`` and the ``eval/<name>`` results, as Python floats.

    Checkpoints are written from a background thread after a copy to host memory, with the data
    pipeline's position, and ``fit`` waits for the last one before returning; a resumed run (a
    ``kn.data`` pipeline built the same way, with the same ``seed``) is the same as one that
    never stopped, and ``st`` then only gives the structure, dtypes and layout. With
    ``steps_per_call=K > 1`` the ``K`` reports of a block come after the block, each with its
    own loss and the state after the whole block; :class:`EarlyStop` is honoured at block
    granularity (the block's steps stay applied). A final partial block, or a block whose
    batches differ, runs as single steps.
    """
    check_state(st, "fit")
    if report is not None:
        keywords["report"] = report
    if ctx is not None:
        keywords["ctx"] = ctx
    options = FitOptions.of(options, keywords)
    options.check_data(data)
    run, skip = _FitRun.start(trainer, st, data, options)
    for callback in options.callbacks:
        callback.on_fit_start(trainer, run.st)
    failed = True
    try:
        run.run(data, skip)
        result = run.finish(data)
        failed = False
    finally:
        run.close(failed)
    return result

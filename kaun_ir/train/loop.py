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
from dataclasses import dataclass
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.train import checkpointing
from kaun_ir.train.callbacks import Callback
from kaun_ir.train.evaluation import evaluate
from kaun_ir.train.io import load
from kaun_ir.train.state import State, Trainer, check_state
from kaun_ir.train.stepping import block_step, step

__all__ = ["EarlyStop", "fit"]


class EarlyStop(Exception):
    """Raise inside ``fit``'s ``report`` (or a callback's ``on_log``) to end training; ``fit``
    returns the state."""


class _Progress:
    """A one-line progress bar on a terminal (stderr); silent otherwise."""

    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled
        self.start = self.last = time.perf_counter()

    def update(
        self,
        count: int,
        loss_value: Callable[[], float],
        final: bool = False,
        extra: Callable[[], str] | None = None,
    ) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.1:
            return
        self.last = now
        sys.stderr.write(
            f"\r{progress_line(count, self.total, loss_value(), count / max(now - self.start, 1e-9))}"
        )
        if extra is not None:
            sys.stderr.write(extra())
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def progress_line(count: int, total: int | None, loss: float, steps_per_s: float) -> str:
    """The progress bar's text: ``[####....] 12/40  loss 0.5213  31.2 steps/s``."""
    if total:
        width = 24
        filled = min(width, int(width * count / total))
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {count}/{total}"
    else:
        bar = f"step {count}"
    return f"{bar}  loss {loss:.4f}  {steps_per_s:.1f} steps/s"


def learning_rate(optimizer: Any, t: int) -> float | None:
    """The learning rate ``optimizer`` uses at the 1-based step ``t`` (its ``lr`` hyper-parameter,
    a schedule evaluated at ``t``; searched through chains), or None when it has none."""
    hyper = getattr(optimizer, "hyperparams", None) or {}
    for key in ("lr", "learning_rate"):
        if key in hyper:
            lr = hyper[key]
            return float(np.asarray(lr(np.int32(t)) if callable(lr) else lr))
    for value in hyper.values():
        for inner in value if isinstance(value, (list, tuple)) else [value]:
            if hasattr(inner, "hyperparams"):
                found = learning_rate(inner, t)
                if found is not None:
                    return found
    return None


def _sizes(x: Any) -> tuple[int, int | None]:
    """Examples and tokens in a batch's inputs: the first axis of the first array, and the
    element count of integer inputs of rank >= 2 (token ids ``[batch, time]``), else None."""
    leaves = [leaf for leaf in tree.flatten(x)[0] if hasattr(leaf, "shape") and len(leaf.shape)]
    if not leaves:
        return 0, None
    first = leaves[0]
    examples = int(first.shape[0])
    dtype = np.dtype(getattr(first, "dtype", np.float32))
    tokens = int(np.prod(first.shape)) if dtype.kind in "iu" and len(first.shape) >= 2 else None
    return examples, tokens


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


@dataclass(frozen=True)
class _Options:
    """What one ``fit`` call was asked to do besides stepping (see :func:`fit`)."""

    report: Any
    ctx: Any
    progress: Any
    steps_per_call: Any
    report_every: Any
    epochs: Any
    callbacks: Any
    eval_data: Any
    eval_metrics: Any
    eval_every: Any
    checkpoint_dir: Any
    checkpoint_every: Any
    keep_last: Any
    resume: Any
    profiler: Any


class _FitRun:
    """One call of :func:`fit`: the state being trained and what the run has done so far."""

    def __init__(self, trainer: Trainer, st: State, options: _Options, bar: _Progress):
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
    def start(cls, trainer: Trainer, st: State, data: Iterable, options: _Options) -> tuple[_FitRun, int]:
        """Set up the run: resume from a checkpoint when asked (the state, the finished passes and
        the data's position), and the progress bar. Returns the run and the number of leading
        elements of the first pass to skip (for data that is not a ``kn.data`` pipeline)."""
        length = _length(data)
        total = None if length is None else length * options.epochs
        bar = _Progress(total, sys.stderr.isatty() if options.progress is None else options.progress)
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
        examples, tokens = _sizes(batch[0])
        self.examples += examples
        self.tokens = None if tokens is None or self.tokens is None else self.tokens + tokens
        self.all_tokens = None if tokens is None or self.all_tokens is None else self.all_tokens + tokens

    def _after_steps(self, data: Iterable) -> bool:
        """Checkpoint, evaluate and profile after the steps that just ran; ``False`` to stop."""
        step_now = self.st.step
        if self.o.profiler is not None:
            self.o.profiler.after(step_now, self.st)
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
        if self.o.profiler is not None:
            self.o.profiler.before(self.st.step + 1)
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
        if self.o.profiler is not None:
            self.o.profiler.before(self.st.step + 1)
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
            if self.o.profiler is not None:
                self.o.profiler.close(self.st if not failed else None)
            for callback in self.o.callbacks:
                callback.on_fit_end(self.st.step, self.st)


def _check_callbacks(callbacks: Any) -> list:
    callbacks = list(callbacks or ())
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TypeError(
                f"train.fit: callbacks must be train.Callback objects (e.g. train.JsonlWriter(path)), "
                f"got {type(callback).__name__}"
            )
    return callbacks


def fit(
    trainer: Trainer,
    st: State,
    data: Iterable,
    report: Callable | None = None,
    ctx: dict | None = None,
    progress: bool | None = None,
    steps_per_call: int = 1,
    report_every: int = 1,
    *,
    epochs: int = 1,
    callbacks: Iterable[Callback] = (),
    eval_data: Iterable | None = None,
    eval_metrics: dict[str, Callable] | None = None,
    eval_every: int | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    keep_last: int | None = None,
    resume: bool | str = False,
    profile_steps: tuple[int, int] | None = None,
    profile_dir: str | None = None,
) -> State:
    """Run :func:`step` over ``data`` and return the final state. ``data`` is an iterable (e.g. a
    ``kn.data`` pipeline) of ``(x, *targets)`` tuples for a trainer made with ``loss=``, or of
    ``(x, loss_fn)`` pairs in the closure form.

    A ``kn.data`` pipeline is ``reset()`` before each pass, so calling ``fit`` once per epoch
    works; ``epochs=E`` makes ``E`` passes in one call.
    ``report(step=, loss=, state=)`` is called after every ``report_every``-th step and after
    the last one (1-based ``step`` counts the steps of this call). ``loss`` is the step's loss
    as a 0-d device array: nothing waits for the device until the report reads it
    (``float(loss)``, formatting, a comparison), so a report that logs every 100th step does
    not stall the other 99. Raising :class:`EarlyStop` inside it ends training and returns the
    state at that point. A progress bar with the running loss, learning rate, throughput and
    last evaluation is shown when stderr is a terminal (``progress=`` forces it on or off; it
    reads the loss at most ten times a second).

    ``callbacks``: :class:`~kaun_ir.train.Callback` objects, e.g. the metric writers
    :class:`~kaun_ir.train.JsonlWriter`, :class:`~kaun_ir.train.CsvWriter` and
    :class:`~kaun_ir.train.TensorBoardWriter`. On the steps ``report`` is due they get
    ``on_log(state.step, logs, state)`` with ``loss``, ``lr`` (the optimiser's learning rate
    at that step, schedules evaluated), ``steps_per_s``, ``examples_per_s``, ``tokens_per_s``
    (when ``x`` holds integer token ids ``[batch, time]``) and ``epoch``, as Python floats
    (logging reads the loss, so it waits for the device on those steps).

    ``eval_data``: run :func:`~kaun_ir.train.evaluate` (the trainer's loss and
    ``eval_metrics``) at the end of every pass, or every ``eval_every`` steps; the results go
    to the callbacks as ``eval/<name>`` (and show on the progress bar). ``eval_data`` is read
    from its start each time, so with ``eval_every`` it must not be the ``data`` pipeline object
    itself (``ValueError``).

    ``checkpoint_dir`` with ``checkpoint_every=N``: save the state every ``N`` global steps (and
    after the last step) as ``checkpoint_dir/step_XXXXXXXX.safetensors``, with the data
    pipeline's position, keeping the newest ``keep_last`` files (all when None). Files are
    written from a background thread after a copy to host memory; ``fit`` waits for the last
    one before returning. ``resume=True`` continues from the newest checkpoint in
    ``checkpoint_dir`` (a fresh start when there is none; ``resume=PATH`` names a file or
    directory): the state, the passes finished, and the pipeline's position (a ``kn.data``
    pipeline built the same way, with the same ``seed``, yields the batch that would have come
    next), so the resumed run is the same as one that never stopped; ``st`` then only gives the
    structure, dtypes and layout.

    ``profile_steps=(a, b)`` records a profile of global steps ``a`` to ``b`` (inclusive) into
    ``profile_dir`` (see :func:`kaun_ir.profile`) and prints the per-layer time table.

    ``steps_per_call=K > 1`` fuses training: ``K`` consecutive batches with the same shapes (and
    in the closure form the same loss code) are stacked and ``K`` steps run inside ONE
    executable (:func:`steps`), giving the same result as ``K`` single steps. ``report`` is then
    called for each of the ``K`` steps afterwards, in order, with that step's loss and the
    state *after the whole block*; :class:`EarlyStop` is honoured at block granularity: the
    steps of the block already ran and stay applied (no roll-back), and the remaining reports
    of the block are skipped. A final partial block (fewer than ``K`` batches left), or a
    block whose batches differ, runs as single steps. (A block's losses arrive on the host
    together, as NumPy scalars.) Checkpoints, evaluations and profile boundaries fall on block
    boundaries.
    """
    check_state(st, "fit")
    steps_per_call = _check_count(steps_per_call, "steps_per_call")
    report_every = _check_count(report_every, "report_every")
    epochs = _check_count(epochs, "epochs")
    for name, value in (
        ("eval_every", eval_every),
        ("checkpoint_every", checkpoint_every),
        ("keep_last", keep_last),
    ):
        if value is not None:
            _check_count(value, name)
    if eval_data is not None and eval_data is data and eval_every is not None:
        raise ValueError("train.fit: eval_data is the training pipeline; evaluating mid-pass would rewind it")
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ValueError(
            "train.fit: checkpoint_every= needs checkpoint_dir= (where to write the checkpoints)"
        )
    profiler = None
    if profile_steps is not None:
        from kaun_ir.train.profiling import StepProfiler  # noqa: PLC0415 - loads the profiler only when asked

        profiler = StepProfiler(profile_steps, profile_dir)
    options = _Options(
        report=report,
        ctx=ctx,
        progress=progress,
        steps_per_call=steps_per_call,
        report_every=report_every,
        epochs=epochs,
        callbacks=_check_callbacks(callbacks),
        eval_data=eval_data,
        eval_metrics=eval_metrics,
        eval_every=eval_every,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_last=keep_last,
        resume=resume,
        profiler=profiler,
    )
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

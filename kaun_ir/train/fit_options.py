"""What one :func:`~kaun_ir.train.fit` call is asked to do besides stepping: one record,
checked once at the door.

``train.fit(trainer, st, data, options=train.FitOptions(epochs=3, report_every=100))`` and
``train.fit(trainer, st, data, epochs=3, report_every=100)`` are the same call: keyword arguments
of ``fit`` are the fields of this record.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kaun_ir.train.callbacks import Callback

__all__ = ["FitOptions"]


def _count(value: Any, name: str, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"train.fit: {name} must be an int >= 1, got {value!r}")


def _path_or_none(value: Any, name: str) -> None:
    if value is not None and not isinstance(value, str | os.PathLike):
        raise TypeError(f"train.fit: {name} must be a directory path (str or os.PathLike), got {value!r}")


def _eval_options(options: FitOptions) -> None:
    metrics = options.eval_metrics
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise TypeError(
                "train.fit: eval_metrics must be a dict {name: fn(outputs, *targets)}, got "
                + type(metrics).__name__
            )
        for name, fn in metrics.items():
            if not isinstance(name, str) or not callable(fn):
                raise TypeError(
                    f"train.fit: eval_metrics[{name!r}] must be a function, got {type(fn).__name__}"
                )
    if options.eval_data is not None and not isinstance(options.eval_data, Iterable):
        raise TypeError(
            f"train.fit: eval_data must be an iterable of batches, got {type(options.eval_data).__name__}"
        )
    if options.eval_data is None and (options.eval_every is not None or metrics):
        raise ValueError("train.fit: eval_every= / eval_metrics= need eval_data= (the data to evaluate on)")


def _profile_range(steps: Any) -> None:
    """``(first, last)``: two integers with ``1 <= first <= last`` (1.5 is not a step)."""
    if steps is None:
        return
    try:
        first, last = steps
    except (TypeError, ValueError):
        raise ValueError(f"train.fit: profile_steps must be a pair (first, last), got {steps!r}") from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in (first, last)):
        raise ValueError(f"train.fit: profile_steps must be two integer steps, got {steps!r}")
    if not 1 <= first <= last:
        raise ValueError(f"train.fit: profile_steps needs 1 <= first <= last, got {steps!r}")


@dataclass(frozen=True)
class FitOptions:
    """The options of one :func:`~kaun_ir.train.fit` call (every field has a default).

    Invalid values raise ``ValueError`` / ``TypeError`` naming the option when the record is
    made, before any step runs.
    """

    #: ``report(step=, loss=, state=)`` after every ``report_every``-th step and after the last
    #: one (``step`` is 1-based and counts the steps of this call; ``loss`` a 0-d device array,
    #: read only if the report reads it). Raising ``train.EarlyStop`` in it ends training.
    report: Callable | None = None
    #: passed to the model's ``apply`` as ``ctx`` on every step
    ctx: dict | None = None
    #: the progress bar on stderr: None shows it when stderr is a terminal, True / False force it
    progress: bool | None = None
    #: ``K > 1`` runs ``K`` consecutive same-shaped batches as one executable (``train.steps``);
    #: reports, checkpoints, evaluations and profile boundaries then fall on block boundaries
    steps_per_call: int = 1
    #: call ``report`` (and log to the callbacks) every this many steps
    report_every: int = 1
    #: passes over ``data`` (a ``kn.data`` pipeline is ``reset()`` before each)
    epochs: int = 1
    #: ``train.Callback`` objects (``JsonlWriter``, ``CsvWriter``, ``TensorBoardWriter`` ...)
    callbacks: Iterable[Callback] = ()
    #: evaluated with ``train.evaluate`` at the end of every pass, or every ``eval_every`` steps
    eval_data: Iterable | None = None
    #: extra metrics for the evaluation: ``{name: fn(outputs, *targets)}``
    eval_metrics: dict[str, Callable] | None = None
    #: evaluate every this many steps instead of once per pass
    eval_every: int | None = None
    #: where checkpoints go (``step_XXXXXXXX.safetensors``)
    checkpoint_dir: str | None = None
    #: save every this many global steps and after the last one (needs ``checkpoint_dir``)
    checkpoint_every: int | None = None
    #: keep the newest this many checkpoint files (all when None)
    keep_last: int | None = None
    #: True: continue from the newest checkpoint in ``checkpoint_dir``; a path: from that file
    #: or directory; False: start afresh
    resume: bool | str = False
    #: ``(first, last)``: profile global steps ``first`` to ``last`` (inclusive) into
    #: ``profile_dir`` and print the per-layer time table
    profile_steps: tuple[int, int] | None = None
    #: where the profile of ``profile_steps`` is written
    profile_dir: str | None = None

    def __post_init__(self):
        for name in ("steps_per_call", "report_every", "epochs"):
            _count(getattr(self, name), name)
        for name in ("eval_every", "checkpoint_every", "keep_last"):
            _count(getattr(self, name), name, optional=True)
        if self.report is not None and not callable(self.report):
            raise TypeError(f"train.fit: report must be callable, got {type(self.report).__name__}")
        if self.checkpoint_every is not None and self.checkpoint_dir is None:
            raise ValueError(
                "train.fit: checkpoint_every= needs checkpoint_dir= (where to write the checkpoints)"
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise TypeError(f"train.fit: progress must be None, True or False, got {self.progress!r}")
        _path_or_none(self.checkpoint_dir, "checkpoint_dir")
        _path_or_none(self.profile_dir, "profile_dir")
        if not isinstance(self.resume, bool | str | os.PathLike):
            raise TypeError(
                f"train.fit: resume must be True, False or a checkpoint path, got {self.resume!r}"
            )
        _eval_options(self)
        _profile_range(self.profile_steps)
        if self.profile_steps is not None and self.profile_dir is None:
            raise ValueError("train.fit: profile_steps= needs profile_dir= (where to write the trace)")
        object.__setattr__(self, "callbacks", _checked_callbacks(self.callbacks))

    @classmethod
    def of(cls, options: FitOptions | None, keywords: dict[str, Any]) -> FitOptions:
        """``options`` with ``keywords`` (``fit``'s keyword arguments) laid over it."""
        if options is not None and not isinstance(options, FitOptions):
            raise TypeError(
                f"train.fit: options must be a train.FitOptions, got {type(options).__name__} (the "
                "other settings are keyword arguments: fit(trainer, st, data, epochs=3, ...))"
            )
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise TypeError(
                f"train.fit got unexpected keyword argument(s) {', '.join(unknown)}; the options are "
                + ", ".join(sorted(known))
            )
        return dataclasses.replace(options, **keywords) if options is not None else cls(**keywords)

    def check_data(self, data: Iterable) -> None:
        """The checks that need the training data itself."""
        if not isinstance(data, Iterable):
            raise TypeError(
                f"train.fit: data must be an iterable of batches (a kn.data pipeline, a list of "
                f"(x, y) tuples ...), got {type(data).__name__}"
            )
        if self.eval_data is not None and self.eval_data is data and self.eval_every is not None:
            raise ValueError(
                "train.fit: eval_data is the training pipeline; evaluating mid-pass would rewind it"
            )


def _checked_callbacks(callbacks: Any) -> tuple:
    try:
        callbacks = tuple(callbacks or ())
    except TypeError:
        raise TypeError(
            f"train.fit: callbacks must be a list of train.Callback objects, got {type(callbacks).__name__}"
        ) from None
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TypeError(
                f"train.fit: callbacks must be train.Callback objects (e.g. train.JsonlWriter(path)), "
                f"got {type(callback).__name__}"
            )
    return callbacks

"""``train.fit(..., profile_steps=(a, b))``: a :func:`kaun_ir.profile` of global steps ``a`` to
``b``, started before step ``a`` (once the earlier steps have finished on the device) and stopped
once step ``b`` has finished there; its table gives figures per step over the steps it held."""

from __future__ import annotations

import os
from typing import Any

from kaun_ir.runtime.profiling import Profile, profile

__all__ = ["StepProfiler"]


class StepProfiler:
    """Starts and stops one profile around a range of steps."""

    def __init__(self, steps: Any, logdir: str | os.PathLike | None):
        try:
            first, last = (int(s) for s in steps)
        except (TypeError, ValueError):
            raise ValueError(
                f"train.fit: profile_steps must be a pair (first, last), got {steps!r}"
            ) from None
        if not 1 <= first <= last:
            raise ValueError(f"train.fit: profile_steps needs 1 <= first <= last, got {steps!r}")
        if logdir is None:
            raise ValueError("train.fit: profile_steps= needs profile_dir= (where to write the trace)")
        self.first, self.last, self.logdir = first, last, os.fspath(logdir)
        self._context = None
        self._started = 0  # the first step inside the profile
        #: the recorded :class:`~kaun_ir.runtime.profiling.Profile` once the range has run
        self.result: Profile | None = None

    def before(self, step: int) -> None:
        """Called before the step numbered ``step`` runs (the state's step + 1)."""
        if self._context is None and self.result is None and self.first <= step <= self.last:
            self._context = profile(self.logdir)
            self.result = self._context.__enter__()
            self._started = step

    def after(self, step: int, st: Any) -> None:
        """Called once the steps up to ``step`` were dispatched."""
        if self._context is not None and step >= self.last:
            self.close(st)

    def close(self, st: Any) -> None:
        """Stop the profile once the device has finished; ``st`` (the state after the last step
        run, None when the run failed) says how many steps it held."""
        if self._context is None:
            return
        if st is not None and self.result is not None:
            last = max(int(st.step), self._started)
            self.result.steps = last - self._started + 1
            self.result.span = f"step {last}" if last == self._started else f"steps {self._started}-{last}"
        context, self._context = self._context, None
        context.__exit__(None, None, None)

"""``train.fit(..., profile_steps=(a, b))``: a :func:`kaun_ir.profile` of global steps ``a`` to
``b``, started before step ``a`` and stopped once step ``b`` has finished on the device."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.runtime.profiling import Profile, profile

__all__ = ["StepProfiler"]


def _wait(st: Any) -> None:
    """Wait until the device has computed ``st`` (a parameter copied to the host)."""
    leaves = [leaf for leaf in tree.flatten(st.vars.params)[0] if hasattr(leaf, "shape")]
    if leaves:
        np.asarray(leaves[0])


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
        #: the recorded :class:`~kaun_ir.runtime.profiling.Profile` once the range has run
        self.result: Profile | None = None

    def before(self, step: int) -> None:
        """Called before the step numbered ``step`` runs (the state's step + 1)."""
        if self._context is None and self.result is None and self.first <= step <= self.last:
            self._context = profile(self.logdir)
            self.result = self._context.__enter__()

    def after(self, step: int, st: Any) -> None:
        """Called once the steps up to ``step`` were dispatched."""
        if self._context is not None and step >= self.last:
            self.close(st)

    def close(self, st: Any) -> None:
        """Stop the profile (waiting for ``st`` when given)."""
        if self._context is None:
            return
        if st is not None:
            _wait(st)
        context, self._context = self._context, None
        context.__exit__(None, None, None)

"""The default pass pipelines per backend: what ``kn.jit`` and ``kn.train`` run before lowering.

The passes themselves know nothing of backends; choosing a pipeline for the device a program
will run on is the runtime's business, so the defaults live here (see docs/passes.md):

- :data:`DEFAULT_JIT_PIPELINE` / :data:`DEFAULT_TRAIN_PIPELINE`: exact clean-ups for any backend;
- :data:`BACKEND_JIT_PIPELINES` / :data:`BACKEND_TRAIN_PIPELINES`: where a backend differs;
- :func:`jit_pipeline` / :func:`train_pipeline`: what is actually run — an explicit pipeline,
  else the environment variable, else the backend's default.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from kaun_ir.runtime.iree import IREE_BACKENDS
from kaun_ir.runtime.xla import backend as xla_backend

#: What ``kn.jit`` runs before lowering on any backend: exact clean-ups (see docs/passes.md).
#: The default actually used depends on the backend: :func:`default_jit_pipeline`.
DEFAULT_JIT_PIPELINE = "canonicalize,fold,cse,dce"
#: What ``kn.train`` runs on the whole training step (forward, backward, optimiser update) on
#: any backend; the default actually used is :func:`default_train_pipeline`.
DEFAULT_TRAIN_PIPELINE = "canonicalize,fold,cse,dce"
#: Appended to the defaults on XLA CPU: convolution chains in NHWC, tiling pooling windows as
#: slices + elementwise ops (``kaun-ir bench -w cnn``: about 3x the steps/s; docs/passes.md),
#: kernel gradients with a large cotangent split by batch (about 1.3x more; docs/performance-results.md),
#: input-dilated convolutions (strided convolutions' input gradients) as one convolution per phase.
CPU_CONVOLUTION_PASSES = "layout{prefer=nhwc},lower-pool,split-kernel-gradient,polyphase-conv,cse,dce"
#: Appended after those on XLA CPU: small products sharing an operand (attention's q/k/v and their
#: gradients) merged into larger ones, and products whose larger operand XLA would transpose
#: computed the other way round (docs/performance-results.md, "Third round: the step per XLA kernel").
CPU_DOT_PASSES = "merge-dots,cse,dce,dot-operand-order,cse,dce"
#: Appended to the defaults on IREE: max pooling's gradient (``select_and_scatter_add``, which IREE
#: 3.13 does not compile) as slices and elementwise ops where the windows tile the input
IREE_PASSES = "lower-pool,cse,dce"
#: The defaults per backend (``kaun_ir.runtime.backend_name()``, or an IREE backend's name);
#: others get the DEFAULT_* above.
BACKEND_JIT_PIPELINES = {
    "cpu": f"{DEFAULT_JIT_PIPELINE},{CPU_CONVOLUTION_PASSES},{CPU_DOT_PASSES}",
    **dict.fromkeys(IREE_BACKENDS, f"{DEFAULT_JIT_PIPELINE},{IREE_PASSES}"),
}
BACKEND_TRAIN_PIPELINES = {
    "cpu": f"{DEFAULT_TRAIN_PIPELINE},{CPU_CONVOLUTION_PASSES},{CPU_DOT_PASSES}",
    **dict.fromkeys(IREE_BACKENDS, f"{DEFAULT_TRAIN_PIPELINE},{IREE_PASSES}"),
}
#: Environment variables that override the defaults (read each time something is compiled).
JIT_PIPELINE_ENV = "KAUN_IR_PIPELINE"
TRAIN_PIPELINE_ENV = "KAUN_IR_TRAIN_PIPELINE"


def _backend(backend: str | None) -> str:
    if backend is not None:
        return backend

    return xla_backend.backend_name()  # asked only when needed: it may start jax's runtime


def default_jit_pipeline(backend: str | None = None) -> str:
    """``kn.jit``'s default pipeline on ``backend`` (cpu/gpu/tpu; None: the runtime's backend)."""
    return BACKEND_JIT_PIPELINES.get(_backend(backend), DEFAULT_JIT_PIPELINE)


def default_train_pipeline(backend: str | None = None) -> str:
    """``kn.train``'s default pipeline on ``backend`` (cpu/gpu/tpu; None: the runtime's backend)."""
    return BACKEND_TRAIN_PIPELINES.get(_backend(backend), DEFAULT_TRAIN_PIPELINE)


def jit_pipeline(explicit: str | None = None, compiler: str | None = None) -> str:
    """The pipeline ``kn.jit`` uses: ``explicit`` if given, else ``$KAUN_IR_PIPELINE``, else
    :func:`default_jit_pipeline` for the runtime's backend (for ``compiler`` when it is an IREE
    backend: XLA CPU's tuned passes are XLA's business)."""
    return _choose(explicit, JIT_PIPELINE_ENV, lambda: default_jit_pipeline(_iree_or_none(compiler)))


def train_pipeline(explicit: str | None = None, compiler: str | None = None) -> str:
    """The pipeline ``kn.train`` uses: ``explicit``, else ``$KAUN_IR_TRAIN_PIPELINE``, else
    :func:`default_train_pipeline` for the runtime's backend (or the IREE backend ``compiler``)."""
    return _choose(explicit, TRAIN_PIPELINE_ENV, lambda: default_train_pipeline(_iree_or_none(compiler)))


def _iree_or_none(compiler: str | None) -> str | None:
    return compiler if compiler in IREE_BACKENDS else None


def backend_in_use() -> str:
    """The backend the runtime compiles for (what ``layout{target=auto}`` means)."""
    return _backend(None)


def _choose(explicit: str | None, env: str, default: Callable[[], str]) -> str:
    if explicit is not None:
        return str(explicit)
    value = os.environ.get(env)
    # an empty variable means "no passes", an unset one "the default" (asked for only then, so
    # an explicit or environment pipeline never starts the runtime to learn the backend)
    return default() if value is None else value


__all__ = [
    "BACKEND_JIT_PIPELINES",
    "BACKEND_TRAIN_PIPELINES",
    "CPU_CONVOLUTION_PASSES",
    "CPU_DOT_PASSES",
    "DEFAULT_JIT_PIPELINE",
    "DEFAULT_TRAIN_PIPELINE",
    "IREE_PASSES",
    "JIT_PIPELINE_ENV",
    "TRAIN_PIPELINE_ENV",
    "backend_in_use",
    "default_jit_pipeline",
    "default_train_pipeline",
    "jit_pipeline",
    "train_pipeline",
]

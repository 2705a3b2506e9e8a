"""Graph-to-graph passes and the pass manager, imported as ``kaun_ir.passes``.

``run(graph, "cse,dce")`` runs a pipeline of registered passes; ``available()`` lists them;
``register(name, options=...)`` adds your own; ``statistic(name)`` lets a pass report a counter.
Pipelines take per-pass options (``"unroll{factor=8},cse"``, see :class:`Pipeline`), and
:class:`PassManager` adds instrumentation (IR printing, timing, statistics), verification
after each pass, stop-after bisection and crash reproducers. See docs/passes.md.
"""

from . import autodiff, canonicalize, cse, dce, fold, fuse_optimizer, layout  # noqa: F401  (the built-in passes)
from .manager import (DEFAULT_JIT_PIPELINE, DEFAULT_TRAIN_PIPELINE, JIT_PIPELINE_ENV, TRAIN_PIPELINE_ENV,
                      Instrumentation, PassCrash, PassManager, PassRun, PassStatistics, PassStep,
                      PassVerificationError, Pipeline, PipelineError, PrintAfterAll, PrintAfterChange,
                      Statistics, Timing, jit_pipeline, load_module, run, train_pipeline)
from .registry import REGISTRY, PassInfo, PassOption, available, parse_pipeline, register, statistic

__all__ = ["DEFAULT_JIT_PIPELINE", "DEFAULT_TRAIN_PIPELINE", "Instrumentation", "JIT_PIPELINE_ENV",
           "PassCrash", "PassInfo", "PassManager", "PassOption", "PassRun", "PassStatistics", "PassStep",
           "PassVerificationError", "Pipeline", "PipelineError", "PrintAfterAll", "PrintAfterChange",
           "REGISTRY", "Statistics", "TRAIN_PIPELINE_ENV", "Timing", "available", "jit_pipeline",
           "load_module", "parse_pipeline", "register", "run", "statistic", "train_pipeline"]

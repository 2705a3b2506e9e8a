"""Graph-to-graph passes and the pass manager, imported as ``kaun_ir.passes``.

``run(graph, "cse,dce")`` runs a pipeline of registered passes; ``available()`` lists them;
``register(name, options=...)`` adds your own; ``statistic(name)`` lets a pass report a counter.
Pipelines take per-pass options (``"unroll{factor=8},cse"``, see :class:`Pipeline`), and
:class:`PassManager` adds instrumentation (IR printing, timing, statistics), verification
after each pass, stop-after bisection and crash reproducers. See docs/passes.md.
"""

# the built-in passes (importing a module registers its passes)
from . import (  # noqa: F401  (forward mode and batching, see docs/transforms.md)
    autodiff,
    canonicalize,
    check_finite,
    conv_lowering,
    cse,
    dce,
    fold,
    fuse_optimizer,
    jvp,
    layout,
    mixed_precision,
    pool_lowering,
    remat,
    vmap,
    winograd_conv,
)  # noqa: F401
from .manager import (
    Instrumentation,
    PassCrash,
    PassManager,
    PassRun,
    PassStatistics,
    PassStep,
    PassVerificationError,
    Pipeline,
    PipelineError,
    PrintAfterAll,
    PrintAfterChange,
    Statistics,
    Timing,
    load_module,
    run,
)
from .registry import REGISTRY, PassInfo, PassOption, available, parse_pipeline, register, statistic

__all__ = [
    "Instrumentation",
    "PassCrash",
    "PassInfo",
    "PassManager",
    "PassOption",
    "PassRun",
    "PassStatistics",
    "PassStep",
    "PassVerificationError",
    "Pipeline",
    "PipelineError",
    "PrintAfterAll",
    "PrintAfterChange",
    "REGISTRY",
    "Statistics",
    "Timing",
    "available",
    "load_module",
    "parse_pipeline",
    "register",
    "run",
    "statistic",
]

"""Graph-to-graph passes and the pass manager, imported as ``kaun_ir.passes``.

``run(graph, "cse,dce")`` runs a pipeline of registered passes; ``available()`` lists them;
``register(name, options=...)`` adds your own; ``statistic(name)`` lets a pass report a counter.
Pipelines take per-pass options (``"unroll{factor=8},cse"``, see :class:`Pipeline`), and
:class:`PassManager` adds instrumentation (IR printing, timing, statistics), verification
after each pass, stop-after bisection and crash reproducers. See docs/passes.md.
"""

# the built-in passes (importing a module registers its passes)
from kaun_ir.errors import PassCrash, PassOptionError, PassVerificationError, PipelineError
from kaun_ir.names import public_dir
from kaun_ir.passes import (  # noqa: F401
    autodiff,
    canonicalize,
    check_finite,
    cse,
    dce,
    dot_operand_order,
    fold,
    fuse_optimizer,
    jvp,
    layout,
    lower_conv,
    lower_pool,
    merge_dots,
    mixed_precision,
    polyphase_conv,
    remat,
    split_kernel_gradient,
    vmap,
    winograd_conv,
)
from kaun_ir.passes.instrumentation import (
    Instrumentation,
    PassRun,
    PassStatistics,
    PrintAfterAll,
    PrintAfterChange,
    Statistics,
    Timing,
)
from kaun_ir.passes.manager import VERIFY_EACH_ENV, PassManager, run
from kaun_ir.passes.pipeline import PassStep, Pipeline, parse_pipeline
from kaun_ir.passes.registry import REGISTRY, Option, PassInfo, PassOption, available, register, statistic

__all__ = [
    "Instrumentation",
    "PassCrash",
    "PassOptionError",
    "PassInfo",
    "PassManager",
    "Option",
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
    "VERIFY_EACH_ENV",
    "available",
    "parse_pipeline",
    "register",
    "run",
    "statistic",
]

__dir__ = public_dir(__all__)

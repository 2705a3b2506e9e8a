"""Graph-to-graph passes, imported as ``kaun_ir.passes``.

``run(graph, "cse,dce")`` runs a pipeline of registered passes; ``available()`` lists them;
``register(name)`` adds your own.
"""

from . import autodiff, cse, dce  # noqa: F401  (the built-in passes)
from .registry import REGISTRY, PassInfo, available, parse_pipeline, register, run

__all__ = ["REGISTRY", "PassInfo", "available", "parse_pipeline", "register", "run"]

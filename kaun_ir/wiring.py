"""The composition root: the one place where upper layers plug into hooks of the layers below.

The layers of docs/architecture.md import downwards only, yet a few lower layers must call code
that sits above them:

========================  ==================================  ===============================
hook (layer)              filled with                         why it points up
========================  ==================================  ===============================
``ir.optable``            the op table (``kaun_ir.ops``)      the parser, verifier and
                                                              interpreter look ops up by name
``ops.rules``             the tracer, ``vmap``, ``autodiff``  rules of ops with regions build
                                                              and transform sub-graphs
``surface.eager``         ``runtime`` (run one op, DLPack)    a primitive on concrete arrays
                                                              runs eagerly
``surface.function``      ``runtime.jit``                     ``kn.*`` functions compile
                                                              concrete calls
``passes.target``         ``runtime``'s backend               ``layout{target=auto}``
========================  ==================================  ===============================

:func:`install` fills all of them; it is idempotent and cheap after the first call. Nothing calls
it at ``import kaun_ir`` (the package loads its names lazily, so ``kaun-ir --help`` starts in a
blink); instead each hook, when it is first asked for and finds itself empty, calls it. Code
that never touches a hook never pays for the runtime's import.
"""

from __future__ import annotations

import threading

from kaun_ir import ops
from kaun_ir.ir import optable
from kaun_ir.ops import rules as op_rules
from kaun_ir.passes import target
from kaun_ir.runtime import compilation, jit
from kaun_ir.runtime.pipelines import backend_in_use
from kaun_ir.runtime.xla import transfer
from kaun_ir.surface import eager, function, tensor
from kaun_ir.transforms import autodiff, vmap

_LOCK = threading.Lock()
_INSTALLED = False


def install() -> None:
    """Fill every hook of the lower layers with the code of the upper ones (once per process)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        optable.install(ops.TABLE)
        op_rules.install(
            apply=tensor.apply,
            tensor=tensor.Tensor,
            to_value=tensor.to_value,
            batch_graph=vmap.batch_graph,
            gradient_graph=autodiff.region_gradient_graph,
        )
        eager.install_runtime(compilation.run_op, transfer.from_dlpack)
        function.install_jit(jit)
        target.set_backend_query(backend_in_use)
        _INSTALLED = True


__all__ = ["install"]

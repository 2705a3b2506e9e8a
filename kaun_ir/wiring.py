"""The composition root: the one place where upper layers plug into slots of the layers below.

The layers of docs/architecture.md import downwards only, yet a few lower layers must call code
that sits above them. They keep a slot each and never import the code that fills it:

========================  ==================================  ===============================
slot (layer)              filled with                         why it points up
========================  ==================================  ===============================
``ir.optable``            the op table (``kaun_ir.ops``)      the parser, verifier and
                                                              interpreter look ops up by name
``ir.importers``          ``runtime.interop``'s readers       ``kn.ir.from_stablehlo`` /
                                                              ``from_torch`` need jaxlib, torch
``ir.core`` (svg view)    the viewer (``tools.viz.svg``)      ``Graph._repr_svg_`` in notebooks
``ops.rules``             the tracer, ``vmap``, ``autodiff``  rules of ops with regions build
                                                              and transform sub-graphs
``surface.eager``         ``runtime`` (run one op, DLPack)    a primitive on concrete arrays
                                                              runs eagerly
``surface.function``      ``runtime.jit``                     ``kn.*`` functions compile
                                                              concrete calls
``passes.target``         ``runtime``'s backend               ``layout{target=auto}``
``checkpoint.core``       ``train.io``                        ``checkpoint.save(path, state)``
                                                              saves a whole ``train.State``
``runtime.interop``       ``layer.Layer``, ``layer.Vars``     ``kn.interop.torch_layer``
(``torch_layer``)                                             returns a layer
========================  ==================================  ===============================

:func:`install` fills all of them; it is idempotent and cheap after the first call. Nothing calls
it at ``import kaun_ir`` (the package loads its names lazily, so ``kaun-ir --help`` starts in a
blink). ``kaun_ir/__init__.py`` registers it with :mod:`kaun_ir.hooks`, and a slot that is asked
for while empty calls :func:`kaun_ir.hooks.ensure_installed`: so only the top of the package ever
names this module, and code that never touches a slot never pays for the runtime's import.
"""

from __future__ import annotations

import threading

from kaun_ir import ops
from kaun_ir.checkpoint import core as checkpoint
from kaun_ir.ir import core as ir_core
from kaun_ir.ir import importers, optable
from kaun_ir.layer.core import Layer, Vars
from kaun_ir.ops import rules as op_rules
from kaun_ir.passes import target
from kaun_ir.runtime import compilation, jit
from kaun_ir.runtime.interop import stablehlo_import, torch_import
from kaun_ir.runtime.interop.torch_layer import install_layer_records
from kaun_ir.runtime.pipelines import backend_in_use
from kaun_ir.runtime.xla import transfer
from kaun_ir.surface import eager, function, tensor
from kaun_ir.tools.viz.svg import render_svg
from kaun_ir.train import io as train_io
from kaun_ir.train.state import State
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
        importers.install(
            from_stablehlo=stablehlo_import.from_stablehlo,
            from_torch=torch_import.from_torch,
            torch_inputs=torch_import.torch_inputs,
        )
        ir_core.install_views(svg=render_svg)
        checkpoint.install_whole_state_io(checkpoint.WholeStateIO(State, train_io.save, train_io.load_like))
        op_rules.install(
            apply=tensor.apply,
            tensor=tensor.Tensor,
            to_value=tensor.to_value,
            batch_graph=vmap.batch_graph,
            gradient_graph=autodiff.region_gradient_graph,
        )
        eager.install_runtime(compilation.run_op, transfer.from_dlpack)
        function.install_jit(jit)
        install_layer_records(Layer, Vars)
        target.set_backend_query(backend_in_use)
        _INSTALLED = True


__all__ = ["install"]

"""Programs in and out of other systems: the StableHLO and PyTorch importers and ``jax.export`` serialisation.

``kn.interop`` is this package: ``torch_function`` (a PyTorch module as a traceable kaun_ir
function), ``torch_layer`` (a PyTorch module as a ``kn.layer.Layer``: parameters as params,
buffers as state), ``from_torch`` and ``torch_inputs`` (also ``kn.ir.from_torch`` /
``kn.ir.torch_inputs``).
"""

from kaun_ir.names import public_dir
from kaun_ir.runtime.interop.torch_import import (
    TorchFunction,
    covered_ops,
    from_torch,
    torch_function,
    torch_inputs,
)
from kaun_ir.runtime.interop.torch_layer import torch_layer

__all__ = ["TorchFunction", "covered_ops", "from_torch", "torch_function", "torch_inputs", "torch_layer"]

__dir__ = public_dir(__all__)

"""Programs in and out of other systems: the StableHLO importer, ``jax.export`` serialisation and
PyTorch programs (``kn.interop``: ``torch_function``, ``from_torch``, ``torch_inputs``)."""

from kaun_ir.runtime.interop.torch_import import (
    TorchFunction,
    covered_ops,
    from_torch,
    torch_function,
    torch_inputs,
)

__all__ = ["TorchFunction", "covered_ops", "from_torch", "torch_function", "torch_inputs"]

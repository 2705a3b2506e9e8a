"""Programs in and out of other systems: the StableHLO and PyTorch importers and ``jax.export`` serialisation.

``kn.interop`` is this package: ``torch_function`` (a PyTorch module as a traceable kaun_ir
function), ``from_torch`` and ``torch_inputs`` (also ``kn.ir.from_torch`` / ``kn.ir.torch_inputs``).
"""

from kaun_ir.runtime.interop.torch_import import (
    TorchFunction,
    covered_ops,
    from_torch,
    torch_function,
    torch_inputs,
)

__all__ = ["TorchFunction", "covered_ops", "from_torch", "torch_function", "torch_inputs"]


def __dir__() -> list[str]:
    """The public names (``__all__``): what ``dir()`` and tab completion show."""
    return sorted(__all__)

"""The ATen op table of the PyTorch importer: each core ATen op written with kaun_ir's NumPy-style surface.

``ATEN`` maps an op's name as ``torch.export`` prints it (``"aten.addmm.default"``) onto a
function of the op's arguments: traced tensors (``Tensor``) where PyTorch has tensors, Python
values (ints, floats, lists, ``None``, dtypes as their ``str``) elsewhere. A function returns
one tensor, or a tuple for an op with several outputs, where ``None`` stands for an output the
importer does not compute (the indices of ``max_pool2d_with_indices``, the saved statistics of
a normalisation): using one raises :class:`~kaun_ir.errors.TorchImportError`.

Because every op is written with the surface functions (``add``, ``matmul``, ``reshape``, the
``convolution`` and ``reduce_window`` primitives ...), an imported program gets reverse mode,
batching and forward mode from the op table's own rules. Most ops map one to one; the others
are decompositions, each stated in the function's docstring. No module here imports torch.

The table is one dictionary assembled from one module per op family: ``torch_elementwise``
(arithmetic, comparisons, activations), ``torch_reductions``, ``torch_shapes`` (views, slicing,
padding, indexing), ``torch_creation`` and ``torch_nn`` (matrix products, convolution, pooling,
normalisation); ``torch_args`` holds what they share (dtypes, ``dim`` arguments).
"""

from __future__ import annotations

from collections.abc import Callable

from kaun_ir.runtime.interop import (
    torch_creation,
    torch_elementwise,
    torch_nn,
    torch_reductions,
    torch_shapes,
)
from kaun_ir.runtime.interop.torch_args import DTYPES, dtype_of_torch

__all__ = ["ATEN", "DTYPES", "FAMILIES", "dtype_of_torch"]

#: the op-family modules whose tables make up ``ATEN``
FAMILIES = (torch_elementwise, torch_reductions, torch_shapes, torch_creation, torch_nn)

#: ops that only check shapes or values at run time in PyTorch: nothing to compute
_NO_OPS = (
    "aten._assert_tensor_metadata.default",
    "aten._assert_scalar.default",
    "aten.sym_constrain_range_for_size.default",
    "aten.sym_constrain_range.default",
    "aten._assert_async.msg",
)


def _no_op(*args, **kwargs):
    """Nothing: the assertion is PyTorch's run-time check, which the traced program does not need."""
    return None


def _merge(families) -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for family in families:
        twice = sorted(table.keys() & family.ATEN.keys())
        if twice:
            raise ValueError(f"ATen ops mapped by two families ({family.__name__} and another): {twice}")
        table.update(family.ATEN)
    return table


ATEN: dict[str, Callable] = _merge(FAMILIES)
for _name in _NO_OPS:
    ATEN[_name] = _no_op

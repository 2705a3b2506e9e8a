"""The tracing surface: ``Tensor``, ``trace`` and the NumPy-style functions a traced function is
written with.

``Tensor``'s operators and methods (``x + y``, ``x.sum()``) are the functions of this package's
modules, which are built on ``Tensor``: the package hands them to it here, once.
"""

from kaun_ir.surface import elementwise, indexing, linalg, promotion, reductions, shapes, tensor

tensor.bind_functions(
    elementwise=elementwise,
    indexing=indexing,
    linalg=linalg,
    promotion=promotion,
    reductions=reductions,
    shapes=shapes,
)

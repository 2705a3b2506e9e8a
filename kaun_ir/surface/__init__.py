"""The tracing surface: ``Tensor``, ``trace`` and the NumPy-style functions a traced function is
written with."""

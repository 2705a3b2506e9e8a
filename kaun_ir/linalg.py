"""kaun_ir.linalg (being written)."""

__all__: list[str] = []

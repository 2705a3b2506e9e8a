"""kaun_ir.random (being written)."""

__all__: list[str] = []

"""kaun_ir.fn (being written)."""

__all__: list[str] = []

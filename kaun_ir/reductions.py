"""kaun_ir.reductions (being written)."""

__all__: list[str] = []

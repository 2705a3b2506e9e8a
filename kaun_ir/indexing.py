"""kaun_ir.indexing (being written)."""

__all__: list[str] = []

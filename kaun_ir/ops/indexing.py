"""Primitives of the indexing family (being written)."""

from .base import OpDef

OPS: list[OpDef] = []

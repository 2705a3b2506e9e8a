"""Primitives of the reduce family (being written)."""

from .base import OpDef

OPS: list[OpDef] = []

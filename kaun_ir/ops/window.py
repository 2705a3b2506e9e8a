"""Primitives of the window family (being written)."""

from .base import OpDef

OPS: list[OpDef] = []

"""Primitives of the linalg family (being written)."""

from .base import OpDef

OPS: list[OpDef] = []

"""One call of ``train.step`` as it arrives: built once at the door, carried down.

:class:`StepCall` holds the batch and the targets after they are made global (a multi-process
run on a mesh), the call's options, and, computed at most once, the abstract signature of the
model's input (``x`` as a tree of ``kn.ShapeDtype`` leaves) that everything which only traces
(the probing path of a closure, the model's output types) reads instead of ``x`` itself. The
route is decided from it in one place (:func:`kaun_ir.train.stepping.step`): the fast path of a
state returned by ``step``, else the general path, which builds the loss call once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kaun_ir import tree
from kaun_ir.surface.tensor import Tensor
from kaun_ir.surface.trace import ShapeDtype, is_array_leaf, leaf_type
from kaun_ir.train import builder
from kaun_ir.train.state import State, Trainer

__all__ = ["StepCall"]


@dataclass(eq=False, slots=True)
class StepCall:
    """``train.step(trainer, st, x, *targets, training=, ctx=)`` as one record."""

    x: Any
    targets: tuple
    training: bool = True
    ctx: dict | None = None
    #: this process's batch rows when a closure's lifted arrays must be made global, else None
    rows: int | None = None
    _input_types: Any = field(default=None, repr=False)

    @classmethod
    def at_the_door(
        cls, trainer: Trainer, x: Any, targets: tuple, training: bool, ctx: dict | None, block: bool = False
    ) -> StepCall:
        """The call with its batch made global over the processes of a mesh run (as it is
        otherwise), once."""
        rows = None
        if trainer.mesh is not None:
            rows = builder.local_rows(trainer, x, block=block)
            x, targets = builder.global_batch(trainer, x, targets, block=block)
        return cls(x, tuple(targets), bool(training), ctx, rows)

    def may_take_the_fast_path(self, st: State) -> bool:
        """A state returned by ``step`` with its flat arrays, no ``ctx``, one process's batch."""
        return not self.ctx and type(st) is State and self.rows is None and st.cache.flat is not None

    def input_types(self) -> Any:
        """``x`` as a tree of ``kn.ShapeDtype`` leaves (non-array leaves as they are), made once."""
        if self._input_types is None:
            leaves, treedef = tree.flatten(self.x)
            self._input_types = tree.unflatten(treedef, [_abstract(leaf) for leaf in leaves])
        return self._input_types


def _abstract(leaf: Any) -> Any:
    """An array leaf as the ``kn.ShapeDtype`` of the type a trace gives it; anything else (a
    Python scalar, which stays static, a spec, a symbolic Tensor) as it is."""
    if isinstance(leaf, (ShapeDtype, Tensor)) or not is_array_leaf(leaf):
        return leaf
    kind = leaf_type(leaf)
    return ShapeDtype(kind.shape, kind.dtype)

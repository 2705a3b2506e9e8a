"""How the loss of a training step is called, in each of the three forms.

* :class:`Explicit` — ``train.make(model, opt, loss=fn)``: ``fn(outputs, *targets)``; the
  targets are ordinary inputs of the compiled step. Nothing is inspected.
* :class:`LossSpec` — the Kaun closure form ``loss_fn(outputs)`` whose data can be *lifted*: the
  arrays it holds in its closure cells, default arguments, the module globals its code names
  or the bound arguments of a ``functools.partial`` become inputs, and everything else it can
  reach (Python numbers, strings, library functions and modules, and the same things inside
  user functions it calls) is part of the compile key. A new closure of the same code over new
  arrays of the same shapes runs the same executable.
* :class:`Probed` — a closure whose data cannot be lifted that way (an attribute of an object,
  a bound method, a user module's attribute, an array inside a function it calls ...). On
  every call the loss alone is traced on symbolic outputs (cheap: the model is not traced);
  every array it turns into a graph constant, however it reached it, is taken out and made an
  input, and the compile key is that small graph. Correct for any deterministic loss, but
  slower; a one-time warning names the faster forms.

A closure that looked liftable but turned arrays into constants while its step was traced
(reached by a path the inspection does not see) is caught then: the trace is abandoned, the
closure's key is remembered as opaque, and it takes the probing path from then on. So no form
ever runs an executable built for other data.
"""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.ir.builder import Builder
from kaun_ir.surface.constant_hooks import constant_hook
from kaun_ir.surface.tensor import Tensor, to_value, type_of
from kaun_ir.surface.trace import ShapeDtype, leaf_type
from kaun_ir.train.closure_key import (
    SCALARS,
    Opaque,
    function_parts,
    liftable,
    named_globals,
    quick_key,
    remember,
    static_key,
)

__all__ = ["Explicit", "LossSpec", "Probed", "Unlifted", "probe", "quick_key", "remember", "warn_opaque"]


class Unlifted(Exception):
    """Raised while tracing a :class:`LossSpec` step when the loss turned an array into a constant."""


class Explicit:
    """``fn(outputs, *targets)``: the loss given to ``train.make``."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, outputs: Any, targets: tuple) -> Any:
        return self.fn(outputs, *targets)

    def __hash__(self):
        return hash(("explicit", id(self.fn)))

    def __eq__(self, other):
        return isinstance(other, Explicit) and other.fn is self.fn


class LossSpec:
    """A loss closure without its liftable arrays: hashable, so it keys the compile cache.

    ``opaque`` is None when the closure can be lifted (then ``arrays`` are its arrays in input
    order and ``key`` identifies everything else), else a description of what it reaches that
    cannot be (then the :class:`Probed` path runs).
    """

    __slots__ = ("fn", "leaves", "treedef", "key", "arrays", "opaque", "kind")

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise TypeError(f"loss_fn must be callable, got {type(fn).__name__}")
        self.fn, self.leaves, self.treedef, self.key, self.arrays = fn, [], None, None, []
        self.opaque: str | None = None
        try:
            self._inspect(fn)
        except Opaque as why:
            self.opaque = str(why)
            self.key = None

    def _inspect(self, fn: Callable) -> None:
        if isinstance(fn, functools.partial):
            self.kind = "partial"
            static = ("partial", static_key(fn.func, 1, set()))
            contents = [fn.args, fn.keywords]
        elif isinstance(fn, types.FunctionType):
            self.kind = "function"
            contents = function_parts(fn)
            static = ("function", fn.__code__, id(fn.__globals__), contents.pop(3))
        elif isinstance(fn, types.MethodType):
            raise Opaque(f"the bound method {fn.__qualname__} (it reads attributes of its object)")
        else:
            raise Opaque(f"a callable {type(fn).__name__} object (its attributes can change)")
        try:
            leaves, treedef = tree.flatten(contents)
        except TypeError:  # e.g. a dict whose keys do not sort
            raise Opaque("a dict whose keys do not sort") from None
        arrays, statics, seen = [], [], {id(fn)}
        for leaf in leaves:
            if liftable(leaf):
                arrays.append(leaf)
                statics.append(None)
            else:
                statics.append(static_key(leaf, 1, seen))
        self.leaves, self.treedef, self.arrays = leaves, treedef, arrays
        self.key = (static, treedef, tuple(statics))

    def rebuild(self, arrays: list) -> Callable:
        """The loss function with its lifted arrays replaced (by traced inputs)."""
        it = iter(arrays)
        leaves = [next(it) if liftable(leaf) else leaf for leaf in self.leaves]
        contents = tree.unflatten(self.treedef, leaves)
        if self.kind == "partial":
            args, keywords = contents
            return functools.partial(self.fn.func, *args, **keywords)
        cells, defaults, kwdefaults, globals_ = contents
        namespace = self.fn.__globals__
        names = named_globals(self.fn)[0]
        if any(isinstance(leaf, Tensor) for leaf in tree.flatten(globals_)[0]):
            namespace = dict(namespace)  # a copy of the module namespace with the traced arrays in it
            namespace.update(zip(names, globals_))
        fn = types.FunctionType(
            self.fn.__code__,
            namespace,
            self.fn.__name__,
            defaults,
            tuple(types.CellType(value) for value in cells),
        )
        fn.__kwdefaults__ = kwdefaults
        return fn

    def __call__(self, outputs: Any, arrays: tuple) -> Any:
        """The loss on ``outputs`` (while tracing the step); raises :class:`Unlifted` if it turns
        a concrete array into a constant (data it reached by a path not inspected)."""
        fn = self.rebuild(list(arrays))
        with constant_hook(_refuse_data):
            return fn(outputs)

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, LossSpec) and self.key == other.key


def _is_data(x: Any) -> bool:
    """Concrete operands that are data rather than literals of the code: NumPy arrays of rank >= 1
    and device arrays of any rank (scalars stay constants; their values are part of the key)."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 1
    return not isinstance(x, (np.generic, *SCALARS)) and hasattr(x, "shape") and hasattr(x, "dtype")


def _refuse_data(x: Any) -> None:
    if _is_data(x):
        raise Unlifted()
    return None


class Probed:
    """A loss closure traced alone on symbolic outputs: ``arrays`` are the data it turned into
    constants (in the order it did), ``key`` the traced graph with those arrays made inputs."""

    __slots__ = ("fn", "arrays", "key")

    def __init__(self, fn: Callable, arrays: list, key: Any):
        self.fn, self.arrays, self.key = fn, arrays, key

    def __call__(self, outputs: Any, arrays: tuple) -> Any:
        """The loss on ``outputs`` with the k-th data constant replaced by ``arrays[k]``."""
        found = iter(arrays)
        used = [0]

        def substitute(x):
            if not _is_data(x):
                return None
            used[0] += 1
            try:
                return next(found)
            except StopIteration:
                raise RuntimeError(
                    "train.step: the loss function read more arrays while the step was "
                    "traced than when it was probed; it must be deterministic"
                ) from None

        with constant_hook(substitute):
            value = self.fn(outputs)
        if used[0] != len(arrays):
            raise RuntimeError(
                "train.step: the loss function read fewer arrays while the step was traced "
                "than when it was probed; it must be deterministic"
            )
        return value

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, Probed) and self.key == other.key


def probe(fn: Callable, output_types: Any) -> Probed:
    """Trace ``fn`` alone on symbolic outputs of ``output_types`` (a tree of ShapeDtype) and take
    out the arrays it turns into constants."""
    leaves, treedef = tree.flatten(output_types)
    found: list = []
    with Builder(record_source=False) as builder:
        symbolic = [Tensor(builder.add_input(leaf_type(leaf)), builder) for leaf in leaves]

        def collect(x):
            if not _is_data(x):
                return None
            found.append(x)
            return Tensor(builder.add_input(type_of(x)), builder)

        with constant_hook(collect):
            value = fn(tree.unflatten(treedef, symbolic))
        out = [to_value(builder, value)]
    graph = builder.finish(out, name="loss")
    types_ = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in found)
    return Probed(fn, found, (graph.text(), types_))


def output_spec(leaves: list) -> list:
    """``ShapeDtype`` s with the shapes and dtypes of ``leaves``."""
    return [ShapeDtype(tuple(leaf.shape), leaf.dtype) for leaf in leaves]


_WARNED: set = set()


def warn_opaque(fn: Callable, why: str) -> None:
    """Warn once per loss code that the slow, always-correct probing path is used."""
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "func", None), "__code__", None) or type(fn)
    if code in _WARNED:
        return
    _WARNED.add(code)
    warnings.warn(
        f"train: the loss function reads data that cannot be made an input of the compiled step ({why}); "
        "it is traced again on every step so that new data is never mixed up with old, which is slow. "
        "Pass the targets explicitly instead: trainer = train.make(model, optimizer, loss=fn) with "
        "fn(outputs, *targets), then train.step(trainer, st, x, *targets); or let the closure hold "
        "its arrays directly (a closure variable, a default argument or functools.partial).",
        stacklevel=4,
    )

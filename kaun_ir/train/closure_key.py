"""What of a loss closure is data and what is code: the compile key of the closure form.

A closure's arrays (in its cells, defaults, the module globals its code names, a
``functools.partial``'s arguments) are *lifted*: they become inputs of the compiled step. All the
rest it reaches must be fixed for the compiled step to stay valid: :func:`static_key` turns it
into a hashable key, or raises :class:`Opaque` naming what could change under it (an attribute of
an object, an array inside a function it calls ...). :func:`quick_key` recognises, in a few
identity checks, a new closure of a code already seen (a user's loop makes one every step).
:mod:`kaun_ir.train.capture` builds the three forms of a step's loss on these.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from kaun_ir.surface.tensor import Tensor
from kaun_ir.surface.trace import is_array_leaf

__all__ = [
    "Opaque",
    "SCALARS",
    "function_parts",
    "liftable",
    "named_globals",
    "quick_key",
    "remember",
    "static_key",
]

# Objects from these packages are taken to be fixed code (functions, modules, classes); a user
# function is looked into instead (its closure, defaults and the globals it names).
_LIBRARY_ROOTS = frozenset(
    {
        "kaun_ir",
        "numpy",
        "jax",
        "jaxlib",
        "ml_dtypes",
        "math",
        "operator",
        "functools",
        "builtins",
        "optax",
        "typing",
        "itertools",
        "collections",
    }
)
SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 6


class Opaque(Exception):
    """The loss reaches data that cannot be lifted (the message says through what)."""


def _is_library(obj: Any) -> bool:
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(name, str) and name.partition(".")[0] in _LIBRARY_ROOTS


def _code_names(code: types.CodeType) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@functools.lru_cache(maxsize=4096)
def _sorted_code_names(code: types.CodeType) -> tuple:
    """The global (and attribute) names ``code`` and the functions defined inside it may read,
    sorted; computed once per code object."""
    return tuple(sorted(_code_names(code)))


def named_globals(fn: types.FunctionType) -> tuple[tuple, list]:
    """The module globals ``fn``'s code may read that its module defines: ``(names, values)``."""
    namespace = fn.__globals__
    names = tuple(name for name in _sorted_code_names(fn.__code__) if name in namespace)
    return names, [namespace[name] for name in names]


def function_parts(fn: types.FunctionType) -> list:
    """What a user function reaches: ``[cells, defaults, kwdefaults, global names, their values]``."""
    try:
        cells = [cell.cell_contents for cell in (fn.__closure__ or ())]
    except ValueError:
        raise ValueError("loss_fn closes over a variable that is not assigned yet") from None
    names, values = named_globals(fn)
    return [cells, fn.__defaults__, fn.__kwdefaults__, names, values]


_CODE_TYPES = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


def liftable(value: Any) -> bool:
    """An array the closure holds (not a module or function that happens to have ``shape`` and
    ``dtype`` attributes, like the ``numpy`` module)."""
    return not isinstance(value, (Tensor, *_CODE_TYPES)) and is_array_leaf(value)


def static_key(value: Any, depth: int, seen: set) -> Any:
    """A hashable key for a value the loss reaches but that is not lifted; ``Opaque`` when the
    value may hold data that would go stale (an array below the top level, a mutable object)."""
    kind = type(value)
    if kind in SCALARS:
        return (kind, "nan") if value != value else (kind, value)
    if isinstance(value, Tensor):
        raise Opaque("a symbolic Tensor of another trace")
    if liftable(value):
        raise Opaque("an array inside a function or container it calls")
    if kind in (list, tuple) and not hasattr(value, "_fields"):
        return (kind, tuple(static_key(v, depth, seen) for v in value))
    if kind is dict:
        try:
            keys = sorted(value)
        except TypeError:
            raise Opaque("a dict whose keys do not sort") from None
        return (dict, tuple(keys), tuple(static_key(value[k], depth, seen) for k in keys))
    if isinstance(value, np.dtype):
        return ("dtype", value)
    if isinstance(value, type):
        return ("type", value)
    code = _code_key(value, depth, seen)
    if code is not None:
        return code
    if _is_library(kind) and _hashable(value):  # e.g. a kn.layer.Layer or an optimiser record
        return ("object", value)
    raise Opaque(f"a {kind.__name__} object (its attributes can change)")


def _code_key(value: Any, depth: int, seen: set) -> Any:
    """The key of a module, function, builtin or ``functools.partial`` (None for anything else):
    library code by identity, a user function by its code and what it reaches."""
    if isinstance(value, types.ModuleType):
        if _is_library(value):
            return ("module", value)
        raise Opaque(f"module {value.__name__!r} (its attributes can change)")
    if isinstance(value, types.FunctionType):
        if _is_library(value):
            return ("function", value)
        if id(value) in seen:
            return ("recursive", value.__code__)
        if depth >= _MAX_DEPTH:
            raise Opaque("functions nested too deeply to inspect")
        seen.add(id(value))
        parts = function_parts(value)
        return ("function", value.__code__, id(value.__globals__), static_key(parts, depth + 1, seen))
    if isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return ("builtin", value)
        raise Opaque(f"the bound method {value.__qualname__} of a {type(owner).__name__}")
    if isinstance(value, functools.partial) and depth < _MAX_DEPTH:
        return (
            "partial",
            static_key(value.func, depth + 1, seen),
            static_key(value.args, depth + 1, seen),
            static_key(value.keywords, depth + 1, seen),
        )
    return None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------ repeated closures, quickly
#
# A user's loop makes a new closure of the same code every step (``lambda out: loss(out, y)``
# over the batch's labels). Once one closure of a code object has been inspected, and it held
# nothing but arrays and fixed atoms (library functions and modules, classes, Python scalars)
# in its cells and named only such atoms as globals, the next closure of that code has the same
# key when its cells hold arrays at the same places and the very same atoms, and its globals
# are the same objects: checked in a few identity comparisons instead of a full inspection.

_ARRAY = object()  # marks a cell that held a lifted array
_MISSING = object()  # marks a global name the code reads that the module does not define


def _atom(value: Any) -> bool:
    """A value whose identity (scalars: type and value) determines its part of the key."""
    kind = type(value)
    if kind in SCALARS:
        return value == value  # a NaN is keyed by kind, not value: leave it to the full path
    if kind is types.FunctionType or kind is types.ModuleType:
        return _is_library(value)
    if kind is types.BuiltinFunctionType:
        owner = getattr(value, "__self__", None)
        return owner is None or isinstance(owner, types.ModuleType)
    return isinstance(value, type)


class _Known:
    """What the quick check of a code object's closures compares with (see above)."""

    __slots__ = ("globals_id", "cells", "names", "values", "key")

    def __init__(self, globals_id: int, cells: tuple, names: tuple, values: tuple, key: Any):
        self.globals_id, self.cells, self.names, self.values, self.key = globals_id, cells, names, values, key


_KNOWN: dict = {}
_KNOWN_MAX = 256


def remember(spec: Any, array_types: tuple) -> None:
    """File a liftable closure's layout (a :class:`~kaun_ir.train.capture.LossSpec`) for
    :func:`quick_key`, when it qualifies."""
    fn = spec.fn
    if spec.opaque is not None or type(fn) is not types.FunctionType:
        return
    if fn.__defaults__ is not None or fn.__kwdefaults__ is not None:
        return
    try:
        cells = [cell.cell_contents for cell in (fn.__closure__ or ())]
    except ValueError:
        return
    layout = []
    for value in cells:
        if type(value) in array_types:
            layout.append(_ARRAY)
        elif _atom(value):
            layout.append(value)
        else:
            return
    namespace = fn.__globals__
    names = _sorted_code_names(fn.__code__)
    values = tuple(namespace.get(name, _MISSING) for name in names)
    if not all(v is _MISSING or _atom(v) for v in values):
        return
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[fn.__code__] = _Known(id(namespace), tuple(layout), names, values, spec.key)


def quick_key(fn: Any, array_types: tuple) -> tuple[Any, list] | None:
    """``(key, arrays)`` of a closure whose code was :func:`remember` ed, equal to what
    ``LossSpec(fn)`` would find; None when it cannot be told quickly."""
    if type(fn) is not types.FunctionType:
        return None
    known = _KNOWN.get(fn.__code__)
    if known is None or known.globals_id != id(fn.__globals__):
        return None
    if fn.__defaults__ is not None or fn.__kwdefaults__ is not None:
        return None
    arrays = []
    try:
        for cell, held in zip(fn.__closure__ or (), known.cells):
            value = cell.cell_contents
            if held is _ARRAY:
                if type(value) not in array_types:
                    return None
                arrays.append(value)
            elif value is not held and not (
                type(value) is type(held) and type(value) in SCALARS and value == held
            ):
                return None
    except ValueError:  # a cell not assigned yet: the full path says so
        return None
    namespace = fn.__globals__
    for name, value in zip(known.names, known.values):
        if namespace.get(name, _MISSING) is not value:
            return None
    return known.key, arrays

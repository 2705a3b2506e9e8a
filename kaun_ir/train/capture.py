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
from kaun_ir.surface.trace import ShapeDtype, is_array_leaf, leaf_type

__all__ = ["Explicit", "LossSpec", "Probed", "Unlifted", "probe", "quick_key", "remember", "warn_opaque"]

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
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_MAX_DEPTH = 6


class Opaque(Exception):
    """The loss reaches data that cannot be lifted (the message says through what)."""


class Unlifted(Exception):
    """Raised while tracing a :class:`LossSpec` step when the loss turned an array into a constant."""


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


def _named_globals(fn: types.FunctionType) -> tuple[tuple, list]:
    namespace = fn.__globals__
    names = tuple(name for name in _sorted_code_names(fn.__code__) if name in namespace)
    return names, [namespace[name] for name in names]


def _function_parts(fn: types.FunctionType) -> list:
    try:
        cells = [cell.cell_contents for cell in (fn.__closure__ or ())]
    except ValueError:
        raise ValueError("loss_fn closes over a variable that is not assigned yet") from None
    names, values = _named_globals(fn)
    return [cells, fn.__defaults__, fn.__kwdefaults__, names, values]


_CODE_TYPES = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)


def _liftable(value: Any) -> bool:
    """An array the closure holds (not a module or function that happens to have ``shape`` and
    ``dtype`` attributes, like the ``numpy`` module)."""
    return not isinstance(value, (Tensor, *_CODE_TYPES)) and is_array_leaf(value)


def _static(value: Any, depth: int, seen: set) -> Any:
    """A hashable key for a value the loss reaches but that is not lifted; ``Opaque`` when the
    value may hold data that would go stale (an array below the top level, a mutable object)."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, "nan") if value != value else (kind, value)
    if isinstance(value, Tensor):
        raise Opaque("a symbolic Tensor of another trace")
    if _liftable(value):
        raise Opaque("an array inside a function or container it calls")
    if kind in (list, tuple) and not hasattr(value, "_fields"):
        return (kind, tuple(_static(v, depth, seen) for v in value))
    if kind is dict:
        try:
            keys = sorted(value)
        except TypeError:
            raise Opaque("a dict whose keys do not sort") from None
        return (dict, tuple(keys), tuple(_static(value[k], depth, seen) for k in keys))
    if isinstance(value, np.dtype):
        return ("dtype", value)
    if isinstance(value, type):
        return ("type", value)
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
        parts = _function_parts(value)
        return ("function", value.__code__, id(value.__globals__), _static(parts, depth + 1, seen))
    if isinstance(value, types.BuiltinFunctionType):
        owner = getattr(value, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return ("builtin", value)
        raise Opaque(f"the bound method {value.__qualname__} of a {type(owner).__name__}")
    if isinstance(value, functools.partial) and depth < _MAX_DEPTH:
        return (
            "partial",
            _static(value.func, depth + 1, seen),
            _static(value.args, depth + 1, seen),
            _static(value.keywords, depth + 1, seen),
        )
    if _is_library(kind) and _hashable(value):  # e.g. a kn.layer.Layer or an optimiser record
        return ("object", value)
    raise Opaque(f"a {kind.__name__} object (its attributes can change)")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


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
            static = ("partial", _static(fn.func, 1, set()))
            contents = [fn.args, fn.keywords]
        elif isinstance(fn, types.FunctionType):
            self.kind = "function"
            contents = _function_parts(fn)
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
            if _liftable(leaf):
                arrays.append(leaf)
                statics.append(None)
            else:
                statics.append(_static(leaf, 1, seen))
        self.leaves, self.treedef, self.arrays = leaves, treedef, arrays
        self.key = (static, treedef, tuple(statics))

    def rebuild(self, arrays: list) -> Callable:
        """The loss function with its lifted arrays replaced (by traced inputs)."""
        it = iter(arrays)
        leaves = [next(it) if _liftable(leaf) else leaf for leaf in self.leaves]
        contents = tree.unflatten(self.treedef, leaves)
        if self.kind == "partial":
            args, keywords = contents
            return functools.partial(self.fn.func, *args, **keywords)
        cells, defaults, kwdefaults, globals_ = contents
        namespace = self.fn.__globals__
        names = _named_globals(self.fn)[0]
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
    if kind in _SCALARS:
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


def remember(spec: LossSpec, array_types: tuple) -> None:
    """File a liftable closure's layout for :func:`quick_key`, when it qualifies."""
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
                type(value) is type(held) and type(value) in _SCALARS and value == held
            ):
                return None
    except ValueError:  # a cell not assigned yet: the full path says so
        return None
    namespace = fn.__globals__
    for name, value in zip(known.names, known.values):
        if namespace.get(name, _MISSING) is not value:
            return None
    return known.key, arrays


def _is_data(x: Any) -> bool:
    """Concrete operands that are data rather than literals of the code: NumPy arrays of rank >= 1
    and device arrays of any rank (scalars stay constants; their values are part of the key)."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 1
    return not isinstance(x, (np.generic, *_SCALARS)) and hasattr(x, "shape") and hasattr(x, "dtype")


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

"""Naming a model on the command line: ``module:function``, ``path/to/file.py:function``, a ``.kir``
file or a StableHLO module (``.mlir`` / ``.mlirbc``, imported with ``kn.ir.from_stablehlo``).

The function is called without arguments and returns one of:

* a ``kn.layer.Layer`` — its forward pass ``(params, state, x) -> y`` in evaluation mode; the
  example input comes from ``--input f32[32,784]`` (several ``--input`` give a tuple ``x``);
* :class:`Model` ``(layer, inputs)`` — a layer with default example inputs;
* ``(fn, example_args)`` — a traceable function and a tuple of example arguments (arrays or
  ``kn.ShapeDtype``); ``--input`` replaces the example arguments;
* a ``kn.Graph``;
* :class:`TrainSetup` — a training step (``train.step_graph``), in either of the two forms of
  ``train.make``: ``TrainSetup(model, optimizer, loss=fn, inputs=(x,), targets=(y,))`` with
  ``fn(outputs, *targets) -> scalar`` (the explicit form), or ``TrainSetup(model, optimizer,
  loss_fn_builder, inputs)`` where ``loss_fn_builder(*inputs)`` returns the ``loss_fn(y_pred)
  -> scalar`` of an example batch (closing over example targets, e.g.
  ``kn.ShapeDtype((32,), kn.int32)`` labels); the tuple ``(model, optimizer, loss_fn_builder)``
  is the second form without example inputs (give them with ``--input``).

Parameters are never materialised: the model's ``init`` is traced to learn their shapes, so
naming a large model costs no XLA compilation. What a named model becomes, and its stages, is a
:class:`kaun_ir.tools.subject.Subject`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kaun_ir.errors import KaunError, ModelSpecError
from kaun_ir.tools.subject import Subject, abstract_vars

SPEC_HELP = """\
SPEC names the model. It is one of
  module:function          a function in an importable module (the current directory is searched too)
  path/to/file.py:function a function in a Python file
  file.kir                 a graph in kaun_ir's textual IR (its input types are in the file)
The function takes no arguments and returns one of
  a kn.layer.Layer         its forward pass in evaluation mode; give the example input with
                           --input f32[32,784] (repeat --input for several inputs)
  Model(layer, inputs)     a layer with default example inputs (kaun_ir.tools.spec.Model)
  (fn, example_args)       a traceable function and a tuple of example arrays / kn.ShapeDtype
  a kn.Graph               a traced graph
  TrainSetup(model, optimizer, loss=fn, inputs=(x,), targets=(y,))
                           a whole training step (forward, gradients, optimiser update) with
                           fn(outputs, *targets) -> scalar; or TrainSetup(model, optimizer,
                           loss_fn_builder, inputs) with loss_fn_builder(*inputs) returning
                           loss_fn(outputs) -> scalar (kaun_ir.tools.spec.TrainSetup)
Parameters are never materialised: naming a large model costs no XLA compilation.
"""


@dataclass(frozen=True)
class Model:
    """A layer with default example inputs (a tuple of arrays or ``kn.ShapeDtype``)."""

    layer: Any
    inputs: tuple = ()


@dataclass(frozen=True)
class TrainSetup:
    """A training step for ``kaun-ir dump`` / ``viz`` / ``export``, returned by the function a SPEC
    names. Two forms, as ``train.make`` has:

    * explicit targets: ``TrainSetup(model, optimizer, loss=fn, inputs=(x,), targets=(y,))``,
      ``fn(outputs, *targets) -> scalar`` (e.g. ``loss.cross_entropy_sparse``), ``inputs`` and
      ``targets`` example arrays or ``kn.ShapeDtype``;
    * a loss closure: ``TrainSetup(model, optimizer, loss_fn_builder, inputs)``, where
      ``loss_fn_builder(*inputs)`` returns ``loss_fn(outputs) -> scalar`` for an example batch.

    ``inputs`` may be left out and given with ``--input``.
    """

    model: Any
    optimizer: Any
    loss_fn_builder: Callable | None = None
    inputs: tuple = ()
    loss: Callable | None = None
    targets: tuple = ()

    def __post_init__(self):
        if (self.loss is None) == (self.loss_fn_builder is None):
            raise ModelSpecError(
                "TrainSetup needs exactly one of loss= (loss(outputs, *targets), with targets=) "
                "and loss_fn_builder (loss_fn_builder(*inputs) -> loss_fn(outputs))"
            )
        if self.loss is not None and not self.targets:
            raise ModelSpecError(
                "TrainSetup(loss=...) needs example targets: targets=(kn.ShapeDtype((32,), kn.int32),) "
                "for labels of a batch of 32, say"
            )
        for name in ("loss", "loss_fn_builder"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ModelSpecError(f"TrainSetup: {name} must be callable, got {type(value).__name__}")


def parse_input(text: str):
    """``"f32[32,784]"`` -> ``kn.ShapeDtype((32, 784), float32)``; ``ModelSpecError`` if malformed."""
    from kaun_ir.ir.tokens import parse_type
    from kaun_ir.surface.trace import ShapeDtype

    try:
        t = parse_type(text.strip())
        return ShapeDtype(t.shape, t.dtype)
    except (ValueError, TypeError, KeyError, KaunError) as err:  # KaunError: a negative dimension
        raise ModelSpecError(
            f"--input {text!r}: expected a tensor type like f32[32,784] or i32[] ({err})"
        ) from None


def load_object(spec: str) -> Any:
    """Import ``module:function`` (or ``file.py:function``) and call the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ModelSpecError(f"{spec!r}: expected module:function, path/to/file.py:function or a .kir file")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            name = f"_kaun_ir_spec_{abs(hash(path))}"
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or not os.path.exists(path):
                raise ModelSpecError(f"{spec!r}: no such file {module_name!r}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = _import_module(module_name)
    except ModelSpecError:
        raise
    except Exception as err:  # ImportError or whatever the module raised while loading
        raise ModelSpecError(
            f"{spec!r}: cannot import {module_name!r}: {type(err).__name__}: {err}"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ModelSpecError(f"{spec!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn) or _is_layer(fn) or _is_graph(fn):
        return fn
    try:
        return fn()
    except Exception as err:  # whatever the user's builder raised: name the SPEC it came from
        raise ModelSpecError(
            f"{spec!r}: calling {attr}() to build the model failed: {type(err).__name__}: {err} "
            "(a SPEC names a function of no arguments returning the model; see --help)"
        ) from err


def _import_module(module_name: str):
    """Import ``module_name``; a module in the current directory is found too (the console script,
    unlike ``python -m``, does not put the working directory on ``sys.path``)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        top = module_name.split(".")[0]
        cwd = os.getcwd()
        if err.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)
        try:
            return importlib.import_module(module_name)
        finally:
            sys.path.remove(cwd)


def _is_layer(x) -> bool:
    from kaun_ir.layer import Layer

    return isinstance(x, Layer)


def _is_graph(x) -> bool:
    from kaun_ir.ir.core import Graph

    return isinstance(x, Graph)


def _is_optimizer(x) -> bool:
    from kaun_ir.optim import Algorithm

    return isinstance(x, Algorithm)


def _layer_subject(name: str, model, inputs: Sequence) -> Subject:
    from kaun_ir import dtypes, layer

    if not inputs:
        raise ModelSpecError(
            f"{name}: a layer needs an example input: add --input TYPE, e.g. --input f32[32,784]"
        )
    params, state = abstract_vars(model)
    x = inputs[0] if len(inputs) == 1 else tuple(inputs)

    def forward(params, state, x):
        return layer.apply(model, layer.Vars(params, state, dtypes.float32), x)[0]

    forward.__name__ = model.name if model.name.isidentifier() else "forward"
    return Subject(name, "layer", fn=forward, args=(params, state, x))


def resolve(spec: str, inputs: Sequence[str] = ()) -> Subject:
    """The :class:`Subject` named by ``spec``; ``inputs`` are ``--input`` types (override defaults)."""
    given = tuple(parse_input(text) for text in inputs)
    if spec.endswith(GRAPH_FILE_SUFFIXES):
        if given:
            raise ModelSpecError(
                f"{spec}: --input applies to a model named as module:function; a graph file "
                "declares its own input types"
            )
        try:
            graph = read_graph_file(spec)
        except OSError as err:
            raise ModelSpecError(f"{spec}: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise ModelSpecError(f"{spec}: not a UTF-8 text file ({err.reason})") from None
        return Subject(os.path.basename(spec).rsplit(".", 1)[0], "graph", graph=graph)

    obj = load_object(spec)
    name = spec.rpartition(":")[2]
    if _is_graph(obj):
        return Subject(name, "graph", graph=obj)
    if _is_layer(obj):
        return _layer_subject(name, obj, given)
    if isinstance(obj, Model):
        return _layer_subject(name, obj.layer, given or tuple(obj.inputs))
    if isinstance(obj, tuple) and len(obj) == 3 and _is_layer(obj[0]) and _is_optimizer(obj[1]):
        obj = TrainSetup(*obj)
    if isinstance(obj, TrainSetup):
        inputs = given or tuple(obj.inputs)
        if not inputs:
            raise ModelSpecError(
                f"{name}: the TrainSetup has no example input: give TrainSetup(..., inputs=(x,)) "
                "or add --input TYPE"
            )
        return Subject(name, "train", setup=dataclasses.replace(obj, inputs=inputs))
    if isinstance(obj, tuple) and len(obj) == 2 and callable(obj[0]) and isinstance(obj[1], (tuple, list)):
        fn, args = obj
        return Subject(name, "function", fn=fn, args=given or tuple(args))
    raise ModelSpecError(
        f"{spec!r} returned {type(obj).__name__}; expected a kn.layer.Layer, Model, "
        "(fn, example_args), a kn.Graph, TrainSetup or (model, optimizer, loss_fn_builder)"
    )


#: files the tools read as a graph: textual IR, StableHLO text, StableHLO bytecode / portable artifact
GRAPH_FILE_SUFFIXES = (".kir", ".mlir", ".mlirbc")


def looks_like_mlir(text: str) -> bool:
    """Whether ``text`` is an MLIR module rather than kaun_ir's textual IR."""
    head = text.lstrip()
    return head.startswith(("module", "func.func", "#loc", '"builtin.module"'))


def read_graph_file(path: str):
    """The graph in a ``.kir`` file, or imported from StableHLO (``.mlir`` text, ``.mlirbc``)."""
    from kaun_ir.ir import parse

    if path.endswith((".mlir", ".mlirbc")):
        return import_stablehlo(path, read_stablehlo_file(path))
    with open(path, encoding="utf-8") as handle:
        return parse(handle.read())


def read_stablehlo_file(path: str) -> str | bytes:
    """The contents of a StableHLO file: bytes for ``.mlirbc`` (bytecode / portable artifact),
    text otherwise (a ``UnicodeDecodeError`` for a file that is not UTF-8)."""
    with open(path, "rb") as handle:
        data = handle.read()
    return data if path.endswith(".mlirbc") else data.decode()


def import_stablehlo(path: str, data: str | bytes, function: str | None = None):
    """``data`` read from ``path`` imported as a graph: every command reads StableHLO this one way
    (untrusted bytes checked before MLIR parses them; errors start with ``path``)."""
    from kaun_ir.runtime.interop.stablehlo_import import from_stablehlo

    return from_stablehlo(data, function, source="<stdin>" if path == "-" else path)


def load_graph(spec: str, inputs: Sequence[str], stage: str | None):
    """``(subject, graph)`` for the tools that work on one IR graph (viz, export, stats)."""
    subject = resolve(spec, inputs)
    return subject, subject.stage_graph(stage or subject.default_stage)

"""Naming a model on the command line: ``module:function``, ``path/to/file.py:function``, a ``.kir``
file or a StableHLO module (``.mlir`` / ``.mlirbc``, imported with ``kn.ir.from_stablehlo``).

The function is called without arguments and returns one of:

* a ``kn.layer.Layer`` — its forward pass ``(params, state, x) -> y`` in evaluation mode; the
  example input comes from ``--input f32[32,784]`` (several ``--input`` give a tuple ``x``);
* :class:`Model` ``(layer, inputs)`` — a layer with default example inputs;
* ``(fn, example_args)`` — a traceable function and a tuple of example arguments (arrays or
  ``kn.ShapeDtype``); ``--input`` replaces the example arguments;
* a ``kn.Graph``;
* :class:`TrainSetup` ``(model, optimizer, loss_fn_builder, inputs)`` or the tuple
  ``(model, optimizer, loss_fn_builder)`` — a training step (``train.step_graph``).
  ``loss_fn_builder(*inputs)`` returns the ``loss_fn(y_pred) -> scalar`` of an example batch
  (closing over example targets, e.g. ``kn.ShapeDtype((32,), kn.int32)`` labels).

Parameters are never materialised: the model's ``init`` is traced to learn their shapes, so
naming a large model costs no XLA compilation. The stages of a :class:`Subject`:

===========  ===================================================================================
traced       the forward pass / function / graph as traced (for a training setup: the forward
             pass of its model)
autodiff     the ``autodiff`` pass applied to ``(params, state, x) -> sum(y)`` for a layer
             (gradients w.r.t. every floating-point input: the parameters and a float ``x``); to
             ``sum(first output)`` for a function; to the graph itself for a graph / ``.kir``
             (output 0 must be a float scalar). For a training setup: the whole training step
             (forward, backward, optimiser update) as ``train.step_graph`` traces it
optimized    ``autodiff``'s graph for training setups, else ``traced``'s, after the default
             pipeline (``kn.runtime.pipelines.train_pipeline()`` / ``jit_pipeline()``)
stablehlo    the optimized graph lowered to StableHLO text
hlo          XLA's optimised HLO after compiling the StableHLO
===========  ===================================================================================
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.errors import ModelSpecError

STAGES = ("traced", "autodiff", "optimized", "stablehlo", "hlo")
GRAPH_STAGES = ("traced", "autodiff", "optimized")


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
  TrainSetup(model, optimizer, loss_fn_builder, inputs)
                           a whole training step (forward, gradients, optimiser update)
Parameters are never materialised: naming a large model costs no XLA compilation.
"""


def examples_help() -> str:
    """The bundled example models, one line each (for ``--help``)."""
    import inspect

    from kaun_ir.tools import examples
    from kaun_ir.tools.cli import plain

    lines = ["Bundled examples (try: kaun-ir dump kaun_ir.tools.examples:mlp --stage optimized):"]
    for name, fn in inspect.getmembers(examples, inspect.isfunction):
        if (
            name.startswith("_")
            or fn.__module__ != examples.__name__
            or inspect.signature(fn).parameters
            and any(p.default is inspect.Parameter.empty for p in inspect.signature(fn).parameters.values())
        ):
            continue
        summary = plain((fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
        lines.append(f"  kaun_ir.tools.examples:{name:26s} {summary}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Model:
    """A layer with default example inputs (a tuple of arrays or ``kn.ShapeDtype``)."""

    layer: Any
    inputs: tuple = ()


@dataclass(frozen=True)
class TrainSetup:
    """A training setup: ``loss_fn_builder(*inputs)`` returns ``loss_fn(y_pred) -> scalar``."""

    model: Any
    optimizer: Any
    loss_fn_builder: Callable
    inputs: tuple = ()


def parse_input(text: str):
    """``"f32[32,784]"`` -> ``kn.ShapeDtype((32, 784), float32)``; ``ModelSpecError`` if malformed."""
    from kaun_ir.ir.tokens import parse_type
    from kaun_ir.surface.trace import ShapeDtype

    try:
        t = parse_type(text.strip())
    except (ValueError, TypeError, KeyError) as err:
        raise ModelSpecError(
            f"--input {text!r}: expected a tensor type like f32[32,784] or i32[] ({err})"
        ) from None
    return ShapeDtype(t.shape, t.dtype)


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
    return fn() if callable(fn) and not _is_layer(fn) and not _is_graph(fn) else fn


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


def abstract_vars(model, dtype=None):
    """``(params, state)`` of ``model`` as trees of ``kn.ShapeDtype``, by tracing its ``init``."""
    from kaun_ir import dtypes, layer, rng, tree
    from kaun_ir.surface.trace import ShapeDtype, trace_flat

    dtype = dtype or dtypes.float32

    def make():
        v = layer.init(model, dtype)
        return v.params, v.state

    with rng.scope(0):
        traced = trace_flat(make, (), {}, name="init")
    leaves = [ShapeDtype(t.shape, t.dtype) for t in traced.graph.output_types]
    return tree.unflatten(traced.out_treedef, leaves)


@dataclass
class Subject:
    """A named model and the stages of its IR (see the module docstring)."""

    name: str
    kind: str  # "layer" | "function" | "graph" | "train"
    fn: Callable | None = None  # the traced function (layer / function kinds)
    args: tuple = ()  # its example arguments
    graph: Any = None  # graph kind
    setup: TrainSetup | None = None
    _cache: dict = field(default_factory=dict)

    @property
    def default_stage(self) -> str:
        """What ``viz`` and ``dump --stats`` show without ``--stage``: the training step for a
        training setup, else the traced graph."""
        return "autodiff" if self.kind == "train" else "traced"

    def stage_graph(self, stage: str):
        """The IR graph of ``traced``, ``autodiff`` or ``optimized``."""
        if stage not in GRAPH_STAGES:
            raise ModelSpecError(f"stage {stage!r} is not an IR graph; choose from {', '.join(GRAPH_STAGES)}")
        if stage not in self._cache:
            self._cache[stage] = getattr(self, f"_{stage}")()
        return self._cache[stage]

    def stage_text(self, stage: str) -> str:
        """The text of any stage: textual IR, StableHLO or HLO."""
        from kaun_ir import runtime

        if stage in GRAPH_STAGES:
            return self.stage_graph(stage).text()
        if stage == "stablehlo":
            return runtime.lower(self.stage_graph("optimized"))
        if stage == "hlo":
            return runtime.compile(self.stage_graph("optimized")).hlo_text()
        raise ModelSpecError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")

    # ------------------------------------------------------------------ the stages

    def _traced(self):
        from kaun_ir.surface.trace import trace

        if self.kind == "graph":
            return self.graph
        if self.kind == "train":
            return self._train_forward()
        return trace(self.fn, *self.args)

    def _autodiff(self):
        from kaun_ir import passes

        if self.kind == "train":
            return self._train_step()
        if self.kind == "graph":
            return passes.run(self.graph, "autodiff")
        return passes.run(self._summed(), "autodiff")

    def _optimized(self):
        from kaun_ir import passes
        from kaun_ir.runtime.pipelines import jit_pipeline, train_pipeline

        if self.kind == "train":
            return passes.run(
                self.stage_graph("autodiff"),
                train_pipeline(getattr(self._trainer(), "pipeline", None)),
            )
        return passes.run(self.stage_graph("traced"), jit_pipeline())

    def _summed(self):
        """The function with its first output leaf summed to a scalar (what ``autodiff`` needs)."""
        import kaun_ir as kn
        from kaun_ir import tree

        fn = self.fn

        def summed(*args):
            first = tree.flatten(fn(*args))[0][0]
            return kn.sum(kn.astype(first, kn.float32) if not _float(first) else first)

        summed.__name__ = getattr(fn, "__name__", "main")
        return kn.trace(summed, *self.args)

    def _trainer(self):
        from kaun_ir import train

        if "trainer" not in self._cache:
            self._cache["trainer"] = train.make(self.setup.model, self.setup.optimizer)
        return self._cache["trainer"]

    def _abstract_state(self):
        """A ``train.State`` whose leaves are ``kn.ShapeDtype``: nothing runs on XLA."""
        from kaun_ir import dtypes, layer, optim, train, tree
        from kaun_ir.surface.trace import ShapeDtype, trace_flat

        trainer = self._trainer()
        params, state = abstract_vars(trainer.model)

        def opt_init(p):
            st = optim.init(trainer.optimizer, p)
            return tuple(st)

        traced = trace_flat(opt_init, (params,), {})
        leaves = [ShapeDtype(t.shape, t.dtype) for t in traced.graph.output_types]
        count, trees = tree.unflatten(traced.out_treedef, leaves)
        opt_state = optim.State(count, trees)  # state_of_trees wants a concrete count
        return train.State(
            layer.Vars(params, state, dtypes.float32), opt_state, 0, ShapeDtype((2,), dtypes.uint32)
        )

    def _x(self):
        inputs = self.setup.inputs
        return inputs[0] if len(inputs) == 1 else tuple(inputs)

    def _train_forward(self):
        from kaun_ir import train

        return train.forward_graph(self._trainer(), self._abstract_state(), self._x())

    def _train_step(self):
        from kaun_ir import train

        loss_fn = self.setup.loss_fn_builder(*self.setup.inputs)
        return train.step_graph(self._trainer(), self._abstract_state(), self._x(), loss_fn)


def _float(x) -> bool:
    from kaun_ir import dtypes
    from kaun_ir.surface.tensor import type_of

    return dtypes.is_float(type_of(x).dtype)


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
            raise ModelSpecError(f"{name}: a training setup needs an example input: add --input TYPE")
        return Subject(name, "train", setup=TrainSetup(obj.model, obj.optimizer, obj.loss_fn_builder, inputs))
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
    from kaun_ir.ir import from_stablehlo, parse

    if path.endswith(".mlirbc"):
        with open(path, "rb") as handle:
            return from_stablehlo(handle.read())
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return from_stablehlo(text) if path.endswith(".mlir") else parse(text)


def load_graph(spec: str, inputs: Sequence[str], stage: str | None):
    """``(subject, graph)`` for the tools that work on one IR graph (viz, export, stats)."""
    subject = resolve(spec, inputs)
    return subject, subject.stage_graph(stage or subject.default_stage)


# ------------------------------------------------------------------ layer paths

from kaun_ir.ir.core import path_components  # noqa: E402,F401 - re-exported for the tools


def parameter_inputs(subject: Subject, graph) -> list[int]:
    """Indices of the graph inputs that are model parameters (argument 0 of the traced forward
    pass or training step); every input for functions and graphs, whose parameters are unknown."""
    if subject.kind in ("layer", "train") and graph.input_names:
        return [i for i, name in enumerate(graph.input_names) if name == "0" or name.startswith("0.")]
    return list(range(len(graph.inputs)))

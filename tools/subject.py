"""What a model named on the command line becomes: a :class:`Subject`, the stages of its IR
from the traced graph to XLA's HLO, and the abstract (never materialised) parameters they need.

The stages of a :class:`Subject`:

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
partitioned  for a graph partitioned over a mesh (its sharding constraints name the mesh): the
             optimized graph with every value's propagated layout in its type
             (``f32[8@data,16@model]``), then the collectives XLA's partitioner inserted, per
             layer, as ``//`` comments (not in ``--all``, which writes the stages every subject has)
===========  ===================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kaun_ir.errors import KaunError, ModelSpecError

STAGES = ("traced", "autodiff", "optimized", "stablehlo", "hlo")
GRAPH_STAGES = ("traced", "autodiff", "optimized")


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
    setup: Any = None  # a kaun_ir.tools.spec.TrainSetup (train kind); spec.py imports this module
    _cache: dict = field(default_factory=dict)

    @property
    def default_stage(self) -> str:
        """What ``viz`` and ``dump --stats`` show without ``--stage``: the optimised training step
        for a training setup (the traced step is mostly the random-key bookkeeping of every
        possible dropout, which the pipeline removes: its per-layer counts would mislead), else
        the traced graph."""
        return "optimized" if self.kind == "train" else "traced"

    def stage_graph(self, stage: str):
        """The IR graph of ``traced``, ``autodiff`` or ``optimized``, its inputs named by the
        traced function's arguments (``params.0.weight``, ``x``) where they are known."""
        if stage not in GRAPH_STAGES:
            raise ModelSpecError(f"stage {stage!r} is not an IR graph; choose from {', '.join(GRAPH_STAGES)}")
        if stage not in self._cache:
            self._cache[stage] = named_inputs(getattr(self, f"_{stage}")(), self._argument_names(stage))
        return self._cache[stage]

    def _argument_names(self, stage: str) -> list[str] | None:
        """The names of the traced function's arguments, in order (None when unknown)."""
        if self.kind == "layer":
            return ["params", "state", "x"]
        if self.kind == "train":
            return ["params", "state", "x"] if stage == "traced" else list(TRAIN_STEP_ARGUMENTS)
        if self.kind == "function" and self.fn is not None:
            import inspect

            try:
                parameters = list(inspect.signature(self.fn).parameters.values())
            except (TypeError, ValueError):
                return None
            if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
                return None
            return [p.name for p in parameters]
        return None

    def stage_text(self, stage: str) -> str:
        """The text of any stage: textual IR, StableHLO or HLO."""
        from kaun_ir import runtime

        if stage in GRAPH_STAGES:
            return self.stage_graph(stage).text()
        if stage == "stablehlo":
            return runtime.lower(self.stage_graph("optimized"))
        if stage == "hlo":
            return runtime.compile(self.stage_graph("optimized")).hlo_text()
        if stage == "partitioned":
            return self.partitioned_text()
        raise ModelSpecError(f"unknown stage {stage!r}; choose from {', '.join(STAGES)}")

    def partitioned_text(self, link_gbps: float | None = None) -> str:
        """The partitioned stage: the mesh, the graph with its layouts, and the collectives per
        layer (with their time on a link of ``link_gbps`` Gbit/s) as ``//`` comments, so the text
        still parses as a graph. ``ModelSpecError`` when the graph names no mesh."""
        from kaun_ir import runtime
        from kaun_ir.runtime import partitioned

        exe = runtime.compile(self.stage_graph("optimized"))
        if exe.mesh is None:
            raise ModelSpecError(
                f"{self.name}: the partitioned stage needs a graph partitioned over a mesh "
                "(kn.sharding.constrain in the traced function names one); this one runs on one device"
            )
        axes = ", ".join(f"{name}={size}" for name, size in exe.mesh.axes)
        table = partitioned.comm_table(exe, link_gbps)
        return (
            f"// partitioned over mesh {axes}\n"
            + partitioned.partitioned_graph(exe).text()
            + "// collectives inserted by XLA's partitioner, per layer (bytes per device per call):\n"
            + "".join(f"// {line}\n" for line in table.splitlines())
        )

    # ------------------------------------------------------------------ the stages

    def _traced(self):
        from kaun_ir.surface.trace import trace

        if self.kind == "graph":
            return self.graph
        if self.kind == "train":
            return self._train_forward()
        try:
            return trace(self.fn, *self.args)
        except ModelSpecError:
            raise
        except (KaunError, TypeError, ValueError) as err:  # name the model the command line gave
            hint = ""
            if self.kind == "function" and isinstance(err, TypeError) and "argument" in str(err):
                hint = f" (called with {len(self.args)} example input(s): give one --input TYPE per argument)"
            raise ModelSpecError(f"{self.name}: {err}{hint}") from err

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
        from kaun_ir import tree
        from kaun_ir.dtypes import float32
        from kaun_ir.surface import reductions
        from kaun_ir.surface.promotion import astype
        from kaun_ir.surface.trace import trace

        fn = self.fn

        def summed(*args):
            first = tree.flatten(fn(*args))[0][0]
            return reductions.sum(astype(first, float32) if not _float(first) else first)

        summed.__name__ = getattr(fn, "__name__", "main")
        return trace(summed, *self.args)

    def _trainer(self):
        from kaun_ir import train

        if "trainer" not in self._cache:
            self._cache["trainer"] = train.make(self.setup.model, self.setup.optimizer, loss=self.setup.loss)
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

    def train_call(self) -> tuple:
        """``(trainer, state, args)`` of a training setup: ``train.step(trainer, state, *args)``
        is its step (``args``: the input and the targets, or the input and the loss closure);
        the state's leaves are ``kn.ShapeDtype``, so nothing runs."""
        if self.setup.loss is not None:
            return self._trainer(), self._abstract_state(), (self._x(), *self.setup.targets)
        try:
            loss_fn = self.setup.loss_fn_builder(*self.setup.inputs)
        except Exception as err:  # the builder was given something else, e.g. the loss itself
            raise ModelSpecError(
                f"{self.name}: TrainSetup's loss_fn_builder(*inputs) failed "
                f"({type(err).__name__}: {err}); it must return loss_fn(outputs) -> scalar for an "
                "example batch. To pass a loss of "
                "(outputs, *targets) such as loss.cross_entropy_sparse, use "
                "TrainSetup(model, optimizer, loss=fn, inputs=(x,), targets=(y,))"
            ) from err
        if not callable(loss_fn):
            raise ModelSpecError(
                f"{self.name}: TrainSetup's loss_fn_builder(*inputs) returned "
                f"{type(loss_fn).__name__}, not a function loss_fn(outputs) -> scalar; for a loss of "
                "(outputs, *targets) use "
                "TrainSetup(model, optimizer, loss=fn, inputs=(x,), targets=(y,))"
            )
        return self._trainer(), self._abstract_state(), (self._x(), loss_fn)

    def _train_step(self):
        from kaun_ir import train

        trainer, state, args = self.train_call()
        return train.step_graph(trainer, state, *args)


#: the arguments of a traced training step (``kaun_ir.train.builder``), in order
TRAIN_STEP_ARGUMENTS = ("params", "state", "opt_state", "key", "x", "targets", "ctx", "loss")


def named_inputs(graph, names: list[str] | None):
    """``graph`` with input names whose leading argument index (``0.0.weight``, ``2``) is replaced
    by the argument's name (``params.0.weight``, ``x``); unchanged when ``names`` is None."""
    if names is None or not graph.input_names:
        return graph
    renamed = []
    for name in graph.input_names:
        head, dot, rest = name.partition(".")
        if head.isdigit() and int(head) < len(names):
            name = names[int(head)] + dot + rest
        renamed.append(name)
    return type(graph)(graph.inputs, graph.outputs, graph.nodes, graph.name, renamed)


def _float(x) -> bool:
    from kaun_ir import dtypes
    from kaun_ir.surface.tensor import type_of

    return dtypes.is_float(type_of(x).dtype)


def parameter_inputs(subject: Subject, graph) -> list[int]:
    """Indices of the graph inputs that are model parameters (argument 0 of the traced forward
    pass or training step); every input for functions and graphs, whose parameters are unknown."""
    if subject.kind in ("layer", "train") and graph.input_names:
        return [
            i
            for i, name in enumerate(graph.input_names)
            if name in ("0", "params") or name.startswith(("0.", "params."))
        ]
    return list(range(len(graph.inputs)))

"""The walk of a ``torch.export`` program's FX graph: each node's ATen op applied as its function in
``torch_ops.ATEN``, recorded with the node's layer path and source line, its result's type checked
against the type PyTorch recorded for the node.

:class:`Program` is what ``from_torch``, ``torch_inputs`` and ``torch_function`` (in
``torch_import``) share: the decomposed program, its inputs' kinds and types, and ``run``.
torch is imported only when a program is walked (it is an optional extra).
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from kaun_ir.errors import KaunError, TorchImportError
from kaun_ir.ir.builder import current_path, location
from kaun_ir.ir.core import TensorType
from kaun_ir.runtime.interop.torch_ops import ATEN, dtype_of_torch
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import type_of

__all__ = ["Program", "load_torch", "program_of", "quiet_torch_warnings"]

#: the user-facing names of the higher-order ops torch.export records
HIGHER_ORDER = {
    "cond": "torch.cond",
    "while_loop": "torch.while_loop",
    "map_impl": "torch.map",
    "scan": "torch.scan",
    "associative_scan": "torch.associative_scan",
}
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def load_torch():
    """The torch module."""
    import torch  # noqa: PLC0415 - optional package (the interop extra), loaded on first use

    return torch


#: the one FutureWarning torch (2.10 and later) prints from its own code when a program is exported
#: or decomposed (its pytree's deprecated ``LeafSpec``): nothing a user of kaun_ir can act on
_TORCH_TREESPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def quiet_torch_warnings():
    """Silence exactly torch's internal ``LeafSpec`` FutureWarning while kaun_ir calls into
    ``torch.export``; every other warning (and this one outside the block) is shown as usual."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_TREESPEC_WARNING, category=FutureWarning)
        yield


class _Missing:
    """An output an op's mapping does not compute; using it is an error."""

    def __init__(self, op: str, where: str):
        self.op, self.where = op, where


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    fqn = list(stack.values())[-1][0]
    # a module called more than once is recorded as "name@2"
    return ".".join(part.split("@")[0] for part in str(fqn).split(".") if part.split("@")[0])


def _source(node, skip: str) -> str:
    """``file:line`` of the innermost frame of the node's stack trace outside torch itself."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    outside = [f for f in frames if not f[0].startswith("<") and not os.path.realpath(f[0]).startswith(skip)]
    if not outside:
        return ""
    filename, line = outside[-1]
    return f"{os.path.basename(filename)}:{line}"


def _expected_type(val) -> TensorType | None:
    if val is None or not (hasattr(val, "shape") and hasattr(val, "dtype")):
        return None
    return TensorType(dtype_of_torch(val.dtype), tuple(int(s) for s in val.shape))


def _where(path: str, source: str) -> str:
    parts = [f"module '{path}'" if path else "the top-level module"]
    if source:
        parts.append(source)
    return " at ".join(parts)


class Program:
    """A decomposed ExportedProgram and the walk of its FX graph."""

    def __init__(self, exported):
        torch = load_torch()
        if not isinstance(exported, torch.export.ExportedProgram):
            raise TypeError(
                f"from_torch takes a torch.export.ExportedProgram (torch.export.export(module, args)), "
                f"got {type(exported).__name__}"
            )
        with quiet_torch_warnings():
            self.program = exported.run_decompositions()
        self.torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
        signature = self.program.graph_signature
        self.input_specs = list(signature.input_specs)
        self.output_specs = list(signature.output_specs)
        self.placeholders = [n for n in self.program.graph.nodes if n.op == "placeholder"]
        self.kinds = torch.export.graph_signature.InputKind, torch.export.graph_signature.OutputKind
        for spec in self.input_specs:
            if spec.kind not in (
                self.kinds[0].PARAMETER,
                self.kinds[0].BUFFER,
                self.kinds[0].CONSTANT_TENSOR,
                self.kinds[0].USER_INPUT,
            ):
                raise TorchImportError(f"input {spec.arg} of kind {spec.kind.name} is not supported")
        self.input_types = []
        for node in self.placeholders:
            expected = _expected_type(node.meta.get("val"))
            if expected is None:
                raise TorchImportError(f"input {node.name} is not a tensor (got {node.meta.get('val')!r})")
            self.input_types.append(expected)

    def input_names(self) -> list[str]:
        """Parameter, buffer and constant inputs by their state_dict names, user inputs by theirs."""
        return [
            spec.arg.name if spec.kind == self.kinds[0].USER_INPUT else spec.target
            for spec in self.input_specs
        ]

    def run(self, inputs: Sequence[Any]) -> list:
        """The program's outputs (``output_specs`` order) on ``inputs`` (placeholder order)."""
        if len(inputs) != len(self.placeholders):
            raise TorchImportError(f"the program takes {len(self.placeholders)} inputs, got {len(inputs)}")
        env: dict = dict(zip(self.placeholders, inputs))
        prefix = current_path()
        for node in self.program.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outs = self._resolve(node.args[0], env, "the program's output")
                return list(outs)
            if node.op == "get_attr":  # a subgraph of a higher-order op: named by the op that uses it
                env[node] = _Missing(f"subgraph {node.name}", "")
                continue
            if node.op != "call_function":
                raise TorchImportError(f"FX node {node.name} ({node.op}) is not supported")
            env[node] = self._call(node, env, prefix)
        raise TorchImportError("the program has no output node")

    def _resolve(self, arg, env: dict, user: str):
        torch = load_torch()
        if isinstance(arg, torch.fx.Node):
            value = env[arg]
            if isinstance(value, _Missing):
                raise TorchImportError(
                    f"{user} uses an output of {value.op} ({value.where}) "
                    "that kaun_ir's mapping does not compute"
                )
            return value
        if isinstance(arg, tuple):
            return tuple(self._resolve(a, env, user) for a in arg)
        if isinstance(arg, list):
            return [self._resolve(a, env, user) for a in arg]
        if isinstance(arg, dict):
            return {k: self._resolve(v, env, user) for k, v in arg.items()}
        if isinstance(arg, torch.dtype):
            return str(arg)
        return arg

    def _call(self, node, env: dict, prefix: str):
        path = _module_path(node)
        source = _source(node, self.torch_dir)
        where = _where(path, source)
        if node.target is operator.getitem:
            container, i = node.args
            return env[container][i]
        name = str(node.target)
        handler = ATEN.get(name)
        if handler is None and isinstance(node.target, load_torch()._ops.HigherOrderOperator):
            construct = HIGHER_ORDER.get(node.target.name(), f"torch.ops.higher_order.{node.target.name()}")
            raise TorchImportError(
                f"{construct} in {where}: higher-order control flow is not supported by the PyTorch "
                "importer; compute both branches and select with torch.where, or unroll the loop"
            )
        if handler is None:
            raise TorchImportError(f"{name} in {where}: this ATen op has no mapping in kaun_ir's op table")
        args = self._resolve(node.args, env, f"{name} in {where}")
        kwargs = self._resolve(dict(node.kwargs), env, f"{name} in {where}")
        full_path = ".".join(p for p in (prefix, path) if p)
        with location(path=full_path, source=source):
            try:
                result = handler(*args, **kwargs)
            except (KaunError, TypeError, ValueError, IndexError) as err:
                raise TorchImportError(f"{name} in {where}: {err}") from err
            return self._check(result, node.meta.get("val"), name, where)

    def _check(self, result, val, name: str, where: str):
        if isinstance(val, (list, tuple)):
            if not isinstance(result, (list, tuple)) or len(result) != len(val):
                raise TorchImportError(
                    f"{name} in {where}: the mapping returned {result!r}, not {len(val)} outputs"
                )
            return tuple(
                _Missing(f"{name} (output {i})", where) if r is None else self._check(r, v, name, where)
                for i, (r, v) in enumerate(zip(result, val))
            )
        expected = _expected_type(val)
        if expected is None or result is None:
            return _Missing(name, where) if result is None else result
        got = type_of(result)
        if got.shape != expected.shape:
            raise TorchImportError(
                f"{name} in {where}: the mapping gives {got}, "
                f"PyTorch's program says {expected} (a mapping mistake)"
            )
        return result if got.dtype == expected.dtype else astype(result, expected.dtype)


def program_of(exported) -> Program:
    """The :class:`Program` of an ExportedProgram, made once per program (kept while it lives)."""
    try:
        cached = _PROGRAMS.get(exported)
    except TypeError:
        cached = None
    if cached is None:
        cached = Program(exported)
        try:
            _PROGRAMS[exported] = cached
        except TypeError:
            pass
    return cached

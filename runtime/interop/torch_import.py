"""PyTorch programs in: a ``torch.export`` program becomes a kaun_ir graph, or a traceable function.

    graph = kn.ir.from_torch(torch.export.export(module, (x,)))
    fn, params = kn.interop.torch_function(module, x)

The program is first brought to the core ATen opset (``ExportedProgram.run_decompositions()``),
then its FX graph is walked node by node, each ATen op applied as the function of
``torch_ops.ATEN`` that writes it with kaun_ir's NumPy-style surface. Walking inside a trace
records our own graph; walking on concrete arrays runs it eagerly; walking inside ``kn.jit``,
``kn.grad`` or ``kn.vmap`` makes the program part of the traced function, which is how
``torch_function`` gets derivatives and batching from the op table's own rules.

Each node is recorded with the layer path of the module that ran it (``nn_module_stack``) and
the ``file:line`` of the Python line that called the op (the node's ``stack_trace``). Each
result's type is checked against the type PyTorch recorded for the node: a different shape is a
mapping mistake and raises :class:`TorchImportError`, a different dtype (promotion rules differ
at the edges) is converted to PyTorch's. PyTorch's 64-bit integers become 32-bit ones.

torch is imported only when a function of this module is called (it is an optional extra).
"""

from __future__ import annotations

import operator
import os
import re
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import dtypes
from kaun_ir.errors import KaunError, TorchImportError
from kaun_ir.ir.builder import Builder, current_path, location
from kaun_ir.ir.core import Graph, TensorType
from kaun_ir.runtime.interop.torch_ops import ATEN, dtype_of_torch
from kaun_ir.surface.promotion import astype
from kaun_ir.surface.tensor import Tensor, to_value, type_of
from kaun_ir.tree import nested as nested_tree

__all__ = ["TorchFunction", "covered_ops", "from_torch", "torch_function", "torch_inputs"]

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _torch():
    import torch  # noqa: PLC0415 - optional package (the interop extra), loaded on first use

    return torch


def covered_ops() -> list[str]:
    """The ATen ops the importer maps, sorted (``"aten.addmm.default"`` ...)."""
    return sorted(ATEN)


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
    outside = [f for f in frames if not os.path.realpath(f[0]).startswith(skip)] or frames
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


class _Program:
    """A decomposed ExportedProgram and the walk of its FX graph."""

    def __init__(self, exported):
        torch = _torch()
        if not isinstance(exported, torch.export.ExportedProgram):
            raise TypeError(
                f"from_torch takes a torch.export.ExportedProgram (torch.export.export(module, args)), "
                f"got {type(exported).__name__}"
            )
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
            if node.op != "call_function":
                raise TorchImportError(f"FX node {node.name} ({node.op}) is not supported")
            env[node] = self._call(node, env, prefix)
        raise TorchImportError("the program has no output node")

    def _resolve(self, arg, env: dict, user: str):
        torch = _torch()
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


def _program(exported) -> _Program:
    try:
        cached = _PROGRAMS.get(exported)
    except TypeError:
        cached = None
    if cached is None:
        cached = _Program(exported)
        try:
            _PROGRAMS[exported] = cached
        except TypeError:
            pass
    return cached


def from_torch(exported_program, name: str = "main") -> Graph:
    """A ``torch.export.ExportedProgram`` as a kaun_ir :class:`Graph`.

    The program is decomposed to core ATen (``run_decompositions()``) and its FX graph walked.
    The graph's inputs are the program's parameters, buffers and lifted constants in
    ``graph_signature`` order, followed by its user inputs (flattened); its outputs are the
    program's outputs in ``graph_signature`` order: the updated buffers (batch norm in train
    mode) first, then the user outputs. :func:`torch_inputs` gives the arrays to call it with.
    Raises :class:`TorchImportError` naming the ATen op and the module path for an op with no
    mapping.
    """
    program = _program(exported_program)
    with Builder(record_source=False) as builder:
        args = [Tensor(builder.add_input(t), builder) for t in program.input_types]
        outs = program.run(args)
        values = [to_value(builder, out) for out in outs]
    return Graph.from_outputs(builder.inputs, values, name, program.input_names())


def _to_numpy(x) -> np.ndarray:
    """An array for kaun_ir from a torch tensor or an array: 64-bit integers become 32-bit
    (TorchImportError when a value does not fit)."""
    torch = _torch()
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.float().numpy().astype(dtypes.bfloat16)
        x = t.numpy().copy()  # a copy: the module may later update its tensors in place
    arr = np.asarray(x)
    for wide, narrow in ((np.int64, np.int32), (np.uint64, np.uint32)):
        if arr.dtype == wide:
            info = np.iinfo(narrow)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise TorchImportError(
                    f"a {arr.dtype} tensor of shape {arr.shape} holds values in [{arr.min()}, {arr.max()}], "
                    f"outside {np.dtype(narrow)} (64-bit integers become 32-bit ones): they would wrap"
                )
            return arr.astype(narrow)
    return arr


def _leaves(args) -> list:
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(_leaves(a))
        elif isinstance(a, dict):
            out.extend(_leaves([a[k] for k in a]))
        else:
            out.append(a)
    return out


def torch_inputs(exported_program, *args) -> list[np.ndarray]:
    """The flat list of arrays to call :func:`from_torch`'s graph with: the program's parameters,
    buffers and constants (``graph_signature`` order), then ``args`` flattened."""
    program = _program(exported_program)
    user = iter(_leaves(args))
    kind = program.kinds[0]
    flat = []
    state, constants = program.program.state_dict, program.program.constants
    for spec in program.input_specs:
        if spec.kind == kind.USER_INPUT:
            try:
                flat.append(_to_numpy(next(user)))
            except StopIteration:
                raise TorchImportError(
                    f"the program takes {sum(s.kind == kind.USER_INPUT for s in program.input_specs)} "
                    f"user inputs, got {len(_leaves(args))}"
                ) from None
        else:
            flat.append(_to_numpy(state[spec.target] if spec.target in state else constants[spec.target]))
    return flat


def _lookup(tree, key: str):
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"params has no entry '{key}' (a state_dict name of the module)")
        node = node[part]
    return node


class TorchFunction:
    """``fn(params, *args)``: an exported PyTorch module as a traceable kaun_ir function.

    ``params`` is a tree of the module's floating-point ``state_dict`` entries (parameters and
    buffers), nested by the dots of their names. When the program updates buffers (batch norm
    in train mode) the call returns ``(output, buffers)``, ``buffers`` the tree of the updated
    floating-point buffers. Attributes: ``program`` (the decomposed ``ExportedProgram``),
    ``parameter_names`` and ``buffer_names`` (the names in ``params`` of each kind), ``training``.
    """

    def __init__(self, program: _Program, names: dict, constants: dict, training: bool):
        self._program = program
        self.program = program.program
        self._constants = constants
        self._names = names  # the program's name of each entry of params -> its name in params
        kind = program.kinds[0]
        self.parameter_names = tuple(
            names[s.target] for s in program.input_specs if s.kind == kind.PARAMETER and s.target in names
        )
        self.buffer_names = tuple(
            names[s.target] for s in program.input_specs if s.kind == kind.BUFFER and s.target in names
        )
        self.training = training
        self.__name__ = "torch_function"

    def __call__(self, params, *args):
        kind, out_kind = self._program.kinds
        user = iter(_leaves(args))
        inputs = []
        for spec, expected in zip(self._program.input_specs, self._program.input_types):
            if spec.kind == kind.USER_INPUT:
                try:
                    leaf = next(user)
                except StopIteration:
                    raise TorchImportError(
                        "the function was called with fewer inputs than it was exported with"
                    ) from None
                leaf = leaf if isinstance(leaf, Tensor) else _to_numpy(leaf)
                if tuple(type_of(leaf).shape) != expected.shape:
                    raise TorchImportError(
                        f"input {spec.arg.name} has shape {list(type_of(leaf).shape)}, but the program was "
                        f"exported for {list(expected.shape)}: "
                        "export with inputs of the shape it is called with"
                    )
                inputs.append(leaf)
            elif spec.target in self._names:
                inputs.append(_lookup(params, self._names[spec.target]))
            else:
                inputs.append(self._constants[spec.target])
        outs = self._program.run(inputs)
        torch = _torch()
        user_outs = [o for o, s in zip(outs, self._program.output_specs) if s.kind == out_kind.USER_OUTPUT]
        result = torch.utils._pytree.tree_unflatten(user_outs, self.program.call_spec.out_spec)
        updated = {
            self._names[s.target]: o
            for o, s in zip(outs, self._program.output_specs)
            if s.kind == out_kind.BUFFER_MUTATION and s.target in self._names
        }
        return (result, nested_tree(updated)) if updated else result


def torch_function(module, *example_args) -> tuple[TorchFunction, dict]:
    """``fn, params``: ``module`` exported with ``torch.export`` at ``example_args`` (in its
    current train/eval mode) as a traceable kaun_ir function ``fn(params, *args)``.

    ``params`` holds the module's floating-point ``state_dict`` entries as float32 NumPy arrays
    (other floating dtypes kept), nested by the dots of their names, so that
    ``kn.ptree.flatten_with_paths(params)`` gives the ``state_dict`` names. A weight tied under
    two names appears once, under the name the program reads. Integer buffers (batch norm's
    ``num_batches_tracked``), non-persistent buffers and constants are held by ``fn``. See
    :class:`TorchFunction` for what a call returns.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torch_function takes a torch.nn.Module, got {type(module).__name__}")
    example = tuple(
        a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a)) for a in example_args
    )
    program = _Program(torch.export.export(module, example))
    kind = program.kinds[0]
    entries = module.state_dict(keep_vars=True)
    # a tensor under several names (tied weights) goes by its first name, as in named_parameters()
    first: dict = {}
    for name, tensor in entries.items():
        first.setdefault((tensor.data_ptr(), tuple(tensor.shape), tensor.dtype), name)
    state, constants_of = program.program.state_dict, program.program.constants
    params, constants, names = {}, {}, {}
    for spec in program.input_specs:
        if spec.kind == kind.USER_INPUT:
            continue
        tensor = state[spec.target] if spec.target in state else constants_of[spec.target]
        value = _to_numpy(tensor)
        trainable = spec.kind in (kind.PARAMETER, kind.BUFFER) and spec.target in entries
        if trainable and (np.issubdtype(value.dtype, np.floating) or value.dtype == dtypes.bfloat16):
            t = entries[spec.target]
            names[spec.target] = first[(t.data_ptr(), tuple(t.shape), t.dtype)]
            params[names[spec.target]] = value
        else:
            constants[spec.target] = value
    return TorchFunction(program, names, constants, module.training), nested_tree(params)

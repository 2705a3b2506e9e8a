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

The walk itself is ``torch_program.Program``. torch is imported only when a function of this
module is called (it is an optional extra).
"""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes, tree
from kaun_ir.errors import TorchImportError
from kaun_ir.ir.builder import Builder
from kaun_ir.ir.core import Graph
from kaun_ir.runtime.interop.torch_export import export
from kaun_ir.runtime.interop.torch_ops import ATEN
from kaun_ir.runtime.interop.torch_program import Program, program_of
from kaun_ir.runtime.interop.torch_program import load_torch as _torch
from kaun_ir.surface.tensor import Tensor, to_value, type_of
from kaun_ir.surface.trace import ShapeDtype, trace_flat
from kaun_ir.tree import nested as nested_tree

__all__ = ["TorchFunction", "covered_ops", "from_torch", "torch_function", "torch_inputs"]


def covered_ops() -> list[str]:
    """The ATen ops the importer maps, sorted (``"aten.addmm.default"`` ...)."""
    return sorted(ATEN)


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
    program = program_of(exported_program)
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
    program = program_of(exported_program)
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

    def __init__(self, program: Program, names: dict, constants: dict, training: bool):
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
        inputs_seen: list = []  # the user inputs so far, for the error's position
        for spec, expected in zip(self._program.input_specs, self._program.input_types):
            if spec.kind == kind.USER_INPUT:
                try:
                    leaf = next(user)
                except StopIteration:
                    raise TorchImportError(
                        "the function was called with fewer inputs than it was exported with"
                    ) from None
                leaf = leaf if isinstance(leaf, Tensor) else _to_numpy(leaf)
                inputs_seen.append(leaf)
                if tuple(type_of(leaf).shape) != expected.shape:
                    raise TorchImportError(
                        f"torch_function: input {len(inputs_seen)} ({spec.arg.name!r} in the program) "
                        f"has shape {list(type_of(leaf).shape)}, but the program was exported for "
                        f"{list(expected.shape)}: export it with example inputs of the shape it is "
                        "called with"
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
    program = Program(export(torch, module, example))
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
    fn, params = TorchFunction(program, names, constants, module.training), nested_tree(params)
    _check_coverage(fn, params, example)
    return fn, params


def _check_coverage(fn: TorchFunction, params: dict, example: tuple) -> None:
    """Walk the program once abstractly (nothing runs): an op without a mapping, a construct the
    importer refuses (torch.cond, dropout in train mode ...) raises here, when the module is
    imported, not at the first call after a trainer and a data pipeline were built."""
    abstract = [ShapeDtype(tuple(a.shape), _to_numpy(a.reshape(-1)[:0]).dtype) for a in example]
    leaves, treedef = tree.flatten(params)
    abstract_params = tree.unflatten(treedef, [ShapeDtype(v.shape, v.dtype) for v in leaves])
    trace_flat(fn, (abstract_params, *abstract), {})

"""A PyTorch module as a kaun_ir layer: ``kn.interop.torch_layer(module, *example_args)``.

:func:`torch_function` gives a traceable function of every floating-point ``state_dict`` entry;
a training loop then has to split the trainable parameters from the buffers, thread the buffers
a train-mode batch norm updates, and pick the program of the right mode. :func:`torch_layer` does
that once and returns a ``kn.layer.Layer``:

- ``params``: the module's parameters that require a gradient, nested by the dots of their
  ``state_dict`` names (what an optimiser updates);
- ``state``: its floating-point buffers (batch norm's ``running_mean`` / ``running_var``) and
  any parameter that requires no gradient; ``apply(..., training=True)`` returns the buffers the
  train-mode program updated;
- ``apply(training=True)`` runs the module exported in train mode, ``training=False`` the module
  exported in eval mode (batch norm reads the running statistics), so ``train.step`` /
  ``train.fit`` train it and ``train.predict`` / ``train.evaluate`` evaluate it.

The layer is built from ``kn.layer``'s records, which sit above the runtime: it reaches them
through a slot the composition root fills (:mod:`kaun_ir.wiring`), as the IR reaches the runtime's
importers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kaun_ir import dtypes, hooks
from kaun_ir import tree as trees
from kaun_ir.runtime.interop.torch_import import torch_function
from kaun_ir.runtime.interop.torch_program import load_torch

__all__ = ["torch_layer", "install_layer_records"]

# kn.layer's Layer and Vars records, filled by the composition root
_RECORDS: dict = {}


def install_layer_records(layer_class: type, vars_class: type) -> None:
    """Fill the slot with ``kn.layer.Layer`` and ``kn.layer.Vars`` (the composition root does)."""
    _RECORDS["layer"], _RECORDS["vars"] = layer_class, vars_class


def _records() -> tuple[type, type]:
    if not _RECORDS:
        hooks.ensure_installed()
    return _RECORDS["layer"], _RECORDS["vars"]


def _modes(module) -> dict:
    return {sub: sub.training for sub in module.modules()}


def _export_both(module, example_args: tuple) -> tuple:
    """``(train_fn, eval_fn, params)``: the module exported in train and in eval mode (its own
    modes are restored afterwards, submodule by submodule)."""
    saved = _modes(module)
    try:
        module.train()
        train_fn, params = torch_function(module, *example_args)
        module.eval()
        eval_fn, _ = torch_function(module, *example_args)
    finally:
        for sub, mode in saved.items():
            sub.training = mode
    return train_fn, eval_fn, params


def _split(module, params: dict, buffer_names: tuple) -> tuple[dict, dict]:
    """``(trainable, state)`` trees: parameters requiring a gradient, and the rest (buffers,
    frozen parameters), each nested by the dots of their names."""
    requires = {name: p.requires_grad for name, p in module.named_parameters()}
    trainable, state = [], []
    for path, value in trees.paths(params):
        wanted = path not in buffer_names and requires.get(path, True)
        (trainable if wanted else state).append((path, value))
    return trees.nested(trainable), trees.nested(state)


def _mutates(fn) -> bool:
    """Whether the program updates buffers (then a call returns ``(output, buffers)``)."""
    out_kind = fn._program.kinds[1]
    return any(s.kind == out_kind.BUFFER_MUTATION and s.target in fn._names for s in fn._program.output_specs)


def _float_dtype(params: dict) -> Any:
    for _, leaf in trees.paths(params):
        return dtypes.canonical(leaf.dtype)
    return dtypes.float32


def _check_module(module, example_args: tuple, name: Any) -> None:
    torch = load_torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"torch_layer: module must be a torch.nn.Module, got {type(module).__name__}")
    if not example_args:
        raise TypeError(
            "torch_layer: give the example inputs the module is exported at, e.g. "
            "torch_layer(module, torch.randn(8, 3, 32, 32)); the layer takes inputs of those shapes"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"torch_layer: name must be a str, got {name!r}")


def torch_layer(module, *example_args, name: str | None = None):
    """``module`` (a ``torch.nn.Module``) as a ``kn.layer.Layer``, exported with
    ``torch.export`` at ``example_args`` in train mode and in eval mode.

    ``layer.init(model)`` gives ``Vars(params, state, dtype)``: ``params`` the parameters that
    require a gradient and ``state`` the floating-point buffers (batch norm statistics) and the
    parameters that require none, both nested by the dots of their ``state_dict`` names, copied
    from the module as it is now (``dtype``: the module's floating dtype; ``layer.init`` with
    another dtype is a ``ValueError``: convert the module with ``module.to(...)`` first).
    ``apply(params, state, x, training=True)`` runs the train-mode program and returns the
    buffers it updated as the new state (batch norm's running statistics; a module with several
    inputs takes ``x`` as a tuple of them); ``training=False`` runs the eval-mode program.

    Inputs have the example inputs' shapes (as for :func:`torch_function`). Integer buffers
    (``num_batches_tracked``) are constants of the programs, so a batch norm with
    ``momentum=None`` (a cumulative average) is not followed. ``name`` (default: the module's
    class name) is the layer's name in layer paths.
    """
    _check_module(module, example_args, name)
    train_fn, eval_fn, all_params = _export_both(module, example_args)
    params, state = _split(module, all_params, train_fn.buffer_names)
    own_dtype = _float_dtype(all_params)
    mutates = _mutates(train_fn)
    layer_class, vars_class = _records()
    label = name or type(module).__name__

    def init(dtype):
        if dtypes.canonical(dtype) != own_dtype:
            raise ValueError(
                f"torch_layer {label!r}: the module's parameters are {own_dtype}, layer.init asked for "
                f"{dtypes.canonical(dtype)}; convert the module (module.to(...)) before torch_layer, "
                f"or init with dtype={own_dtype}"
            )
        copy = lambda tree: trees.nested([(p, np.array(v)) for p, v in trees.paths(tree)])  # noqa: E731
        return vars_class(copy(params), copy(state), own_dtype)

    def apply(p, s, x, *, training, ctx):
        merged = trees.nested(trees.paths(p) + trees.paths(s))
        args = tuple(x) if isinstance(x, tuple) and len(example_args) > 1 else (x,)
        if not training:
            return eval_fn(merged, *args), s
        result = train_fn(merged, *args)
        if not mutates:  # nothing updated: the program returns the output alone
            return result, s
        out, updated = result
        new = dict(trees.paths(s))
        new.update(trees.paths(updated))
        return out, trees.nested(list(new.items()))

    return layer_class(init, apply, label)

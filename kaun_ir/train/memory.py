"""``kn.memory_report``: where a compiled step's memory goes, and what rematerialisation saves.

``kn.memory_report(trainer, st, x, *targets)`` compiles (never runs) the training step, replays
its schedule (:mod:`kaun_ir.runtime.memory`) with every argument named (parameters, optimiser
state, layer state, inputs) and every buffer attributed to its layer through the lowering's
``op_name`` metadata, and compiles the step again under each rematerialisation policy of
``remat=`` to give the figure each one reaches. ``kn.memory_report(fn, *args)`` does the same for
any function (its arguments are ``inputs``; no remat rows). See docs/memory.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kaun_ir import ptree, tree
from kaun_ir.ir.core import Graph
from kaun_ir.runtime import jit
from kaun_ir.runtime.compilation import compile_graph
from kaun_ir.runtime.executable import Executable
from kaun_ir.runtime.memory import MemoryReport, analyse
from kaun_ir.train.inspection import step_executable
from kaun_ir.train.state import State, Trainer
from kaun_ir.transforms.remat import as_policy

__all__ = ["memory_report", "executable_report"]

#: the policies ``memory_report`` measures by default
DEFAULT_POLICIES = ("nothing", "dots")


def executable_report(
    exe: Executable, argument_kinds=None, argument_layers=None, loss_output: int | None = None
) -> MemoryReport:
    """The :class:`~kaun_ir.runtime.memory.MemoryReport` of a compiled executable (``loss_output``:
    the index of the loss among its outputs, for a training step)."""
    stats = exe.memory_analysis()
    if stats is None:
        raise ValueError("memory report: this backend keeps no compiled memory statistics")
    return analyse(exe.hlo_text(), stats, argument_kinds, argument_layers, loss_output)


def _step_arguments(st: State, x: Any, targets: tuple) -> tuple[list, list]:
    """Kind and layer of every argument of the compiled step, in the executable's order
    (params, layer state, optimiser state, key, x, targets)."""
    kinds, layers = [], []

    def add(kind: str, t: Any, named: bool) -> None:
        for path, _ in (
            ptree.flatten_with_paths(t) if named else [("(inputs)", leaf) for leaf in tree.flatten(t)[0]]
        ):
            kinds.append(kind)
            layers.append(path.rsplit(".", 1)[0] if named and "." in path else (path or "(root)"))

    add("parameters", st.vars.params, True)
    add("layer state", st.vars.state, True)
    param_paths = {path for path, _ in ptree.flatten_with_paths(st.vars.params)}
    for path, _ in ptree.flatten_with_paths(list(st.opt_state)):
        # a slot mirrors the parameters: its path ends with the parameter's
        tokens = path.split(".")
        owner = next(
            (".".join(tokens[i:]) for i in range(len(tokens)) if ".".join(tokens[i:]) in param_paths), ""
        )
        kinds.append("optimiser state")
        layers.append(owner.rsplit(".", 1)[0] if "." in owner else "optimizer")
    kinds.append("inputs")  # the rng key
    layers.append("rng")
    for _leaf in tree.flatten((x, targets))[0]:
        kinds.append("inputs")
        layers.append("(batch)")
    return kinds, layers


def _checked_policy(policy: Any) -> Any:
    """``policy`` if ``train.make(..., remat=policy)`` takes it, else a ``ValueError`` now (before
    the first of the report's compilations)."""
    try:
        as_policy(policy)
    except (TypeError, ValueError) as err:
        raise ValueError(f"kn.memory_report: remat policy {policy!r}: {err}") from None
    return policy


def memory_report(step: Any, *args: Any, remat: Sequence = DEFAULT_POLICIES, **kwargs: Any) -> MemoryReport:
    """Explain the memory of a compiled step (compiled, never run).

    - ``memory_report(trainer, st, x, *targets)``: the training step of ``train.step``; the
      report names parameters, optimiser state, layer state and inputs, sorts the buffers live
      at the peak into activations saved for the backward pass and temporaries, and, for each
      policy of ``remat`` (``"nothing"``, ``"dots"``, a ``kn.RematPolicy`` ...), compiles the
      step with ``train.make(..., remat=policy)`` and records XLA's statistics and the replayed
      peak (``report.remat``; an empty ``remat=()`` skips it);
    - ``memory_report(fn, *args)`` (a function or ``kn.jit`` function and example arguments) or
      ``memory_report(graph)``: the compiled function; its arguments are inputs.

    ``print(report)`` shows the table; see :class:`~kaun_ir.runtime.memory.MemoryReport`.
    """
    if isinstance(remat, str):  # one policy named alone
        remat = (remat,)
    if not isinstance(remat, list | tuple):
        raise TypeError(f"kn.memory_report: remat must be a list of remat policies, got {remat!r}")
    remat = [_checked_policy(policy) for policy in remat]
    if isinstance(step, Trainer):
        if not args or not isinstance(args[0], State):
            raise TypeError("kn.memory_report(trainer, st, x, *targets): st must be a train.State")
        st, x, targets = args[0], args[1], tuple(args[2:])
        kinds, layers = _step_arguments(st, x, targets)
        report = executable_report(step_executable(step, st, x, *targets, **kwargs), kinds, layers, 0)
        for policy in remat:
            other = dataclasses.replace(step, remat=(as_policy(policy), 1))
            measured = executable_report(step_executable(other, st, x, *targets, **kwargs), kinds, layers, 0)
            report.remat.append((policy, measured.stats, measured.peak_bytes))
        return report
    if isinstance(step, Graph):
        graph = step
    elif callable(step):
        fn = step if hasattr(step, "graph") else jit(step)
        graph = fn.graph(*args, **kwargs)
    else:
        raise TypeError(
            f"kn.memory_report: expected a trainer, a function or a kn.Graph, got {type(step).__name__}"
        )
    return executable_report(compile_graph(graph))

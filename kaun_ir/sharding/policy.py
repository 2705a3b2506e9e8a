"""Parameter layouts for training on a mesh: data parallel, fully sharded (FSDP), rule tables.

A *policy* says how each parameter (and its optimiser state) is laid out on the mesh:

- ``None`` / ``"replicated"``: every device holds every parameter (data parallelism);
- ``"fsdp"``: each parameter is split along the data axis over its largest dimension that the
  axis divides (FSDP / ZeRO-3: parameters, gradients and optimiser state all sharded; XLA
  gathers a parameter where it is used and reduce-scatters its gradient);
- a rule table: ``[(pattern, spec), ...]`` (or a dict), where ``pattern`` is a glob over the
  dotted parameter path (``"*.attn.query.weight"``, ``"*fc1.*"``) and the first matching rule
  gives the spec (a ``Spec``, a tuple of entries, ``"fsdp"`` or ``None``); unmatched parameters
  are replicated. This is how tensor parallelism is written: :func:`attention_rules` and
  :func:`mlp_rules` give the Megatron-style tables for ``multi_head_attention`` and a pair of
  ``linear`` layers;
- :func:`rules` ``(table, fsdp=True)``: a table whose parameters are additionally split along
  the data axis over a dimension the table left unsplit, unmatched ones fully sharded (FSDP
  combined with tensor parallelism).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import numpy as np

from kaun_ir import optim, ptree, tree
from kaun_ir.runtime.mesh import REPLICATED, Mesh, Spec, as_spec
from kaun_ir.runtime.xla import shardings, transfer

__all__ = ["Rules", "rules", "param_specs", "attention_rules", "mlp_rules", "fsdp_spec"]


@dataclass(frozen=True)
class Rules:
    """A rule table (``((pattern, value), ...)``) and whether FSDP applies on top of it."""

    table: tuple
    fsdp: bool = False


def rules(table: Any, fsdp: bool = False) -> Rules:
    """A policy from a rule table (see the module docstring); ``fsdp=True`` adds sharding
    along the data axis to every parameter."""
    items = list(table.items()) if isinstance(table, dict) else list(table)
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"a sharding rule is a (pattern, spec) pair, got {item!r}")
    return Rules(tuple((p, v) for p, v in items), bool(fsdp))


def _policy(policy: Any) -> Rules:
    if isinstance(policy, Rules):
        return policy
    if policy is None or policy in ("replicated", "dp"):
        return Rules(())
    if policy == "fsdp":
        return Rules((), fsdp=True)
    if isinstance(policy, (list, tuple, dict)):
        return rules(policy)
    raise ValueError(
        f"param_sharding must be None, 'replicated', 'fsdp', a rule table or "
        f"kn.sharding.rules(...), got {policy!r}"
    )


def fsdp_spec(shape: tuple, mesh: Mesh, axis: str, base: Spec = REPLICATED) -> Spec:
    """``base`` with ``axis`` added on the largest unsplit dimension that its size divides
    (``base`` unchanged when none does, e.g. small or odd-sized parameters)."""
    size = dict(mesh.axes)[axis]
    dims = list(base.padded(len(shape)))
    if any(axis in d for d in dims) or size == 1:
        return base
    best = None
    for d, n in enumerate(shape):
        if not dims[d] and n % size == 0 and n >= size and (best is None or n > shape[best]):
            best = d
    if best is None:
        return base
    dims[best] = (axis,)
    return Spec(*[d if d else None for d in dims])


def param_specs(params: Any, mesh: Mesh, policy: Any, data_axis: str = "data") -> Any:
    """A tree like ``params`` with the ``Spec`` of every parameter under ``policy``; raises
    ``ShapeError`` naming the parameter when a rule's spec does not fit it."""
    pol = _policy(policy)
    if pol.fsdp and data_axis not in dict(mesh.axes):
        raise ValueError(f"FSDP shards along data_axis={data_axis!r}, which mesh {dict(mesh.axes)} lacks")
    leaves, rebuild = ptree.flatten(params)
    specs = []
    for (path, leaf), _ in zip(ptree.flatten_with_paths(params), leaves):
        shape = tuple(leaf.shape)
        spec = None
        matched = False
        for pattern, value in pol.table:
            if fnmatch.fnmatchcase(path, pattern):
                matched = True
                spec = "fsdp" if value == "fsdp" else as_spec(value)
                break
        if spec == "fsdp":
            spec = fsdp_spec(shape, mesh, data_axis)
        else:
            spec = spec if matched else REPLICATED
            if spec is not None:
                mesh.check(shape, spec, f"parameter {path!r} ({list(shape)})")
            if pol.fsdp:
                spec = fsdp_spec(shape, mesh, data_axis, spec)
        specs.append(spec)
    return rebuild(specs)


def attention_rules(prefix: str = "*", axis: str = "model") -> list:
    """Tensor-parallel rules for ``layer.multi_head_attention`` parameters under ``prefix``:
    query/key/value projections split by output column (whole heads per device, so attention
    needs no communication), the output projection by input row (one all-reduce after it)."""
    rules_ = []
    for name in ("query", "key", "value"):
        rules_ += [(f"{prefix}{name}.weight", Spec(None, axis)), (f"{prefix}{name}.bias", Spec(axis))]
    rules_ += [(f"{prefix}out.weight", Spec(axis, None)), (f"{prefix}out.bias", None)]
    return rules_


def mlp_rules(up: str, down: str, axis: str = "model") -> list:
    """Tensor-parallel rules for two ``linear`` layers applied one after the other (an MLP):
    ``up`` (a path pattern of the first, e.g. ``"*fc1"``) split by output column, ``down`` by
    input row, so the hidden activation stays split and one all-reduce follows ``down``."""
    return [
        (f"{up}.weight", Spec(None, axis)),
        (f"{up}.bias", Spec(axis)),
        (f"{down}.weight", Spec(axis, None)),
        (f"{down}.bias", None),
    ]


def _opt_specs(opt_state: Any, params: Any, pspecs: Any) -> Any:
    """The optimiser state's specs: trees shaped like the parameters follow them, the rest
    (the step counter) is replicated."""
    _, pdef = tree.flatten(params)

    def follow(node):
        if tree.flatten(node)[1] == pdef:
            return pspecs
        if isinstance(node, (tuple, list)):
            return tuple(follow(n) for n in node)
        return REPLICATED

    return follow(opt_state)


def step_shardings(mesh: Mesh, policy: Any, data_axis: str, block: bool):
    """``(in_shardings, out_shardings)`` functions for ``kn.jit`` of a training step (``block``:
    of ``K`` steps over stacked batches) whose arguments are ``(params, state, opt_state, key,
    x, targets, ctx, ...)`` and whose results are ``(loss, params, state, opt_state)``: the
    batch (``x``, the targets) split over ``data_axis`` along its batch dimension, parameters
    and optimiser state laid out by ``policy``, everything else replicated."""
    batch = Spec(None, data_axis) if block else Spec(data_axis)
    memo: dict = {}

    def specs_of(params):
        leaves, treedef = tree.flatten(params)
        key = (treedef, tuple(tuple(leaf.shape) for leaf in leaves))
        if key not in memo:
            memo[key] = param_specs(params, mesh, policy, data_axis)
        return memo[key]

    def ins(params, state, opt_state, key, x, targets, *rest, **kwargs):
        pspecs = specs_of(params)
        axis = 1 if block else 0
        ways = dict(mesh.axes)[data_axis] if data_axis is not None else 1
        for leaf in tree.flatten(x)[0]:
            shape = tuple(getattr(leaf, "shape", ()))
            if len(shape) > axis and shape[axis] % ways:
                raise ValueError(
                    f"train: a batch of {shape[axis]} rows (x of shape {list(shape)}) does not "
                    f"split evenly over the {ways} devices of mesh axis {data_axis!r}; use a "
                    f"multiple of {ways}"
                )
        rows = {
            tuple(leaf.shape)[axis] for leaf in tree.flatten(x)[0] if len(getattr(leaf, "shape", ())) > axis
        }
        # targets with the batch's rows are split like it; other arrays a loss reads are replicated
        leaves, treedef = tree.flatten(targets)
        split = [len(getattr(t, "shape", ())) > axis and t.shape[axis] in rows for t in leaves]
        tspecs = tree.unflatten(treedef, [batch if s else None for s in split])
        ospecs = _opt_specs(opt_state, params, pspecs)
        return (pspecs, None, ospecs, None, batch, tspecs) + (None,) * len(rest)

    def outs(params, state, opt_state, *rest, **kwargs):
        pspecs = specs_of(params)
        # results come back laid out as the next step takes them (the fast path relies on it)
        return (REPLICATED, pspecs, REPLICATED, _opt_specs(opt_state, params, pspecs))

    return ins, outs


def check_training_layout(mesh: Any, data_axis: str, policy: Any, stages: Any = None) -> str | None:
    """``train.make``'s checks: a kaun_ir mesh, a data axis it has, a policy that parses. Returns
    the data axis the step splits the batch over: ``data_axis``, or None for a pipeline-parallel
    trainer (``stages``, a ``kn.sharding.pipeline``) whose mesh has no such axis (a mesh of
    stages only: every stage sees the whole batch, cut into micro-batches)."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"train.make: mesh must be a kn.sharding.mesh(...), got {type(mesh).__name__}")
    axes = dict(mesh.axes)
    if data_axis not in axes:
        if stages is None or stages.axis not in axes or _policy(policy).fsdp:
            raise ValueError(f"train.make: data_axis {data_axis!r} is not an axis of mesh {axes}")
        data_axis = None
    _policy(policy)
    return data_axis


def place_state(mesh: Mesh, policy: Any, data_axis: str, params: Any, opt_state: Any) -> tuple:
    """``(params, opt_state)`` as global arrays laid out by ``policy`` on ``mesh``."""
    pspecs = param_specs(params, mesh, policy, data_axis)
    ospecs = _opt_specs(opt_state, params, pspecs)

    def place(values, specs):
        leaves, treedef = tree.flatten(values)
        spec_leaves = _spec_leaves(specs, values)
        out = []
        for leaf, spec in zip(leaves, spec_leaves):
            dtype = np.dtype(getattr(leaf, "dtype", None) or np.asarray(leaf).dtype)
            out.append(transfer.put_sharded(leaf, dtype, shardings.named_sharding(mesh, spec)))
        return tree.unflatten(treedef, out)

    count, trees = opt_state

    placed_trees = place(tuple(trees), ospecs[1])
    return place(params, pspecs), optim.State(place(count, REPLICATED), placed_trees)


def _spec_leaves(specs: Any, values: Any) -> list:
    """One spec per array leaf of ``values`` from a spec tree (a spec covers its whole subtree)."""
    out = []

    def walk(spec, value):
        if spec is None or isinstance(spec, Spec):
            out.extend([spec or REPLICATED] * len(tree.flatten(value)[0]))
        elif isinstance(value, dict):
            for key in sorted(value):
                walk(spec[key], value[key])
        else:
            for s, v in zip(spec, value):
                walk(s, v)

    walk(specs, values)
    return out

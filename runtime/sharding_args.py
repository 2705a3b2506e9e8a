"""``kn.jit(..., in_shardings=, out_shardings=)``: from the user's spec trees to one spec per
graph input and output.

``in_shardings`` / ``out_shardings`` may also be functions of the call's arguments returning
them (evaluated once per signature, when compiling): ``kn.train`` derives the layout of a
parameter tree from its shapes that way.

A spec tree is None, a partition spec (``kn.sharding.Spec``, JAX's ``PartitionSpec`` or a
single axis name, which splits dimension 0) that applies to every array below it, or a
dict/list/tuple shaped like the argument whose leaves are again spec trees. Tuples and lists
are containers here, never specs, so a tree reads the same whatever it holds.
"""

from __future__ import annotations

from typing import Any

from kaun_ir import tree
from kaun_ir.runtime.mesh import REPLICATED, Spec, _is_jax_spec, as_spec
from kaun_ir.runtime.xla import shardings, transfer
from kaun_ir.surface.trace import is_array_leaf


def _is_spec(node: Any) -> bool:
    return node is None or isinstance(node, (Spec, str)) or _is_jax_spec(node)


def spec_at(spec_tree: Any, path: str, where: str) -> Spec | None:
    """The spec that ``spec_tree`` gives the leaf at dotted ``path`` (None: unspecified)."""
    node = spec_tree
    for part in path.split(".") if path else []:
        if _is_spec(node):
            break
        try:
            if isinstance(node, dict):
                node = node[part]
            elif isinstance(node, (list, tuple)):
                node = node[int(part)]
            else:
                raise TypeError
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(
                f"{where}: the sharding tree has no entry for {path!r} (it is "
                f"{type(node).__name__}); give a spec, None, or a tree shaped like the value"
            ) from None
    if not _is_spec(node):
        raise ValueError(
            f"{where}: the sharding tree continues below the array at {path or 'the root'!r} "
            f"({type(node).__name__}); give a spec or None there"
        )
    return None if node is None else as_spec(node)


def resolve(jitted, args: tuple, kwargs: dict, traced, n_inputs: int, n_outputs: int) -> dict:
    """``{"in_specs": [...], "out_specs": [...]}`` for ``Executable`` from a mesh-jitted call."""
    mesh = jitted.mesh
    entries = jitted.in_shardings
    if callable(entries) and not _is_spec(entries):  # decided per call signature
        entries = entries(*args, **kwargs)
    if entries is not None and not isinstance(entries, (tuple, list)):
        entries = (entries,) * len(args)  # one spec for every argument
    if entries is not None and len(entries) != len(args):
        raise ValueError(
            f"kn.jit: in_shardings has {len(entries)} entries for {len(args)} positional arguments"
        )
    in_specs = []
    for i, arg in enumerate(args):
        for path, leaf in tree.paths(arg):
            if not is_array_leaf(leaf):
                continue
            spec = spec_at(entries[i], path, f"in_shardings[{i}]") if entries is not None else None
            in_specs.append(spec if spec is not None else _own_spec(leaf, mesh))
    for key in sorted(kwargs):
        in_specs += [_own_spec(leaf, mesh) for _, leaf in tree.paths(kwargs[key]) if is_array_leaf(leaf)]
    in_specs += [REPLICATED] * (n_inputs - len(in_specs))  # closed-over arrays
    out_specs = None
    wanted = jitted.out_shardings
    if callable(wanted) and not _is_spec(wanted):
        wanted = wanted(*args, **kwargs)
    if wanted is not None:
        structure = tree.unflatten(traced.out_treedef, list(range(n_outputs)))
        out_specs = [None] * n_outputs
        for path, index in tree.paths(structure):
            out_specs[index] = spec_at(wanted, path, "out_shardings")
    return {"in_specs": in_specs, "out_specs": out_specs}


def _own_spec(leaf, mesh) -> Spec:
    if transfer.is_device_array(leaf):
        spec = shardings.spec_on_mesh(leaf, mesh)
        if spec is not None:
            return spec
    return REPLICATED

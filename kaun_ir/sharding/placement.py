"""``kn.sharding``: device meshes, partition specs and sharding constraints.

Scale-out is XLA's own machinery: a function compiled with ``kn.jit(f, mesh=...)`` is one SPMD
program; the shardings of its inputs, outputs and of ``constrain``-ed values are written as
Shardy (``sdy``) attributes, XLA's partitioner propagates them to every other value, splits
the program per device and inserts the collectives (all-reduce, all-gather, ...) it needs.

    mesh = kn.sharding.mesh((2, 4), ("data", "model"))
    f = kn.jit(step, mesh=mesh, in_shardings=(kn.sharding.Spec("data"), None))
    y = f(x, w)                    # a global jax.Array, y.sharding a NamedSharding on the mesh

Inside traced code, ``kn.sharding.constrain(h, Spec("data", "model"))`` pins one value's
layout (an IR op, ``sharding_constraint``, that autodiff carries to the backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.runtime import mesh as runtime_mesh
from kaun_ir.runtime.mesh import REPLICATED, Mesh, Spec, as_spec, use
from kaun_ir.runtime.xla import backend, shardings, transfer
from kaun_ir.sharding.policy import Rules, attention_rules, fsdp_spec, mlp_rules, param_specs, rules
from kaun_ir.surface.tensor import Tensor, apply

__all__ = [
    "Mesh",
    "Spec",
    "REPLICATED",
    "mesh",
    "constrain",
    "use_mesh",
    "put",
    "put_local",
    "named_sharding",
    "spec_of",
    "Rules",
    "rules",
    "param_specs",
    "attention_rules",
    "mlp_rules",
    "fsdp_spec",
]


def mesh(shape: Sequence[int], axis_names: Sequence[str], devices: Sequence | None = None) -> Mesh:
    """A device mesh: ``mesh((2, 4), ("data", "model"))`` arranges 8 devices in a 2 x 4 grid.

    ``devices``: the devices in row-major order (default: the first ``prod(shape)`` devices of
    the backend, across processes). A mesh larger than the devices there are raises
    ``ValueError`` saying how many exist (and, on the CPU, how to ask for virtual devices)."""
    return Mesh(shape, axis_names, devices)


def use_mesh(m: Mesh):
    """Context manager: inside it, :func:`constrain` without ``mesh=`` refers to ``m``
    (``kn.jit(f, mesh=m)`` does this for you while tracing ``f``)."""
    return use(m)


def constrain(x: Any, spec: Any, mesh: Mesh | None = None) -> Any:
    """``x`` laid out as ``spec`` over ``mesh`` (default: the mesh in scope, see :func:`use_mesh`).

    The value is unchanged; the layout is a hint to XLA's partitioner, which moves data as
    needed to honour it. ``x`` may be a tree of arrays (each gets ``spec``). Raises
    ``ShapeError`` for an axis the mesh lacks or a dimension its axes do not divide."""
    m = mesh if mesh is not None else runtime_mesh.active()
    if m is None:
        raise ValueError(
            "kn.sharding.constrain needs a mesh: pass mesh=, trace under "
            "kn.jit(..., mesh=) or inside `with kn.sharding.use_mesh(m):`"
        )
    spec = as_spec(spec)
    leaves, treedef = tree.flatten(x)
    out = [apply("sharding_constraint", leaf, mesh=m.axes, spec=spec.dims) for leaf in leaves]
    return tree.unflatten(treedef, out)


def named_sharding(m: Mesh, spec: Any):
    """JAX's ``NamedSharding`` for ``spec`` on ``m`` (what sharded results carry)."""
    return shardings.named_sharding(m, as_spec(spec))


def put(x: Any, m: Mesh, spec: Any = None) -> Any:
    """``x`` (a NumPy/jax array, or a tree of them) as global ``jax.Array``s laid out as ``spec`` on
    ``m`` (default: replicated). Host data must hold the same global value in every process."""
    spec = as_spec(spec)

    def one(leaf):
        dtype = np.dtype(getattr(leaf, "dtype", None) or np.asarray(leaf).dtype)
        shape = tuple(getattr(leaf, "shape", None) or np.shape(leaf))
        m.check(shape, spec, f"kn.sharding.put of {dtype}{list(shape)}")
        return transfer.put_sharded(leaf, dtype, shardings.named_sharding(m, spec))

    if isinstance(x, Tensor):
        return constrain(x, spec, m)
    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, [one(leaf) for leaf in leaves])


def put_local(x: Any, m: Mesh, spec: Any = "data") -> Any:
    """Global ``jax.Array``s from this process's part of the data: ``x`` (or each leaf of a tree)
    holds the rows of dimension 0 that this process loaded (``kn.data.shard``), and the result
    is the concatenation over processes, in process order, laid out as ``spec`` (default: split
    over ``"data"``). In a single process this is :func:`put`."""
    spec = as_spec(spec)
    if backend.process_count() == 1:
        return put(x, m, spec)
    sharding = shardings.named_sharding(m, spec)

    def one(leaf):
        host = np.asarray(leaf)
        return transfer.from_process_local(host, host.dtype, sharding)

    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, [one(leaf) for leaf in leaves])


def spec_of(x: Any, m: Mesh) -> Spec | None:
    """The partition spec of a ``jax.Array`` laid out on ``m``, or None if it is laid out otherwise."""
    return shardings.spec_on_mesh(x, m)

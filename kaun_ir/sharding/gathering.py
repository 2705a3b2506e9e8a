"""``kn.sharding.gather``: the whole value of sharded arrays on the host, in a run of one or
many processes.

In a multi-process run an array split over a mesh that spans the processes is held in pieces by
each process, and reading it (``np.asarray``) raises JAX's "spans non-addressable devices"
error. :func:`gather` compiles, once per mesh, an identity program whose results are
replicated over the mesh: XLA's partitioner turns it into all-gathers (over gloo or NCCL between
processes), after which every process holds the whole value on its own devices and copies it to
the host. Every process of the run must call it with the same tree (it is a collective).
"""

from __future__ import annotations

from typing import Any

from kaun_ir import ptree
from kaun_ir import tree as trees
from kaun_ir.runtime import compilation
from kaun_ir.runtime.jit import jit
from kaun_ir.runtime.mesh import REPLICATED, Mesh
from kaun_ir.runtime.xla import backend, transfer

__all__ = ["gather"]


def _replicator(mesh: Mesh):
    """The process-wide ``kn.jit`` identity whose results are replicated over ``mesh``."""

    def replicate(*arrays):
        return arrays

    replicate.__name__ = "gather"
    return compilation.shared(
        ("sharding", "gather", mesh), lambda: jit(replicate, mesh=mesh, out_shardings=REPLICATED)
    )


def gather(tree: Any, to: int | str = "all") -> Any:
    """``tree`` with every array leaf replaced by its whole value as a NumPy array.

    ``to="all"``: every process gets the values; ``to=k``: process ``k`` gets them and every
    other process gets None (all processes still take part: call it on all of them). Leaves that
    are not device arrays are kept as they are; arrays this process can read whole (one process,
    or replicated) are copied without communicating; the rest are all-gathered over their mesh,
    one compiled program per mesh. A ``train.State`` is gathered as ``train.state_to_tree(st)``.
    ``ValueError`` for a ``to`` that names no process, or for a split array that is not laid out
    on a mesh."""
    count, index = backend.process_count(), backend.process_index()
    if not (to == "all" or (isinstance(to, int) and not isinstance(to, bool) and 0 <= to < count)):
        raise ValueError(
            f"kn.sharding.gather: to must be 'all' or a process index in [0, {count}), got {to!r}"
        )
    from kaun_ir.train import State, state_to_tree  # noqa: PLC0415 - kaun_ir.train imports this package

    if isinstance(tree, State):  # a training state: its arrays, as train.state_to_tree lays them out
        tree = state_to_tree(tree)
    leaves, treedef = trees.flatten(tree)
    for path, leaf in ptree.flatten_with_paths(tree):
        if isinstance(leaf, str | bytes):
            raise TypeError(
                f"kn.sharding.gather: the leaf at {path!r} is a {type(leaf).__name__}, not an array"
            )
    out = list(leaves)
    pending: dict[Mesh, list[int]] = {}
    for i, leaf in enumerate(leaves):
        if not transfer.is_device_array(leaf):
            continue
        whole = transfer.local_copy(leaf)
        if whole is not None:
            out[i] = whole
            continue
        found = transfer.array_mesh(leaf)
        if found is None:
            raise ValueError(
                f"kn.sharding.gather: leaf {i} (shape {tuple(leaf.shape)}) is split over devices of "
                "several processes but not laid out on a mesh; lay it out with kn.sharding.put"
            )
        grid, names = found
        pending.setdefault(Mesh(grid.shape, names, list(grid.flat)), []).append(i)
    for mesh, positions in pending.items():
        replicated = _replicator(mesh)(*[leaves[i] for i in positions])
        for i, array in zip(positions, replicated):
            out[i] = transfer.local_copy(array)
    if to != "all" and to != index:
        return None
    return trees.unflatten(treedef, out)

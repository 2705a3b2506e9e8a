"""The sharding annotation: ``sharding_constraint``, lowered to Shardy's ``sdy.sharding_constraint``.

The op is the identity on values; it tells XLA's SPMD partitioner how its operand is laid out
over a device mesh. Attributes (plain data, so the IR stays free of device objects):

- ``mesh``: the mesh's axes as ``(("data", 2), ("model", 4))`` (name, size), in mesh order;
- ``spec``: one entry per dimension of the operand, each a tuple of mesh-axis names (major to
  minor) that dimension is split over; ``()`` leaves the dimension unsplit (replicated over the
  axes named nowhere).

The text IR prints them as nested tuples; the lowering writes the mesh inline in the sharding
attribute (``#sdy.sharding<mesh<["data"=2]>, [{"data"}, {}]>``), so the op needs no module-level
symbol and a graph keeps the same StableHLO whichever function it is inlined into.
"""

from __future__ import annotations

import operator

from kaun_ir.errors import ShapeError
from kaun_ir.ir.core import TensorType
from kaun_ir.ops.base import OpDef, Sample
from kaun_ir.ops.emit import sdy_mesh, sdy_sharding
from kaun_ir.ops.rules import apply


def check_spec(shape: tuple[int, ...], mesh, spec, what: str = "sharding") -> None:
    """Raise ``ShapeError`` unless ``spec`` is a valid layout of an array of ``shape`` on ``mesh``.

    ``mesh``: ``((name, size), ...)``; ``spec``: per-dimension tuples of axis names. Checked: the
    spec is no longer than the rank, names exist, no axis is used twice, and every split
    dimension is divisible by the product of its axes' sizes.
    """
    for entry in mesh:  # verify() checks graphs read from text: the mesh must be one XLA accepts
        try:
            name, size = entry
            valid = (
                isinstance(name, str)
                and name != ""
                and not isinstance(size, bool)
                and operator.index(size) > 0
            )
        except (TypeError, ValueError):
            valid = False
        if not valid:
            raise ShapeError(
                f"{what}: mesh axis {entry!r} of {mesh} is not (name, size) with a non-empty name "
                "and a positive size"
            )
    sizes = dict(mesh)
    if len(sizes) != len(mesh):
        raise ShapeError(f"{what}: mesh axis names repeat in {mesh}")
    if len(spec) > len(shape):
        raise ShapeError(
            f"{what}: spec {spec} has {len(spec)} entries but the array has rank {len(shape)} (shape {shape})"
        )
    used: set[str] = set()
    for dim, axes in enumerate(spec):
        ways = 1
        for axis in axes:
            if axis not in sizes:
                raise ShapeError(
                    f"{what}: spec {spec} names mesh axis {axis!r}, but the mesh has only "
                    f"{', '.join(repr(a) for a in sizes) or 'no axes'}"
                )
            if axis in used:
                raise ShapeError(f"{what}: spec {spec} uses mesh axis {axis!r} twice")
            used.add(axis)
            ways *= sizes[axis]
        if shape[dim] % ways:
            raise ShapeError(
                f"{what}: dimension {dim} of shape {shape} (size {shape[dim]}) is not "
                f"divisible by {ways}, the size of mesh axes {axes}"
            )


def _infer(x: TensorType, mesh, spec) -> TensorType:
    check_spec(x.shape, mesh, spec, "layout")
    return x


def _emit(em, node, x):
    mesh, spec = node.attr("mesh"), node.attr("spec")
    sharding = sdy_sharding(spec, len(node.inputs[0].type.shape), "mesh" + sdy_mesh(mesh))
    return em.simple("sdy.sharding_constraint", node, x, attrs={"sharding": sharding})


def _vjp(ct, y, x, mesh, spec):
    # the cotangent of a constrained value is laid out the same way: the backward pass keeps
    # the partitioning the user asked for instead of leaving it to propagation
    return (apply("sharding_constraint", ct, mesh=mesh, spec=spec),)


def _batch(batched, size, x, mesh, spec):
    # under kn.vmap the new batch axis is left unsplit (replicated); the example's axes keep
    # the layout the user asked for
    return apply("sharding_constraint", x, mesh=mesh, spec=((),) + tuple(spec))


def _samples(rng):
    # One device suffices to compile these (the test process has one); the multi-device
    # behaviour is tested in subprocesses with virtual CPU devices (tests/test_sharding.py).
    yield Sample(
        (rng.standard_normal((4, 3)).astype("float32"),), {"mesh": (("data", 1),), "spec": (("data",), ())}
    )
    yield Sample(
        (rng.standard_normal((2, 6)).astype("float32"),),
        {"mesh": (("data", 1), ("model", 1)), "spec": ((), ("model", "data"))},
    )
    yield Sample((rng.integers(0, 5, (3,)).astype("int32"),), {"mesh": (("x", 1),), "spec": ()})


OPS = [
    OpDef(
        name="sharding_constraint",
        traits=(),
        stablehlo="sdy.sharding_constraint",
        arity=1,
        attrs=("mesh", "spec"),
        infer=_infer,
        reference=lambda x, mesh, spec: x,
        emit=_emit,
        samples=_samples,
        vjp=_vjp,
        batch=_batch,
        doc="The identity, annotated with how its value is split over a device mesh (attributes "
        "``mesh`` = ((axis, size), ...) and ``spec`` = per-dimension tuples of axis names).",
    ),
]

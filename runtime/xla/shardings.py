"""jax's sharding objects for kaun_ir's meshes and partition specs, and the reverse: the spec of
an array laid out over a mesh, the specs XLA chose for a partitioned executable's results, and
the layouts Shardy's sharding propagation gives a partitioned module's values."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence

import numpy as np

from kaun_ir.runtime.mesh import REPLICATED, Mesh, Spec
from kaun_ir.runtime.xla.mlir import open_module

# jax's Mesh of each kaun_ir Mesh, built once: a NamedSharding is made per result of every
# partitioned executable and per argument placed on a mesh. Keyed weakly, so a mesh that is no
# longer used takes its jax Mesh with it; equal meshes (the same devices, axes and order) may
# share one, which is the same value.
_JAX_MESHES: weakref.WeakKeyDictionary[Mesh, object] = weakref.WeakKeyDictionary()


def single_device_sharding(device):
    """jax's sharding of an array held whole by ``device``."""
    # imported here: jax loads only when a program compiles or compares
    from jax.sharding import SingleDeviceSharding  # noqa: PLC0415

    return SingleDeviceSharding(device)


def _jax_mesh(mesh: Mesh):
    """jax's ``Mesh`` of the same devices and axis names as ``mesh`` (cached per mesh)."""
    jax_mesh = _JAX_MESHES.get(mesh)
    if jax_mesh is None:
        # imported here: jax loads only when a program compiles or compares
        from jax.sharding import Mesh as JaxMesh  # noqa: PLC0415

        jax_mesh = JaxMesh(mesh.devices, mesh.axis_names)
        _JAX_MESHES[mesh] = jax_mesh
    return jax_mesh


def named_sharding(mesh: Mesh, spec: Spec):
    """jax's ``NamedSharding`` of a kaun_ir ``Mesh`` and ``Spec`` (the container of results)."""
    # imported here: jax loads only when a program compiles or compares
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    entries = [None if not d else d[0] if len(d) == 1 else d for d in spec.dims]
    return NamedSharding(_jax_mesh(mesh), PartitionSpec(*entries))


def spec_on_mesh(array, mesh: Mesh) -> Spec | None:
    """The partition spec of a ``jax.Array`` laid out over ``mesh`` (same devices in the same
    order and the same axis names), or None when it lives elsewhere or is laid out otherwise."""
    # imported here: jax loads only when a program compiles or compares
    from jax.sharding import NamedSharding  # noqa: PLC0415

    sharding = getattr(array, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    if tuple(sharding.mesh.axis_names) != mesh.axis_names or sharding.mesh.devices.shape != mesh.shape:
        return None
    if any(a is not b for a, b in zip(sharding.mesh.devices.flat, mesh.devices.flat)):
        return None
    return Spec(*list(sharding.spec))


# ----------------------------------------------------------------------- specs XLA chose


def output_specs(executable, mesh: Mesh, ranks: Sequence[int]) -> list:
    """The spec XLA chose for each output of a partitioned executable, as a ``Spec`` on
    ``mesh``; None for an output whose layout no spec on ``mesh`` describes."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    protos = executable.get_output_shardings()
    if protos is None:  # XLA keeps none for a one-device program: everything is whole there
        return [REPLICATED if mesh.size == 1 else None for _ in ranks]
    chosen = [xc.HloSharding.from_proto(p) for p in protos]
    specs = []
    for hlo, rank in zip(chosen, ranks):
        found = None
        if hlo.is_replicated():
            found = REPLICATED
        else:
            for spec in _candidate_specs(mesh, rank):
                if _hlo_sharding_of(mesh, spec, rank) == hlo:
                    found = spec
                    break
        specs.append(found)
    return specs


def _hlo_sharding_of(mesh: Mesh, spec: Spec, rank: int):
    """The ``HloSharding`` that ``spec`` on ``mesh`` means, with device positions in mesh order."""
    from jaxlib import xla_client as xc  # noqa: PLC0415 - jaxlib loads only when a program compiles

    names = list(mesh.axis_names)
    dims = spec.padded(rank)
    used = [names.index(a) for axes in dims for a in axes]
    if not used:
        return xc.HloSharding.replicate()
    rest = [i for i in range(len(names)) if i not in used]
    sizes = dict(mesh.axes)
    tile = [int(np.prod([sizes[a] for a in axes])) for axes in dims]
    replicas = int(np.prod([mesh.shape[i] for i in rest]))
    order = np.arange(mesh.size).reshape(mesh.shape).transpose(used + rest).reshape(-1)
    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = tile + ([replicas] if replicas > 1 else [])
    proto.replicate_on_last_tile_dim = replicas > 1
    proto.tile_assignment_devices = [int(i) for i in order]
    return xc.HloSharding.from_proto(proto)


def _candidate_specs(mesh: Mesh, rank: int) -> Iterator[Spec]:
    """Every spec of a rank-``rank`` array on ``mesh`` (each axis on one dimension or none, the
    axes of one dimension in every order), simplest first."""
    names = mesh.axis_names
    seen = set()
    for placement in itertools.product(range(rank + 1), repeat=len(names)):
        groups = [[n for n, p in zip(names, placement) if p == d] for d in range(rank)]
        for orders in itertools.product(*[list(itertools.permutations(g)) for g in groups]):
            spec = Spec(*[tuple(o) if o else None for o in orders])
            if spec not in seen:
                seen.add(spec)
                yield spec


# ----------------------------------------------------------------------- Shardy's propagation


def propagated_shardings(text: str, tag: str) -> dict:
    """Run Shardy's sharding propagation (the pipeline XLA's partitioner starts with) on a
    partitioned module and read back the layout of every value of its main function.

    Returns ``{"inputs": [...], "outputs": [...], "ops": {location: [...]}}``: one layout per
    argument, per result and, for every op of the main function's body whose location starts
    with ``tag``, per op result (the last op of a location wins). A layout is a tuple of mesh-axis
    tuples, one per dimension, or None where Shardy left it open or it is not one the textual
    IR writes (a sub-axis). Raises ``ValueError`` when the module does not parse or propagation
    fails."""
    from jaxlib.mlir import ir, passmanager  # noqa: PLC0415 - jaxlib loads only when a program compiles

    with open_module(text) as module:
        try:
            passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)").run(module.operation)
        except Exception as err:  # MLIRError: diagnostics in the message
            raise ValueError(f"Shardy's sharding propagation failed: {err}") from None
        main = next(
            op
            for op in module.body.operations
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main"
        )
        out = {
            "inputs": _attr_layouts(main, "arg_attrs"),
            "outputs": _attr_layouts(main, "res_attrs"),
            "ops": {},
        }
        for op in main.regions[0].blocks[0].operations:
            location = str(op.location)
            start = location.find(tag)
            if start < 0:
                continue
            end = start + len(tag)
            while end < len(location) and location[end].isdigit():
                end += 1
            layouts = [None] * len(op.results)
            if "sdy.sharding" in op.attributes:
                layouts = _layouts(str(op.attributes["sdy.sharding"]))
            elif op.operation.name in ("sdy.sharding_constraint", "sdy.reshard"):  # layout: the attribute
                layouts = _layouts(str(op.attributes["sharding"]))
            out["ops"][location[start:end]] = layouts
        return out


def _attr_layouts(func, name: str) -> list:
    """The ``sdy.sharding`` layout of each argument / result of ``func`` (None: none)."""
    from jaxlib.mlir import ir  # noqa: PLC0415 - jaxlib loads only when a program compiles

    if name not in func.attributes:
        return []
    found = []
    for entry in ir.ArrayAttr(func.attributes[name]):
        entry = ir.DictAttr(entry)
        found.append(_layouts(str(entry["sdy.sharding"]))[0] if "sdy.sharding" in entry else None)
    return found


def _layouts(text: str) -> list:
    """The layouts in the text of a ``#sdy.sharding`` or ``#sdy.sharding_per_value`` attribute."""
    import re  # noqa: PLC0415 - only the partitioned stage reads Shardy attributes

    layouts = []
    # each layout follows its mesh: a symbol (@mesh) or an inline mesh<["data"=2, ...]>
    for head in re.finditer(r"(?:@[\w.$-]+|mesh<\[[^\]]*\]>)\s*,\s*\[", text):
        open_ = head.end() - 1
        close = text.index("]", open_)
        dims = []
        for body in text[open_ + 1 : close].split("}")[:-1]:
            body = body[body.index("{") + 1 :]
            names = [n.strip() for n in body.split(",") if n.strip() and n.strip() != "?"]
            if any(not (n.startswith('"') and n.endswith('"')) for n in names):
                dims = None  # a sub-axis ("x":(1)2): no textual-IR form
                break
            dims.append(tuple(n.strip('"') for n in names))
        layouts.append(None if dims is None else tuple(dims))
    return layouts

"""``remat``: recompute forward values in the backward pass, segment by segment (kaun_ir.transforms.remat)."""

from kaun_ir.ir.core import Graph
from kaun_ir.passes.registry import Option, register
from kaun_ir.transforms.remat import rematerialize


@register(
    "remat",
    options={
        "policy": (str, "nothing", "which residuals are saved: nothing, dots, or paths:<pattern>|<pattern>"),
        "depth": Option(
            int,
            1,
            "layers whose layer paths share this many leading components form one segment (0: chosen "
            "from the graph, 1 or 2)",
            min=0,
        ),
        "min_bytes": Option(
            int, 0, "leave the graph unchanged when the residuals to recompute hold fewer bytes", min=0
        ),
    },
)
def remat(graph: Graph, policy: str, depth: int, min_bytes: int) -> Graph:
    """Rematerialise the residuals of every layer at ``depth`` of the layer path (and of the
    segments ``kn.remat`` marked), each recomputation tied to the cotangent that reaches it;
    with ``min_bytes``, only when those residuals hold at least that many bytes."""
    return rematerialize(graph, policy=policy, depth=depth, min_bytes=min_bytes)

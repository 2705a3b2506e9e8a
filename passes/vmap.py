"""The ``vmap`` pass: the batched graph (``kaun_ir.transforms.vmap.batch_graph``) as a pipeline step."""

from kaun_ir.errors import BatchingError
from kaun_ir.ir.core import Graph
from kaun_ir.passes.registry import Option, register
from kaun_ir.transforms.vmap import batch_graph


@register(
    "vmap",
    options={
        "size": Option(
            int,
            2,
            "the batch size: every mapped input and every output gains a leading axis of this size",
            min=0,
        ),
        "unmapped": (
            str,
            "",
            "inputs that are not mapped (shared by every example), as indices joined by '+'",
        ),
    },
)
def vmap(graph: Graph, size: int, unmapped: str) -> Graph:
    """Batching: every input (but those listed in ``unmapped``) and every output gains a leading
    batch axis of ``size``; each op is rewritten by its batching rule."""
    try:
        shared = {int(part) for part in unmapped.split("+") if part}
    except ValueError:
        raise BatchingError(f"vmap: unmapped must be input indices joined by '+', got {unmapped!r}") from None
    bad = sorted(i for i in shared if not 0 <= i < len(graph.inputs))
    if bad:
        raise BatchingError(f"vmap: unmapped input(s) {bad} out of range for {len(graph.inputs)} inputs")
    flags = [i not in shared for i in range(len(graph.inputs))]
    return batch_graph(graph, flags, size, force=True)[0]

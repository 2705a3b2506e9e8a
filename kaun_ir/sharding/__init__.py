"""``kn.sharding``: device meshes, partition specs, sharding constraints and parameter policies.

``placement`` builds meshes and places or constrains arrays, ``policy`` turns a rule table into
per-parameter specs (data, FSDP and tensor parallelism), and ``processes`` starts and queries a
multi-process run (re-exported as ``kn.distributed``); ``gathering`` brings sharded arrays back
to the host whole (``gather``); ``pipeline`` is pipeline parallelism for
``train.make(..., pipeline=...)``. See docs/distributed.md.
"""

from kaun_ir.names import public_dir
from kaun_ir.sharding.gathering import gather
from kaun_ir.sharding.pipeline import Pipeline, pipeline
from kaun_ir.sharding.placement import (
    REPLICATED,
    Mesh,
    Rules,
    Spec,
    attention_rules,
    constrain,
    fsdp_spec,
    mesh,
    mlp_rules,
    named_sharding,
    param_specs,
    put,
    put_local,
    rules,
    spec_of,
    use_mesh,
)

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
    "gather",
    "Pipeline",
    "pipeline",
]

__dir__ = public_dir(__all__)

"""``kn.checkpoint``: trees of arrays saved as SafeTensors files, whole or sharded.

``core`` saves and loads one file (atomic writes, the tree's structure in the metadata), ``reader``
opens a file and explains one it cannot read (and reads the JSON index of a checkpoint directory,
checking every file it names stays inside), ``storable`` names a leaf whose dtype SafeTensors
cannot hold, ``mapping`` renames and transposes foreign ``state_dict`` names onto a template, and
``sharded`` writes one file per process with an index for arrays spread over a mesh. See
docs/training.md.
"""

from kaun_ir.checkpoint.core import (
    STRUCTURE_KEY,
    CheckpointError,
    from_state_dict,
    load,
    load_raw,
    load_sharded,
    metadata,
    save,
    save_sharded,
)
from kaun_ir.names import public_dir

__all__ = [
    "save",
    "load",
    "load_raw",
    "metadata",
    "from_state_dict",
    "save_sharded",
    "load_sharded",
    "STRUCTURE_KEY",
    "CheckpointError",
]

__dir__ = public_dir(__all__)

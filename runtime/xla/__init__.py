"""The one adapter between kaun_ir and jaxlib: only the modules of this package import jax or
jaxlib (ruff's banned-API rule TID251 holds every other runtime module to it), so a jaxlib
upgrade touches this folder alone.

- :mod:`~kaun_ir.runtime.xla.backend`: the PJRT client, the choice of platform, device lists,
  processes of a distributed run, the library versions that cache keys record;
- :mod:`~kaun_ir.runtime.xla.transfer`: host <-> device copies, DLPack, global arrays laid out
  over a mesh;
- :mod:`~kaun_ir.runtime.xla.shardings`: jax's sharding objects of kaun_ir's meshes and specs,
  the specs XLA chose for a partitioned executable's results, Shardy's propagated layouts;
- :mod:`~kaun_ir.runtime.xla.compiler`: compile options, compiling, running executables, their
  HLO and memory / cost statistics;
- :mod:`~kaun_ir.runtime.xla.mlir`: jaxlib's MLIR bindings: parsing StableHLO, portable
  artifacts, and the attribute readers the StableHLO importer needs; untrusted modules are
  checked by :mod:`~kaun_ir.runtime.xla.mlir_bytecode` and read first by the helper process of
  :mod:`~kaun_ir.runtime.xla.mlir_helper`;
- :mod:`~kaun_ir.runtime.xla.export`: the ``jax.export.Exported`` record;
- :mod:`~kaun_ir.runtime.xla.profiler`: ``jax.profiler``'s traces (``kn.profile``).

The public modules do most of it (``jax.extend.backend``, ``jaxlib.xla_client``, ``jax.sharding``,
``jax.distributed``, ``jaxlib.mlir``). Four entry points are private to jaxlib (a leading
underscore, or undocumented internals of jax's own dispatch); each sits in one function, and
where a jaxlib lacks the last two the code falls back to the generic ``execute`` and to
``jax.device_put``:

- ``jaxlib.mlir._mlir_libs._jax_mlir_ext.register_dialects`` (:func:`mlir.mlir_context`):
  registers the upstream MLIR dialects jaxlib was built with (``func`` above all: every
  module's ``func.func @main``); the public bindings register StableHLO, CHLO and Shardy but
  offer no registration for ``func``. jax builds its own contexts the same way.
- ``jaxlib.mlir._mlir_libs._stablehlo.register_stablehlo_passes`` (:func:`mlir.legalize_chlo`):
  registers the StableHLO passes so that ``chlo-legalize-to-stablehlo`` can run before a
  portable artifact is written (CHLO ops such as ``chlo.erf`` have no portable form).
- ``xla_client.array_result_handler`` (with ``_skip_checks=True`` up to jaxlib 0.10; from 0.11
  on it takes no such argument and skips the checks itself), used through an executable's
  ``execute_sharded(...).consume_with_handlers`` (:func:`compiler.executor`,
  :func:`compiler.partitioned_executor`): jaxlib's C++ result handlers, which jax's own dispatch
  uses to turn results into ``jax.Array`` s without Python work per output (about 2 µs each with
  the generic ``execute``); the types are ours and already checked.
- ``xla_client.batched_device_put`` (:func:`transfer.to_device`): the C++ host-to-device copy
  under ``jax.device_put``; calling it directly costs about 3 µs instead of about 30 µs of tree
  and sharding handling, which matters for a step of about 50 µs.

jax and jaxlib are imported inside the functions that need them, so ``import kaun_ir`` stays
cheap and free of jax until a computation runs.
"""

from __future__ import annotations

import os

# jaxlib's C++ logging reads TF_CPP_MIN_LOG_LEVEL when it first logs. ``import jax`` sets it to
# 1 (warnings and errors, no INFO), but the MLIR bindings and xla_client load jaxlib without jax,
# after which creating a PJRT client printed INFO lines ("PjRt-IFRT device count ..."). The same
# default as jax's, set here because this package is imported before any of its modules can load
# jaxlib; a level the user set wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

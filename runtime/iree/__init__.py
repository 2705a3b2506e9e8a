"""The adapter between kaun_ir and IREE, the second compiler of the lowered StableHLO (beside
XLA, ``kaun_ir.runtime.xla``): only this package imports ``iree.compiler`` and ``iree.runtime``.

- :mod:`~kaun_ir.runtime.iree.compiler`: whether IREE is installed, its version, the devices its
  drivers find, compiling StableHLO text to a VM flatbuffer (through the persistent compilation
  cache) and loading it;
- :mod:`~kaun_ir.runtime.iree.executable`: :class:`IreeExecutable`, the IREE counterpart of
  :class:`kaun_ir.runtime.Executable`, and the checks that refuse what IREE cannot run before
  anything is compiled.

IREE is optional (the extra ``iree``) and imported inside the functions that need it: without it
``import kaun_ir`` works and only choosing an IREE backend fails, with a
:class:`kaun_ir.errors.BackendError` saying how to install it.
"""

#: the IREE backends: name -> (compiler target, runtime driver)
IREE_BACKENDS = {
    "iree-cpu": ("llvm-cpu", "local-task"),
    "iree-vulkan": ("vulkan-spirv", "vulkan"),
    "iree-cuda": ("cuda", "cuda"),
}

"""XLA's typed FFI: a handler of a shared library of our own registered as a CPU custom-call
target (``kaun_ir.runtime.kernels`` builds the library and decides what to register)."""

from __future__ import annotations


def include_dir() -> str:
    """The folder holding ``xla/ffi/api/ffi.h``, the FFI headers that ship with jaxlib."""
    from jax import ffi  # noqa: PLC0415 - jax loads only when a kernel is built

    return ffi.include_dir()


def register_cpu_target(name: str, handler) -> None:
    """Register ``handler`` (a ctypes function of an ``XLA_FFI_DEFINE_HANDLER_SYMBOL``) as the
    CPU custom-call target ``name`` (typed FFI: ``api_version = 4`` in the module)."""
    from jax import ffi  # noqa: PLC0415 - jax loads only when a kernel is registered

    ffi.register_ffi_target(name, ffi.pycapsule(handler), platform="cpu", api_version=1)

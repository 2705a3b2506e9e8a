"""The key of a persistent cache entry: a SHA-256 of everything that can change the compiled code
(the module, the devices, the host CPU, the compile options, the library versions and flags, and
the parts registered with :func:`register_key_part`); see :mod:`kaun_ir.runtime.disk_cache`."""

from __future__ import annotations

import hashlib
import os
import platform

from kaun_ir.runtime.xla import backend

_FORMAT = "kaun_ir-xla-cache-3"  # 2: entries carry a header (magic, key, checksum); 3: host CPU in the key


_KEY_PARTS: dict[str, str] = {}


def register_key_part(name: str, value: str | bytes) -> None:
    """Make ``value`` part of every cache key (of this cache and of
    :mod:`kaun_ir.runtime.graph_cache`) from now on, under ``name``.

    For whatever changes compiled code outside the StableHLO text: a library of custom-call
    kernels registered with XLA registers a hash of its binary here, so that rebuilding it never
    serves executables compiled against the old one. Registering the same name again replaces its
    value."""
    if isinstance(value, bytes):
        value = hashlib.sha256(value).hexdigest()
    _KEY_PARTS[str(name)] = str(value)


def key_parts() -> list[str]:
    """The registered key parts (:func:`register_key_part`) as ``name=value`` strings, sorted."""
    return [f"{name}={value}" for name, value in sorted(_KEY_PARTS.items())]


_HOST: list[str] = []


def host_identity() -> str:
    """The host CPU as the key sees it: the OS, the machine type, the CPU model and a SHA-256 of its
    feature flags (from ``/proc/cpuinfo`` where there is one). Computed once per process."""
    if not _HOST:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = ""
        fields: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                if fields:
                    break  # the first processor is enough: the flags are the same for all
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name.strip().lower(), value.strip())
        # x86: "model name" and "flags"; ARM: "cpu implementer"/"cpu part" and "features"
        ident = [fields.get(k, "") for k in ("vendor_id", "model name", "cpu implementer", "cpu part")]
        # platform.processor() may start a process (uname -p): only without /proc/cpuinfo
        model = "/".join(ident) if any(ident) else platform.processor()
        flags = fields.get("flags") or fields.get("features") or ""
        features = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]
        _HOST.append(f"{platform.system()}/{platform.machine()}/{model}/{features}")
    return _HOST[0]


def key(module: str | bytes, devices, options_bytes: bytes) -> str:
    """The hex cache key of compiling ``module`` for ``devices`` with serialised compile options."""
    digest = hashlib.sha256()
    for part in (
        _FORMAT,
        backend.jaxlib_version(),
        backend.xla_extension_version(),
        os.environ.get("XLA_FLAGS", ""),
        os.environ.get("TF_XLA_FLAGS", ""),
        os.environ.get("LIBTPU_INIT_ARGS", ""),
        ",".join(f"{d.platform}/{d.device_kind}/{d.id}" for d in devices),
        host_identity(),
        *key_parts(),
    ):
        digest.update(str(part).encode())
        digest.update(b"\0")
    digest.update(options_bytes)
    digest.update(b"\0")
    digest.update(module.encode() if isinstance(module, str) else bytes(module))
    return digest.hexdigest()

"""The persistent compilation cache (``KAUN_IR_CACHE_DIR``): a second process loads what the
first compiled, results equal NumPy's, anything that changes compiled code changes the key, and
broken entries are recompiled rather than trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kaun_ir.runtime import cache_directory, cache_key, disk_cache

PROGRAM = textwrap.dedent("""
    import json
    import numpy as np
    import kaun_ir as kn
    from kaun_ir.runtime import disk_cache

    def loss(w, x):
        return kn.tanh(x @ w).sum()

    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    x = np.linspace(0, 2, 6, dtype=np.float32).reshape(2, 3)
    grad = np.asarray(kn.jit(kn.grad(loss))(w, x))
    value = float(kn.jit(loss)(w, x))
    c = disk_cache.counters
    print(json.dumps({"hits": c.hits, "misses": c.misses, "errors": c.errors,
                      "grad": grad.tolist(), "value": value}))
""")


def run_program(cache_dir, base_env=None, **env_extra):
    """PROGRAM in a fresh process with the cache in ``cache_dir`` (None: ``base_env`` decides)."""
    env = dict(os.environ if base_env is None else base_env, JAX_PLATFORMS="cpu", **env_extra)
    if cache_dir is not None:
        env["KAUN_IR_CACHE_DIR"] = str(cache_dir)
    env.pop("KAUN_IR_BACKEND", None)
    result = subprocess.run(
        [sys.executable, "-W", "always::RuntimeWarning", "-c", PROGRAM],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def numpy_reference():
    w = np.linspace(-1, 1, 12, dtype=np.float64).reshape(3, 4)
    x = np.linspace(0, 2, 6, dtype=np.float64).reshape(2, 3)
    hidden = np.tanh(x @ w)
    return x.T @ (1 - hidden**2), hidden.sum()


def entries(cache_dir):
    return sorted(str(p) for p in cache_dir.rglob("*.xlaexe"))


def test_second_process_loads_instead_of_compiling_and_corrupt_entries_are_recompiled(tmp_path):
    cache_dir = tmp_path / "cache"
    want_grad, want_value = numpy_reference()

    first, _ = run_program(cache_dir)
    assert (first["hits"], first["misses"], first["errors"]) == (0, 2, 0)
    assert len(entries(cache_dir)) == 2
    np.testing.assert_allclose(first["grad"], want_grad, rtol=1e-5)
    np.testing.assert_allclose(first["value"], want_value, rtol=1e-5)
    assert oct(os.stat(os.path.dirname(entries(cache_dir)[0])).st_mode & 0o777) == oct(0o700)

    second, _ = run_program(cache_dir)
    assert (second["hits"], second["misses"], second["errors"]) == (2, 0, 0)
    assert second["grad"] == first["grad"] and second["value"] == first["value"]

    # a truncated entry (a full disk, a killed copy) is removed and recompiled, never trusted
    victim = entries(cache_dir)[0]
    with open(victim, "r+b") as handle:
        handle.truncate(100)
    third, stderr = run_program(cache_dir)
    assert (third["hits"], third["misses"], third["errors"]) == (1, 1, 1)
    assert "unreadable compilation cache entry" in stderr
    assert third["grad"] == first["grad"] and third["value"] == first["value"]
    assert os.path.getsize(victim) > 100

    # two entries swapped between their keys (the gradient's and the value's programs): each is
    # detected by the key in its header, recompiled and stored again; never run as the other
    a, b = entries(cache_dir)
    data_a, data_b = open(a, "rb").read(), open(b, "rb").read()
    open(a, "wb").write(data_b)
    open(b, "wb").write(data_a)
    swapped, stderr = run_program(cache_dir)
    assert (swapped["hits"], swapped["misses"], swapped["errors"]) == (0, 2, 2)
    assert "another key" in stderr and stderr.count("compilation cache entry") == 1  # warned once
    np.testing.assert_allclose(swapped["grad"], want_grad, rtol=1e-5)
    np.testing.assert_allclose(swapped["value"], want_value, rtol=1e-5)
    head = len(disk_cache._MAGIC) + 32  # rewritten: each file holds its own key's entry again
    assert (open(a, "rb").read()[:head], open(b, "rb").read()[:head]) == (data_a[:head], data_b[:head])

    # XLA flags change the compiled code: a different key, so a fresh compilation
    fourth, _ = run_program(cache_dir, XLA_FLAGS="--xla_cpu_enable_fast_math=false")
    assert (fourth["hits"], fourth["misses"]) == (0, 2)
    assert len(entries(cache_dir)) == 4


def test_key_covers_module_devices_options_and_flags(monkeypatch):
    from jaxlib import xla_client as xc

    from kaun_ir.runtime.xla import backend

    devices = backend.devices()[:1]
    options = xc.CompileOptions().SerializeAsString()
    base = disk_cache.key("module A", devices, options)
    assert base == disk_cache.key("module A", devices, options)
    assert base != disk_cache.key("module B", devices, options)
    assert base != disk_cache.key(b"module A\0", devices, options)
    tupled = xc.CompileOptions()
    tupled.parameter_is_tupled_arguments = True
    assert base != disk_cache.key("module A", devices, tupled.SerializeAsString())
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=false")
    assert base != disk_cache.key("module A", devices, options)


def test_off_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV, "off")
    assert disk_cache.directory() is None
    assert disk_cache.clear() == 0
    calls = []
    compiled = disk_cache.compile_cached(
        "m", [], b"", lambda: calls.append(1) or "exe", save=lambda exe: b"", load=lambda data: "loaded"
    )
    assert compiled == "exe"
    assert calls == [1]

    monkeypatch.setenv(disk_cache.ENV, str(tmp_path / "c"))
    (tmp_path / "c" / "ab").mkdir(parents=True)
    for name in ("x.xlaexe", ".x.xlaexe.1234.tmp", "keep.txt"):
        (tmp_path / "c" / "ab" / name).write_bytes(b"1")
    assert disk_cache.clear() == 2
    assert [p.name for p in (tmp_path / "c" / "ab").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("value", ["", "   ", "off", " OFF ", "0"])
def test_off_or_blank_variable_means_off(monkeypatch, value):
    monkeypatch.setenv(disk_cache.ENV, value)
    assert disk_cache.directory() is None


# ------------------------------------------------------------------ entries are verified, dirs trusted

TEXT = {"saved": lambda exe: exe.encode(), "load": lambda data: data.decode()}


def cached(module, compiled):
    """``compile_cached`` of a fake executable (a string): returns what the cache handed back and
    whether ``compile_fn`` ran."""
    ran = []
    got = disk_cache.compile_cached(
        module, [], b"", lambda: ran.append(1) or compiled, save=TEXT["saved"], load=TEXT["load"]
    )
    return got, bool(ran)


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(disk_cache.ENV, str(root))
    monkeypatch.setattr(cache_directory, "_warned", set())
    return root


def test_a_swapped_or_damaged_entry_is_a_miss_never_the_wrong_program(cache_env):
    assert cached("program A", "exe A") == ("exe A", True)
    assert cached("program B", "exe B") == ("exe B", True)
    assert cached("program A", "unused") == ("exe A", False)  # a hit
    path_a = disk_cache._entry(str(cache_env), disk_cache.key("program A", [], b""))
    path_b = disk_cache._entry(str(cache_env), disk_cache.key("program B", [], b""))
    data_a, data_b = open(path_a, "rb").read(), open(path_b, "rb").read()
    open(path_a, "wb").write(data_b)  # B's entry under A's key
    with pytest.warns(RuntimeWarning, match="stored under another key"):
        assert cached("program A", "exe A") == ("exe A", True)
    assert open(path_a, "rb").read() == data_a  # stored again, and a hit next time
    assert cached("program A", "unused") == ("exe A", False)

    damaged = bytearray(data_b)
    damaged[-1] ^= 0x20  # same length, one flipped bit in the executable
    open(path_b, "wb").write(bytes(damaged))
    cache_directory._warned.clear()  # one warning per kind and process: let the next ones through
    with pytest.warns(RuntimeWarning, match="checksum mismatch"):
        assert cached("program B", "exe B") == ("exe B", True)
    open(path_b, "wb").write(data_b[len(disk_cache._MAGIC) + 64 :])  # a bare payload: no header
    cache_directory._warned.clear()
    with pytest.warns(RuntimeWarning, match="no cache header"):
        assert cached("program B", "exe B") == ("exe B", True)
    assert cached("program B", "unused") == ("exe B", False)


def test_a_directory_others_may_write_or_own_is_not_trusted(cache_env, monkeypatch):
    assert cached("program", "exe") == ("exe", True)
    assert oct(cache_env.stat().st_mode & 0o777) == oct(0o700)  # created private
    assert cached("program", "unused") == ("exe", False)

    os.chmod(cache_env, 0o777)
    with pytest.warns(RuntimeWarning, match=r"not using the compilation cache .*mode 0777"):
        assert cached("program", "fresh") == ("fresh", True)  # the entry is not even read
    assert cached("program", "fresh") == ("fresh", True)
    os.chmod(cache_env, 0o720)
    assert disk_cache.untrusted_reason(str(cache_env)).startswith("its group or other users may write")
    os.chmod(cache_env, 0o755)
    assert disk_cache.untrusted_reason(str(cache_env)) is None

    monkeypatch.setattr(cache_directory, "_uid", lambda: os.stat(cache_env).st_uid + 1)
    monkeypatch.setattr(cache_directory, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"owned by user id \d+, not by this user"):
        assert cached("program", "fresh") == ("fresh", True)


# ------------------------------------------------------------- on by default: where, bound, key


@pytest.fixture
def home(tmp_path, monkeypatch):
    """No ``KAUN_IR_CACHE_DIR``, and HOME / XDG_CACHE_HOME (LOCALAPPDATA on Windows) in a
    temporary folder: no test reaches the user's own cache."""
    monkeypatch.delenv(disk_cache.ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "home" / "AppData" / "Local"))
    monkeypatch.setattr(cache_directory, "_warned", set())
    return tmp_path / "home"


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout")
def test_the_default_directory_follows_xdg(home, tmp_path, monkeypatch):
    assert not disk_cache.explicit()
    assert disk_cache.directory() == str(home / ".cache" / "kaun_ir" / "compiled")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.directory() == str(tmp_path / "xdg" / "kaun_ir" / "compiled")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert disk_cache.directory() == str(home / ".cache" / "kaun_ir" / "compiled")

    assert cached("program", "exe") == ("exe", True)  # created private, then a hit
    assert oct((home / ".cache" / "kaun_ir" / "compiled").stat().st_mode & 0o777) == oct(0o700)
    assert cached("program", "unused") == ("exe", False)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX modes")
def test_an_unusable_default_directory_is_off_silently(home, monkeypatch, recwarn):
    root = home / ".cache" / "kaun_ir" / "compiled"
    root.mkdir(parents=True)
    os.chmod(root, 0o777)
    assert cached("program", "exe") == ("exe", True)
    assert cached("program", "fresh") == ("fresh", True)  # off: nothing stored or read
    (home / ".cache" / "kaun_ir").chmod(0o700)
    root.rmdir()
    root.parent.rmdir()
    root.parent.write_text("a file where the folder should be")  # cannot be created
    assert cached("program", "again") == ("again", True)
    assert [w for w in recwarn if issubclass(w.category, RuntimeWarning)] == []

    monkeypatch.setenv(disk_cache.ENV, str(root))  # named explicitly: one warning says why
    with pytest.warns(RuntimeWarning, match="cannot create"):
        assert cached("program", "exe") == ("exe", True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 1 << 30), ("12345", 12345), ("500M", 500 << 20), ("2g", 2 << 30), ("64K", 64 << 10), ("0", 0)],
)
def test_max_bytes(monkeypatch, text, expected):
    monkeypatch.setenv(disk_cache.MAX_BYTES_ENV, text)
    assert disk_cache.max_bytes() == expected


def test_an_unreadable_max_bytes_warns_and_uses_the_default(monkeypatch):
    monkeypatch.setattr(cache_directory, "_warned", set())
    monkeypatch.setenv(disk_cache.MAX_BYTES_ENV, "lots")
    with pytest.warns(RuntimeWarning, match="KAUN_IR_CACHE_MAX_BYTES"):
        assert disk_cache.max_bytes() == 1 << 30


def test_the_bound_evicts_the_least_recently_used(cache_env, monkeypatch):
    size = 1000 + disk_cache._HEADER  # each entry: a 1000-byte "executable" and its header
    monkeypatch.setenv(disk_cache.MAX_BYTES_ENV, str(3 * size))  # room for three

    def entry(name):
        return disk_cache._entry(str(cache_env), disk_cache.key(name, [], b""))

    for age, name in enumerate("abc"):
        assert cached(name, name * 1000) == (name * 1000, True)
        os.utime(entry(name), (1000 + age, 1000 + age))  # a, then b, then c: distinct and old
    assert cached("a", "unused") == ("a" * 1000, False)  # a hit makes a the most recent
    assert cached("d", "d" * 1000) == ("d" * 1000, True)  # four: over the bound
    kept = {name for name in "abcd" if os.path.exists(entry(name))}
    assert kept == {"a", "d"}  # down to 90% of three: b and c, the least recently used, went

    assert disk_cache.evict(str(cache_env), limit=0) == 0  # no bound
    assert disk_cache.evict(str(cache_env), limit=2 * size) == 0  # within the bound
    assert disk_cache.evict(str(cache_env), limit=size) == 2  # down to 90% of one entry: both go


def test_the_key_holds_the_host_cpu_and_registered_parts(monkeypatch):
    identity = disk_cache.host_identity()
    assert identity.split("/")[1] == __import__("platform").machine()
    base = disk_cache.key("module", [], b"")
    monkeypatch.setattr(cache_key, "_HOST", ["Linux/x86_64/another CPU/0123"])
    assert disk_cache.key("module", [], b"") != base
    monkeypatch.setattr(cache_key, "_HOST", [identity])
    monkeypatch.setattr(cache_key, "_KEY_PARTS", {})
    assert disk_cache.key("module", [], b"") == base
    disk_cache.register_key_part("custom-calls", b"library binary")
    with_lib = disk_cache.key("module", [], b"")
    assert with_lib != base
    disk_cache.register_key_part("custom-calls", b"rebuilt library")
    assert disk_cache.key("module", [], b"") not in (base, with_lib)
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_some_flag")
    monkeypatch.setattr(cache_key, "_KEY_PARTS", {})
    assert disk_cache.key("module", [], b"") != base


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="the XDG layout")
def test_a_fresh_process_uses_the_default_directory(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in (disk_cache.ENV, "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    first, stderr = run_program(None, base_env=env)
    assert (first["hits"], first["misses"], first["errors"]) == (0, 2, 0), stderr
    assert len(list((home / ".cache" / "kaun_ir" / "compiled").rglob("*.xlaexe"))) == 2


def test_eviction_skips_files_another_process_removed(cache_env, monkeypatch):
    for name in "ab":
        assert cached(name, name * 1000) == (name * 1000, True)
    real_unlink = os.unlink

    def racing_unlink(path, *args, **kwargs):  # another process evicted it first
        real_unlink(path, *args, **kwargs)
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "unlink", racing_unlink)
    assert disk_cache.evict(str(cache_env), limit=10) == 0  # none removed by this process
    monkeypatch.undo()
    assert list(cache_env.rglob("*.xlaexe")) == []


def test_stores_count_the_directory_once_then_only_when_over_the_bound(cache_env, monkeypatch):
    monkeypatch.setenv(disk_cache.MAX_BYTES_ENV, str(3 * (1000 + disk_cache._HEADER)))
    scans = []
    real_scan = disk_cache._scan_and_evict
    monkeypatch.setattr(
        disk_cache, "_scan_and_evict", lambda root, limit: scans.append(root) or real_scan(root, limit)
    )
    for name in "abc":  # the first store counts; the next two fit the bound
        cached(name, name * 1000)
    assert scans == [str(cache_env)]
    cached("a", "unused")  # a lookup never counts
    assert len(scans) == 1
    cached("d", "d" * 1000)  # past the bound: counted again, and evicted
    assert len(scans) == 2 and len(list(cache_env.rglob("*.xlaexe"))) == 2

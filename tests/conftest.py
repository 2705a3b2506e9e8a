"""Shared test setup: run on XLA's CPU backend unless told otherwise, quiet logs, and verify the IR
after every pass of every pipeline (kn.jit, kn.train, kaun-ir opt), so a pass that breaks an IR
invariant fails where it does so (KAUN_IR_VERIFY_EACH=0 turns that off)."""

import os

import pytest

os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
# never read or write the user's persistent compilation cache (on by default): the suite and its
# child processes run without it; the cache's own tests point it at temporary directories
os.environ["KAUN_IR_CACHE_DIR"] = "off"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KAUN_IR_VERIFY_EACH", "1")
# the suite times nothing: no warning about glibc's malloc tunables on large programs
# (tests/test_malloc_tuning.py sets the switch itself for its child processes)
os.environ.setdefault("KAUN_IR_MALLOC_TUNING", "0")


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``long`` unless KAUN_IR_LONG_TESTS=1 (``make test-interop`` sets it)."""
    if os.environ.get("KAUN_IR_LONG_TESTS"):
        return
    skip = pytest.mark.skip(reason="long: set KAUN_IR_LONG_TESTS=1 (make test-interop runs it)")
    for item in items:
        if item.get_closest_marker("long"):
            item.add_marker(skip)

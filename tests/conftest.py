"""Shared test setup: run on XLA's CPU backend unless told otherwise, quiet logs, and verify the IR
after every pass of every pipeline (kn.jit, kn.train, kaun-ir opt), so a pass that breaks an IR
invariant fails where it does so (KAUN_IR_VERIFY_EACH=0 turns that off)."""

import os

os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
# never read or write the user's persistent compilation cache (on by default): the suite and its
# child processes run without it; the cache's own tests point it at temporary directories
os.environ["KAUN_IR_CACHE_DIR"] = "off"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KAUN_IR_VERIFY_EACH", "1")

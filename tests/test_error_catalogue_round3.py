"""The round-3 catalogue (``tests/catalogue_round3.py``): every bad input gets the documented
error class from kaun_ir's own code, before any work.

``python tests/test_error_catalogue_round3.py`` prints the clean / raw / wrong counts and each
case that is not clean (raw: another class, another message or a frame outside kaun_ir last;
wrong: accepted without an error).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest
from catalogue_round3 import CASES
from test_error_catalogue import last_frame_is_ours


def verdict(case) -> tuple[str, str]:
    """``("clean" | "raw" | "wrong", what happened)`` for one case."""
    try:
        case.call()
    except BaseException as err:  # noqa: BLE001 - every outcome is classified
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        ours, where = last_frame_is_ours(err)
        said = f"{type(err).__name__}: {str(err)[:160]} (at {where})"
        if isinstance(err, case.error) and re.search(case.pattern, str(err)) and ours:
            return "clean", said
        return "raw", said
    return "wrong", "accepted"


def test_the_catalogue_is_large_and_covers_the_round3_surfaces():
    assert len(CASES) >= 150
    families = {c.family for c in CASES}
    for family in (
        "lora",
        "accumulate",
        "ema",
        "init-vars",
        "writers",
        "fit-options",
        "pipeline",
        "partitioned",
    ):
        assert family in families, family
    names = [(c.family, c.name) for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"


#: families whose cases need a mesh of several devices: run in a child process with 8 virtual
#: CPU devices (the backend of this process has started with one)
MULTI_DEVICE = ("pipeline",)
ONE_DEVICE = [c for c in CASES if c.family not in MULTI_DEVICE]


@pytest.mark.parametrize("case", ONE_DEVICE, ids=[f"{c.family}/{c.name}" for c in ONE_DEVICE])
def test_round3_bad_input_gets_our_error(case):
    outcome, said = verdict(case)
    assert outcome == "clean", f"{outcome}: {said}; expected {case.error} matching {case.pattern!r}"


def _torch_cases() -> list:
    try:
        import torch  # noqa: F401, PLC0415 - optional
    except ImportError:
        return []
    from catalogue_round3 import torch_cases  # noqa: PLC0415

    return torch_cases()


TORCH = _torch_cases()


@pytest.mark.interop
@pytest.mark.skipif(not TORCH, reason="PyTorch is not installed (the interop extra)")
@pytest.mark.parametrize("case", TORCH or [None], ids=[c.name for c in TORCH] or ["torch"])
def test_round3_torch_bad_input_fails_at_import_with_our_error(case):
    outcome, said = verdict(case)
    assert outcome == "clean", f"{outcome}: {said}; expected {case.error} matching {case.pattern!r}"


def test_round3_multi_device_cases_in_a_child_process():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    here = os.path.dirname(os.path.abspath(__file__))
    argv = [sys.executable, os.path.abspath(__file__), "--strict", *(f"--family={f}" for f in MULTI_DEVICE)]
    done = subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def main(argv=None) -> int:
    """Print each case that is not clean and the counts; ``--strict``: exit 1 unless all are."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--family", action="append", help="only this family (repeatable)")
    parser.add_argument("--strict", action="store_true", help="exit 1 unless every case is clean")
    args = parser.parse_args(argv)
    cases = [c for c in CASES + _torch_cases() if not args.family or c.family in args.family]
    counts = {"clean": 0, "raw": 0, "wrong": 0}
    for case in cases:
        outcome, said = verdict(case)
        counts[outcome] += 1
        if outcome != "clean":
            print(f"{outcome:5}  {case.family}/{case.name}: {said}")
    print(f"{len(cases)} cases: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 1 if args.strict and counts["clean"] != len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())

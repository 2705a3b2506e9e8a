"""The StableHLO importer survives mutated modules: a seeded campaign of mutated MLIR text and
bytecode (``make fuzz-import`` runs 20,000 inputs), each input checked in a worker process so
that a process death is a test failure, not the end of the test run."""

from __future__ import annotations

import os

from fuzz_stablehlo import Report, _run_worker, run


def test_seeded_import_fuzz_campaign_has_no_death_and_no_raw_error():
    # 200 inputs take seconds (make fuzz-import: 20k); input 237 of this seed is one that sends
    # MLIR's reader into a loop, which costs the helper's CPU budget before it is an error
    inputs = int(os.environ.get("KAUN_IR_IMPORT_FUZZ_INPUTS", "200"))
    report = run(inputs=inputs, seed=20261126)
    assert report.inputs == inputs
    assert report.imported > 0 and report.rejected > 0  # the mutants reach both outcomes
    assert not report.deaths, report.deaths[0]
    assert not report.raw_errors, report.raw_errors[0]


def test_a_worker_that_dies_is_counted_as_a_death_and_the_campaign_goes_on(tmp_path):
    broken = tmp_path / "corpus.pickle"
    broken.write_bytes(b"not a pickle")  # the worker fails before its first input
    report = Report()
    next_input = _run_worker(str(broken), 0, 5, 10, 30.0, report, False, 0.0)
    assert next_input == 6
    assert report.inputs == 1 and len(report.deaths) == 1
    assert report.deaths[0][:2] == (5, "death") and "exit status 1" in report.deaths[0][2]

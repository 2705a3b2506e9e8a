"""The textual IR parser cannot be crashed: a seeded mutation-fuzzing campaign (bounded to a few
seconds here; ``make fuzz`` runs 100,000 inputs) and targeted inputs that used to crash it."""

from __future__ import annotations

import os

import pytest
from fuzz_ir import check, corpus, run

import kaun_ir as kn

GOOD = "graph @main(%0: f32[2]) -> (f32[2]) {\n  %1 = negate %0 : f32[2]{loc}\n  return %1\n}\n"


def test_seeded_fuzz_campaign_finds_no_crash():
    inputs = int(os.environ.get("KAUN_IR_FUZZ_INPUTS", "800"))  # a few seconds; `make fuzz` runs 100k
    report = run(inputs=inputs, seed=20261123)
    assert report.inputs == inputs
    assert report.accepted > 0 and report.rejected > 0  # the mutants exercise both paths
    assert not report.crashes, report.crashes[0]


def test_corpus_texts_are_handled_and_most_lower():
    outcomes = [check(text) for text in corpus()]
    assert not [problem for outcome, problem in outcomes if outcome == "crash"]
    # a few .kir files hold deliberately invalid graphs (the verifier's own tests)
    assert sum(outcome == "accepted" for outcome, _ in outcomes) >= 0.8 * len(outcomes)


@pytest.mark.parametrize("depth", [33, 500, 5000])
def test_deeply_nested_attributes_are_a_parse_error(depth):
    text = GOOD.replace("negate %0 :", "negate %0 {x = " + "[" * depth + "1" + "]" * depth + "} :")
    with pytest.raises(kn.ParseError, match="nested deeper than 32"):
        kn.ir.parse(text.replace("{loc}", ""))


def test_deeply_nested_regions_are_a_parse_error():
    inner = "graph @r(%0: f32[]) -> (f32[]) {\n  return %0\n}"
    for _ in range(40):
        inner = (
            "graph @r(%0: f32[]) -> (f32[]) {\n  %1 = negate %0 : f32[] regions {\n"
            + inner
            + "\n}\n  return %1\n}"
        )
    with pytest.raises(kn.ParseError, match="regions nested deeper"):
        kn.ir.parse(inner)


def test_lone_surrogate_in_a_location_is_a_parse_error():
    with pytest.raises(kn.ParseError, match="lone surrogate") as info:
        kn.ir.parse(GOOD.replace("{loc}", ' loc("\\ud800")'))
    assert info.value.line == 2


@pytest.mark.parametrize("name", ["1hain", "9", "_x", "caf\u00e9"])
def test_graph_names_the_parser_accepts_lower(name):
    # found by `make fuzz`: @1hain parsed but its MLIR module name did not
    text = f"graph @{name}(%0: f32[]) -> (f32[]) {{\n  %1 = sine %0 : f32[]\n  return %1\n}}\n"
    try:
        kn.ir.parse(text)
    except kn.ParseError:
        return  # not a name of the IR: rejected, fine
    assert check(text) == ("accepted", None)


@pytest.mark.parametrize("dims", ["99999999999999999999", "1099511627777", "1048576,1048576,1048576"])
def test_dimensions_too_large_to_lower_are_a_parse_error(dims):
    with pytest.raises(kn.ParseError, match="limited to"):
        kn.ir.parse(f"graph @main(%0: f32[{dims}]) -> (f32[{dims}]) {{\n  return %0\n}}")


# found by mutating the op table's samples and compiling what verify() accepts: XLA (or the
# runtime's mesh) rejected these graphs that the verifier let through
@pytest.mark.parametrize(
    "mesh",
    ['[["x", 0]]', '[["data", -2]]', '[["", 1]]', '[["x", true]]', '[["x", 1], ["x", 1]]', "[[1, 1]]"],
)
def test_verify_rejects_a_sharding_mesh_the_backend_rejects(mesh):
    text = (
        "graph @g(%0: i32[3]) -> (i32[3]) {\n"
        f"  %1 = sharding_constraint %0 {{mesh = {mesh}, spec = []}} : i32[3]\n  return %1\n}}\n"
    )
    with pytest.raises(kn.IRError, match=r"sharding_constraint.*mesh"):
        kn.ir.parse(text)
    assert check(text.replace(mesh, '[["x", 1]]')) == ("accepted", None)  # a valid mesh lowers

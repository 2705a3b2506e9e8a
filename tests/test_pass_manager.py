"""The pass manager: pipelines with options, instrumentation, verification, stop-after, crash
reproducers, default pipelines and their overrides, and ``kaun-ir opt`` (see docs/passes.md).

The ``.kir`` files under ``tests/kir/pass_manager/`` are FileCheck tests of the CLI flags whose
output goes to stderr: their RUN lines may end in ``2>&1 | FileCheck %s`` (stdout and stderr
checked together, interleaved as written) and may use ``%S`` for the directory of the file, as
in LLVM's lit.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pathlib
import random
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from filecheck import check

import kaun_ir as kn
from kaun_ir import passes
from kaun_ir.errors import IRError
from kaun_ir.ir import parse
from kaun_ir.runtime import pipelines
from kaun_ir.tools.opt import load_module

TESTS = pathlib.Path(__file__).parent
ROOT = TESTS.parent
F32 = np.float32

DUPS = """graph @dups(%0: f32[3] "x", %1: f32[3] "y") -> (f32[3]) {
  %2 = exponential %0 : f32[3]
  %3 = exponential %0 : f32[3]
  %4 = sine %1 : f32[3]
  %5 = add %2, %3 : f32[3]
  return %5
}
"""


@pytest.fixture
def scratch():
    """Passes registered by the test itself are removed afterwards (module-loaded ones stay)."""
    before = set(passes.REGISTRY)
    yield
    for name in set(passes.REGISTRY) - before:
        if passes.REGISTRY[name].fn.__module__ == __name__:
            del passes.REGISTRY[name]


def _register_option_passes():
    seen = {}

    @passes.register(
        "t-layout",
        options={
            "prefer": (str, "nchw", "preferred layout"),
            "strict": (bool, False, "fail on mixed layouts"),
        },
    )
    def t_layout(graph, prefer, strict):
        seen["t-layout"] = {"prefer": prefer, "strict": strict}
        return graph

    @passes.register(
        "t-fuse",
        options={
            "horizontal": (bool, False, "fuse siblings"),
            "max_group": (int, 8, "largest group"),
            "ratio": (float, 0.5, "cost ratio"),
        },
    )
    def t_fuse(graph, horizontal, max_group, ratio):
        seen["t-fuse"] = {"horizontal": horizontal, "max_group": max_group, "ratio": ratio}
        return graph

    return seen


# ------------------------------------------------------------------------- the registry


def test_each_built_in_pass_lives_in_a_file_named_after_it():
    import importlib

    builtin = {n: i for n, i in passes.REGISTRY.items() if i.fn.__module__.startswith("kaun_ir.passes.")}
    assert {"autodiff", "cse", "dce", "lower-pool", "lower-conv", "fuse-optimizer"} <= set(builtin)
    for name, info in builtin.items():
        assert info.fn.__module__ == "kaun_ir.passes." + name.replace("-", "_"), name
    # and every module of passes/ that registers a pass is named after one
    package = pathlib.Path(passes.__file__).parent
    for path in package.glob("*.py"):
        module = importlib.import_module(f"kaun_ir.passes.{path.stem}")
        registered = [n for n, i in passes.REGISTRY.items() if i.fn.__module__ == module.__name__]
        assert registered in ([], [path.stem.replace("_", "-")]), (path.name, registered)


def test_register_contract_options_are_always_filled(scratch):
    seen = _register_option_passes()
    graph = parse(DUPS)
    passes.run(graph, "t-layout,t-fuse{ratio=2.5}")
    assert seen["t-layout"] == {"prefer": "nchw", "strict": False}
    assert seen["t-fuse"] == {"horizontal": False, "max_group": 8, "ratio": 2.5}
    passes.run(graph, "t-fuse{max_group=3 horizontal=true}")
    assert seen["t-fuse"] == {"horizontal": True, "max_group": 3, "ratio": 0.5}
    info = passes.REGISTRY["t-fuse"]
    assert info.options["max_group"] == passes.PassOption("max_group", int, 8, "largest group")
    assert info.description == ""  # no docstring, no description: empty, not an error


def test_passes_without_options_are_called_with_the_graph_alone(scratch):
    calls = []

    @passes.register("t-plain", description="plain")
    def t_plain(graph):
        calls.append(graph)
        return graph

    graph = parse(DUPS)
    assert passes.run(graph, "t-plain") is graph and calls == [graph]
    assert passes.available()["t-plain"] == "plain"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"Bad-Name": (int, 1, "")}, "snake_case"),
        ({"n": (list, [], "")}, "type must be one of bool, int, float, str"),
        ({"n": (int, "3", "")}, "default '3' is not a int"),
        ({"n": (bool, 0, "")}, "default 0 is not a bool"),
        ({"n": (int, 1)}, r"expected Option\(type, default, help, ...\)"),
        ({"n": passes.Option(int, -1, "", min=0)}, "default -1 .*must be int >= 0"),
        ({"n": passes.Option(str, "a", "", min=0)}, "min= / max= bound int and float options only"),
        ({"n": passes.Option(int, 1, "", choices=("1",))}, "choices= lists the values of a str option"),
    ],
)
def test_register_rejects_bad_option_declarations(options, message):
    with pytest.raises(ValueError, match=message):
        passes.register("t-bad", options=options)
    assert "t-bad" not in passes.REGISTRY


def test_float_options_accept_int_defaults(scratch):
    @passes.register("t-float", options={"x": (float, 1, "")})
    def t_float(graph, x):
        assert type(x) is float
        return graph

    assert passes.REGISTRY["t-float"].options["x"].default == 1.0
    passes.run(parse(DUPS), "t-float")


# ------------------------------------------------------------------------------ pipelines


def test_pipeline_parses_and_prints_back(scratch):
    _register_option_passes()
    text = "t-layout{prefer=nhwc},t-fuse{horizontal=true},cse,dce"
    pipeline = passes.Pipeline.parse(text)
    assert str(pipeline) == text
    assert pipeline.steps[0] == passes.PassStep("t-layout", (("prefer", "nhwc"),))
    assert pipeline.steps[1].resolved_options() == {"horizontal": True, "max_group": 8, "ratio": 0.5}
    assert pipeline == passes.Pipeline.parse(" t-layout { prefer = nhwc } , t-fuse{horizontal=1},cse, dce ")
    assert pipeline != passes.Pipeline.parse("t-layout{prefer=nchw},t-fuse{horizontal=true},cse,dce")
    assert len(pipeline) == 4 and [s.name for s in pipeline] == ["t-layout", "t-fuse", "cse", "dce"]
    assert passes.Pipeline.of("cse", "dce") == passes.Pipeline.parse("cse,dce")
    assert str(passes.Pipeline.parse("")) == "" and not passes.Pipeline.parse("  ")
    assert passes.parse_pipeline(" cse , dce ,") == ["cse", "dce"]
    assert passes.Pipeline.parse(pipeline) is pipeline
    assert hash(pipeline) == hash(passes.Pipeline.parse(text))


def _random_value(rng: random.Random, kind):
    if kind is bool:
        return rng.random() < 0.5
    if kind is int:
        return rng.choice([0, 1, -1, 7, 2**40, -(2**63)]) if rng.random() < 0.5 else rng.randint(-999, 999)
    if kind is float:
        return rng.choice(
            [
                0.0,
                -0.0,
                0.5,
                -2.0,
                1e-300,
                3.5e20,
                math.inf,
                -math.inf,
                rng.uniform(-1e6, 1e6),
                rng.random() * 10 ** rng.randint(-30, 30),
            ]
        )
    alphabet = 'ab-_.xyz09, {}="\\\t'
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))


def test_pipeline_round_trip_over_random_pipelines(scratch):
    """Property: for random steps, the canonical text prints back identically and parses to an
    equal pipeline; re-spacing the text (outside quoted values) does not change the pipeline."""
    for kind in (bool, int, float, str):
        name = kind.__name__
        passes.register(f"t-{name}", options={"a": (kind, kind(), ""), "b_2": (kind, kind(), "")})(
            lambda graph, a, b_2: graph
        )
    names = ["cse", "dce", "t-bool", "t-int", "t-float", "t-str"]
    rng = random.Random(1234)
    for _ in range(400):
        steps = []
        for _ in range(rng.randint(0, 5)):
            name = rng.choice(names)
            info = passes.REGISTRY[name]
            chosen = rng.sample(sorted(info.options), rng.randint(0, len(info.options)))
            steps.append(
                passes.PassStep(
                    name, tuple((opt, _random_value(rng, info.options[opt].type)) for opt in chosen)
                )
            )
        pipeline = passes.Pipeline(tuple(steps))
        text = str(pipeline)
        parsed = passes.Pipeline.parse(text)
        assert parsed == pipeline, text
        assert str(parsed) == text
        if '"' not in text:  # whitespace around tokens is free
            spaced = text.replace(",", " , ").replace("{", " { ").replace("}", " } ").replace("=", " = ")
            assert passes.Pipeline.parse(f"  {spaced}  ") == pipeline, spaced


def _parse_error(text):
    with pytest.raises(passes.PipelineError) as info:
        passes.Pipeline.parse(text)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_pipeline_errors_name_what_exists(scratch):
    _register_option_passes()
    assert _parse_error("cse,nope") == f"unknown pass 'nope'; available: {', '.join(sorted(passes.REGISTRY))}"
    assert {"autodiff", "cse", "dce", "t-fuse"} <= set(passes.REGISTRY)
    message = _parse_error("t-fuse{maxgroup=2}")
    assert message == (
        "unknown option 'maxgroup' of pass 't-fuse'; its options: horizontal (bool, "
        "default false), max_group (int, default 8), ratio (float, default 0.5)"
    )
    assert _parse_error("cse{x=1}") == "unknown option 'x' of pass 'cse'; it takes no options"
    assert (
        _parse_error("t-fuse{max_group=2.5}") == "option 'max_group' of pass 't-fuse' expects int, got '2.5'"
    )
    assert _parse_error("t-fuse{ratio=fast}") == "option 'ratio' of pass 't-fuse' expects float, got 'fast'"
    assert (
        _parse_error("t-fuse{horizontal=yes}")
        == "option 'horizontal' of pass 't-fuse' expects bool, got 'yes' (use true or false)"
    )


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("cse dce", "expected ',' between passes, found 'd'", 4),
        ("t-fuse{max_group=2", "missing '}' after the options of 't-fuse'", 18),
        ("t-fuse{max_group}", "expected '=' after option 'max_group' of pass 't-fuse'", 16),
        ("t-fuse{max_group=}", 'expected an option value (use "" for an empty string)', 17),
        ("t-fuse{max_group=1,ratio=2.0}", "options are separated by spaces, passes by ','", 18),
        ("t-fuse{max_group=1 max_group=2}", "option 'max_group' of pass 't-fuse' given twice", 19),
        ('t-layout{prefer="nhwc}', "unterminated quoted value", 16),
        (",cse", "expected a pass name, found ','", 0),
        ("cse,,dce", "expected a pass name, found ','", 4),
        ("cse{", "missing '}' after the options of 'cse'", 4),
    ],
)
def test_pipeline_syntax_errors_point_at_the_column(scratch, text, message, column):
    _register_option_passes()
    lines = _parse_error(text).split("\n")
    assert lines[0] == message
    assert lines[1] == f"  {text}"
    assert lines[2] == "  " + " " * column + "^"


def test_pipeline_type_errors():
    with pytest.raises(TypeError, match="a pipeline is a string"):
        passes.Pipeline.parse(["cse"])
    with pytest.raises(ValueError, match="stop_after"):
        passes.PassManager("cse", stop_after=-1)


def test_quoted_string_values(scratch):
    _register_option_passes()
    pipeline = passes.Pipeline.parse('t-layout{prefer="a b,{c}=\\"d\\\\"}')
    assert pipeline.steps[0].options == (("prefer", 'a b,{c}="d\\'),)
    assert str(pipeline) == 't-layout{prefer="a b,{c}=\\"d\\\\"}'
    assert str(passes.Pipeline.parse('t-layout{prefer=""}')) == 't-layout{prefer=""}'


def test_int_option_spellings(scratch):
    _register_option_passes()
    values = {
        text: passes.Pipeline.parse(f"t-fuse{{max_group={text}}}").steps[0].options[0][1]
        for text in ("12", "-3", "007", "0x1f", "0b101")
    }
    assert values == {"12": 12, "-3": -3, "007": 7, "0x1f": 31, "0b101": 5}


# ------------------------------------------------------------------------ instrumentation


class Recorder(passes.Instrumentation):
    def __init__(self, log, tag):
        self.log, self.tag = log, tag

    def before(self, pass_, graph):
        self.log.append((self.tag, "before", str(pass_), len(graph.nodes)))

    def after(self, pass_, graph, result, seconds):
        assert seconds >= 0
        self.log.append((self.tag, "after", str(pass_), len(result.nodes)))

    def failed(self, pass_, graph, error):
        self.log.append((self.tag, "failed", str(pass_), type(error).__name__))

    def finish(self):
        self.log.append((self.tag, "finish"))


def test_hooks_run_around_every_pass_in_order():
    log = []
    passes.run(parse(DUPS), "cse,dce", instrumentations=[Recorder(log, "a"), Recorder(log, "b")])
    assert log == [
        ("a", "before", "cse (#1)", 4),
        ("b", "before", "cse (#1)", 4),
        ("a", "after", "cse (#1)", 3),
        ("b", "after", "cse (#1)", 3),
        ("a", "before", "dce (#2)", 3),
        ("b", "before", "dce (#2)", 3),
        ("a", "after", "dce (#2)", 2),
        ("b", "after", "dce (#2)", 2),
        ("a", "finish"),
        ("b", "finish"),
    ]


def test_print_after_all_prints_every_pass():
    out = io.StringIO()
    graph = parse(DUPS)
    result = passes.run(graph, "cse,dce,dce", [passes.PrintAfterAll(out)])
    after_cse = passes.run(graph, "cse")
    assert out.getvalue() == (
        "// -----// IR Dump After cse (#1) //----- //\n"
        + after_cse.text()
        + "// -----// IR Dump After dce (#2) //----- //\n"
        + result.text()
        + "// -----// IR Dump After dce (#3) //----- //\n"
        + result.text()
    )


def test_print_after_change_prints_a_unified_diff_of_changed_passes_only():
    import difflib

    out = io.StringIO()
    graph = parse(DUPS)
    passes.run(graph, "dce,cse,cse,dce", [passes.PrintAfterChange(out)])
    text = out.getvalue()
    # dce (#1) drops the dead sine, cse (#2) merges the exponentials; the rest change nothing
    headers = re.findall(r"^// -----// IR Dump After (.*) //----- //$", text, re.M)
    assert headers == ["dce (#1) (changed)", "cse (#2) (changed)"]
    after_dce = passes.run(graph, "dce")
    after_cse = passes.run(after_dce, "cse")
    expected = "".join(
        difflib.unified_diff(
            after_dce.text().splitlines(True),
            after_cse.text().splitlines(True),
            "before cse (#2)",
            "after cse (#2)",
        )
    )
    assert text.endswith(expected)
    assert "-  %3 = exponential %0 : f32[3]\n" in expected


def test_timing_records_each_pass():
    timing = passes.Timing()
    passes.run(parse(DUPS), "cse,dce", [timing])
    assert [name for name, _ in timing.times] == ["cse (#1)", "dce (#2)"]
    assert all(seconds >= 0 for _, seconds in timing.times)
    report = timing.report()
    assert "Execution time report" in report and "Total Execution Time:" in report
    assert re.search(r"^\s+\d+\.\d{4} \(\s*\d+\.\d%\)\s+cse \(#1\)$", report, re.M)
    assert re.search(r"^\s+\d+\.\d{4} \(100\.0%\)\s+Total$", report, re.M)


def test_statistics_count_nodes_ops_and_pass_counters(scratch):
    @passes.register("t-count")
    def t_count(graph):
        passes.statistic("graphs seen")
        passes.statistic("nodes seen", len(graph.nodes))
        passes.statistic("nodes seen", len(graph.nodes))
        return graph

    stats = passes.Statistics()
    passes.run(parse(DUPS), "t-count,cse,dce", [stats])
    records = {r.name: r for r in stats.records}
    assert list(records) == ["t-count (#1)", "cse (#2)", "dce (#3)"]
    assert records["t-count (#1)"].counters == {"graphs seen": 1, "nodes seen": 8}
    assert (records["cse (#2)"].nodes_before, records["cse (#2)"].nodes_after) == (4, 3)
    assert records["cse (#2)"].ops_removed == {"exponential": 1} and records["cse (#2)"].ops_added == {}
    assert records["dce (#3)"].ops_removed == {"sine": 1} and records["dce (#3)"].counters == {}
    report = stats.report()
    assert "t-count (#1)\n  nodes: 4 -> 4 (+0)\n  1 graphs seen\n  8 nodes seen\n" in report
    assert "cse (#2)\n  nodes: 4 -> 3 (-1)\n  -1 exponential\n" in report
    passes.statistic("outside any pass")  # a no-op, not an error


def test_statistics_count_ops_added(scratch):
    stats = passes.Statistics()
    graph = kn.trace(lambda x: (kn.sin(x) * x).sum(), np.ones(3, F32))
    passes.run(graph, "autodiff", [stats])
    record = stats.records[0]
    assert record.nodes_after > record.nodes_before
    assert record.ops_added.get("cosine", 0) >= 1 and record.ops_removed == {}


def test_verify_each_names_the_pass_that_broke_the_ir():
    load_module(str(TESTS / "broken_passes.py"))
    log = []
    graph = parse(DUPS)
    # without verification nobody notices here
    broken = passes.run(graph, "cse,break-types,dce", verify_each=False)
    with pytest.raises(IRError):
        broken.verify()
    with pytest.raises(
        passes.PassVerificationError, match=r"the IR produced by pass break-types \(#2\) is invalid: "
    ) as info:
        passes.run(graph, "cse,break-types,dce", [Recorder(log, "r")], verify_each=True)
    assert isinstance(info.value, IRError)
    assert info.value.pass_name == "break-types" and info.value.index == 2
    assert ("r", "failed", "break-types (#2)", "PassVerificationError") in log
    assert ("r", "before", "dce (#3)", 3) not in [entry[:4] for entry in log]


def test_verify_each_checks_the_input_too():
    load_module(str(TESTS / "broken_passes.py"))
    bad = passes.run(parse(DUPS), "break-types", verify_each=False)
    with pytest.raises(passes.PassVerificationError, match=r"the input IR \(before any pass\) is invalid"):
        passes.run(bad, "dce", verify_each=True)


def test_verify_each_follows_the_environment_unless_given(monkeypatch):
    load_module(str(TESTS / "broken_passes.py"))
    graph = parse(DUPS)
    monkeypatch.setenv(passes.VERIFY_EACH_ENV, "1")
    with pytest.raises(passes.PassVerificationError, match=r"pass break-types \(#1\)"):
        passes.run(graph, "break-types")
    with pytest.raises(IRError):
        passes.run(graph, "break-types", verify_each=False).verify()  # explicit wins
    monkeypatch.setenv(passes.VERIFY_EACH_ENV, "0")
    assert not passes.PassManager("dce").verify_each
    with pytest.raises(passes.PassVerificationError):
        passes.run(graph, "break-types", verify_each=True)
    monkeypatch.delenv(passes.VERIFY_EACH_ENV)
    assert not passes.PassManager("dce").verify_each
    monkeypatch.setenv(passes.VERIFY_EACH_ENV, "yes")
    with pytest.raises(ValueError, match="KAUN_IR_VERIFY_EACH='yes'"):
        passes.PassManager("dce")
    # the command line follows it too (without --verify-each)
    monkeypatch.setenv(passes.VERIFY_EACH_ENV, "1")
    status, _, stderr = run_cli(
        ["opt", "--load", str(TESTS / "broken_passes.py"), "-p", "break-types"], stdin=DUPS
    )
    assert status == 1 and "the IR produced by pass break-types (#1) is invalid" in stderr


def test_stop_after_runs_only_the_first_passes():
    graph = parse(DUPS)
    log = []
    assert passes.run(graph, "cse,dce", stop_after=0) is graph
    assert (
        passes.run(graph, "cse,dce", [Recorder(log, "r")], stop_after=1).text()
        == passes.run(graph, "cse").text()
    )
    assert [e[2] for e in log if e[1] == "before"] == ["cse (#1)"]
    assert passes.run(graph, "cse,dce", stop_after=5).text() == passes.run(graph, "cse,dce").text()


# ------------------------------------------------------------------------- crashes


def test_a_crash_writes_a_reproducer_that_reproduces_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    module = load_module(str(TESTS / "broken_passes.py"))
    log = []
    graph = parse(DUPS)
    with pytest.raises(passes.PassCrash) as info:
        passes.run(graph, "cse,crash,dce", [Recorder(log, "r")])
    crash = info.value
    assert crash.pass_name == "crash" and crash.index == 2
    assert isinstance(crash.__cause__, ZeroDivisionError)
    path = pathlib.Path(crash.reproducer)
    assert path.parent == tmp_path and re.fullmatch(r"crash-[0-9a-f]{12}\.kir", path.name)
    assert str(crash) == (
        f"pass crash (#2) crashed: ZeroDivisionError: integer division or modulo by "
        f"zero; reproducer written to {path}"
    )
    assert ("r", "failed", "crash (#2)", "ZeroDivisionError") in log
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing half-written left over
    # the file: a RUN line re-running the failing pass and the rest, then the pass's input IR
    lines = path.read_text().split("\n")
    load = os.path.abspath(module.__file__)
    assert lines[0] == f"// RUN: kaun-ir opt %s --load {load} -p crash,dce"
    assert lines[1] == "// kaun_ir pass crash reproducer: pass 'crash' raised"
    assert lines[2] == "// ZeroDivisionError: integer division or modulo by zero"
    assert "\n".join(lines[3:]) == passes.run(graph, "cse").text()
    assert parse(path.read_text()).text() == passes.run(graph, "cse").text()

    # re-running the RUN line reproduces the crash, in a fresh process
    argv = [str(path) if w == "%s" else w for w in shlex.split(lines[0][len("// RUN:") :])]
    assert argv[0] == "kaun-ir"
    result = subprocess.run(
        [sys.executable, "-m", "kaun_ir.tools.cli", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(tmp_path / "again"),
    )
    assert result.returncode == 1 and result.stdout == ""
    assert re.search(
        r"kaun-ir opt: error: pass crash \(#1\) crashed: ZeroDivisionError: .*; reproducer "
        r"written to .*again.crash-[0-9a-f]{12}\.kir",
        result.stderr,
    ), result.stderr
    # the same input and remaining pipeline: the same reproducer, byte for byte
    again = list((tmp_path / "again").iterdir())
    assert [p.name for p in again] == [path.name] and again[0].read_text() == path.read_text()


def _env(repro_dir):
    env = dict(os.environ)
    env["KAUN_IR_REPRO_DIR"] = str(repro_dir)
    return env


def test_reproducer_keeps_options_and_quotes_the_pipeline(tmp_path, monkeypatch, scratch):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    load_module(str(TESTS / "broken_passes.py"))
    _register_option_passes()
    with pytest.raises(passes.PassCrash) as info:
        passes.run(parse(DUPS), "crash{divisor=0},t-fuse{horizontal=true max_group=2}")
    first = pathlib.Path(info.value.reproducer).read_text().split("\n")[0]
    assert first.endswith(" -p 'crash{divisor=0},t-fuse{horizontal=true max_group=2}'")
    # the test module registered t-fuse, so it is listed for --load
    assert shlex.split(first[len("// RUN:") :])[3:6] == [
        "--load",
        os.path.abspath(TESTS / "broken_passes.py"),
        "--load",
    ]


def test_diagnostics_of_a_pass_propagate_unchanged_without_reproducer(tmp_path, monkeypatch):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    graph = kn.trace(lambda x: x * 2.0, kn.ShapeDtype((3,)))
    with pytest.raises(kn.GradientError, match="use kn.vjp") as info:
        passes.run(graph, "cse,autodiff")
    assert "in pass autodiff (#2) of pipeline 'cse,autodiff'" in info.value.__notes__
    assert list(tmp_path.iterdir()) == []


def test_a_pass_returning_something_else_is_a_crash(tmp_path, monkeypatch, scratch):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    passes.register("t-none")(lambda graph: None)
    with pytest.raises(
        passes.PassCrash,
        match=r"pass t-none \(#1\) crashed: TypeError: a pass must "
        r"return a Graph, got NoneType",
    ):
        passes.run(parse(DUPS), "t-none")


# ---------------------------------------------------------------------- default pipelines


def _dup_fn(x):
    return kn.exp(x) + kn.exp(x)


def test_jit_default_pipeline_env_override_and_explicit(monkeypatch):
    x = np.ones(3, F32)
    monkeypatch.delenv("KAUN_IR_PIPELINE", raising=False)
    assert pipelines.DEFAULT_JIT_PIPELINE == "canonicalize,fold,cse,dce"
    # the backend's default: the neutral one plus, on CPU, the convolution/pooling passes
    assert pipelines.default_jit_pipeline("gpu") == pipelines.DEFAULT_JIT_PIPELINE
    assert (
        pipelines.default_jit_pipeline("cpu")
        == f"{pipelines.DEFAULT_JIT_PIPELINE},{pipelines.CPU_CONVOLUTION_PASSES},{pipelines.CPU_DOT_PASSES}"
    )
    exe = kn.jit(_dup_fn).executable(x)
    assert exe.pipeline == pipelines.default_jit_pipeline() and exe.graph.op_counts()["exponential"] == 1

    jitted = kn.jit(_dup_fn)  # decorated before the variable is set: read at compile time
    monkeypatch.setenv("KAUN_IR_PIPELINE", "")
    assert jitted.pipeline == ""
    exe = jitted.executable(x)
    assert exe.pipeline == "" and exe.graph.op_counts()["exponential"] == 2
    np.testing.assert_allclose(np.asarray(jitted(x)), 2 * np.exp(x), rtol=1e-6)

    monkeypatch.setenv("KAUN_IR_PIPELINE", " dce ")
    assert kn.jit(_dup_fn).executable(x).pipeline == "dce"
    # an explicit pipeline wins over the environment
    assert kn.jit(_dup_fn, pipeline="cse").executable(x).pipeline == "cse"
    assert kn.jit(_dup_fn, pipeline=passes.Pipeline.parse("cse, dce")).executable(x).pipeline == "cse,dce"

    monkeypatch.setenv("KAUN_IR_PIPELINE", "cse,nope")
    with pytest.raises(passes.PipelineError, match="unknown pass 'nope'"):
        kn.jit(_dup_fn)(x)


def test_train_pipeline_keyword_and_env(monkeypatch):
    from kaun_ir import layer, optim, train
    from kaun_ir.nn import loss
    from kaun_ir.train import step_memory

    x = np.random.default_rng(0).standard_normal((4, 3)).astype(F32)
    labels = np.array([0, 1, 1, 0])
    monkeypatch.delenv("KAUN_IR_TRAIN_PIPELINE", raising=False)

    def step_executable(trainer):
        with kn.rng.scope(0):
            st = train.init(trainer)
        return train.step_executable(trainer, st, x, lambda y: loss.cross_entropy_sparse(y, labels))

    assert pipelines.DEFAULT_TRAIN_PIPELINE == "canonicalize,fold,cse,dce"
    assert pipelines.default_train_pipeline("tpu") == pipelines.DEFAULT_TRAIN_PIPELINE
    # the default pipeline starts with the default rematerialisation (a no-op below its size);
    # a pipeline given by keyword or environment runs as written
    auto = f"remat{{policy=dots depth=0 min_bytes={step_memory.AUTO_REMAT_MIN_BYTES}}},"
    assert (
        step_executable(train.make(layer.linear(3, 2), optim.sgd(0.1))).pipeline
        == auto + pipelines.default_train_pipeline()
    )
    trainer = train.make(layer.linear(3, 2), optim.sgd(0.1), pipeline=" dce ")
    assert trainer.pipeline == "dce"
    monkeypatch.setenv("KAUN_IR_TRAIN_PIPELINE", "")
    assert step_executable(trainer).pipeline == "dce"  # the keyword wins over the environment
    lean = step_executable(train.make(layer.linear(3, 2), optim.sgd(0.1)))
    assert lean.pipeline == ""
    monkeypatch.setenv("KAUN_IR_PIPELINE", "")  # kn.jit's variable does not affect training
    monkeypatch.setenv("KAUN_IR_TRAIN_PIPELINE", "cse")
    assert step_executable(train.make(layer.linear(3, 2), optim.sgd(0.1))).pipeline == "cse"
    with pytest.raises(passes.PipelineError, match="unknown pass 'nope'"):
        train.make(layer.linear(3, 2), optim.sgd(0.1), pipeline="nope")


# --------------------------------------------------------------------------------- the CLI


def run_cli(argv, stdin: str = "", merge: bool = False):
    """``kaun-ir ARGV`` in-process: (status, stdout, stderr); ``merge``: stderr into stdout."""
    from kaun_ir.tools import cli

    out = io.StringIO()
    err = out if merge else io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(argv)
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdin = old_stdin
    return status, out.getvalue(), ("" if merge else err.getvalue())


def test_opt_keeps_stdout_for_ir_and_stderr_for_the_rest():
    argv = [
        "opt",
        "-p",
        "cse,dce",
        "--print-ir-after-all",
        "--print-ir-after-change",
        "--timing",
        "--stats",
        "--verify-each",
    ]
    status, stdout, stderr = run_cli(argv, stdin=DUPS)
    assert status == 0
    assert stdout == passes.run(parse(DUPS), "cse,dce").text()
    assert stderr.count("IR Dump After") == 4 and "Execution time report" in stderr
    assert "Pass statistics report" in stderr


def test_opt_stop_after_notes_what_was_skipped():
    status, stdout, stderr = run_cli(["opt", "-p", "cse,dce,cse", "--stop-after", "1"], stdin=DUPS)
    assert status == 0 and stdout == passes.run(parse(DUPS), "cse").text()
    assert stderr == "kaun-ir opt: note: stopped after pass #1; skipped: dce,cse\n"
    status, _, stderr = run_cli(["opt", "-p", "cse", "--stop-after", "-1"], stdin=DUPS)
    assert status == 1 and "--stop-after needs a non-negative number" in stderr


def test_opt_errors():
    status, stdout, stderr = run_cli(["opt", "-p", "cse{x=1}"], stdin=DUPS)
    assert (status, stdout) == (1, "")
    assert stderr == "kaun-ir opt: error: unknown option 'x' of pass 'cse'; it takes no options\n"
    status, _, stderr = run_cli(["opt", "--load", "no_such_module_xyz"])
    assert status == 1 and stderr.startswith(
        "kaun-ir opt: error: --load no_such_module_xyz: ModuleNotFoundError"
    )
    status, _, stderr = run_cli(["opt", "--load", "/nonexistent/dir/mod.py"])
    assert status == 1 and "no such file" in stderr
    status, _, stderr = run_cli(["opt", "/nonexistent/input.kir"])
    assert status == 1 and "No such file" in stderr


def test_opt_load_by_name_and_by_path():
    status, stdout, _ = run_cli(["opt", "--load", "example_pass", "--list-passes"])
    assert status == 0 and "double-negation" in stdout
    path = str(TESTS / "example_pass.py")
    status, stdout, stderr = run_cli(
        ["opt", "--load", path, "-p", "double-negation{limit=1}", "--stats"],
        stdin=(TESTS / "example_pass.kir").read_text(),
    )
    assert status == 0 and stdout.count("negate") == 3
    assert "1 double negations removed" in stderr


def test_opt_load_module_that_fails(tmp_path):
    bad = tmp_path / "bad_passes_mod.py"
    bad.write_text("raise RuntimeError('cannot load me')\n")
    status, _, stderr = run_cli(["opt", "--load", str(bad), "--list-passes"])
    assert status == 1 and stderr == f"kaun-ir opt: error: --load {bad}: RuntimeError: cannot load me\n"
    assert "bad_passes_mod" not in sys.modules


def test_list_passes_shows_options_and_defaults():
    load_module(str(TESTS / "broken_passes.py"))
    status, stdout, _ = run_cli(["opt", "--list-passes"])
    assert status == 0
    lines = stdout.splitlines()
    assert (
        lines[lines.index(next(s for s in lines if s.startswith("crash "))) + 1]
        == "    divisor=<int>        what to divide by (0 crashes) (default: 0)"
    )
    for name in passes.available():
        assert any(line.startswith(name + " ") for line in lines)


# ---------------------------------------------------------------------------- docs example


def _doc_blocks() -> dict[str, str]:
    """The fenced blocks of docs/passes.md that follow an ``<!-- example: KIND ... -->`` marker."""
    text = (ROOT / "docs" / "passes.md").read_text()
    blocks = {}
    for match in re.finditer(r"<!-- example: (\w+)[^>]*-->\n```[a-z]*\n(.*?)```\n", text, re.S):
        blocks[match.group(1)] = match.group(2)
    return blocks


def test_the_worked_example_of_the_docs_runs_as_written():
    blocks = _doc_blocks()
    assert set(blocks) == {"module", "input", "command", "stdout", "stderr"}
    assert blocks["module"] == (TESTS / "example_pass.py").read_text()
    assert blocks["input"] == (TESTS / "example_pass.kir").read_text()
    argv = shlex.split(blocks["command"])
    assert argv[:4] == ["kaun-ir", "opt", "--load", "tests/example_pass.py"]
    script = shutil.which("kaun-ir", path=str(pathlib.Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "kaun_ir.tools.cli"]
    result = subprocess.run(command + argv[1:], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == blocks["stdout"]
    assert result.stderr == blocks["stderr"]


# ----------------------------------------------------------------- .kir tests of the CLI flags

KIR_DIR = TESTS / "kir" / "pass_manager"
KIR_FILES = sorted(KIR_DIR.glob("*.kir"))


def _run_line(path: pathlib.Path):
    runs = [
        (fails, line.strip()[len(prefix) :])
        for line in path.read_text().splitlines()
        for prefix, fails in (("// RUN:", False), ("// RUN-FAIL:", True))
        if line.strip().startswith(prefix)
    ]
    assert len(runs) == 1, f"{path.name}: expected one RUN or RUN-FAIL line"
    fails, command = runs[0]
    tool, _, checker = command.partition("|")
    words = shlex.split(tool)
    merge = "2>&1" in words
    words = [w for w in words if w != "2>&1"]
    assert words[0] == "kaun-ir", path.name
    implicit = []
    for option in shlex.split(checker)[2:]:
        name, _, value = option.partition("=")
        assert name == "--implicit-check-not" and value, option
        implicit.append(value)
    argv = [w.replace("%s", str(path)).replace("%S", str(path.parent)) for w in words[1:]]
    return fails, argv, merge, implicit


def test_there_are_pass_manager_kir_tests():
    assert {
        "print_after_all",
        "print_after_change",
        "timing",
        "stats",
        "verify_each",
        "stop_after",
        "crash_reproducer",
        "list_passes",
        "options",
    } <= {p.stem for p in KIR_FILES}


@pytest.mark.parametrize("path", KIR_FILES, ids=[p.stem for p in KIR_FILES])
def test_pass_manager_kir_file(path, tmp_path, monkeypatch):
    monkeypatch.setenv("KAUN_IR_REPRO_DIR", str(tmp_path))
    fails, argv, merge, implicit = _run_line(path)
    status, stdout, stderr = run_cli(argv, merge=merge)
    if fails:
        assert status != 0, f"expected kaun-ir {' '.join(argv)} to fail; it printed:\n{stdout}"
        check(stdout + stderr, path.read_text(), implicit)
    else:
        assert status == 0, f"kaun-ir {' '.join(argv)} failed ({status}):\n{stderr}"
        check(stdout, path.read_text(), implicit)

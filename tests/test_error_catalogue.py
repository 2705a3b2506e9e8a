"""The error contract of docs/errors.md, checked over a catalogue of bad inputs.

Every case in ``tests/catalogue_cases.py`` must raise the documented class with a message naming
what the contract says, and the last frame of the traceback must be kaun_ir's own code: no raw
error from jaxlib, MLIR, NumPy or safetensors reaches the user.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

import pytest
from catalogue_cases import CASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = tuple(os.path.join(ROOT, folder) + os.sep for folder in ("kaun_ir", "passes", "runtime", "tools"))


def last_frame_is_ours(err: BaseException) -> tuple[bool, str]:
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1]
    return os.path.abspath(last.filename).startswith(OURS), f"{last.filename}:{last.lineno}"


def test_the_catalogue_is_large_and_covers_every_family():
    assert len(CASES) >= 150
    families = {c.family for c in CASES}
    for family in ("tracing", "indexing", "layers", "nn", "init", "optim", "train", "data", "ptree", "rng"):
        assert family in families, family
    names = [(c.family, c.name) for c in CASES]
    assert len(names) == len(set(names)), "duplicate case names"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.family}/{c.name}" for c in CASES])
def test_bad_input_gets_our_error(case):
    with pytest.raises(BaseException) as info:
        case.call()
    err = info.value
    assert isinstance(err, case.error), f"{type(err).__name__}: {err}"
    assert re.search(case.pattern, str(err)), f"{type(err).__name__}: {err!r} does not match {case.pattern!r}"
    ours, where = last_frame_is_ours(err)
    assert ours, f"raised from {where}, outside kaun_ir: {type(err).__name__}: {err}"


# ------------------------------------------------------------------ the command line
GRAPH = "graph @g(%0: f32[2]) -> (f32[2]) {\n  %1 = negate %0 : f32[2]\n  return %1\n}\n"
# (arguments, exit status, pattern of the one stderr line); {d} is a scratch directory holding
# g.kir (a graph), binary.kir (not text), plain (a file) and mymodels.py (a module in the cwd)
CLI_CASES = [
    (
        ["dump"],
        2,
        r"^kaun-ir dump: error: the following arguments are required: SPEC \(see kaun-ir dump --help\)$",
    ),
    (["dump", "--bogus", "x"], 2, r"unrecognized arguments: --bogus"),
    (["dump", "g.kir", "--stage", "nope"], 2, r"invalid choice: 'nope'"),
    (["opt", "g.kir", "--emit", "pdf"], 2, r"invalid choice"),
    (["opt", "g.kir", "--stop-after", "x"], 2, r"invalid int value"),
    (["nosuchcommand"], 2, r"invalid choice"),
    (["export", "g.kir"], 2, r"required: -o"),
    (["viz", "g.kir"], 2, r"required: -o"),
    (["bench", "--workloads", "nope"], 2, r"nope|invalid"),
    (["opt", "binary.kir"], 1, r"^kaun-ir opt: error: binary\.kir: .*not a UTF-8 text file"),
    (["opt", "missing.kir"], 1, r"missing\.kir: No such file"),
    (["opt", "g.kir", "-o", "{d}/no/such/dir/out.kir"], 1, r"-o .*out\.kir: no such directory"),
    (["opt", "g.kir", "-p", "frob"], 1, r"unknown pass 'frob'"),
    (["opt", "g.kir", "-p", "cse dce"], 1, r"expected ','"),
    (["opt", "g.kir", "--load", "no_such_module_xyz"], 1, r"--load no_such_module_xyz"),
    (["opt", "g.kir", "--stop-after", "-1"], 1, r"--stop-after"),
    (["opt", "plain"], 1, r"line 1, column 1: expected 'graph'"),
    (["dump", "g.kir", "--input", "f32[2]"], 1, r"--input applies to a model named as module:function"),
    (["dump", "g.kir", "--all", "plain"], 1, r"plain: exists and is not a directory"),
    (["dump", "g.kir", "-o", "{d}/no/such/x.kir"], 1, r"no such directory"),
    (["dump", "binary.kir"], 1, r"binary\.kir: not a UTF-8 text file"),
    (["dump", "missing.kir"], 1, r"missing\.kir: No such file"),
    (["dump", "no_such_module_xyz:f"], 1, r"cannot import 'no_such_module_xyz'"),
    (["dump", "mymodels:nothere"], 1, r"module 'mymodels' has no attribute 'nothere'"),
    (["dump", "mymodels:net"], 1, r"a layer needs an example input: add --input"),
    (
        ["dump", "mymodels:net", "--input", "f32[3,7]"],
        1,
        r"0\.linear: .*expects an input \[\.\.\., 4\], got f32\[3,7\]",
    ),
    (["dump", "mymodels:net", "--input", "q9[3]"], 1, r"--input 'q9\[3\]': expected a tensor type"),
    (["dump", "mymodels:not_a_model"], 1, r"returned int; expected"),
    (["dump", "nocolon"], 1, r"expected module:function"),
    (["dump", "g.kir", "--stats", "--stage", "hlo"], 1, r"--stats works on an IR stage"),
    (["export", "g.kir", "-o", "out.txt"], 1, r"-o must end in \.mlir or \.mlirbc"),
    (["export", "g.kir", "-o", "plain/x.mlir"], 1, r"plain: no such directory"),
    (["viz", "g.kir", "-o", "g.gif"], 1, r"the extension picks the format"),
    (["viz", "g.kir", "-o", "{d}/no/such/g.dot"], 1, r"no such directory"),
    (["demo", "nosuch"], 2, r"invalid choice: 'nosuch'"),
    # round-3 commands: usage mistakes are usage errors (exit 2), before anything is compiled
    (["memory", "g.kir", "--rows", "-3"], 2, r"argument --rows: must be >= 0, got -3"),
    (["dump", "g.kir", "--stage", "partitioned", "--link-gbps", "0"], 2, r"--link-gbps: must be a finite"),
    (["dump", "g.kir", "--stage", "partitioned", "--link-gbps", "nan"], 2, r"--link-gbps: must be a finite"),
    (["viz", "g.kir", "--overlay", "bogus", "-o", "g.dot"], 2, r"invalid choice: 'bogus'"),
    (["demo", "--bogus"], 2, r"unrecognized arguments: --bogus"),
    (["import"], 2, r"required: file"),
    (["import", "missing.mlir", "-o", "x.kir"], 1, r"missing\.mlir: No such file"),
    (["import", "binary.kir", "-o", "x.kir"], 1, r"binary\.kir: not a UTF-8 text file"),
    (["import", "g.kir", "-o", "x.kir"], 1, r"g\.kir does not parse as StableHLO: .*error: .*'graph'"),
    # StableHLO files: the file named first, MLIR's diagnostics kept off stderr
    (
        ["import", "bad.mlir", "-o", "x.kir"],
        1,
        r"^kaun-ir import: error: bad\.mlir does not parse as StableHLO: ",
    ),
    (["opt", "bad.mlir"], 1, r"^kaun-ir opt: error: bad\.mlir does not parse as StableHLO: .*frobnicate"),
    (["viz", "bad.mlir", "-o", "g.dot"], 1, r"^kaun-ir viz: error: bad\.mlir does not parse as StableHLO"),
    (
        ["import", "bad.mlirbc", "-o", "x.kir"],
        1,
        r"^kaun-ir import: error: bad\.mlirbc: MLIR bytecode string",
    ),
    (["opt", "short.mlirbc"], 1, r"^kaun-ir opt: error: short\.mlirbc: truncated MLIR bytecode"),
    (
        ["import", "rec.mlir", "-o", "x.kir"],
        1,
        r"^kaun-ir import: error: rec\.mlir: func\.call .*recursive call of @f",
    ),
]
BAD_MLIR = (
    "module {\n  func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
    "    %0 = stablehlo.frobnicate %a : tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n}\n"
)
REC_MLIR = (
    "module {\n  func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
    "    %0 = func.call @f(%a) : (tensor<2xf32>) -> tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n"
    "  func.func private @f(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
    "    %0 = func.call @f(%a) : (tensor<2xf32>) -> tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n}\n"
)


def _stablehlo_files(d) -> None:
    from catalogue_cases import damaged_bytecode

    (d / "bad.mlir").write_text(BAD_MLIR)
    (d / "rec.mlir").write_text(REC_MLIR)
    (d / "bad.mlirbc").write_bytes(damaged_bytecode())
    (d / "short.mlirbc").write_bytes(damaged_bytecode()[:60])


@pytest.fixture()
def cli_dir(tmp_path, monkeypatch):
    (tmp_path / "g.kir").write_text(GRAPH)
    (tmp_path / "binary.kir").write_bytes(bytes(range(256)) * 2)
    (tmp_path / "plain").write_text("just text\n")
    _stablehlo_files(tmp_path)
    (tmp_path / "mymodels.py").write_text(
        "from kaun_ir import layer\n"
        "def net():\n    return layer.sequential([layer.linear(4, 2)])\n"
        "def not_a_model():\n    return 3\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("mymodels", None)


@pytest.mark.parametrize("argv, status, pattern", CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_cli_errors_are_one_line_with_the_documented_exit_status(cli_dir, capsys, argv, status, pattern):
    from kaun_ir.tools import cli

    argv = [a.replace("{d}", str(cli_dir)) for a in argv]
    try:
        rc = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == status, err
    lines = err.strip("\n").split("\n")
    if len(lines) == 3 and lines[2].strip() == "^":  # a parse error echoes its line with a caret
        lines = lines[:1]
    assert len(lines) == 1 and lines[0].startswith("kaun-ir"), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err


def test_cli_debug_shows_the_traceback(cli_dir):
    from kaun_ir.tools import cli

    with pytest.raises(NotADirectoryError):
        cli.main(["--debug", "dump", "g.kir", "--all", "plain"])
    with pytest.raises(NotADirectoryError):
        cli.main(["dump", "g.kir", "--all", "plain", "--debug"])
    assert cli.main(["dump", "g.kir", "--all", "plain"]) == 1  # the flag does not stick


def test_cli_finds_a_module_in_the_current_directory(cli_dir, capsys):
    from kaun_ir.tools import cli

    assert cli.main(["dump", "mymodels:net", "--input", "f32[3,4]"]) == 0
    assert "graph @" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["dump", "export", "viz"])
def test_cli_help_explains_spec_and_lists_the_examples(capsys, command):
    from kaun_ir.tools import cli, examples

    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "SPEC names the model" in out and "takes no arguments" in out and "--input" in out
    for name in ("mlp", "cnn", "transformer_block", "train_step_mlp"):
        assert f"kaun_ir.tools.examples:{name}" in out and callable(getattr(examples, name))
    assert "``" not in out and ":func:`" not in out and ":class:`" not in out  # no reST markup


def test_every_cli_help_is_free_of_rest_markup(capsys):
    from kaun_ir.tools import cli

    for command in (
        ["--help"],
        *([c, "--help"] for c in ("demo", "opt", "dump", "export", "import", "viz", "bench")),
    ):
        with pytest.raises(SystemExit):
            cli.main(list(command))
        out = capsys.readouterr().out
        assert "``" not in out and ":func:`" not in out, command


def test_docs_errors_md_example_runs():
    text = open(os.path.join(ROOT, "docs", "errors.md"), encoding="utf-8").read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/errors.md", "exec"), {"__name__": "__docs__"})


# ------------------------------------------------------------------ messages that used to mislead


def test_integer_input_to_a_dense_layer_is_announced():
    import numpy as np

    from kaun_ir import layer, rng

    model = layer.linear(3, 2)
    with rng.scope(0):
        v = layer.init(model)
    with pytest.warns(UserWarning, match=r"linear.*integer input i32\[4,3\] is converted to floating point"):
        y, _ = layer.apply(model, v, np.ones((4, 3), np.int32))
    assert np.asarray(y).dtype == np.float32


def test_a_loss_that_ignores_the_parameters_warns():
    import numpy as np

    import kaun_ir as kn
    from kaun_ir import layer, optim, rng, train

    trainer = train.make(layer.sequential([layer.linear(3, 2)]), optim.sgd(0.1))
    with rng.scope(0):
        st = train.init(trainer)
    target = np.ones((4, 2), np.float32)
    with pytest.warns(UserWarning, match="loss does not depend on the model's parameters"):
        _, st = train.step(trainer, st, np.ones((4, 3), np.float32), lambda out: kn.sum(target * 2.0))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a loss that uses the output: no warning
        train.step(trainer, st, np.ones((4, 3), np.float32), lambda out: kn.sum((out - target) ** 2))


# command-line inputs whose errors did not name the input (the SPEC, the --input): each names it now
CLI_NAMING_CASES = [
    (
        ["dump", "mymodels:net", "--input", "f32[-1,4]"],
        r"--input 'f32\[-1,4\]': expected a tensor type.*negative",
    ),
    (
        ["dump", "named29:needs_x"],
        r"'named29:needs_x': calling needs_x\(\) to build the model failed: TypeError",
    ),
    (
        ["dump", "named29:pair"],
        r"^kaun-ir dump: error: pair: .*missing 1 required.*give one --input TYPE per argument",
    ),
    (
        ["dump", "named29:layer", "--input", "f32[2,5]"],
        r"^kaun-ir dump: error: layer: linear.*expects an input",
    ),
]


@pytest.mark.parametrize("argv, pattern", CLI_NAMING_CASES, ids=[" ".join(c[0]) for c in CLI_NAMING_CASES])
def test_cli_errors_name_the_input_they_are_about(cli_dir, capsys, argv, pattern):
    from kaun_ir.tools import cli

    (cli_dir / "named29.py").write_text(
        "import kaun_ir as kn\nfrom kaun_ir import layer\n"
        "def needs_x(x):\n    return x\n"
        "def pair():\n    return (lambda a, b: a + b), (kn.ShapeDtype((2,), kn.float32),)\n"
        "def layer():\n    return kn.layer.linear(3, 4)\n"
    )
    try:
        assert cli.main(argv) == 1
    finally:
        sys.modules.pop("named29", None)
    lines = capsys.readouterr().err.strip("\n").split("\n")
    assert len(lines) == 1 and re.search(pattern, lines[0]), lines

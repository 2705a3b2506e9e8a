"""``kaun-ir demo`` runs end to end (briefly) and writes its files; the commands' --help work."""

from __future__ import annotations

import pytest

import kaun_ir as kn
from kaun_ir.tools.cli import main

STAGES = [
    "forward.kir",
    "train_step.kir",
    "train_step.optimized.kir",
    "train_step.stablehlo.mlir",
    "train_step.hlo.txt",
]


def test_demo_runs_and_writes_the_ir_of_every_stage(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "-o", str(out), "--epochs", "2"])
    # two epochs are too few for the accuracy targets: 1 says "below target", not a crash
    assert rc in (0, 1)
    printed = capsys.readouterr().out
    assert "mlp: test accuracy" in printed and "cnn: test accuracy" in printed
    assert "predictions identical: True" in printed
    expected = {f"{name}.{stage}" for name in ("mlp", "cnn") for stage in STAGES} | {"cnn.safetensors"}
    assert expected <= {p.name for p in out.iterdir()}
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    for name in ("mlp", "cnn"):
        for stage in ("forward.kir", "train_step.kir", "train_step.optimized.kir"):
            text = (out / f"{name}.{stage}").read_text()
            graph = kn.ir.parse(text)
            graph.verify()
            assert graph.text() == text
        mlir = (out / f"{name}.train_step.stablehlo.mlir").read_text()
        assert "stablehlo." in mlir
        assert (out / f"{name}.train_step.hlo.txt").read_text().strip()


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["opt", "--help"]])
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "usage: kaun-ir" in capsys.readouterr().out


def test_no_command_prints_help_and_returns_2(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


@pytest.mark.long  # three compilations
def test_demo_lm_trains_and_prints_a_sample(capsys):
    rc = main(
        [
            "demo",
            "lm",
            "--seconds",
            "1",
            "--dim",
            "16",
            "--layers",
            "1",
            "--seq-len",
            "16",
            "--sample-chars",
            "24",
            "--prompt",
            "KING.",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "corpus: 1,036,489 characters of Shakespeare" in printed
    sample = printed.split("--- sample")[1].split("\n", 1)[1].rsplit("---", 1)[0]
    assert sample.startswith("KING.") and len(sample.rstrip("\n")) == len("KING.") + 24


def test_shakespeare_corpus():
    text = kn.datasets.shakespeare()
    assert len(text) == 1_036_489 and text.isascii()
    assert text.startswith("HAMLET, PRINCE OF DENMARK") and "Exit Pyramus" not in text[:1000]
    assert text.count("by William Shakespeare") == 8

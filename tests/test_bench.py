"""``kaun-ir bench``: kaun_ir and the hand-written JAX + optax reference train every workload to the
same loss (tiny sizes, few steps); the CLI's ``--json`` output parses. No timing assertions."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kaun_ir.tools import bench
from kaun_ir.tools.bench_workloads import WORKLOADS
from kaun_ir.tools.cli import main


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_kaun_ir_and_jax_reach_the_same_loss(name):
    result = bench.bench_workload(name, steps=3, rounds=1, small=True)
    losses = {impl: entry["loss_after_3"] for impl, entry in result["implementations"].items()}
    assert set(losses) == {"kaun_ir", "jax"}
    assert result["losses_agree"], losses
    np.testing.assert_allclose(losses["kaun_ir"], losses["jax"], rtol=bench.LOSS_RTOL)
    # training moved: the loss after 3 steps differs from the first step's (the check can fail)
    first = result["implementations"]["kaun_ir"]["initial_loss"]
    assert losses["kaun_ir"] != first


def test_the_reference_differs_when_the_weights_differ():
    """The agreement check is not vacuous: a JAX step from other weights gives another loss."""
    from kaun_ir import layer, rng
    from kaun_ir.tools.bench_workloads import initial_params

    workload = WORKLOADS["mlp_small"]
    cfg = workload.small
    batches = [workload.batch(cfg, 0)]
    with rng.scope(0):
        structure = layer.init(workload.kaun_model(cfg)).params
    a = bench.JaxRunner(workload, cfg, initial_params(structure, 1), batches)
    b = bench.JaxRunner(workload, cfg, initial_params(structure, 2), batches)
    assert abs(float(a.step()) - float(b.step())) > 1e-4


def test_workload_option_parsing():
    assert bench.parse_workloads(None) == list(WORKLOADS)
    assert bench.parse_workloads(["mlp,cnn", "transformer"]) == ["mlp", "cnn", "transformer"]
    with pytest.raises(ValueError, match="unknown workload"):
        bench.parse_workloads(["resnet"])


def test_cli_json_output_parses(capsys):
    # --small (hidden): the CLI at the tiny test sizes, seconds instead of minutes
    rc = main(["bench", "--workload", "mlp_small", "--steps", "2", "--rounds", "1", "--json", "--small"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["ok"] is True
    (result,) = data["results"]
    assert result["workload"] == "mlp_small"
    assert set(result["implementations"]) == {"kaun_ir", "jax"}
    assert result["implementations"]["jax"]["steps_per_s"] > 0


def test_cli_table_and_bad_workload(capsys):
    assert main(["bench", "-w", "mlp_small", "--steps", "2", "--rounds", "1", "--small"]) == 0
    out = capsys.readouterr().out
    assert "| mlp_small | kaun_ir |" in out and "| mlp_small | jax |" in out and "agree" in out
    assert main(["bench", "-w", "nope"]) == 2


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--workload" in out and "--steps" in out and "--rounds" in out and "--json" in out

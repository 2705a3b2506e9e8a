"""``kaun-ir bench``: kaun_ir (single steps and K fused steps per call), the hand-written JAX + optax
reference and PyTorch eager (when importable) train every workload to the same loss (tiny sizes,
few steps); memory is measured in a child process; the CLI's ``--json`` output parses. No timing
assertions."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from kaun_ir.tools.bench import command as bench_command
from kaun_ir.tools.bench import measure as bench_measure
from kaun_ir.tools.bench import memory as bench_memory
from kaun_ir.tools.bench import reference as bench_reference
from kaun_ir.tools.bench import runners as bench_runners
from kaun_ir.tools.bench import workloads as bench_workloads
from kaun_ir.tools.bench.workloads import WORKLOADS
from kaun_ir.tools.cli import main

TORCH_OK, TORCH_LINE = bench_reference.torch_status()
#: transformer12 is the transformer's code at other sizes (test_transformer12_is_the_transformer):
#: its small run would test nothing new
TESTED = [name for name in WORKLOADS if name != "transformer12"]


@pytest.mark.parametrize("name", TESTED)
def test_every_implementation_reaches_the_same_loss(name):
    result = bench_measure.bench_workload(name, steps=4, rounds=0, small=True, steps_per_call=2)
    entries = result["implementations"]
    losses = {impl: entry["loss_after_steps"] for impl, entry in entries.items()}
    assert set(losses) == {"kaun_ir", "kaun_ir[K=2]", "jax"} | ({"torch"} if TORCH_OK else set())
    assert result["losses_agree"], losses
    # the fused row (2 calls of 2 steps) reaches single-step JAX's loss after 4 steps; at these
    # sizes even the CNN's does within LOSS_RTOL (the bench allows FUSED_LOSS_RTOL, see its docs)
    np.testing.assert_allclose(losses["kaun_ir"], losses["jax"], rtol=bench_measure.LOSS_RTOL)
    np.testing.assert_allclose(losses["kaun_ir[K=2]"], losses["jax"], rtol=bench_measure.LOSS_RTOL)
    if TORCH_OK:
        np.testing.assert_allclose(losses["torch"], losses["jax"], rtol=bench_measure.TORCH_LOSS_RTOL)
    # training moved: the loss after 4 steps differs from the first step's (the check can fail)
    assert losses["kaun_ir"] != entries["kaun_ir"]["first_call_loss"]


def test_losses_are_compared_after_the_workloads_loss_steps(monkeypatch):
    """A workload's ``loss_steps`` moves the loss check earlier (the rows still train all their
    steps): every row's compared loss is JAX's own loss after that many steps, computed here by a
    separate JAX run; a count that a fused row's calls cannot reach is rounded up to whole calls."""
    import dataclasses

    workload = dataclasses.replace(WORKLOADS["mlp_small"], loss_steps=2)
    monkeypatch.setitem(WORKLOADS, "mlp_small", workload)
    result = bench_measure.bench_workload("mlp_small", steps=4, rounds=0, small=True, steps_per_call=2)
    reference = bench_reference.JaxRunner.of(bench_workloads.Setup("mlp_small", small=True))
    after_two = reference.last_loss([reference.call() for _ in range(2)][-1])
    after_four = reference.last_loss([reference.call() for _ in range(2)][-1])
    # the check can fail: after 4 steps every row would be outside any row's tolerance
    assert abs(after_four - after_two) > 10 * bench_measure.TORCH_LOSS_RTOL * abs(after_two)
    for impl, entry in result["implementations"].items():
        assert entry["loss_steps"] == 2, impl
        rtol = bench_measure.loss_rtol(impl)
        np.testing.assert_allclose(entry["loss_after_steps"], after_two, rtol=rtol, err_msg=impl)
    assert bench_measure.loss_steps(workload, 4, 0) == 2
    assert bench_measure.loss_steps(workload, 1, 0) == 1
    assert bench_measure.loss_steps(workload, 8, 4) == 4  # rounded up to a whole call of 4
    assert bench_measure.loss_steps(workload, 48, 12) == 12
    assert bench_measure.loss_steps(dataclasses.replace(workload, loss_steps=3), 4, 0) == 3
    assert bench_measure.loss_steps(dataclasses.replace(workload, loss_steps=3), 4, 4) == 4
    assert bench_measure.loss_steps(dataclasses.replace(workload, loss_steps=0), 6, 2) == 6


def test_torch_is_left_out_with_a_reason_when_not_importable(monkeypatch, capsys):
    line = "skipped: import torch failed (ImportError: no torch); install kaun-ir[bench]"
    monkeypatch.setattr(bench_measure, "torch_status", lambda: (False, line))
    result = bench_measure.bench_workload("mlp_small", steps=2, rounds=0, small=True)
    assert "torch" not in result["implementations"] and result["torch"] == line
    with pytest.raises(RuntimeError, match="import torch failed"):
        bench_measure.bench_workload("mlp_small", steps=2, rounds=0, small=True, torch=True)
    assert (
        main(
            [
                "bench",
                "-w",
                "mlp_small",
                "--steps",
                "2",
                "--rounds",
                "0",
                "--steps-per-call",
                "2",
                "--no-memory",
                "--small",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| torch |" not in out and f"PyTorch: {line}" in out


@pytest.mark.parametrize("name", TESTED)
def test_torch_forward_matches_the_jax_reference(name):
    """PyTorch eager computes the reference's network over the same weights (layouts, GELU,
    layer norm, causal attention), and other weights give other logits (not vacuous)."""
    if not TORCH_OK:
        pytest.skip(TORCH_LINE)
    import torch

    setup = bench_workloads.Setup(name, small=True)
    x, _ = setup.batches[0]
    expected = np.asarray(setup.workload.jax_forward(setup.params, x, setup.cfg))  # JAX, op by op

    def torch_logits():
        runner = bench_reference.TorchRunner(setup)
        with torch.no_grad():
            return runner.forward(runner.batches[0][0]).numpy()

    np.testing.assert_allclose(torch_logits(), expected, rtol=1e-4, atol=1e-5)
    setup.params = bench_workloads.initial_params(setup.fresh.params, 7)
    assert np.abs(torch_logits() - expected).max() > 1e-3


def test_the_reference_differs_when_the_weights_differ():
    """The agreement check is not vacuous: a JAX step from other weights gives another loss."""
    from kaun_ir import layer, rng
    from kaun_ir.tools.bench.workloads import initial_params

    workload = WORKLOADS["mlp_small"]
    cfg = workload.small
    batches = [workload.batch(cfg, 0)]
    with rng.scope(0):
        structure = layer.init(workload.kaun_model(cfg)).params
    a = bench_reference.JaxRunner(workload, cfg, initial_params(structure, 1), batches)
    b = bench_reference.JaxRunner(workload, cfg, initial_params(structure, 2), batches)
    assert abs(float(a.step()) - float(b.step())) > 1e-4


def test_block_runner_follows_the_batch_cycle():
    """K=3 does not divide the 8 batches: the blocks start at 0, 3, 6, 1, ...; the losses of
    every fused step equal JAX's single steps over the same cycle."""
    setup = bench_workloads.Setup("mlp_small", small=True)
    fused, ref = bench_runners.KaunBlockRunner(setup, 3), bench_reference.JaxRunner.of(setup)
    assert sorted(fused.blocks) == list(range(bench_workloads.NUM_BATCHES))
    losses = np.concatenate([np.asarray(fused.call()) for _ in range(4)])
    expected = [ref.last_loss(ref.call()) for _ in range(12)]
    np.testing.assert_allclose(losses, expected, rtol=bench_measure.LOSS_RTOL)


def test_memory_is_measured_in_a_child_process():
    measured = bench_memory.measure_in_child("mlp_small", "kaun_ir", small=True, calls=2)
    assert "error" not in measured, measured
    assert measured["peak_bytes"] > 0 and measured["compile_peak_bytes"] > 0
    assert measured["rss_before_bytes"] > measured["peak_bytes"] / 100  # a whole process, not a delta
    assert measured["first_step_s"] > 0
    xla = measured["xla"]
    if xla is not None:  # XLA's analysis: the parameters and Adam state at least
        assert xla["total_bytes"] == xla["argument"] + xla["output"] + xla["temp"] - xla["alias"]
        assert xla["argument"] >= 3 * 4 * (64 * 128 + 128 * 10)


def test_warm_first_step_fills_then_reads_a_private_cache_and_removes_it(monkeypatch):
    made = []
    real_mkdtemp = bench_memory.tempfile.mkdtemp
    monkeypatch.setattr(
        bench_memory.tempfile, "mkdtemp", lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1]
    )
    calls = []
    real_run_child = bench_memory.run_child

    def spy(module, spec, tag, timeout, env=None):
        result = real_run_child(module, spec, tag, timeout, env)
        calls.append((env["KAUN_IR_CACHE_DIR"], result))
        return result

    monkeypatch.setattr(bench_memory, "run_child", spy)
    warm = bench_memory.warm_first_step("mlp_small", "kaun_ir", small=True)
    assert warm is not None and warm > 0
    assert [root for root, _ in calls] == made * 2  # both children: the one new directory
    assert calls[1][1]["first_step_s"] == warm
    assert not os.path.exists(made[0])


def test_the_bench_runs_cold_unless_the_cache_is_named(monkeypatch, capsys):
    monkeypatch.delenv("KAUN_IR_CACHE_DIR")  # the default (on) for a user: the bench turns it off
    args = ["bench", "-w", "mlp_small", "--steps", "2", "--rounds", "0", "--no-memory", "--json", "--small"]
    assert main(args) == 0
    assert os.environ["KAUN_IR_CACHE_DIR"] == "off"
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["compilation_cache"] is None
    assert all(e["first_step_warm_s"] is None for e in result["implementations"].values())


def test_option_checks():
    # the real-size GPT-2 rows run only when named
    assert bench_command.parse_workloads(None) == [n for n in WORKLOADS if not n.startswith("gpt2_small")]
    assert bench_command.parse_workloads(["mlp,cnn", "transformer"]) == ["mlp", "cnn", "transformer"]
    with pytest.raises(ValueError, match="unknown workload"):
        bench_command.parse_workloads(["resnet50"])
    with pytest.raises(ValueError, match="multiple of steps_per_call"):
        bench_measure.bench_workload("mlp_small", steps=3, rounds=0, small=True, steps_per_call=2)


def test_cli_json_output_parses(capsys):
    # --small (hidden): the CLI at the tiny test sizes, seconds instead of minutes
    rc = main(
        [
            "bench",
            "--workload",
            "mlp_small",
            "--steps",
            "2",
            "--rounds",
            "1",
            "--steps-per-call",
            "2",
            "--no-memory",
            "--json",
            "--small",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["ok"] is True
    (result,) = data["results"]
    assert result["workload"] == "mlp_small"
    entries = result["implementations"]
    assert {"kaun_ir", "kaun_ir[K=2]", "jax"} <= set(entries)
    for entry in entries.values():
        assert entry["steps_per_s"] > 0 and entry["first_step_s"] > 0 and entry["loss_agrees"]
        assert entry["peak_memory_bytes"] is None  # --no-memory
    assert entries["jax"]["ratio_vs_jax"] == 1.0
    assert entries["kaun_ir[K=2]"]["steps_per_call"] == 2


def test_cli_table_and_bad_options(capsys):
    assert (
        main(
            [
                "bench",
                "-w",
                "mlp_small",
                "--steps",
                "2",
                "--rounds",
                "1",
                "--steps-per-call",
                "0",
                "--no-memory",
                "--small",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| mlp_small | kaun_ir |" in out and "| mlp_small | jax |" in out and "(agree)" in out
    assert "kaun_ir[K=" not in out  # --steps-per-call 0: no fused row
    assert ("| mlp_small | torch |" in out) == TORCH_OK
    assert "PyTorch:" in out
    tunables = os.environ.get("GLIBC_TUNABLES")  # whichever heap the suite runs with
    assert (
        f"malloc: GLIBC_TUNABLES={tunables} for every row" if tunables else "malloc: the C library's defaults"
    ) in out
    assert main(["bench", "-w", "nope"]) == 2
    assert main(["bench", "-w", "mlp_small", "--steps", "5", "--steps-per-call", "2"]) == 2
    assert "multiple of --steps-per-call" in capsys.readouterr().out
    # an explicit N that the workload's default K does not divide drops the fused row, no error
    assert main(["bench", "-w", "mlp_small", "--steps", "3", "--rounds", "0", "--no-memory", "--small"]) == 0
    assert "kaun_ir[K=" not in capsys.readouterr().out


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    options = ("--workload", "--steps", "--rounds", "--json", "--steps-per-call", "--memory", "--no-memory")
    for option in options:
        assert option in out


def test_variant_rows_mixed_precision_and_remat():
    setup = bench_workloads.Setup("mlp_small", small=True)
    names = ["kaun_ir", "kaun_ir[remat=nothing]", "kaun_ir[bfloat16]"]
    assert bench_runners.implementations(0, False, ("remat=nothing", "bfloat16")) == names + ["jax"]
    losses = {}
    for name in names:
        runner = bench_runners.make_runner(name, setup)
        assert runner.name == name
        for _ in range(3):
            value = runner.call()
        losses[name] = runner.last_loss(value)
    # rematerialisation recomputes, it does not change the arithmetic; bfloat16 products do, a little
    assert losses["kaun_ir[remat=nothing]"] == losses["kaun_ir"]
    np.testing.assert_allclose(
        losses["kaun_ir[bfloat16]"], losses["kaun_ir"], rtol=bench_measure.MIXED_LOSS_RTOL
    )


def test_resnet_running_statistics_agree():
    """The ResNet's batch norms update their running statistics alike in kaun_ir, JAX and
    PyTorch (momentum 0.1 of the new batch, unbiased running variance), and they moved."""
    from kaun_ir import tree

    setup = bench_workloads.Setup("resnet", small=True)
    runners = [bench_runners.KaunRunner(setup), bench_reference.JaxRunner.of(setup)]
    if TORCH_OK:
        runners.append(bench_reference.TorchRunner(setup))
    for runner in runners:
        for _ in range(2):
            runner.call()
    kaun, jax_, *torch_ = runners
    expected = [np.asarray(a) for a in tree.flatten(jax_.opt_state[1])[0]]
    initial = tree.flatten(setup.layer_state)[0]
    assert len(expected) == 2 * 6 and all(np.abs(e - i).max() > 1e-3 for e, i in zip(expected, initial))
    for got in [kaun.state.vars.state, *(t.layer_state for t in torch_)]:
        leaves = [np.asarray(a) for a in tree.flatten(got)[0]]
        assert len(leaves) == len(expected)
        for g, e in zip(leaves, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


def test_transformer12_is_the_transformer():
    a, b = WORKLOADS["transformer12"], WORKLOADS["transformer"]
    assert (a.kaun_model, a.jax_forward, a.torch_forward, a.batch) == (
        b.kaun_model,
        b.jax_forward,
        b.torch_forward,
        b.batch,
    )
    assert a.full["layers"] == 12 and a.full["dim"] == 256


def test_gflops_and_the_matmul_microbenchmark():
    """The step's FLOPs are the cost model's count (mlp_small small: three matmuls per dense
    layer, forward and backward), GFLOP/s is FLOPs x steps/s, and the matmul rates are positive."""
    from kaun_ir.tools.bench import flops as bench_flops

    result = bench_measure.bench_workload("mlp_small", steps=2, rounds=1, small=True, torch=False)
    b, sizes = 8, (64, 128, 10)
    matmuls = sum(2 * b * i * o for i, o in zip(sizes[:-1], sizes[1:]))
    # forward, the weight gradients, and the input gradient of the second layer only
    dense = 2 * matmuls + 2 * b * sizes[1] * sizes[2]
    flops = result["gflop_per_step"] * 1e9
    assert dense <= flops <= dense * 1.5  # plus element-wise work (ReLU, softmax, Adam)
    entry = result["implementations"]["kaun_ir"]
    assert entry["gflops"] == pytest.approx(flops * entry["steps_per_s"] / 1e9)
    rates = bench_flops.matmul_rates(16, torch=TORCH_OK)
    assert rates["xla"] > 0 and (rates["torch"] is None) != TORCH_OK
    line = bench_flops.format_line(rates, [result])
    assert "matmul 16x16x16" in line and "mlp_small" in line


def test_closure_row_trains_like_the_explicit_row():
    """``--variant closure``: a new loss closure per step over device-resident labels runs the
    same arithmetic as the explicit-targets row, and after the first step takes the fast path."""
    setup = bench_workloads.Setup("mlp_small", small=True)
    explicit, closure = (
        bench_runners.make_runner("kaun_ir", setup),
        bench_runners.make_runner("kaun_ir[closure]", setup),
    )
    assert closure.name == "kaun_ir[closure]" and closure.trainer.loss is None
    for _ in range(3):
        a, b = explicit.last_loss(explicit.call()), closure.last_loss(closure.call())
        assert a == b
    assert closure.state.cache.flat is not None  # the dispatch fast path is armed


@pytest.mark.skipif(not TORCH_OK, reason="PyTorch is not installed")
def test_torch_compile_row_reaches_jax_loss(monkeypatch):
    import functools

    import torch

    # dynamo's capture and AOTAutograd as in the bench, with the eager backend: inductor's C++
    # compilation takes minutes, and what is tested here is the row's step, not the kernels
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    result = bench_measure.bench_workload("mlp_small", steps=3, rounds=0, small=True, torch_compile=True)
    entries = result["implementations"]
    assert list(entries)[-2:] == ["torch", "torch.compile"]
    assert result["losses_agree"]
    np.testing.assert_allclose(
        entries["torch.compile"]["loss_after_steps"],
        entries["jax"]["loss_after_steps"],
        rtol=bench_measure.TORCH_LOSS_RTOL,
    )
    assert "wheel" in result["torch"]


def test_user_loop_rows_train_like_jax():
    result = bench_measure.bench_workload(
        "mlp_small", steps=3, rounds=0, small=True, torch=False, variants=("user", "user-closure")
    )
    entries = result["implementations"]
    for impl in ("kaun_ir[user]", "kaun_ir[user-closure]"):
        np.testing.assert_allclose(
            entries[impl]["loss_after_steps"],
            entries["jax"]["loss_after_steps"],
            rtol=bench_measure.LOSS_RTOL,
        )
    assert result["losses_agree"]


def test_categories_name_kernels_and_add_up_to_the_step():
    from kaun_ir.tools.bench import categories

    assert (
        categories.xla_category("ynn_fusion.3", "2.decoder_block/attention/dot_general")
        == "attention products"
    )
    assert categories.xla_category("dot.5", "1.linear/transpose") == "products"
    assert categories.xla_category("ynn_fusion.2", "2.lstm/transpose") == "products"
    assert (
        categories.xla_category("subtract_exponential_fusion", "3.block/attention/exponential") == "softmax"
    )
    assert categories.xla_category("add_select_fusion", "optimizer/select") == "optimiser"
    assert categories.xla_category("transpose_copy_fusion", "1.block/key/reshape") == "copies / transposes"
    assert categories.xla_category("multiply_erf_fusion", "2.block/erf") == "element-wise"
    assert categories.torch_category("aten::addmm") == "products"
    assert (
        categories.torch_category("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention products"
    )
    assert categories.torch_category("aten::native_layer_norm") == "norms"
    assert categories.torch_category("Optimizer.step#AdamW.step") == "optimiser"
    assert categories.torch_category("cpp_fused__softmax_3") == "softmax"
    results = categories.run("mlp_small", 2, small=True, torch_compile=False)
    for impl, row in results.items():
        assert set(categories.CATEGORIES) <= set(row), impl
        np.testing.assert_allclose(sum(row[c] for c in categories.CATEGORIES), row["step"], rtol=1e-6)
        assert row["products"] > 0, impl  # the MLP's products were found and named
    assert "| mlp_small: ms per step | kaun_ir" in categories.table("mlp_small", results)

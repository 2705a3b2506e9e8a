"""``kaun-ir bench``: training-step throughput of kaun_ir against a hand-written JAX + optax step.

For every workload (``mlp``, ``cnn``, ``mlp_small``, ``transformer``; see
``kaun_ir.tools.bench_workloads``) both implementations start from the same NumPy-generated
weights, train on the same fixed synthetic batches (8, cycled) with the same optimiser, and run in one process:

1. time to first finished step: trace + compile + first run on a fresh trainer / a fresh
   ``jax.jit`` (the first compilation of that workload in the process);
2. ``--steps`` - 1 more steps each; the losses after ``--steps`` steps must agree (relative 1e-4);
3. ``--rounds`` alternating rounds of ``--steps`` steps of kaun_ir then ``--steps`` steps of JAX;
   steps/s is the median over the rounds (each round blocks on its last loss).

The JAX reference jits the whole step (forward, ``jax.grad``, optax update) with the parameters
and optimiser state donated, which is what kaun_ir's ``train.step`` does with its own IR and
autodiff. PyTorch eager is added when ``import torch`` works (not implemented yet: reported as
skipped). Peak memory is reported as n/a: both implementations share one process and one XLA
allocator, and the CPU client keeps no per-executable memory statistics, so no honest
per-implementation number is cheap to get.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from .bench_workloads import WORKLOADS, Workload, initial_params

LOSS_RTOL = 1e-4
SEED = 0
#: distinct fixed batches, cycled step by step (one batch alone is memorised within ~20 steps,
#: after which the loss is ~1e-4 and a relative comparison of it measures nothing)
NUM_BATCHES = 8


def add_parser(sub) -> None:
    parser = sub.add_parser("bench", help="training-step speed of kaun_ir vs a hand-written JAX + optax step",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-w", "--workload", action="append", default=None,
                        help=f"workload(s), repeatable or comma-separated: {', '.join(WORKLOADS)} "
                             "(default: all)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    # tiny sizes of every workload, for the tests (not a benchmark)
    parser.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def parse_workloads(values: list[str] | None) -> list[str]:
    """``["mlp,cnn", "transformer"]`` -> ``["mlp", "cnn", "transformer"]``; None -> all."""
    if not values:
        return list(WORKLOADS)
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


# ------------------------------------------------------------------------------ kaun_ir side


def _kaun_optimizer(spec: tuple):
    from kaun_ir import optim

    if spec[0] == "adam":
        return optim.adam(spec[1])
    return optim.adamw(spec[1], weight_decay=spec[2])


class KaunRunner:
    """kaun_ir: ``train.make`` + ``train.step`` on the fixed batch (state donated step to step)."""

    name = "kaun_ir"

    def __init__(self, workload: Workload, cfg: dict, params: Any, batches: list):
        from kaun_ir import layer, loss, rng, train, tree
        from kaun_ir.runtime import xla

        model = workload.kaun_model(cfg)
        self.trainer = train.make(model, _kaun_optimizer(workload.optimizer))
        with rng.scope(SEED):
            fresh = layer.init(model)
        device = xla.default_device()
        leaves, treedef = tree.flatten(params)
        on_device = tree.unflatten(treedef, [xla.to_device(np.array(a), a.dtype, device) for a in leaves])
        self.state = train.make_state(self.trainer, layer.with_params(fresh, on_device))

        def pair(x, y):
            labels = xla.to_device(y, y.dtype, device)
            # one lambda per batch, same code: the labels are an input of one shared executable
            return xla.to_device(x, x.dtype, device), lambda logits: loss.cross_entropy_sparse(logits, labels)

        self.batches = [pair(x, y) for x, y in batches]
        self.count = 0
        self._train = train

    def step(self):
        x, loss_fn = self.batches[self.count % len(self.batches)]
        self.count += 1
        value, self.state = self._train.step(self.trainer, self.state, x, loss_fn)
        return value


# ------------------------------------------------------------------------------ JAX reference


def _jax_optax_optimizer(spec: tuple):
    import optax

    if spec[0] == "adam":
        return optax.adam(spec[1])
    return optax.adamw(spec[1], weight_decay=spec[2])


def make_jax_step(workload: Workload, cfg: dict):
    """The reference step: ``jax.jit`` of loss + ``jax.grad`` + optax update, params and
    optimiser state donated. Returns ``(step, optimizer)``; ``step(params, opt_state, x, y) ->
    (loss, params, opt_state)``."""
    import jax
    import optax

    opt = _jax_optax_optimizer(workload.optimizer)

    def loss_of(params, x, y):
        logits = workload.jax_forward(params, x, cfg)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss_of)(params, x, y)
        updates, opt_state = opt.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    return jax.jit(step, donate_argnums=(0, 1)), opt


class JaxRunner:
    """The JAX + optax reference (one jit of the whole step, donated)."""

    name = "jax"

    def __init__(self, workload: Workload, cfg: dict, params: Any, batches: list):
        import jax

        self.jax_step, opt = make_jax_step(workload, cfg)
        self.params = jax.device_put(jax.tree_util.tree_map(np.array, params))
        self.opt_state = opt.init(self.params)
        self.batches = [(jax.device_put(x), jax.device_put(y)) for x, y in batches]
        self.count = 0

    def step(self):
        x, y = self.batches[self.count % len(self.batches)]
        self.count += 1
        value, self.params, self.opt_state = self.jax_step(self.params, self.opt_state, x, y)
        return value


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------ measuring


def _run_steps(runner, n: int) -> float:
    """``n`` steps, blocking on the last loss; returns that loss."""
    value = None
    for _ in range(n):
        value = runner.step()
    return float(np.asarray(value))


def bench_workload(name: str, steps: int, rounds: int, small: bool = False) -> dict:
    """Benchmark one workload; ``small=True`` uses the tiny test sizes. Returns a result dict."""
    workload = WORKLOADS[name]
    cfg = workload.small if small else workload.full
    batches = [workload.batch(cfg, SEED + 100 + i) for i in range(NUM_BATCHES)]

    # the parameter structure of the kaun_ir model, filled with the shared NumPy weights
    from kaun_ir import layer, rng

    with rng.scope(SEED):
        structure = layer.init(workload.kaun_model(cfg)).params
    params = initial_params(structure, SEED + 1)

    runners = [KaunRunner(workload, cfg, params, batches), JaxRunner(workload, cfg, params, batches)]
    result: dict = {"workload": name, "description": workload.description, "steps": steps, "rounds": rounds,
                    "small": small, "implementations": {}}
    for runner in runners:
        start = time.perf_counter()
        first_loss = _run_steps(runner, 1)
        first = time.perf_counter() - start
        loss_n = _run_steps(runner, steps - 1) if steps > 1 else first_loss
        result["implementations"][runner.name] = {"first_step_s": first, "initial_loss": first_loss,
                                                  f"loss_after_{steps}": loss_n, "steps_per_s_rounds": []}
    for _ in range(rounds):
        for runner in runners:
            start = time.perf_counter()
            _run_steps(runner, steps)
            elapsed = time.perf_counter() - start
            result["implementations"][runner.name]["steps_per_s_rounds"].append(steps / elapsed)
    for entry in result["implementations"].values():
        entry["steps_per_s"] = statistics.median(entry["steps_per_s_rounds"]) if rounds else None
        entry["peak_memory"] = None  # see the module docstring
    ours, ref = result["implementations"]["kaun_ir"], result["implementations"]["jax"]
    a, b = ours[f"loss_after_{steps}"], ref[f"loss_after_{steps}"]
    result["loss_rel_diff"] = abs(a - b) / max(abs(b), 1e-30)
    result["losses_agree"] = bool(result["loss_rel_diff"] <= LOSS_RTOL)
    result["ratio_kaun_over_jax"] = (ours["steps_per_s"] / ref["steps_per_s"]) if rounds else None
    result["torch"] = "skipped (import torch failed)" if not _torch_available() else "not implemented"
    return result


# ------------------------------------------------------------------------------ output


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def format_table(results: list[dict]) -> str:
    """A Markdown table: one row per workload and implementation."""
    lines = ["| workload | implementation | steps/s (median) | first step | peak memory | "
             "loss after N steps | kaun_ir/JAX |",
             "|---|---|---:|---:|---|---:|---:|"]
    for r in results:
        steps = r["steps"]
        for impl, entry in r["implementations"].items():
            ratio = ""
            if impl == "kaun_ir" and r["ratio_kaun_over_jax"] is not None:
                ratio = f"{r['ratio_kaun_over_jax']:.2f}"
            lines.append(f"| {r['workload']} | {impl} | {_fmt_rate(entry['steps_per_s'])} | "
                         f"{entry['first_step_s']:.2f} s | n/a | {entry[f'loss_after_{steps}']:.6f} | {ratio} |")
    return "\n".join(lines)


def run(args) -> int:
    import kaun_ir as kn

    try:
        names = parse_workloads(args.workload)
    except ValueError as err:
        print(f"kaun-ir bench: {err}")
        return 2
    if args.steps < 1 or args.rounds < 0:
        print("kaun-ir bench: --steps must be >= 1 and --rounds >= 0")
        return 2
    results = [bench_workload(name, args.steps, args.rounds, small=args.small) for name in names]
    ok = all(r["losses_agree"] for r in results)
    if args.json:
        print(json.dumps({"backend": kn.runtime.backend_name(), "loss_rtol": LOSS_RTOL, "results": results,
                          "ok": ok}, indent=1))
        return 0 if ok else 1
    print(f"kaun_ir {kn.__version__} on XLA '{kn.runtime.backend_name()}': {args.steps} steps x "
          f"{args.rounds} alternating rounds per implementation\n")
    for r in results:
        print(f"- {r['workload']}: {r['description']}")
    print()
    print(format_table(results))
    print()
    for r in results:
        verdict = "agree" if r["losses_agree"] else "DISAGREE"
        print(f"{r['workload']}: losses after {r['steps']} steps {verdict} (relative difference "
              f"{r['loss_rel_diff']:.1e}, tolerance {LOSS_RTOL:.0e})")
    print("peak memory: n/a (one process, one XLA allocator shared by both implementations; no "
          "per-implementation statistics on this client)")
    print(f"PyTorch: {results[0]['torch'] if results else 'skipped'}")
    return 0 if ok else 1

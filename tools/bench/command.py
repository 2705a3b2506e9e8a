"""``kaun-ir bench``: training-step throughput of kaun_ir against a hand-written JAX + optax step
(and PyTorch eager when ``torch`` is importable).

Implementations, all in one process and started from the same NumPy-generated weights, trained
on the same fixed synthetic batches (8, cycled step by step) with the same optimiser:

- ``kaun_ir``: ``train.step``, one executable call per step (state donated);
- ``kaun_ir[K=k]``: ``k`` steps fused in one executable (a ``while`` loop, as
  ``train.fit(..., steps_per_call=k)``) on a device-resident block of ``k`` stacked batches;
  ``--steps-per-call`` (0 leaves the row out; ``--steps`` must be a multiple of it);
- ``kaun_ir[bfloat16]``, ``kaun_ir[float16]``, ``kaun_ir[remat=nothing]``, ``kaun_ir[remat=dots]``
  (``--variant``, repeatable, none by default): ``kaun_ir`` trained with
  ``train.make(..., precision=...)`` or ``train.make(..., remat=...)`` (docs/memory.md); their
  losses must agree with JAX's within ``MIXED_LOSS_RTOL`` (5e-2, products in 8 / 11 mantissa bits)
  or ``LOSS_RTOL`` (rematerialisation does not change the arithmetic);
- ``kaun_ir[closure]`` (``--variant closure``): the path a user's loop writes, the Kaun closure
  form: ``train.make`` without ``loss=`` and ``train.step(trainer, st, x, lambda logits:
  loss.cross_entropy_sparse(logits, y))`` with a new closure every step over the batch's labels
  (device arrays); the same executable as ``kaun_ir`` plus the closure's inspection per call;
- ``kaun_ir[roll]`` (``--variant roll``): the transformers built with
  ``layer.sequential(..., roll=True)``, their decoder blocks one ``scan`` over stacked
  parameters (docs/loops.md); loss within ``LOSS_RTOL``. Workloads without repeated blocks
  train exactly as ``kaun_ir``;
- ``kaun_ir[iree]`` (``--backend iree``, or ``--variant iree``): the ``kaun_ir`` step compiled by
  IREE for this CPU (``train.make(..., backend="iree")``, the extra ``iree``) instead of XLA: its
  first step is IREE's compile time, its loss must agree with JAX's within ``FUSED_LOSS_RTOL``
  (other kernels, other rounding);
- ``kaun_ir[user]``, ``kaun_ir[user-closure]`` (``--variant user`` / ``user-closure``): the loop
  as a user writes it, public API only: ``jax.Array`` batches (``jax.device_put``, 16 distinct
  arrays cycled) and ``train.step`` with explicit targets or a new loss closure every step;
- ``jax``: the reference, ``jax.jit`` of the whole step (forward, ``jax.grad``, optax update)
  with parameters and optimiser state donated;
- ``torch``: PyTorch eager, ``torch.optim.Adam`` / ``AdamW`` with optax's hyper-parameters and
  PyTorch's default (per-parameter loop) optimiser implementation and thread count. Left out,
  with a line saying so, when ``import torch`` fails (``pip install kaun-ir[bench]``). The
  footer names the wheel that ran (CPU-only or CUDA);
- ``torch.compile`` (``--torch-compile``): the same PyTorch step with the forward + loss and
  ``opt.step`` compiled by ``torch.compile`` (inductor's C++ backend on the CPU); its
  compilation is part of its first step.

Measured per workload (``--workload``, default all):

1. *first step*: building a fresh instance (weights to the device, optimiser state) + trace +
   compile + the first finished call (for ``kaun_ir[K]`` that call runs ``k`` steps). With
   ``--memory`` (the default) it is taken in the fresh child process of 4., where that
   compilation is the first of its kind in the process (every child first builds the same host
   data, which warms up XLA alike for kaun_ir and JAX); with ``--no-memory``, in the bench
   process, with the order of the implementations rotated from workload to workload. The JSON
   keeps both (``first_step_child_s``, ``first_step_in_process_s``). First steps are cold: the
   persistent compilation cache (on by default) is off for the bench and its children unless
   ``KAUN_IR_CACHE_DIR`` is set (the footer says which); ``--warm-cache`` adds each kaun_ir row's
   first step with a warm cache (``first_step_warm_s``, "(warm ...)" in the table).
2. ``--steps`` (N) steps each, the first included; the losses after N steps must agree with
   JAX's within a relative tolerance: ``LOSS_RTOL`` (1e-4) for ``kaun_ir`` (the same XLA
   kernels as the JAX step), ``TORCH_LOSS_RTOL`` (1e-3) for PyTorch (other kernels, other
   rounding) and ``FUSED_LOSS_RTOL`` (1e-3) for ``kaun_ir[K]`` (XLA compiles some ops inside a
   loop to other kernels: on CPU the convolutions of the CNN, in JAX's own ``fori_loop`` too).
   On a GPU the exact rows get ``ACCELERATOR_LOSS_RTOL`` (1e-3): XLA multiplies float32 in
   TensorFloat-32 there, and two equivalent graphs round apart. Rounding differences grow
   over the steps (Adam amplifies them; the CNN's trajectories of different kernels are ~1e-2
   apart after 100 steps), so the check is meant for modest N; a workload whose trajectory
   outgrows the tolerance within a round compares earlier (``Workload.loss_steps``: resnet
   after 8 of its 16 steps, where both XLA programs are within 3e-6 of a float64 run); the
   table's ``N`` is the step the losses are compared at.
3. ``--rounds`` alternating rounds of N steps per implementation (rotated order as above);
   *steps/s* is the median over the rounds (each round blocks on its last loss), *ratio vs JAX*
   is steps/s over JAX's steps/s.
4. *peak memory* (``--memory``, the default; ``--no-memory`` skips it): every implementation
   runs again in a fresh child process that imports everything, builds the host data (initial
   weights, batches), hands freed heap back to the OS (``malloc_trim``) and records its
   resident set size (RSS). It then builds and compiles its step and runs one call (the peak
   RSS of this phase minus that RSS, compiler working memory included, is
   ``compile_peak_bytes`` in the JSON), trims again, resets the kernel's peak-RSS counter
   (``/proc/self/clear_refs``) and runs ``MEMORY_CALLS`` more calls. **Peak memory** is the
   peak RSS of that last phase minus the RSS before building: what the implementation holds
   and touches while it trains (weights, optimiser state, its device-resident batches — ``k``
   stacked ones for ``kaun_ir[K]`` —, compiled code, runtime caches, per-step temporaries),
   measured the same way for kaun_ir, JAX and PyTorch. For the XLA implementations the JSON
   adds XLA's compiled memory analysis of the step executable (``xla.total_bytes = argument +
   output + temp - alias``), also shown in the footer. Needs Linux's ``/proc``; n/a elsewhere.
5. *GFLOP/s*: the step's FLOPs (kaun_ir's cost model over the optimised step graph, one count
   for every row of a workload) times steps/s. Once per run, before the workloads
   (``--matmul``, the default), XLA's own 1024^3 float32 matmul through kaun_ir's runtime and
   ``torch.mm`` are timed; the footer sets the steps' GFLOP/s against them
   (``kaun_ir.tools.bench.flops``).
"""

from __future__ import annotations

import argparse
import os
import sys

from kaun_ir.runtime import disk_cache
from kaun_ir.tools.bench import categories as bench_categories
from kaun_ir.tools.bench import compile as bench_compile
from kaun_ir.tools.bench import flops as bench_flops
from kaun_ir.tools.bench.measure import bench_workload
from kaun_ir.tools.bench.reference import torch_status
from kaun_ir.tools.bench.report import print_json, print_text
from kaun_ir.tools.bench.runners import VARIANTS
from kaun_ir.tools.bench.workloads import DEFAULT_WORKLOADS, WORKLOADS


def add_parser(sub) -> None:
    """Add the ``bench`` command and its options to the ``kaun-ir`` subcommands ``sub``."""
    parser = sub.add_parser(
        "bench",
        help="training-step speed of kaun_ir vs JAX + optax (and PyTorch)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_workload_options(parser)
    _add_measurement_options(parser)
    # tiny sizes of every workload, for the tests (not a benchmark)
    parser.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


def _add_workload_options(parser) -> None:
    """What runs: the workloads, how many steps and rounds, and the extra kaun_ir rows."""
    parser.add_argument(
        "-w",
        "--workload",
        action="append",
        default=None,
        help=f"workload(s), repeatable or comma-separated: {', '.join(WORKLOADS)} (default: all but the "
        "real-size gpt2_small rows)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per round, N (default: per workload, "
        + ", ".join(f"{w.name} {w.steps}" for w in WORKLOADS.values())
        + ")",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument(
        "--steps-per-call",
        type=int,
        default=None,
        metavar="K",
        help="the kaun_ir[K] row: K steps fused per executable call; 0 leaves it out "
        "(default: per workload, "
        + ", ".join(f"{w.name} {w.steps_per_call}" for w in WORKLOADS.values())
        + ")",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        choices=VARIANTS,
        help="add a kaun_ir[VARIANT] row: mixed precision (train.make(precision=...)), "
        "rematerialisation (train.make(remat=...)), the closure form of the loss (closure), "
        "the transformers' blocks rolled into a loop (roll: layer.sequential(roll=True)) or the "
        "loop as a user writes it over jax.Array batches (user, user-closure), or the step "
        "compiled by IREE (iree); repeatable",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=None,
        choices=("xla", "iree"),
        help="compilers of the kaun_ir rows: xla (always) and iree, which adds the kaun_ir[iree] "
        "row beside XLA's (needs the extra iree); repeatable",
    )


def _add_measurement_options(parser) -> None:
    """What is measured besides the steps' speed, and how the results are printed."""
    parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure peak memory (and first step) in a fresh child process per implementation (default: on)",
    )
    parser.add_argument(
        "--matmul",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"time XLA's {bench_flops.MATMUL_N}^3 float32 matmul through kaun_ir's runtime (and "
        "torch.mm) once, to compare the steps' GFLOP/s with (default: on)",
    )
    parser.add_argument(
        "--torch-compile",
        action="store_true",
        help="add a torch.compile row (forward + loss and opt.step compiled, inductor's C++ "
        "backend; its compilation is part of its first step) next to PyTorch eager",
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="with --memory: also each kaun_ir row's first step with a warm persistent compilation "
        "cache (two more child processes sharing a new cache directory; JSON first_step_warm_s)",
    )
    parser.add_argument(
        "--categories",
        action="store_true",
        help="instead of throughput: profile kaun_ir's step and PyTorch's (eager, and compiled with "
        "--torch-compile) side by side and print ms per step by category (products, attention, "
        "softmax, norms, element-wise, copies, optimiser, idle); see kaun_ir.tools.bench.categories",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="instead of throughput: the time to the first step, per compilation stage, "
        "against JAX's (see kaun_ir.tools.bench.compile)",
    )
    parser.add_argument(
        "--layers",
        default=",".join(map(str, bench_compile.DEFAULT_LAYERS)),
        metavar="N,N,..",
        help="with --compile: also the transformer at these depths (default: %(default)s; '' for none)",
    )


def parse_workloads(values: list[str] | None) -> list[str]:
    """``["mlp,cnn", "transformer"]`` -> ``["mlp", "cnn", "transformer"]``; None -> the default
    workloads (all but the real-size GPT-2 rows, which are named with ``-w``)."""
    if not values:
        return list(DEFAULT_WORKLOADS)
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return names


def _run_compile(args, names: list[str]) -> int:
    """``--compile``: the compile-time report instead of throughput."""
    try:
        layers = tuple(int(n) for n in args.layers.split(",") if n.strip())
    except ValueError:
        print(f"kaun-ir bench: --layers wants comma-separated integers, got {args.layers!r}")
        return 2
    if any(n < 1 for n in layers):
        print("kaun-ir bench: --layers must be positive")
        return 2
    return bench_compile.run(names, layers, args.small, args.json)


def plan_workload(args, name: str) -> tuple[str, int, int]:
    """``(name, N, K)`` of one workload from the options and its defaults; ``ValueError`` with the
    message to print when they do not fit together."""
    w = WORKLOADS[name]
    steps = w.steps if args.steps is None else args.steps
    k = w.steps_per_call if args.steps_per_call is None else args.steps_per_call
    if k and steps % k:
        if args.steps is None:
            steps = -(-steps // k) * k  # the default N rounded up to a multiple of an explicit K
        elif args.steps_per_call is None:
            k = 0  # an explicit N that the workload's default K does not divide: no fused row
    if steps < 1 or args.rounds < 0 or k < 0:
        raise ValueError("--steps must be >= 1, --rounds >= 0 and --steps-per-call >= 0")
    if k and steps % k:
        raise ValueError(
            f"--steps ({steps}) must be a multiple of --steps-per-call ({k}); "
            "--steps-per-call 0 leaves the fused row out"
        )
    return name, steps, k


def _run_plan(args, plan: list[tuple[str, int, int]]) -> list[dict]:
    """Every planned workload benchmarked in turn, with a progress line on a terminal."""
    results = []
    for i, (name, steps, k) in enumerate(plan):
        if sys.stderr.isatty():  # a full run takes minutes: say where it is
            sys.stderr.write(f"\rkaun-ir bench: {name} ({i + 1}/{len(plan)})...\033[K")
            sys.stderr.flush()
        results.append(
            bench_workload(
                name,
                steps,
                args.rounds,
                small=args.small,
                steps_per_call=k,
                memory=args.memory,
                order=i,
                variants=_variants(args),
                torch_compile=args.torch_compile,
                warm=args.warm_cache,
            )
        )
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    return results


def _variants(args) -> tuple:
    """The ``--variant`` rows, plus ``iree`` when ``--backend iree`` asks for IREE's row."""
    variants = list(args.variant or ())
    if "iree" in (args.backend or ()) and "iree" not in variants:
        variants.append("iree")
    return tuple(variants)


def run(args) -> int:
    """``kaun-ir bench``: plan the workloads, time the matmul, benchmark, print; 0 when every
    row's loss agrees with JAX's, 1 when one does not, 2 on a usage error."""
    try:
        names = parse_workloads(args.workload)
    except ValueError as err:
        print(f"kaun-ir bench: {err}")
        return 2
    if not disk_cache.explicit():
        # first steps are measured cold, like JAX's: the persistent compilation cache (on by
        # default) is off for the bench and its child processes unless KAUN_IR_CACHE_DIR is set
        os.environ[disk_cache.ENV] = "off"
    if args.compile:
        return _run_compile(args, names)
    if args.categories:
        for name in names:
            steps = args.steps or WORKLOADS[name].steps
            print(
                bench_categories.table(
                    name, bench_categories.run(name, steps, args.small, args.torch_compile)
                )
            )
            print()
        return 0
    try:
        plan = [plan_workload(args, name) for name in names]
    except ValueError as err:
        print(f"kaun-ir bench: {err}")
        return 2
    matmul = None
    if args.matmul and args.rounds:
        matmul = bench_flops.matmul_rates(
            bench_flops.MATMUL_SMALL_N if args.small else bench_flops.MATMUL_N, torch=torch_status()[0]
        )
    results = _run_plan(args, plan)
    ok = all(r["losses_agree"] for r in results)
    if args.json:
        print_json(results, matmul, ok)
    else:
        print_text(results, matmul, args.rounds)
    return 0 if ok else 1

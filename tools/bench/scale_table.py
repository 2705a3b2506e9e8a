"""Per-device memory and communication of a sharded training step, from XLA's compiler output.

    python -m kaun_ir.tools.bench.scale_table --devices 8 64            # the table of docs/distributed.md
    python -m kaun_ir.tools.bench.scale_table --devices 8 --layers 2    # a quick, small version

For each device count (virtual CPU devices, one child process each: the count must be set
before XLA's backend starts) and each layout — data parallel (DP), fully sharded (FSDP), and
FSDP with 8-way tensor parallelism (FSDP+TP) — the training step of a GPT-2-medium-sized
decoder (AdamW, next-token cross-entropy) is compiled, never run. Reported per device:
parameter and optimiser-state bytes (the shards the layout gives each device), XLA's temporary
bytes (its memory analysis of the partitioned program), and the collectives XLA's partitioner
inserted with the bytes they produce per step (see ``kaun_ir.runtime.collectives``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

LAYOUTS = ("DP", "FSDP", "FSDP+TP")


def _model(args):
    from kaun_ir import models

    # GPT-2 medium: 24 layers, width 1024, 16 heads; the vocabulary padded from 50257 to 50304
    # (a multiple of 64) so that the embedding splits evenly, as large-scale trainers do
    return models.gpt2(
        vocab_size=args.vocab,
        dim=args.dim,
        num_layers=args.layers,
        num_heads=args.heads,
        max_positions=args.seq,
    )


def _abstract_state(trainer):
    """A ``train.State`` of ``kn.ShapeDtype`` leaves: shapes only, nothing allocated or run."""
    from kaun_ir import dtypes, layer, optim, train, tree
    from kaun_ir.surface.trace import ShapeDtype, trace_flat

    def shapes():
        vars_ = layer.init(trainer.model)
        return vars_.params, vars_.state

    traced = trace_flat(lambda: _rng_run(shapes), (), {})
    leaves = [ShapeDtype(t.shape, t.dtype) for t in traced.graph.output_types]
    params, state = tree.unflatten(traced.out_treedef, leaves)
    traced = trace_flat(lambda p: tuple(optim.init(trainer.optimizer, p)), (params,), {})
    leaves = [ShapeDtype(t.shape, t.dtype) for t in traced.graph.output_types]
    count, trees = tree.unflatten(traced.out_treedef, leaves)
    return train.State(
        layer.Vars(params, state, dtypes.float32),
        optim.State(count, trees),
        0,
        ShapeDtype((2,), dtypes.uint32),
    )


def _rng_run(fn):
    from kaun_ir import rng

    return rng.run(0, fn)


def _layout(name: str, model_axis: int):
    from kaun_ir import sharding

    if name == "DP":
        return None
    if name == "FSDP":
        return "fsdp"
    table = (
        sharding.attention_rules("*attn.")
        + sharding.mlp_rules("*mlp.fc", "*mlp.proj")
        + [("embed.weight", sharding.Spec("model", None))]
    )
    return sharding.rules(table, fsdp=True)


def _shard_bytes(tree_, specs, mesh) -> int:
    from kaun_ir import ptree

    total = 0
    spec_of = dict(ptree.flatten_with_paths(specs))
    for path, leaf in ptree.flatten_with_paths(tree_):
        spec = spec_of.get(path)
        shape = mesh.shard_shape(leaf.shape, spec) if spec is not None else tuple(leaf.shape)
        total += math.prod(shape) * leaf.dtype.itemsize
    return total


def child(args) -> list[dict]:
    """The rows for ``args.child`` devices (runs in a process with that many CPU devices)."""
    from kaun_ir import optim, ptree, sharding, train
    from kaun_ir.dtypes import int32
    from kaun_ir.nn import loss
    from kaun_ir.runtime.collectives import collective_stats
    from kaun_ir.surface.trace import ShapeDtype

    count = args.child
    rows = []
    for name in args.layouts:
        tp = 8 if name == "FSDP+TP" else 1
        mesh = sharding.mesh((count // tp, tp), ("data", "model"))
        policy = _layout(name, tp)
        trainer = train.make(
            _model(args), optim.adamw(3e-4), loss=loss.cross_entropy_sparse, mesh=mesh, param_sharding=policy
        )
        st = _abstract_state(trainer)
        batch = args.batch_per_device * (count // tp)
        ids = ShapeDtype((batch, args.seq), int32)
        start = time.perf_counter()
        exe = train.step_executable(trainer, st, ids, ids)
        seconds = time.perf_counter() - start
        params = train.vars(st).params
        pspecs = sharding.param_specs(params, mesh, policy)
        count_, trees = st.opt_state
        memory = exe.memory_analysis() or {}
        rows.append(
            {
                "devices": count,
                "layout": name,
                "mesh": dict(mesh.axes),
                "global_batch": batch,
                "seq": args.seq,
                "parameters": sum(math.prod(leaf.shape) for leaf in ptree.flatten(params)[0]),
                "param_bytes": _shard_bytes(params, pspecs, mesh),
                "opt_bytes": sum(_shard_bytes(t, pspecs, mesh) for t in trees),
                "temp_bytes": memory.get("temp"),
                "argument_bytes": memory.get("argument"),
                "collectives": collective_stats(exe.hlo_text()),
                "compile_s": round(seconds, 1),
            }
        )
        print(f"  {count} devices, {name}: compiled in {seconds:.0f} s", file=sys.stderr, flush=True)
    return rows


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def table(rows: list[dict]) -> str:
    """The Markdown table of ``rows``."""
    lines = [
        "| devices | layout | mesh | params / device (MiB) | optimiser state / device (MiB) | "
        "XLA temporaries / device (MiB) | all-reduce | all-gather | reduce-scatter | "
        "collective MiB / device / step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["collectives"]
        moved = sum(entry["bytes"] for entry in c.values())
        mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
        lines.append(
            f"| {r['devices']} | {r['layout']} | {mesh} | {_mib(r['param_bytes'])} | "
            f"{_mib(r['opt_bytes'])} | {_mib(r['temp_bytes'])} | {c['all-reduce']['count']} | "
            f"{c['all-gather']['count']} | {c['reduce-scatter']['count']} | {_mib(moved)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Print the table described above for the options in ``argv`` (default: the process's
    arguments); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m kaun_ir.tools.bench.scale_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--devices", type=int, nargs="+", default=[8, 64], help="device counts (default 8 64)"
    )
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument(
        "--batch-per-device",
        type=int,
        default=1,
        help="sequences per data-parallel group of devices (default 1)",
    )
    parser.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    rows = []
    for count in args.devices:
        print(f"compiling for {count} virtual devices ...", file=sys.stderr, flush=True)
        env = dict(
            os.environ, KAUN_IR_BACKEND="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={count}"
        )
        command = [
            sys.executable,
            "-m",
            "kaun_ir.tools.bench.scale_table",
            "--child",
            str(count),
            "--layouts",
            *args.layouts,
            "--layers",
            str(args.layers),
            "--dim",
            str(args.dim),
            "--heads",
            str(args.heads),
            "--vocab",
            str(args.vocab),
            "--seq",
            str(args.seq),
            "--batch-per-device",
            str(args.batch_per_device),
        ]
        proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
        if proc.returncode:
            print(f"the {count}-device compilation failed", file=sys.stderr)
            return proc.returncode
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    text = table(rows)
    sys.stdout.write(text)
    if args.json:
        from kaun_ir.fileio import atomic_write

        atomic_write(args.json, json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

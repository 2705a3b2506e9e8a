"""``kaun-ir demo``: the compiler pipeline end to end on two small models.

Traces an MLP and a small convolutional net into kaun_ir's IR, optimises, lowers to StableHLO,
compiles with XLA, runs, checks the result against the IR's NumPy reference interpreter, and
writes every stage to an output directory.
"""

from __future__ import annotations

import os
import time

import numpy as np


def add_parser(sub) -> None:
    parser = sub.add_parser("demo", help="run the compiler pipeline end to end on small models",
                            description=__doc__, formatter_class=_Formatter)
    parser.add_argument("-o", "--out", default="demo_out", help="directory for the IR dumps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    parser.set_defaults(run=run)


class _Formatter(__import__("argparse").RawDescriptionHelpFormatter):
    pass


def _mlp(params, x):
    import kaun_ir as kn

    h = x
    for i, layer in enumerate(params):
        with kn.ir.scope(f"{2 * i}.linear"):
            h = h @ layer["weight"] + layer["bias"]
        if i < len(params) - 1:
            with kn.ir.scope(f"{2 * i + 1}.relu"):
                h = kn.maximum(h, 0.0)
    return kn.log_softmax(h, axis=-1)


def _cnn(params, x):
    import kaun_ir as kn

    with kn.ir.scope("0.conv2d"):
        h = kn.fn.conv2d(x, params["conv"]["weight"], params["conv"]["bias"], padding="same")
    with kn.ir.scope("1.relu"):
        h = kn.maximum(h, 0.0)
    with kn.ir.scope("2.max_pool2d"):
        h = kn.fn.max_pool2d(h, 2)
    with kn.ir.scope("3.flatten"):
        h = h.reshape(h.shape[0], -1)
    with kn.ir.scope("4.linear"):
        return h @ params["dense"]["weight"] + params["dense"]["bias"]


def _init(rng: np.random.Generator, fan_in: int, shape) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def run(args) -> int:
    import kaun_ir as kn

    rng = np.random.default_rng(args.seed)
    sizes = [64, 128, 64, 10]
    mlp_params = [{"weight": _init(rng, a, (a, b)), "bias": np.zeros(b, np.float32)}
                  for a, b in zip(sizes[:-1], sizes[1:])]
    cnn_params = {
        "conv": {"weight": _init(rng, 9, (8, 1, 3, 3)), "bias": np.zeros(8, np.float32)},
        "dense": {"weight": _init(rng, 8 * 4 * 4, (8 * 4 * 4, 10)), "bias": np.zeros(10, np.float32)},
    }
    models = [
        ("mlp", _mlp, mlp_params, rng.standard_normal((32, 64)).astype(np.float32)),
        ("cnn", _cnn, cnn_params, rng.standard_normal((16, 1, 8, 8)).astype(np.float32)),
    ]
    os.makedirs(args.out, exist_ok=True)
    print(f"kaun_ir {kn.__version__} on XLA backend '{kn.runtime.backend_name()}'\n")
    for name, fn, params, x in models:
        start = time.perf_counter()
        compiled = kn.jit(fn)
        out = np.asarray(compiled(params, x))
        elapsed = time.perf_counter() - start
        traced = kn.trace(fn, params, x)
        optimized = compiled.graph(params, x)
        reference = kn.ir.interpret(traced, *kn.tree.flatten((params, x))[0])[0]
        error = float(np.max(np.abs(out - reference)))
        counts = optimized.op_counts()
        top = ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1])[:5])
        print(f"{name}: input {list(x.shape)} -> output {list(out.shape)}; "
              f"{len(traced.nodes)} traced ops, {len(optimized.nodes)} after '{compiled.pipeline}' ({top})")
        print(f"  trace + compile + run {elapsed * 1e3:.0f} ms; max |XLA - NumPy reference| = {error:.2e}")
        _write(os.path.join(args.out, f"{name}.traced.kir"), traced.text())
        _write(os.path.join(args.out, f"{name}.optimized.kir"), optimized.text())
        _write(os.path.join(args.out, f"{name}.stablehlo.mlir"), compiled.lower(params, x))
        _write(os.path.join(args.out, f"{name}.hlo.txt"), compiled.executable(params, x).hlo_text())
        if error > 1e-4:
            print(f"  MISMATCH against the reference interpreter for {name}")
            return 1
    print(f"\nIR dumps (traced, optimised, StableHLO, XLA HLO) written to {os.path.abspath(args.out)}/")
    return 0


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)

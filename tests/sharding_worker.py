"""Checks that need several devices, run in a child process with virtual CPU devices.

``python sharding_worker.py GROUP`` sets XLA_FLAGS before jax starts, runs the checks of GROUP
and prints one JSON object (check name -> result) on the last line of stdout. Each check
compares kaun_ir on a mesh with an independent oracle (JAX on one device, or kaun_ir on one
device) and reports the numbers; tests/test_sharding.py asserts on them. One process serves
several checks because starting jax and compiling dominate the cost.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import kaun_ir as kn  # noqa: E402
from kaun_ir.sharding.placement import Spec  # noqa: E402

RESULTS: dict = {}


TIMES: dict = {}


def check(fn):
    import time

    start = time.perf_counter()
    try:
        RESULTS[fn.__name__] = fn()
    except Exception as err:  # reported, and the test names the check that broke
        RESULTS[fn.__name__] = {"error": f"{type(err).__name__}: {err}"}
    TIMES[fn.__name__] = round(time.perf_counter() - start, 2)
    return fn


def error_of(fn) -> str:
    try:
        fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def group_jit():
    import jax
    import jax.numpy as jnp

    devices = kn.runtime.devices()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 4)).astype(np.float32)

    @check
    def placement():
        on1 = kn.jit(lambda a: a * 2.0, device=devices[1])(x)
        moved = kn.jit(lambda a: a + 1.0)(on1)  # an array on cpu:1 into a cpu:0 executable
        graph = kn.trace(lambda a: a - 1.0, x)
        on2 = kn.runtime.compile(graph, device=devices[2])(on1)[0]
        return {
            "on1": [d.id for d in on1.devices()],
            "moved": [d.id for d in moved.devices()],
            "on2": [d.id for d in on2.devices()],
            "diff": max(max_diff(on1, 2 * x), max_diff(moved, 2 * x + 1), max_diff(on2, 2 * x - 1)),
        }

    mesh = kn.sharding.mesh((2, 4), ("data", "model"))

    def loss(x, w):
        h = kn.sharding.constrain(x @ w, Spec("data", "model"))
        return kn.sum(kn.tanh(h) ** 2)

    step = kn.jit(
        kn.value_and_grad(loss, argnums=1), mesh=mesh, in_shardings=(Spec("data"), Spec(None, "model"))
    )

    @check
    def mesh_grad():
        value, grad = step(x, w)
        want_v, want_g = jax.value_and_grad(lambda x, w: jnp.sum(jnp.tanh(x @ w) ** 2), argnums=1)(x, w)
        graph = step.graph(x, w)
        return {
            "diff": max(max_diff(value, want_v), max_diff(grad, want_g)),
            "grad_spec": str(grad.sharding.spec),
            "value_spec": str(value.sharding.spec),
            "constraints": sum(n.op == "sharding_constraint" for n in graph.nodes),
            "sdy": "sdy.sharding_constraint" in step.lower(x, w) and "sdy.mesh @mesh" in step.lower(x, w),
            "roundtrip": kn.ir.parse(graph.text()).text() == graph.text(),
        }

    @check
    def sharded_inputs():
        xs = kn.sharding.put(x, mesh, Spec("data"))
        shards = sorted({tuple(s.data.shape) for s in xs.addressable_shards})
        traces = step.trace_count
        value, _ = step(xs, w)  # laid out as the executable wants: no new trace, no copy
        same = step.trace_count == traces
        # a sharded array into a one-device function: gathered by the runtime
        total = kn.jit(lambda a: a.sum(axis=1))(xs)
        # no in_shardings: the array's own layout is used
        own = kn.jit(lambda a: a * 3.0, mesh=mesh)(xs)
        return {
            "shards": shards,
            "same_trace": same,
            "diff": max(max_diff(total, x.sum(axis=1)), max_diff(own, 3 * x)),
            "own_spec": str(own.sharding.spec),
        }

    @check
    def errors():
        return {
            "unknown_axis": error_of(
                lambda: kn.jit(lambda a: kn.sharding.constrain(a, Spec("batch")), mesh=mesh)(x)
            ),
            "indivisible": error_of(
                lambda: kn.jit(lambda a: a, mesh=mesh, in_shardings=(Spec(None, ("data", "model")),))(w)
            ),
            "too_big": error_of(lambda: kn.sharding.mesh((4, 4), ("data", "model"))),
            "tree_mismatch": error_of(
                lambda: kn.jit(lambda t: t["a"], mesh=mesh, in_shardings=({"b": Spec("data")},))({"a": x})
            ),
        }

    @check
    def all_reduce_only():
        # data parallel: batch split over all 8 devices, weights replicated
        flat = kn.sharding.mesh((8,), ("data",))
        dp = kn.jit(
            kn.grad(lambda w, x: kn.mean((x @ w) ** 2)),
            mesh=flat,
            in_shardings=(None, Spec("data")),
            out_shardings=Spec(),
        )
        grad = dp(w, x)
        hlo = dp.executable(w, x).hlo_text()
        want = jax.grad(lambda w, x: jnp.mean((x @ w) ** 2))(w, x)
        return {
            "all_reduce": hlo.count(" all-reduce("),
            "all_gather": hlo.count(" all-gather("),
            "diff": max_diff(grad, want),
        }

    @check
    def sharded_checkpoint():
        import tempfile

        a = rng.standard_normal((8, 16)).astype(np.float32)
        b = rng.standard_normal((6,)).astype(np.float32)
        tree = {
            "a": kn.sharding.put(a, mesh, Spec("data", "model")),
            "b": kn.sharding.put(b, mesh),
            "host": np.arange(3),
            "step": 7,
        }
        with tempfile.TemporaryDirectory() as root:
            path = os.path.join(root, "ckpt")
            kn.checkpoint.save_sharded(path, tree)
            kn.checkpoint.save_sharded(path, tree)  # over an existing checkpoint
            files = sorted(os.listdir(path))
            # beside the link ``ckpt`` only the directory it names: no staging or replaced one
            leftovers = sorted(n for n in os.listdir(root) if n not in ("ckpt", os.readlink(path)))
            other = kn.sharding.mesh((8,), ("data",))  # another mesh shape
            like = {
                "a": kn.sharding.put(np.zeros_like(a), other, Spec(None, "data")),
                "b": kn.sharding.put(np.zeros_like(b), other),
                "host": np.zeros(3, np.int64),
                "step": 0,
            }
            back = kn.checkpoint.load_sharded(path, like)
            single = kn.checkpoint.load_sharded(path, {"a": kn.ShapeDtype((8, 16), kn.float32)})
            wrong = {"a": kn.ShapeDtype((8, 13), kn.float32)}
            bad = error_of(lambda: kn.checkpoint.load_sharded(path, wrong))
        return {
            "files": files,
            "leftovers": leftovers,
            "diff": max(max_diff(back["a"], a), max_diff(back["b"], b), max_diff(single["a"], a)),
            "a_spec": str(back["a"].sharding.spec),
            "a_shards": sorted({tuple(s.data.shape) for s in back["a"].addressable_shards}),
            "host": np.asarray(back["host"]).tolist(),
            "step": back["step"],
            "bad": bad,
        }


def group_train():

    from kaun_ir import layer, optim, rng, train
    from kaun_ir.nn import loss

    data_rng = np.random.default_rng(1)
    x = data_rng.standard_normal((10, 16, 12)).astype(np.float32)  # 10 batches of 16 rows
    y = np.tanh(x @ data_rng.standard_normal((12, 4))).astype(np.float32)
    mlp = layer.sequential([layer.linear(12, 32), layer.gelu(), layer.linear(32, 4)])

    def run(mesh=None, **options):
        trainer = train.make(mlp, optim.adam(0.02), loss=loss.mse, mesh=mesh, **options)
        st = rng.run(0, lambda: train.init(trainer))
        losses = []
        for i in range(len(x)):
            value, st = train.step(trainer, st, x[i], y[i])
            losses.append(float(value))
        return trainer, st, losses

    _, single, single_losses = run()
    single_params = train.vars(single).params

    def compare(st, losses):
        got = kn.ptree.flatten_with_paths(train.vars(st).params)
        want = dict(kn.ptree.flatten_with_paths(single_params))
        return {
            "params": max(max_diff(leaf, want[path]) for path, leaf in got),
            "loss": max(abs(a - b) for a, b in zip(losses, single_losses)),
        }

    flat = kn.sharding.mesh((8,), ("data",))

    @check
    def data_parallel():
        trainer, st, losses = run(flat)
        exe = train.step_executable(trainer, st, x[0], y[0])
        hlo = exe.hlo_text()
        return {
            **compare(st, losses),
            "all_reduce": hlo.count(" all-reduce("),
            "all_gather": hlo.count(" all-gather("),
            "param_spec": str(train.vars(st).params[0]["weight"].sharding.spec),
        }

    @check
    def fsdp():
        trainer, st, losses = run(flat, param_sharding="fsdp")
        weight = train.vars(st).params[0]["weight"]  # [12, 32]: split over its 32 columns
        moment = st.opt_state[1][0][0]["weight"]
        return {
            **compare(st, losses),
            "spec": str(weight.sharding.spec),
            "shards": sorted({tuple(s.data.shape) for s in weight.addressable_shards}),
            "moment_shards": sorted({tuple(s.data.shape) for s in moment.addressable_shards}),
            "devices": len(weight.addressable_shards),
        }

    @check
    def fused_steps():
        trainer = train.make(mlp, optim.adam(0.02), loss=loss.mse, mesh=flat, param_sharding="fsdp")
        st = rng.run(0, lambda: train.init(trainer))
        st = train.fit(trainer, st, kn.data.of_iterable(list(zip(x, y))), steps_per_call=5)
        return compare(st, single_losses)["params"]


def group_tools():
    import contextlib
    import io

    from kaun_ir.tools import cli

    @check
    def dump_stats():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = cli.main(["dump", "kaun_ir.tools.examples:sharded_mlp_grad", "--stats"])
        return {"code": code, "text": out.getvalue()}


def group_tensor_parallel():
    from kaun_ir import layer, optim, rng, train
    from kaun_ir.nn import loss
    from kaun_ir.tools.bench.transformer import decoder_block

    data_rng = np.random.default_rng(2)
    x = data_rng.standard_normal((3, 8, 8, 32)).astype(np.float32)  # 3 batches [B=8, T=8, E=32]
    y = data_rng.standard_normal((3, 8, 8, 32)).astype(np.float32)
    block = layer.sequential([decoder_block(32, 4)])

    # plain SGD: Adam would turn rounding noise in gradients that are zero in exact arithmetic
    # (the key projection's bias does not change softmax) into full-size updates
    def run(mesh=None, **options):
        trainer = train.make(block, optim.sgd(0.1), loss=loss.mse, mesh=mesh, **options)
        st = rng.run(0, lambda: train.init(trainer))
        losses = []
        for i in range(len(x)):
            value, st = train.step(trainer, st, x[i], y[i])
            losses.append(float(value))
        return trainer, st, losses

    _, single, single_losses = run()
    want = dict(kn.ptree.flatten_with_paths(train.vars(single).params))
    grid = kn.sharding.mesh((2, 4), ("data", "model"))
    table = kn.sharding.attention_rules("*attn.") + kn.sharding.mlp_rules("*fc1", "*fc2")

    @check
    def tensor_parallel():
        trainer, st, losses = run(grid, param_sharding=table)
        params = train.vars(st).params[0]
        got = kn.ptree.flatten_with_paths(train.vars(st).params)
        hlo = train.step_executable(trainer, st, x[0], y[0]).hlo_text()
        return {
            "params": max(max_diff(leaf, want[path]) for path, leaf in got),
            "loss": max(abs(a - b) for a, b in zip(losses, single_losses)),
            "query": str(params["attn"]["query"]["weight"].sharding.spec),
            "out": str(params["attn"]["out"]["weight"].sharding.spec),
            "fc1": sorted({tuple(s.data.shape) for s in params["fc1"]["weight"].addressable_shards}),
            "all_reduce": hlo.count(" all-reduce("),
        }

    @check
    def fsdp_tensor_parallel_layout():
        params = rng.run(0, lambda: layer.init(block)).params
        specs = kn.sharding.param_specs(params, grid, kn.sharding.rules(table, fsdp=True))[0]
        return {
            "fc1": repr(specs["fc1"]["weight"]),
            "fc2": repr(specs["fc2"]["weight"]),
            "ln1": repr(specs["ln1"][sorted(specs["ln1"])[0]]),
            "out_bias": repr(specs["attn"]["out"]["bias"]),
        }

    @check
    def bad_rules():
        return {
            "axis": error_of(lambda: run(grid, param_sharding=[("*fc1.weight", Spec(None, "tensor"))])),
            "policy": error_of(
                lambda: train.make(block, optim.adam(0.01), loss=loss.mse, mesh=grid, param_sharding="zero")
            ),
            "data_axis": error_of(
                lambda: train.make(block, optim.adam(0.01), loss=loss.mse, mesh=grid, data_axis="batch")
            ),
            "batch": error_of(lambda: train.step(*_one_state(train, block, grid), x[0][:3], y[0][:3])),
        }


def _one_state(train, block, grid):
    from kaun_ir import optim, rng
    from kaun_ir.nn import loss

    trainer = train.make(block, optim.sgd(0.1), loss=loss.mse, mesh=grid)
    return trainer, rng.run(0, lambda: train.init(trainer))


def group_docs():
    import contextlib
    import io
    import re

    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "distributed.md")

    @check
    def docs_examples():
        with open(doc, encoding="utf-8") as handle:
            blocks = re.findall(r"^```python\n(.*?)^```", handle.read(), re.S | re.M)
        namespace: dict = {"__name__": "__distributed_docs__"}
        out = io.StringIO()
        for k, code in enumerate(blocks):
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{doc}:block{k}", "exec"), namespace)
        return {"blocks": len(blocks), "output": out.getvalue()}


GROUPS = {
    "jit": group_jit,
    "train": group_train,
    "tools": group_tools,
    "tp": group_tensor_parallel,
    "docs": group_docs,
}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        GROUPS[name]()
    RESULTS["seconds"] = TIMES
    print(json.dumps(RESULTS))

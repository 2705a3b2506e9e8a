"""Checks of the partitioned stage and of gathering sharded arrays that need several devices,
run in a child process with 8 virtual CPU devices.

``python partitioned_worker.py`` sets XLA_FLAGS before jax starts, runs every check and prints
one JSON object (check name -> result) on the last line of stdout; tests/test_partitioned.py
asserts on it. Oracles: the layouts JAX's own compilation gives the same function, the specs
XLA's compiled executable reports for its results, and NumPy.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("KAUN_IR_BACKEND", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import kaun_ir as kn  # noqa: E402
from kaun_ir.sharding import Spec  # noqa: E402

RESULTS: dict = {}


def check(fn):
    try:
        RESULTS[fn.__name__] = fn()
    except Exception as err:  # reported, and the test names the check that broke
        RESULTS[fn.__name__] = {"error": f"{type(err).__name__}: {err}"}
    return fn


def layout(ttype) -> list | None:
    return None if ttype.sharding is None else [list(axes) for axes in ttype.sharding]


MESH = kn.sharding.mesh((2, 4), ("data", "model"))
RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 16)).astype(np.float32)
X = RNG.standard_normal((8, 8)).astype(np.float32)


def loss_fn(w, x):
    return kn.mean(kn.tanh(x @ w) ** 2)


@check
def jit_partitioned():
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from kaun_ir.ir.text import parse

    f = kn.jit(kn.grad(loss_fn), mesh=MESH, in_shardings=(Spec(None, "model"), Spec("data")))
    graph = f.graph(W, X, stage="partitioned")
    text = graph.text()
    back = parse(text)
    exe = f.executable(W, X)
    dots = [n for n in graph.nodes if n.op == "dot_general"]

    # the oracle: JAX compiles the same function with the same input layouts
    jmesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    jgrad = jax.jit(
        jax.grad(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)),
        in_shardings=(
            NamedSharding(jmesh, PartitionSpec(None, "model")),
            NamedSharding(jmesh, PartitionSpec("data")),
        ),
    )
    jax_spec = [
        list(p) if isinstance(p, tuple) else ([] if p is None else [p]) for p in jgrad(W, X).sharding.spec
    ]
    jax_spec += [[]] * (2 - len(jax_spec))
    xla_spec = [list(axes) for axes in exe.out_specs[0].padded(2)]
    return {
        "text": text,
        "roundtrip": back.text() == text,
        "inputs": [layout(v.type) for v in graph.inputs],
        "output": layout(graph.outputs[0].type),
        "first_dot": layout(dots[0].outputs[0].type),
        "jax_output": jax_spec,
        "xla_output": xla_spec,
        "same_graph": [n.op for n in graph.nodes] == [n.op for n in f.graph(W, X).nodes],
        "unsharded_equal": graph.outputs[0].type == f.graph(W, X).outputs[0].type,
    }


def _tp_trainer():
    from kaun_ir import layer, loss, optim, rng, train

    mlp = layer.sequential([layer.linear(12, 32), layer.gelu(), layer.linear(32, 4)])
    trainer = train.make(
        mlp,
        optim.adam(1e-2),
        loss=loss.mse,
        mesh=MESH,
        param_sharding=kn.sharding.rules(kn.sharding.mlp_rules("0", "2"), fsdp=True),
    )
    st = rng.run(0, lambda: train.init(trainer))
    bx = RNG.standard_normal((16, 12)).astype(np.float32)
    by = RNG.standard_normal((16, 4)).astype(np.float32)
    return trainer, st, bx, by


@check
def train_partitioned():
    from kaun_ir import train
    from kaun_ir.runtime import partitioned
    from kaun_ir.runtime.collectives import collective_stats, collectives_by_layer

    trainer, st, bx, by = _tp_trainer()
    exe = train.step_executable(trainer, st, bx, by)
    graph = partitioned.partitioned_graph(exe)
    names = list(graph.input_names)
    specs = {
        name: [list(axes) for axes in spec.padded(len(v.type.shape))]
        for name, spec, v in zip(names, exe.in_specs, exe.graph.inputs)
    }
    types = {name: layout(v.type) for name, v in zip(names, graph.inputs)}
    rows = collectives_by_layer(exe.hlo_text())
    stats = collective_stats(exe.hlo_text())
    # the layouts XLA's compiled executable reports for its results (None where it chose)
    out_specs = [
        [list(a) for a in spec.padded(len(v.type.shape))] for spec, v in zip(exe.out_specs, exe.graph.outputs)
    ]
    return {
        "specs": specs,
        "types": types,
        "out_specs": out_specs,
        "out_types": [layout(v.type) for v in graph.outputs],
        "rows": rows,
        "row_bytes": sum(r["bytes"] for r in rows),
        "stats_bytes": sum(e["bytes"] for e in stats.values()),
        "row_count": round(sum(r["count"] for r in rows), 6),
        "stats_count": sum(e["count"] for e in stats.values()),
        "table": partitioned.comm_table(exe, link_gbps=100.0),
        "sharded_values": sum(1 for n in graph.nodes for t in n.types if t.sharding is not None),
    }


@check
def cli_partitioned():
    from kaun_ir.ir.text import parse
    from kaun_ir.tools import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(
            ["dump", "kaun_ir.tools.examples:sharded_mlp_grad", "--stage", "partitioned", "--link-gbps", "10"]
        )
    text = out.getvalue()
    parsed = parse(text).text() if code == 0 else ""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("//")) + "\n"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as bad:
        code_one = cli.main(["dump", "kaun_ir.tools.examples:mlp", "--stage", "partitioned"])
    stats = io.StringIO()
    with contextlib.redirect_stdout(stats):
        cli.main(["dump", "kaun_ir.tools.examples:sharded_mlp_grad", "--stats"])
    return {
        "code": code,
        "stats": stats.getvalue(),
        "text": text,
        "stderr": err.getvalue(),
        "parses": parsed == body,
        "one_device_code": code_one,
        "one_device_error": bad.getvalue(),
    }


@check
def viz_comm():
    from kaun_ir.tools import cli

    with tempfile.TemporaryDirectory() as root:
        path = os.path.join(root, "comm.html")
        with contextlib.redirect_stderr(io.StringIO()) as err:
            code = cli.main(
                ["viz", "kaun_ir.tools.examples:sharded_mlp_grad", "--overlay", "comm", "-o", path]
            )
        page = open(path, encoding="utf-8").read() if code == 0 else ""
    payload = (
        json.loads(
            page.split('<script type="application/json" id="kir-data">', 1)[1].split("</script>", 1)[0]
        )
        if page
        else {}
    )
    nodes = payload["graphs"][0]["nodes"] if payload else []
    return {
        "code": code,
        "stderr": err.getvalue(),
        "overlay": payload.get("overlay"),
        "comm_total": sum(n["cost"][2] for n in nodes if len(n["cost"]) > 2),
        "sharded_types": sum("@" in t for n in nodes for t in n.get("types", [])),
    }


if __name__ == "__main__":
    print(json.dumps(RESULTS))

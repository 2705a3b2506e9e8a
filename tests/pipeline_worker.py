"""Pipeline-parallel checks run in a child process with 8 virtual CPU devices.

``python pipeline_worker.py`` trains an MLP stack, a small bench transformer and a GPT-2-shaped
``kn.models`` decoder on one device (the oracle) and pipelined over 4 and 8 stages of a mesh
(the decoder on a mesh of stages alone, no data axis), and prints one JSON object (check name
-> numbers) on the last line of stdout; tests/test_pipeline.py asserts on them.
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
from kaun_ir import layer, loss, optim, rng, train  # noqa: E402
from kaun_ir.runtime.collectives import collective_stats  # noqa: E402

STEPS = 2


def _mlp():
    def block():
        return layer.sequential([layer.linear(16, 16), layer.tanh()])

    model = layer.sequential([layer.linear(8, 16)] + [block() for _ in range(8)] + [layer.linear(16, 4)])
    r = np.random.default_rng(0)
    x = r.standard_normal((16, 8)).astype(np.float32)
    y = r.standard_normal((16, 4)).astype(np.float32)
    return model, optim.adam(1e-2), loss.mse, x, y, None


def _transformer():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kaun_ir.tools.bench.transformer import kaun_model

    cfg = {"layers": 8, "dim": 16, "heads": 2, "seq": 8, "vocab": 32}
    model = kaun_model(cfg)
    r = np.random.default_rng(0)
    x = r.integers(0, 32, (8, 8)).astype(np.int32)
    y = r.integers(0, 32, (8, 8)).astype(np.int32)

    def next_token(logits, targets):
        return loss.cross_entropy_sparse(kn.reshape(logits, (-1, 32)), kn.reshape(targets, (-1,)))

    # the bench initialises embeddings to zero, which makes every attention gradient vanish;
    # random embeddings give the blocks something to learn
    def params():
        v = layer.init(model)
        p = list(v.params)
        p[0] = {
            "tokens": (r.standard_normal((32, 16)) * 0.5).astype(np.float32),
            "positions": (r.standard_normal((8, 16)) * 0.5).astype(np.float32),
        }
        return layer.Vars(p, v.state, v.dtype)

    return model, optim.sgd(0.05), next_token, x, y, rng.run(0, params)


def _train(model, opt, lossf, x, y, start, **kw):
    trainer = train.make(model, opt, loss=lossf, **kw)
    if start is not None:  # a fresh copy: a step donates the state's buffers
        start = layer.Vars(kn.ptree.map(np.array, start.params), start.state, start.dtype)
    st = rng.run(0, lambda: train.init(trainer) if start is None else train.make_state(trainer, start))
    losses = []
    for _ in range(STEPS):
        value, st = train.step(trainer, st, x, y)
        losses.append(float(value))
    params = [np.asarray(leaf) for leaf in kn.ptree.flatten(train.vars(st).params)[0]]
    return trainer, st, losses, params


def _compare(setup, stages, micro, schedule, data):
    model, opt, lossf, x, y, start = setup
    ref = REFERENCE.setdefault(id(setup), _train(model, opt, lossf, x, y, start))
    mesh = kn.sharding.mesh((data, stages), ("data", "stage"))
    pipe = kn.sharding.pipeline(stages=stages, microbatches=micro, schedule=schedule)
    trainer, st, losses, params = _train(model, opt, lossf, x, y, start, mesh=mesh, pipeline=pipe)
    exe = train.step_executable(trainer, st, x, y)
    stats = collective_stats(exe.hlo_text())
    # relative to each leaf's size, with an absolute floor for leaves whose gradient is zero in
    # exact arithmetic (attention's key bias: what it holds is float32 rounding noise)
    errs = [
        float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-2)) for a, b in zip(ref[3], params)
    ]
    report = kn.memory_report(trainer, st, x, y, remat=())  # per device: one stage
    return {
        "report_args": [
            sum(b.bytes for b in report.buffers if b.parameter is not None),
            report.stats["argument"],
        ],
        "loss_ref": ref[2],
        "loss": losses,
        "param_err": max(errs),
        "permutes": stats["collective-permute"]["count"],
        "bubble": pipe.bubble,
        "memory": exe.memory_analysis(),
    }


REFERENCE: dict = {}


def _keep_grads():
    """A transformation that passes the gradients on and keeps them in its state (slot
    ``grad``), so a step's gradients can be read back from the optimiser state."""
    from kaun_ir.optim.core import filled_like

    def init(params):
        return (filled_like(params, 0.0),)

    def step(t, trees, params, grads):
        return grads, (grads,)

    return optim.Algorithm(init, step, "keep_grads", {}, ("grad",))


def _decoder_check() -> dict:
    """A GPT-2-shaped kn.models decoder (8 blocks) pipelined over the 8 devices of a mesh with
    only a stage axis, against the same steps on one device: losses and gradients."""
    vocab = 64
    gpt = kn.models.gpt2(vocab_size=vocab, dim=32, num_layers=8, num_heads=4, max_positions=16)
    ids = np.random.default_rng(0).integers(0, vocab, (8, 17)).astype(np.int32)
    start = rng.run(0, lambda: layer.init(gpt))

    def next_token(logits, targets):
        return loss.cross_entropy_sparse(kn.reshape(logits, (-1, vocab)), kn.reshape(targets, (-1,)))

    def run(**kw):
        trainer = train.make(gpt, optim.chain(_keep_grads(), optim.sgd(0.1)), loss=next_token, **kw)
        st = train.make_state(trainer, layer.Vars(kn.ptree.map(np.array, start.params), [], start.dtype))
        losses, grads = [], []
        for _ in range(STEPS):
            value, st = train.step(trainer, st, ids[:, :-1], ids[:, 1:])
            losses.append(float(value))
            grads.append([np.asarray(g) for g in kn.ptree.leaves(st.opt_state.trees[0])])
        return trainer, st, losses, grads

    _, _, ref_losses, ref_grads = run()
    mesh = kn.sharding.mesh((8,), ("stage",))
    trainer, st, losses, grads = run(mesh=mesh, pipeline=kn.sharding.pipeline(stages=8, microbatches=4))
    exe = train.step_executable(trainer, st, ids[:, :-1], ids[:, 1:])
    pairs = [(a, b) for ref, got in zip(ref_grads, grads) for a, b in zip(ref, got)]
    return {
        "loss_ref": ref_losses,
        "loss": losses,
        "loss_diff": max(abs(a - b) for a, b in zip(ref_losses, losses)),
        "grad_diff": max(float(np.max(np.abs(a - b))) for a, b in pairs),
        "grad_max": max(float(np.max(np.abs(a))) for a, _ in pairs),
        "leaves": len(ref_grads[0]),
        "permutes": collective_stats(exe.hlo_text())["collective-permute"]["count"],
    }


def main() -> None:
    results = {}
    mlp, tf = _mlp(), _transformer()
    for name, setup, stages, micro, schedule, data in (
        ("mlp_4", mlp, 4, 4, "gpipe", 2),
        ("mlp_8", mlp, 8, 2, "1f1b", 1),
        ("transformer_4", tf, 4, 2, "gpipe", 2),
        ("transformer_8", tf, 8, 4, "1f1b", 1),
    ):
        try:
            results[name] = _compare(setup, stages, micro, schedule, data)
        except Exception as err:  # reported, and the test names the check that broke
            results[name] = {"error": f"{type(err).__name__}: {err}"}
    try:
        results["gpt2_8"] = _decoder_check()
    except Exception as err:
        results["gpt2_8"] = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main()

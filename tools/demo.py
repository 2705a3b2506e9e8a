"""``kaun-ir demo``: train an MLP and a small CNN on the embedded digits data set;
``kaun-ir demo lm``: train a small character-level GPT on the shipped Shakespeare text and print
a sample (see :mod:`kaun_ir.tools.demo_lm`).

Both models are trained with ``train.fit`` (forward, kaun_ir's own autodiff and the Adam update
compiled into one XLA executable per input signature). The demo prints per-epoch loss and test
accuracy, saves a checkpoint and loads it into a fresh model (predictions must be identical),
and writes the IR of every stage — the traced forward pass, the training step after autodiff,
the optimised step, its StableHLO and XLA's HLO — to an output directory.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from kaun_ir.fileio import atomic_write


def add_parser(sub) -> None:
    """Add the ``demo`` command to the ``kaun-ir`` sub-parsers ``sub``."""
    parser = sub.add_parser(
        "demo",
        help="train an MLP and a CNN on digits (or, with 'lm', a char-level GPT on Shakespeare)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "which",
        nargs="?",
        choices=("digits", "lm"),
        default="digits",
        help="digits: MLP and CNN (default); lm: character-level GPT on Shakespeare",
    )
    parser.add_argument(
        "-o",
        "--out",
        default="demo_out",
        help="directory for IR dumps and the checkpoint (default: %(default)s)",
    )
    parser.add_argument("--epochs", type=int, default=25, help="epochs per model (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation and shuffling")
    from kaun_ir.tools import demo_lm

    demo_lm.add_arguments(parser)
    parser.set_defaults(run=run)


def mlp():
    """64 -> 128 -> 10 with ReLU (digits flattened to 64 features)."""
    from kaun_ir import layer

    return layer.sequential([layer.flatten(), layer.linear(64, 128), layer.relu(), layer.linear(128, 10)])


def cnn():
    """conv3x3 32, pool 2, conv3x3 64, pool 2, dense 10 on 1x8x8 digits (NCHW)."""
    from kaun_ir import layer

    return layer.sequential(
        [
            layer.conv2d(1, 32, 3),
            layer.relu(),
            layer.max_pool2d(2),
            layer.conv2d(32, 64, 3),
            layer.relu(),
            layer.max_pool2d(2),
            layer.flatten(),
            layer.linear(64 * 2 * 2, 10),
        ]
    )


def _batches(x, y, batch_size, seed):
    from kaun_ir import data
    from kaun_ir.nn import loss

    def pair(batch):
        images, labels = batch
        return images, lambda logits: loss.cross_entropy_sparse(logits, labels)

    return data.map(pair, data.prepare((x, y), batch_size, shuffle=True, seed=seed))


def _train(name, model, splits, args, out):
    from kaun_ir import optim, ptree, rng, runtime, train
    from kaun_ir.nn import metric

    (x_train, y_train), (x_test, y_test) = splits
    trainer = train.make(model, optim.adam(3e-3))
    with rng.scope(args.seed):
        st = train.init(trainer)
    compiles_before = runtime.stats.compiles
    start = time.perf_counter()
    accuracy = 0.0
    print(f"{name}: {ptree.count_parameters(st.vars.params):,} parameters")
    for epoch in range(1, args.epochs + 1):
        losses = []
        st = train.fit(
            trainer,
            st,
            _batches(x_train, y_train, args.batch_size, args.seed * 1000 + epoch),
            report=lambda step, loss, state: losses.append(loss),  # noqa: B023 - fit calls it within this epoch
        )
        accuracy = metric.accuracy(np.asarray(train.predict(trainer, st, x_test)), y_test)
        if epoch == 1 or epoch % 5 == 0 or epoch == args.epochs:
            print(f"  epoch {epoch:3d}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.2%}")
    elapsed = time.perf_counter() - start
    compiles = runtime.stats.compiles - compiles_before
    print(f"  trained in {elapsed:.1f} s, {st.step} steps, {compiles} XLA compilations")

    # the IR of every stage, for one batch
    images, labels = x_train[: args.batch_size], y_train[: args.batch_size]
    loss_fn = _batches(images, labels, args.batch_size, 0).__iter__().__next__()[1]
    stages = {
        "forward.kir": train.forward_graph(trainer, st, images).text(),
        "train_step.kir": train.step_graph(trainer, st, images, loss_fn).text(),
        "train_step.optimized.kir": train.step_graph(trainer, st, images, loss_fn, optimized=True).text(),
    }
    executable = train.step_executable(trainer, st, images, loss_fn)
    stages["train_step.stablehlo.mlir"] = executable.mlir
    stages["train_step.hlo.txt"] = executable.hlo_text()
    for suffix, text in stages.items():
        atomic_write(os.path.join(out, f"{name}.{suffix}"), text)
    return trainer, st, accuracy


def run(args) -> int:
    """Run ``kaun-ir demo`` (or ``demo lm``) with the parsed ``args``; returns the exit status."""
    if args.which == "lm":
        from kaun_ir.tools import demo_lm

        return demo_lm.run(args)
    from kaun_ir import datasets, layer, rng, runtime, train
    from kaun_ir.checkpoint import core as checkpoint
    from kaun_ir.version import __version__

    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    splits = datasets.digits(seed=args.seed)
    (x_train, _), (x_test, _) = splits
    print(
        f"kaun_ir {__version__} on XLA '{runtime.backend_name()}': digits, "
        f"{len(x_train)} training and {len(x_test)} test images of 8x8\n"
    )
    results = {}
    for name, build, threshold in (("mlp", mlp, 0.95), ("cnn", cnn, 0.97)):
        trainer, st, accuracy = _train(name, build(), splits, args, args.out)
        results[name] = (trainer, st, accuracy, threshold)

    # checkpoint round trip: save the CNN, load into a freshly initialised model
    trainer, st, _, _ = results["cnn"]
    path = os.path.join(args.out, "cnn.safetensors")
    checkpoint.save(path, st.vars.params)
    with rng.scope(args.seed + 1):
        fresh = layer.init(trainer.model)
    loaded = layer.with_params(fresh, checkpoint.load(path, like=fresh.params))
    before = np.asarray(train.predict(trainer, st, x_test))
    after = np.asarray(layer.apply(trainer.model, loaded, x_test)[0])
    identical = np.array_equal(before, after)
    print(f"\ncheckpoint {path}: reloaded into a fresh model, predictions identical: {identical}")

    ok = identical
    for name, (_, _, accuracy, threshold) in results.items():
        verdict = "ok" if accuracy >= threshold else f"BELOW the {threshold:.0%} target"
        ok = ok and accuracy >= threshold
        print(f"{name}: test accuracy {accuracy:.2%} ({verdict})")
    print(
        f"IR of every stage written to {os.path.abspath(args.out)}/ "
        f"(forward, train step after autodiff, optimised, StableHLO, HLO)"
    )
    print(f"total {time.perf_counter() - start:.1f} s")
    return 0 if ok else 1

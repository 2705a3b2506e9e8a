"""Whole training states in checkpoints: ``checkpoint.save(path, state)``, resuming bit for bit,
and refusing a state written by a different optimiser. Oracle: the uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest

from kaun_ir import layer, optim, rng, train, tree
from kaun_ir.checkpoint import core as checkpoint
from kaun_ir.nn import loss

X = np.random.default_rng(1).normal(size=(6, 5)).astype(np.float32)
Y = np.array([0, 1, 2, 0, 1, 2], np.int32)


def _model():
    return layer.sequential(
        [layer.linear(5, 7), layer.batch_norm(7), layer.relu(), layer.dropout(0.2), layer.linear(7, 3)]
    )


def _trainer(alg):
    return train.make(_model(), alg, loss=loss.cross_entropy_sparse)


def _init(trainer, seed=0):
    with rng.scope(seed):
        return train.init(trainer)


def _host(st):
    return [np.asarray(a) for a in tree.flatten(train.state_to_tree(st))[0]]


def _run(trainer, st, n):
    losses = []
    for _ in range(n):
        value, st = train.step(trainer, st, X, Y)
        losses.append(float(value))
    return losses, st


def test_checkpoint_save_of_a_train_state_resumes_bit_for_bit(tmp_path):
    trainer = _trainer(optim.adam(1e-2))
    whole_losses, whole = _run(trainer, _init(trainer), 6)

    first_losses, half = _run(trainer, _init(trainer), 3)
    assert half.optimizer == "adam(mu,nu)"
    path = checkpoint.save(tmp_path / "state.safetensors", half)
    assert checkpoint.metadata(path)["kaun_ir.optimizer"] == "adam(mu,nu)"
    restored = checkpoint.load(path, like=_init(trainer, seed=5))
    assert isinstance(restored, train.State) and restored.step == 3 and restored.optimizer == half.optimizer
    restored_host = _host(restored)
    rest_losses, resumed = _run(trainer, restored, 3)
    assert first_losses + rest_losses == whole_losses
    for a, b in zip(_host(resumed), _host(whole)):
        np.testing.assert_array_equal(a, b)

    # train.load reads the same file; without a template it uses train.init's structure
    again = train.load(path, trainer)
    for a, b in zip(_host(again), restored_host):
        np.testing.assert_array_equal(a, b)


def test_a_state_of_another_optimiser_is_refused_naming_both(tmp_path):
    adam = _trainer(optim.adam(1e-2))
    path = train.save(str(tmp_path / "adam.safetensors"), _run(adam, _init(adam), 1)[1])
    momentum = _trainer(optim.sgd(0.1, momentum=0.9))
    with pytest.raises(ValueError, match=r"optimiser adam\(mu,nu\).*optimiser is sgd\(trace\)"):
        train.load(path, momentum, _init(momentum))
    with pytest.raises(ValueError, match=r"adam\(mu,nu\).*sgd\(trace\)"):
        checkpoint.load(path, like=_init(momentum))
    # the same optimiser with another learning rate resumes fine
    train.load(path, _trainer(optim.adam(3e-4)))
    # the parameters alone can still be taken, as the message says
    fresh = _init(momentum)
    params = checkpoint.load(path, like={"params": fresh.vars.params})["params"]
    st = train.make_state(momentum, layer.with_params(fresh.vars, params))
    assert st.optimizer == "sgd(trace)"


def test_the_optimiser_survives_fast_steps_fit_and_blocks():
    trainer = train.make(
        layer.linear(5, 3),
        optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-2)),
        loss=loss.cross_entropy_sparse,
    )
    st = _init(trainer)
    _, st = _run(trainer, st, 3)  # the third step takes the fast path
    assert st.optimizer == "chain(1.mu,1.nu)"
    st = train.fit(trainer, st, [(X, Y)] * 2, steps_per_call=2)
    assert st.optimizer == "chain(1.mu,1.nu)" and st.step == 5


def test_checkpoint_metadata_entries(tmp_path):
    path = checkpoint.save(tmp_path / "p.safetensors", {"w": np.ones(2, np.float32)}, metadata={"run": "a1"})
    assert checkpoint.metadata(path)["run"] == "a1"
    with pytest.raises(ValueError, match="reserved"):
        checkpoint.save(
            tmp_path / "q.safetensors", {"w": np.ones(2, np.float32)}, metadata={"kaun_ir.tree": "x"}
        )
    with pytest.raises(TypeError, match="strings"):
        checkpoint.save(tmp_path / "q.safetensors", {"w": np.ones(2, np.float32)}, metadata={"n": 1})

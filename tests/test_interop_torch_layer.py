"""``kn.interop.torch_layer``: a PyTorch module as a ``kn.layer.Layer`` (trainable parameters as
params, buffers as state), trained with ``train.fit`` and checked against PyTorch's own training
(SGD with momentum on the same batches), batch-norm running statistics included."""

import copy

import numpy as np
import pytest

import kaun_ir as kn
from kaun_ir import data, layer, loss, optim, train

pytestmark = pytest.mark.interop
torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[interop]')")
nn = torch.nn


class Residual(nn.Module):
    """conv-BN-relu-conv-BN plus the identity, then relu (a ResNet basic block)."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = Residual(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.block(torch.relu(self.bn(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


RS = np.random.default_rng(0)
X = RS.standard_normal((32, 3, 8, 8)).astype(np.float32)
Y = RS.integers(0, 5, 32).astype(np.int32)
BATCH = 8


def _torch_training(net, epochs=1):
    """PyTorch's own loop: SGD with momentum over the batches in order."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net.train()
    losses = []
    for _ in range(epochs):
        for i in range(0, len(X), BATCH):
            opt.zero_grad()
            value = nn.functional.cross_entropy(
                net(torch.from_numpy(X[i : i + BATCH])), torch.from_numpy(Y[i : i + BATCH]).long()
            )
            value.backward()
            opt.step()
            losses.append(value.item())
    return losses


def _flat(tree):
    return {path: np.asarray(leaf) for path, leaf in kn.ptree.flatten_with_paths(tree)}


def test_a_torch_resnet_trained_with_fit_equals_torch_training():
    torch.manual_seed(0)
    net = TinyResNet()
    reference = copy.deepcopy(net)
    model = kn.interop.torch_layer(net, torch.from_numpy(X[:BATCH]))
    assert net.training  # the module's mode is left as it was
    trainer = train.make(model, optim.sgd(0.1, momentum=0.9), loss=loss.cross_entropy_sparse)
    st = train.init(trainer)
    params, state = _flat(st.vars.params), _flat(st.vars.state)
    assert sorted(params) == sorted(name for name, _ in net.named_parameters())
    assert sorted(state) == sorted(
        name for name, b in net.named_buffers() if b.dtype.is_floating_point
    )  # running statistics; num_batches_tracked (an integer) is not a variable
    losses = []
    st = train.fit(
        trainer,
        st,
        data.prepare((X, Y), batch_size=BATCH),
        report=lambda step, loss, state: losses.append(float(loss)),
    )
    torch_losses = _torch_training(reference)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5, atol=1e-6)
    expected = reference.state_dict()
    ours = {**_flat(st.vars.params), **_flat(st.vars.state)}
    diffs = {name: float(np.max(np.abs(value - expected[name].numpy()))) for name, value in ours.items()}
    assert max(diffs.values()) < 1e-5, diffs
    assert diffs["bn.running_var"] < 1e-5 and np.any(np.asarray(ours["bn.running_var"]) != 1.0)
    # predict runs the eval-mode program: batch norm reads the running statistics
    reference.eval()
    with torch.no_grad():
        want = reference(torch.from_numpy(X[:BATCH])).numpy()
    np.testing.assert_allclose(np.asarray(train.predict(trainer, st, X[:BATCH])), want, rtol=1e-5, atol=1e-5)


def test_frozen_parameters_are_state_and_modes_are_restored():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    net[0].weight.requires_grad_(False)
    net[1].eval()  # a mixed-mode module keeps its modes
    model = kn.interop.torch_layer(net, torch.zeros(6, 4), name="mlp")
    assert (net.training, net[1].training) == (True, False)
    v = layer.init(model)
    assert "0.weight" in _flat(v.state) and "0.weight" not in _flat(v.params)
    x = RS.standard_normal((6, 4)).astype(np.float32)
    y, new_state = layer.apply(model, v, x, training=True)
    net.train()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(new_state.state["1"]["running_mean"]), net[1].running_mean.numpy(), rtol=1e-5, atol=1e-7
    )


def test_torch_layer_errors_name_the_fix():
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got list"):
        kn.interop.torch_layer([1, 2], torch.zeros(2))
    with pytest.raises(TypeError, match="give the example inputs"):
        kn.interop.torch_layer(nn.Linear(2, 2))
    model = kn.interop.torch_layer(nn.Linear(2, 2), torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"parameters are float32, layer.init asked for float64.*module.to"):
        layer.init(model, dtype=kn.float64)

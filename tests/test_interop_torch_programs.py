"""PyTorch programs in (the `interop` extra; `make test-interop`): `torch.export` programs of a
torchvision-style ResNet, Hugging Face GPT-2, an LSTM, a batch-norm model (eval and train mode) and
`scaled_dot_product_attention`, imported with `kn.ir.from_torch` / `kn.interop.torch_function` and
compared with PyTorch itself: forward within 1e-5, gradients within 1e-4 of `torch.autograd`, and 20
AdamW steps of GPT-2 with `kn.train` tracking PyTorch's own. Skipped when the extra is missing."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[interop]')")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import kaun_ir as kn  # noqa: E402

nn = torch.nn
F = torch.nn.functional


# ------------------------------------------------------------------------------ the models


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convolutions with batch norm, and a 1x1
    convolution with batch norm on the shortcut when the shape changes."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet layout (7x7 stem, max pool, stages of BasicBlocks, adaptive average
    pool, linear head), two narrow stages of one block."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class LSTMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, momentum=0.2)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(F.relu(self.bn(self.conv(x)))), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


class ManyOps(nn.Module):
    """Many ATen ops at once: decompositions (cumsum, padding, pooling, repeat) and indexing."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x, ids):
        y = self.lin(x)  # [4, 6]
        a = torch.cumsum(y, 1) + torch.tril(y[:, :4] @ y[:, :4].T)[:, :1]
        b = F.pad(y, (1, 2))[:, 1:-2] * 0.5 - F.leaky_relu(y, 0.2)
        c = torch.where(y > 0, y, torch.zeros_like(y)).clamp(-0.5, 0.5) + torch.masked_fill(y, y < -0.3, 1.0)
        d = torch.gather(y, 1, ids) + torch.index_select(y, 0, ids[:, 0])
        e = (
            y.max(dim=1, keepdim=True).values
            + y.argmax(1, keepdim=True).float()
            + y.var(0, keepdim=True)
            + y.amin(1, keepdim=True)
        )
        f = torch.stack(torch.split(y, 3, 1), 0).sum(0).repeat(1, 2) + torch.cat(
            torch.unbind(y[:, :2], 1)
        ).reshape(4, 2).repeat(1, 3)
        g = (
            torch.div(y, 0.7, rounding_mode="floor")
            + torch.div(y, 0.7, rounding_mode="trunc")
            + torch.remainder(y, 0.4)
        )
        h = (
            F.avg_pool1d(y[None], 2, 2).repeat_interleave(2, -1)[0]
            + F.silu(y)
            + F.gelu(y, approximate="tanh")
            + F.softplus(y)
            + torch.rsqrt(y * y + 1)
        )
        i = (
            torch.log_softmax(y, -1)
            + torch.triu(torch.ones(4, 6))
            + torch.arange(6.0) / 6
            + torch.full((4, 6), 0.25)
            + torch.erf(y)
            + y.abs().sqrt()
            + torch.exp(-y * y)
        )
        return (
            a
            + b
            + c
            + d
            + e
            + f
            + g
            + h
            + i
            + F.max_pool2d(y[None, None], 2, 2).mean()
            + F.hardtanh(y).mean(0)
        )


class Decoder(nn.Module):
    """Transposed convolutions (grouped, dilated, output padding), upsampling, group and instance
    norm: the ops of a generator's or a U-Net's decoder."""

    def __init__(self):
        super().__init__()
        self.up1 = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2)
        self.norm1 = nn.GroupNorm(3, 6)
        self.up2 = nn.Upsample(size=(17, 23), mode="nearest")
        self.up3 = nn.ConvTranspose1d(6, 2, 4, stride=3)
        self.norm3 = nn.InstanceNorm1d(2, affine=True)

    def forward(self, x):
        y = self.up2(F.elu(self.norm1(self.up1(x))))
        return self.norm3(self.up3(y.mean(2)))


class EncoderGRU(nn.Module):
    """PyTorch's own `nn.TransformerEncoderLayer` (`nn.MultiheadAttention` inside) and `nn.GRU`."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.gru = nn.GRU(16, 8, batch_first=True)

    def forward(self, x):
        return self.gru(self.encoder(x))[0]


VOCAB = 61


class GPT2Logits(nn.Module):
    """A Hugging Face GPT-2 read back from `save_pretrained`, returning the logits."""

    def __init__(self, directory):
        super().__init__()
        self.model = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager")

    def forward(self, ids):
        return self.model(ids, use_cache=False).logits


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    directory = tmp_path_factory.mktemp("gpt2")
    transformers.GPT2LMHeadModel(cfg).save_pretrained(directory)
    return GPT2Logits(directory).eval()


# ------------------------------------------------------------------------------ helpers


def _inputs(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _graph_forward(module, *args):
    """The module through `kn.ir.from_torch`, compiled and run, against PyTorch's forward."""
    program = torch.export.export(module, args)
    graph = kn.ir.from_torch(program)
    got = kn.runtime.compile(graph)(*kn.ir.torch_inputs(program, *args))
    with torch.no_grad():
        want = module(*args)
    return graph, np.asarray(got[-1]), want.numpy()


def _gradients(module, fn, params, x, target, training=False):
    """Gradients of a squared-error loss, ours (`kn.grad` of `fn`) and `torch.autograd`'s, by
    parameter name."""

    def loss(p, x, y):
        out = fn(p, x)
        if training:
            out = out[0]
        return kn.mean((out - y) ** 2)

    ours = dict(kn.ptree.flatten_with_paths(kn.jit(kn.grad(loss))(params, x.numpy(), target.numpy())))
    module.zero_grad()
    F.mse_loss(module(x), target).backward()
    theirs = {name: p.grad.numpy() for name, p in module.named_parameters() if p.grad is not None}
    assert set(theirs) <= set(ours)
    return ours, theirs


def _assert_gradients_close(ours, theirs, tol=1e-4):
    for name, want in theirs.items():
        np.testing.assert_allclose(np.asarray(ours[name]), want, rtol=tol, atol=tol * 0.1, err_msg=name)


# ------------------------------------------------------------------------------ the five models


def test_resnet_forward_gradients_and_provenance():
    torch.manual_seed(0)
    net = ResNet().eval()
    x = _inputs(2, 3, 32, 32)
    graph, got, want = _graph_forward(net, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graph.verify()
    # inputs: parameters and buffers in graph_signature order, then the user input
    names = graph.input_names
    assert names[0] == "conv1.weight" and names[-1] == "x" and "layer1.0.bn1.running_var" in names
    assert list(names) == [n for n, _ in net.named_parameters()] + [n for n, _ in net.named_buffers()] + ["x"]
    paths = {node.path for node in graph.nodes}
    assert {"layer1.0.conv1", "layer2.0.downsample.0", "fc"} <= paths
    conv = next(n for n in graph.nodes if n.op == "convolution" and n.path == "layer1.0.conv2")
    assert conv.source.startswith("test_interop_torch_programs.py:")  # the line of BasicBlock.forward
    fn, params = kn.interop.torch_function(net, x)
    assert kn.ptree.flatten_with_paths(params)[0][0] in net.state_dict()
    ours, theirs = _gradients(net, fn, params, x, _inputs(2, 10, seed=1))
    _assert_gradients_close(ours, theirs)


def test_batch_norm_in_eval_and_train_mode():
    torch.manual_seed(0)
    net = ConvBN()
    x = _inputs(4, 3, 8, 8)
    target = _inputs(4, 5, seed=1)
    with torch.no_grad():  # running statistics away from their initial values
        net.train()(x * 2 + 1)
    # eval mode: the running statistics normalise, nothing is updated
    net.eval()
    fn, params = kn.interop.torch_function(net, x)
    assert fn.buffer_names == ("bn.running_mean", "bn.running_var") and not fn.training
    with torch.no_grad():
        np.testing.assert_allclose(
            np.asarray(kn.jit(fn)(params, x.numpy())), net(x).numpy(), rtol=1e-5, atol=1e-5
        )
    _assert_gradients_close(*_gradients(net, fn, params, x, target))
    # train mode: the batch's statistics, and the running ones come back updated
    net.train()
    fn, params = kn.interop.torch_function(net, x)
    out, buffers = kn.jit(fn)(params, x.numpy())
    with torch.no_grad():
        want = net(x).numpy()  # updates net.bn's running statistics in place
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(buffers["bn"]["running_mean"]), net.bn.running_mean.numpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(buffers["bn"]["running_var"]), net.bn.running_var.numpy(), rtol=1e-5
    )
    _assert_gradients_close(*_gradients(net, fn, params, x, target, training=True))


def test_lstm_forward_and_gradients():
    torch.manual_seed(0)
    net = LSTMHead()
    x = _inputs(3, 5, 4)
    _, got, want = _graph_forward(net, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fn, params = kn.interop.torch_function(net, x)
    _assert_gradients_close(*_gradients(net, fn, params, x, _inputs(3, 3, seed=1)))


def test_scaled_dot_product_attention_forward_gradients_and_vmap():
    torch.manual_seed(0)
    net = CausalSelfAttention()
    x = _inputs(2, 5, 16)
    _, got, want = _graph_forward(net, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fn, params = kn.interop.torch_function(net, x)
    _assert_gradients_close(*_gradients(net, fn, params, x, _inputs(2, 5, 16, seed=1)))
    xs = _inputs(3, 2, 5, 16, seed=2)  # kn.vmap over a leading axis the program never saw
    batched = kn.jit(kn.vmap(lambda x: fn(params, x)))(xs.numpy())
    with torch.no_grad():
        want = torch.stack([net(xi) for xi in xs]).numpy()
    np.testing.assert_allclose(np.asarray(batched), want, rtol=1e-5, atol=1e-5)


def test_gpt2_forward_gradients_and_twenty_adamw_steps(gpt2):
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, (4, 12)))  # the training batch's shape
    fn, params = kn.interop.torch_function(gpt2, ids)
    with torch.no_grad():
        np.testing.assert_allclose(
            np.asarray(kn.jit(fn)(params, ids)), gpt2(ids).numpy(), rtol=1e-5, atol=1e-5
        )
    assert any(
        n.path.startswith("model.transformer.h.1.attn") for n in kn.trace(fn, params, ids.numpy()).nodes
    )
    names = [name for name, _ in kn.ptree.flatten_with_paths(params)]
    # the tied embedding and output weight: once, under the name named_parameters() gives it
    assert "model.transformer.wte.weight" in names and "model.lm_head.weight" not in names

    def loss(p, ids, labels):
        return kn.loss.cross_entropy_sparse(fn(p, ids), labels)

    labels = np.roll(ids.numpy(), -1, axis=1).astype(np.int32)
    grads = dict(kn.ptree.flatten_with_paths(kn.jit(kn.grad(loss))(params, ids.numpy(), labels)))
    gpt2.zero_grad()
    F.cross_entropy(gpt2(ids).reshape(-1, VOCAB), torch.from_numpy(labels).long().reshape(-1)).backward()
    _assert_gradients_close(grads, {n: p.grad.numpy() for n, p in gpt2.named_parameters()})

    # 20 AdamW steps with kn.train against 20 steps of torch.optim.AdamW, same batches
    hyper = {"lr": 3e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    model = kn.layer.Layer(
        lambda dtype: kn.layer.Vars(params, [], dtype),
        lambda p, s, x, *, training, ctx: (fn(p, x), s),
        "gpt2",
    )
    trainer = kn.train.make(model, kn.optim.adamw(**hyper), loss=kn.loss.cross_entropy_sparse)
    state = kn.train.make_state(trainer, kn.layer.Vars(params, [], kn.float32))
    opt = torch.optim.AdamW(
        gpt2.parameters(), lr=hyper["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=hyper["weight_decay"]
    )
    rng = np.random.default_rng(1)
    ours, theirs = [], []
    for _ in range(20):
        batch = (rng.integers(0, VOCAB, (4, 1)) + 3 * np.arange(13)) % VOCAB  # a pattern to learn
        x, y = batch[:, :-1], batch[:, 1:]
        value, state = kn.train.step(trainer, state, x.astype(np.int32), y.astype(np.int32))
        ours.append(float(value))
        opt.zero_grad()
        torch_loss = F.cross_entropy(
            gpt2(torch.from_numpy(x)).reshape(-1, VOCAB), torch.from_numpy(y).reshape(-1)
        )
        torch_loss.backward()
        opt.step()
        theirs.append(torch_loss.item())
    print(f"GPT-2 20 AdamW steps: max |loss difference| {np.max(np.abs(np.subtract(ours, theirs))):.2e}")
    assert theirs[-1] < theirs[0] - 0.1  # it learns
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4)


def test_a_module_of_many_ops_forward_and_gradients():
    torch.manual_seed(0)
    net = ManyOps()
    x = _inputs(4, 6)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [1] * 6, [2, 3] * 3]) % 4
    _, got, want = _graph_forward(net, x, ids)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fn, params = kn.interop.torch_function(net, x, ids)

    def loss(p, x):
        return kn.sum(fn(p, x, ids.numpy()) ** 2)

    grads = dict(kn.ptree.flatten_with_paths(kn.jit(kn.grad(loss))(params, x.numpy())))
    net.zero_grad()
    (net(x, ids) ** 2).sum().backward()
    _assert_gradients_close(grads, {n: p.grad.numpy() for n, p in net.named_parameters()})


def test_a_decoder_of_transposed_convolutions_and_upsampling():
    torch.manual_seed(0)
    net = Decoder()
    x = _inputs(2, 4, 5, 6)
    _, got, want = _graph_forward(net, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fn, params = kn.interop.torch_function(net, x)
    _assert_gradients_close(*_gradients(net, fn, params, x, torch.zeros(want.shape)))


def test_torch_encoder_layer_and_gru_forward():
    torch.manual_seed(0)
    net = EncoderGRU().eval()
    _, got, want = _graph_forward(net, _inputs(2, 5, 16))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ errors


class _Sorted(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4))

    def forward(self, x):
        return torch.sort(self.inner(x), dim=-1).values


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Sorted()

    def forward(self, x):
        return self.block(x)


def test_an_unmapped_op_names_the_aten_op_and_the_module_path():
    program = torch.export.export(_Outer(), (_inputs(2, 4),))
    with pytest.raises(kn.ir.TorchImportError, match=r"aten\.sort\.default in module 'block'") as info:
        kn.ir.from_torch(program)
    assert isinstance(info.value, kn.KaunError)
    fn, params = kn.interop.torch_function(nn.Linear(4, 2), _inputs(2, 4))
    with pytest.raises(
        kn.ir.TorchImportError, match=r"shape \[3, 4\], but the program was exported for \[2, 4\]"
    ):
        fn(params, np.ones((3, 4), np.float32))
    assert "test_interop_torch_programs.py:" in str(info.value)
    with pytest.raises(TypeError, match="ExportedProgram"):
        kn.ir.from_torch(_Outer())


def test_docs_list_every_covered_aten_op():
    import re

    page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "interop.md")
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    listed = text.split("<!-- aten ops:")[1].split("<!-- end of aten ops -->")[0].split("-->", 1)[1]
    names = {f"aten.{n}" if "." in n else f"aten.{n}.default" for n in re.findall(r"`([^`]+)`", listed)}
    assert names == set(kn.interop.covered_ops())

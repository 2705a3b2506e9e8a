"""The catalogue of bad inputs over the round-3 surfaces: PyTorch programs, LoRA, accumulation,
EMA, starting from given weights, metric writers, profiling, resume, pipeline parallelism, the
partitioned IR and its communication table, the memory report, gathering, state dicts and
sharded checkpoints.

Each case is a call a careful user could make with a bad argument; it must raise the class
docs/errors.md gives, with a message naming what the contract says, from kaun_ir's own code —
before any work (no step runs, nothing is written). ``tests/test_error_catalogue_round3.py`` runs
them; ``python tests/test_error_catalogue_round3.py`` prints the clean / raw / wrong counts
(wrong: accepted without an error).
"""

from __future__ import annotations

import functools
import math
import os
import tempfile

import numpy as np
from catalogue_cases import Case

import kaun_ir as kn
from kaun_ir import checkpoint, data, layer, optim, ptree, train
from kaun_ir.nn import loss
from kaun_ir.runtime import partitioned

F32 = np.float32
X = np.ones((4, 3), F32)
Y = np.zeros((4, 2), F32)
CASES: list[Case] = []


def add(family: str, name: str, call, error: type, pattern: str) -> None:
    CASES.append(Case(family, name, call, error, pattern))


@functools.cache
def mlp():
    return layer.sequential([layer.linear(3, 4), layer.relu(), layer.linear(4, 2)])


@functools.cache
def trainer(**kw):
    return train.make(mlp(), optim.sgd(0.1), loss=loss.mse, **dict(kw))


def state():
    """A fresh state each time: a case that runs a step donates the one it was given."""
    with kn.rng.scope(0):
        return train.init(trainer())


def init_with(model, x=X):
    with kn.rng.scope(0):
        return layer.init(model, x)


@functools.cache
def ema_trainer():
    return train.make(mlp(), optim.chain(optim.sgd(0.1), optim.ema(0.9)), loss=loss.mse)


def scratch() -> str:
    return tempfile.mkdtemp(prefix="kaun-ir-catalogue-")


def fit(**options):
    return lambda: train.fit(trainer(), state(), [(X, Y)], **options)


# ------------------------------------------------------------------ LoRA
L = "lora"
for bad in (0, -1, 1.5, True, "4", None):
    add(L, f"rank-{bad!r}", lambda bad=bad: layer.lora(mlp(), bad, targets=r".*weight"), ValueError, r"rank")
for bad in (math.nan, math.inf, -math.inf, 0.0, -2.0, "2", True):
    add(
        L,
        f"alpha-{bad!r}",
        lambda bad=bad: layer.lora(mlp(), 2, targets=r".*weight", alpha=bad),
        ValueError,
        r"layer\.lora: alpha must be a finite number > 0",
    )
add(L, "model-not-layer", lambda: layer.lora("mlp", 2, targets=".*"), TypeError, r"layer\.lora: model")
add(
    L,
    "targets-bad-regex",
    lambda: layer.lora(mlp(), 2, targets="(("),
    ValueError,
    r"not a regular expression",
)
add(L, "targets-int", lambda: layer.lora(mlp(), 2, targets=3), TypeError, r"layer\.lora: targets")
add(L, "targets-none", lambda: layer.lora(mlp(), 2, targets=None), TypeError, r"layer\.lora: targets")
add(
    L,
    "name-not-str",
    lambda: layer.lora(mlp(), 2, targets=".*weight", name=3),
    TypeError,
    r"layer\.lora: name",
)
add(
    L,
    "targets-match-nothing",
    lambda: init_with(layer.lora(mlp(), 2, targets=r"nothing")),
    ValueError,
    r"select no parameter",
)
add(
    L,
    "targets-match-bias",
    lambda: init_with(layer.lora(mlp(), 2, targets=r".*bias")),
    ValueError,
    r"2-D weight matrices",
)
add(
    L,
    "rank-too-large",
    lambda: init_with(layer.lora(mlp(), 64, targets=r".*weight")),
    ValueError,
    r"rank 64",
)
add(L, "merge-not-lora", lambda: layer.lora_merge(mlp(), init_with(mlp())), TypeError, r"lora_merge")
add(L, "vars-not-lora", lambda: layer.lora_vars(mlp(), init_with(mlp())), TypeError, r"lora_vars")
add(
    L,
    "lora-vars-wrong-base",
    lambda: kn.rng.run(
        0,
        lambda: layer.lora_vars(
            layer.lora(mlp(), 2, targets=r".*weight"),
            init_with(layer.sequential([layer.linear(3, 5), layer.relu(), layer.linear(5, 2)])),
        ),
    ),
    kn.ShapeError,
    r"layer\.lora_vars: .*0\.(bias|weight)",
)
add(L, "frozen-not-str", lambda: layer.lora_frozen(3), TypeError, r"lora_frozen")

# ------------------------------------------------------------------ accumulation
A = "accumulate"
for bad in (0, -2, 1.5, True, "2", None):
    add(A, f"accumulate-{bad!r}", lambda bad=bad: trainer(accumulate=bad), ValueError, r"accumulate")
add(
    A,
    "batch-not-divisible",
    lambda: train.step(trainer(accumulate=3), state(), X, Y),
    ValueError,
    r"accumulate=3.*\[4, 3\]",
)

# ------------------------------------------------------------------ the round-3 optimiser pieces
OP = "optim"
add(
    OP,
    "scale-nan",
    lambda: optim.scale(math.nan),
    ValueError,
    r"optim\.scale: factor must be a number, got nan",
)
add(OP, "scale-str", lambda: optim.scale("2"), TypeError, r"optim\.scale: factor")
add(OP, "adam-b1", lambda: optim.scale_by_adam(b1=1.5), ValueError, r"b1")
add(OP, "adam-eps-nan", lambda: optim.scale_by_adam(eps=math.nan), ValueError, r"eps")
add(OP, "decay-nan", lambda: optim.add_decayed_weights(math.nan), ValueError, r"weight_decay")
add(
    OP,
    "decay-mask-int",
    lambda: optim.add_decayed_weights(0.1, mask=3),
    TypeError,
    r"mask must be a predicate",
)
add(OP, "freeze-mask-int", lambda: optim.freeze(optim.sgd(0.1), 3), TypeError, r"optim\.freeze: mask")
add(OP, "freeze-not-optimizer", lambda: optim.freeze("adam", layer.lora_frozen), TypeError, r"optim\.freeze")
add(OP, "apply-every-0", lambda: optim.apply_every(0), ValueError, r"apply_every")
add(OP, "multi-steps-0", lambda: optim.multi_steps(optim.sgd(0.1), 0), ValueError, r"multi_steps")

# ------------------------------------------------------------------ EMA
E = "ema"
for bad in (math.nan, 1.5, -0.1, 1.0):
    add(E, f"decay-{bad!r}", lambda bad=bad: optim.ema(bad), ValueError, r"optim\.ema: decay")
for bad in ("0.9", None):
    add(E, f"decay-{bad!r}", lambda bad=bad: optim.ema(bad), TypeError, r"optim\.ema: decay")
add(E, "state-dtype-int", lambda: optim.ema(0.9, state_dtype="int32"), ValueError, r"state_dtype")
add(
    E,
    "ema-params-none",
    lambda: optim.ema_params(optim.sgd(0.1), ((), ())),
    ValueError,
    r"keeps no weight average",
)
add(E, "ema-vars-none", lambda: train.ema_vars(trainer(), state()), ValueError, r"keeps no weight average")
add(
    E,
    "predict-ema-none",
    lambda: train.predict(trainer(), state(), X, ema=True),
    ValueError,
    r"weight average",
)
add(E, "ema-vars-not-state", lambda: train.ema_vars(ema_trainer(), "st"), TypeError, r"ema_vars")
add(E, "predict-ema-not-bool", lambda: train.predict(trainer(), state(), X, ema="yes"), TypeError, r"ema")


# ------------------------------------------------------------------ starting from given weights
V = "init-vars"


def given(tree_fn):
    return lambda: train.init(trainer(), vars=tree_fn())


def with_leaf(change):
    params = init_with(mlp()).params
    params[0]["weight"] = change(np.asarray(params[0]["weight"]))
    return params


add(
    V,
    "float64-tree",
    given(lambda: ptree.map(lambda w: np.asarray(w, np.float64), init_with(mlp()).params)),
    TypeError,
    r"float64.*dtype=kn\.float64",
)
add(
    V,
    "float64-leaf",
    given(lambda: with_leaf(lambda w: w.astype(np.float64))),
    TypeError,
    r"mix float dtypes",
)
add(V, "int-leaf", given(lambda: with_leaf(lambda w: w.astype(np.int32))), TypeError, r"0\.weight.* i32")
add(V, "nan-leaf", given(lambda: with_leaf(lambda w: np.full_like(w, np.nan))), ValueError, r"not finite|NaN")
add(V, "shape-leaf", given(lambda: with_leaf(lambda w: np.ones((5, 5), F32))), kn.ShapeError, r"0\.weight")
add(V, "string-leaf", given(lambda: with_leaf(lambda w: "weights")), TypeError, r"0\.weight")
add(V, "vars-string", given(lambda: "weights.safetensors"), TypeError, r"vars")
add(V, "vars-int", given(lambda: 3), TypeError, r"vars")
add(V, "vars-list", given(lambda: [1, 2]), kn.ShapeError, r"lack")
add(V, "dtype-bogus", lambda: train.init(trainer(), dtype="float99"), TypeError, r"float99")


# ------------------------------------------------------------------ metric writers and callbacks
W = "writers"


def csv_with(name):
    def call():
        writer = train.CsvWriter(os.path.join(scratch(), "m.csv"))
        writer.write(1, {name: 1.0})

    return call


def tb_step(step):
    def call():
        writer = train.TensorBoardWriter(scratch())
        writer.write(step, {"loss": 1.0})

    return call


def jsonl_write(step, metrics):
    def call():
        writer = train.JsonlWriter(os.path.join(scratch(), "m.jsonl"))
        writer.write(step, metrics)

    return call


add(W, "callbacks-int", fit(callbacks=3), TypeError, r"callbacks must be a list")
add(W, "callbacks-item-int", fit(callbacks=[3]), TypeError, r"train\.Callback")
add(W, "callbacks-str", fit(callbacks="log.jsonl"), TypeError, r"callbacks")
add(W, "callbacks-class", fit(callbacks=[train.JsonlWriter]), TypeError, r"train\.Callback")
add(W, "jsonl-path-int", lambda: train.JsonlWriter(3), TypeError, r"JsonlWriter")
add(
    W,
    "jsonl-no-dir",
    lambda: train.JsonlWriter(os.path.join(scratch(), "no", "m.jsonl")),
    FileNotFoundError,
    r"no",
)
add(W, "jsonl-is-dir", lambda: train.JsonlWriter(scratch()), IsADirectoryError, r"JsonlWriter")
add(W, "csv-path-int", lambda: train.CsvWriter(3), TypeError, r"CsvWriter")
add(W, "csv-is-dir", lambda: train.CsvWriter(scratch()), IsADirectoryError, r"CsvWriter")
add(
    W, "csv-no-dir", lambda: train.CsvWriter(os.path.join(scratch(), "no", "m.csv")), FileNotFoundError, r"no"
)
add(W, "tb-logdir-int", lambda: train.TensorBoardWriter(3), TypeError, r"TensorBoardWriter")
add(W, "tb-logdir-file", lambda: train.TensorBoardWriter(__file__), NotADirectoryError, r"TensorBoardWriter")
for name in ("", 3, None):
    add(W, f"csv-metric-name-{name!r}", csv_with(name), ValueError, r"CsvWriter: metric name")
add(
    W,
    "csv-metrics-list",
    lambda: train.CsvWriter(os.path.join(scratch(), "m.csv")).write(1, [1.0]),
    TypeError,
    r"dict",
)
add(W, "jsonl-metric-array", jsonl_write(1, {"loss": np.ones(3)}), TypeError, r"'loss' must be a number")
for step in (2**63, -1, 1.5, "3", True):
    add(W, f"tb-step-{step!r}", tb_step(step), ValueError, r"TensorBoardWriter: step")
for step in (-1, 1.5, "3"):
    add(W, f"jsonl-step-{step!r}", jsonl_write(step, {"loss": 1.0}), ValueError, r"JsonlWriter: step")
add(W, "jsonl-metric-str", jsonl_write(1, {"loss": "low"}), TypeError, r"JsonlWriter: metric 'loss'")
add(
    W,
    "tb-metric-str",
    lambda: train.TensorBoardWriter(scratch()).write(1, {"loss": "low"}),
    TypeError,
    r"'loss'",
)


# ------------------------------------------------------------------ fit options (profile, resume, eval)
FO = "fit-options"
for bad in ((1.5, 2.5), (0, 1), (3, 2), "3", (1, 2, 3), (True, 2)):
    add(FO, f"profile-steps-{bad!r}", fit(profile_steps=bad, profile_dir="p"), ValueError, r"profile_steps")
add(FO, "profile-no-dir", fit(profile_steps=(1, 2)), ValueError, r"profile_dir")
add(FO, "profile-dir-int", fit(profile_steps=(1, 2), profile_dir=3), TypeError, r"profile_dir")
for name in ("report_every", "epochs", "steps_per_call", "keep_last", "eval_every", "checkpoint_every"):
    add(FO, f"{name}-0", fit(**{name: 0}), ValueError, name)
add(FO, "checkpoint-every-no-dir", fit(checkpoint_every=2), ValueError, r"checkpoint_dir")
add(FO, "checkpoint-dir-int", fit(checkpoint_dir=3), TypeError, r"checkpoint_dir")
add(
    FO,
    "resume-missing",
    fit(resume=os.path.join(tempfile.gettempdir(), "no-such-ckpt-xyz")),
    FileNotFoundError,
    r"resume",
)
add(FO, "resume-int", fit(resume=3), TypeError, r"resume")
add(FO, "resume-true-no-dir", fit(resume=True), ValueError, r"resume=True needs checkpoint_dir")
add(FO, "report-int", fit(report=3), TypeError, r"report must be callable")
add(FO, "options-int", lambda: train.fit(trainer(), state(), [(X, Y)], options=3), TypeError, r"FitOptions")
add(FO, "unknown-keyword", fit(epoch=2), TypeError, r"epoch")
add(FO, "eval-metrics-list", fit(eval_data=[(X, Y)], eval_metrics=[len]), TypeError, r"eval_metrics")
add(
    FO,
    "eval-metric-not-callable",
    fit(eval_data=[(X, Y)], eval_metrics={"acc": 3}),
    TypeError,
    r"eval_metrics",
)
add(FO, "eval-every-no-data", fit(eval_every=2), ValueError, r"eval_every.*eval_data")
add(FO, "eval-data-int", fit(eval_data=3), TypeError, r"eval_data must be an iterable")
add(FO, "progress-str", fit(progress="yes"), TypeError, r"progress")
add(FO, "data-int", lambda: train.fit(trainer(), state(), 3), TypeError, r"data")
add(FO, "state-not-state", lambda: train.fit(trainer(), "st", [(X, Y)]), TypeError, r"train\.State")


# ------------------------------------------------------------------ kn.profile
P = "profile"
add(P, "logdir-int", lambda: kn.profile(3).__enter__(), TypeError, r"kn\.profile")
add(P, "logdir-file", lambda: kn.profile(__file__).__enter__(), NotADirectoryError, r"kn\.profile")
add(
    P,
    "print-table-str",
    lambda: kn.profile(scratch(), print_table="no").__enter__(),
    TypeError,
    r"print_table",
)

# ------------------------------------------------------------------ pipeline parallelism
PP = "pipeline"
for name, kw in (
    ("stages-0", dict(stages=0, microbatches=2)),
    ("stages-float", dict(stages=2.0, microbatches=2)),
    ("microbatches-0", dict(stages=2, microbatches=0)),
    ("microbatches-bool", dict(stages=2, microbatches=True)),
    ("schedule", dict(stages=2, microbatches=2, schedule="zb")),
):
    add(PP, name, functools.partial(kn.sharding.pipeline, **kw), ValueError, r"kn\.sharding\.pipeline")
add(PP, "axis-int", lambda: kn.sharding.pipeline(2, 2, axis=3), TypeError, r"axis")


def pipelined(model, stages, mesh_axes):
    def call():
        mesh = kn.sharding.mesh(tuple(mesh_axes.values()), tuple(mesh_axes))
        t = train.make(
            model, optim.sgd(0.1), loss=loss.mse, pipeline=kn.sharding.pipeline(stages, 2), mesh=mesh
        )
        with kn.rng.scope(0):
            st = train.init(t, example=np.ones((4, 4), F32))
        return train.step(t, st, np.ones((4, 4), F32), np.ones((4, 4), F32))

    return call


def blocks(n):
    return layer.sequential([layer.sequential([layer.linear(4, 4), layer.relu()]) for _ in range(n)])


add(
    PP,
    "blocks-not-divisible",
    pipelined(blocks(3), 2, {"stage": 2}),
    ValueError,
    r"3 .*block.*2 stages|divid",
)
add(
    PP,
    "more-stages-than-blocks",
    pipelined(blocks(2), 4, {"stage": 4}),
    ValueError,
    r"2 .*block.*4 stages|divid",
)
add(PP, "mesh-no-stage-axis", pipelined(blocks(2), 2, {"data": 2}), ValueError, r"stage")
add(PP, "mesh-stage-size", pipelined(blocks(4), 4, {"stage": 2}), ValueError, r"stage.*2.*4|4.*stage.*2")
add(PP, "not-sequential", pipelined(layer.linear(4, 4), 2, {"stage": 2}), ValueError, r"sequential")
add(
    PP,
    "pipeline-str-typo",
    lambda: train.make(mlp(), optim.sgd(0.1), loss=loss.mse, pipeline=3),
    TypeError,
    r"pipeline",
)


# ------------------------------------------------------------------ the partitioned IR, the comm table
C = "partitioned"


@functools.cache
def sharded_exe():
    mesh = kn.sharding.mesh((1,), ("data",))
    f = kn.jit(lambda a: a * 2.0, mesh=mesh)
    return f.executable(np.ones((4, 2), F32))


for bad in ("not an executable", None, 3):
    add(
        C,
        f"partitioned-graph-{bad!r}",
        lambda bad=bad: partitioned.partitioned_graph(bad),
        TypeError,
        r"partitioned_graph",
    )
    add(C, f"comm-table-{bad!r}", lambda bad=bad: partitioned.comm_table(bad), TypeError, r"comm_table")
for bad in (0, -1.0, math.nan, math.inf, "10", True):
    add(
        C,
        f"link-gbps-{bad!r}",
        lambda bad=bad: partitioned.comm_table(sharded_exe(), link_gbps=bad),
        ValueError,
        r"link_gbps",
    )
add(C, "dump-stage-bogus", lambda: kn.jit(lambda a: a).graph(X, stage="partitionned"), ValueError, r"stage")


# ------------------------------------------------------------------ memory report
M = "memory"
add(M, "subject-int", lambda: kn.memory_report(3), TypeError, r"memory_report")
add(M, "trainer-no-state", lambda: kn.memory_report(trainer(), X, Y), TypeError, r"train\.State")
add(
    M,
    "remat-bogus",
    lambda: kn.memory_report(trainer(), state(), X, Y, remat=["bogus"]),
    ValueError,
    r"bogus",
)
add(M, "remat-int", lambda: kn.memory_report(trainer(), state(), X, Y, remat=3), TypeError, r"remat")
add(M, "rows-negative", lambda: kn.memory_report(lambda a: a * 2, X).text(rows=-3), ValueError, r"rows")


# ------------------------------------------------------------------ gathering
G = "gather"
for bad in ("bogus", -1, 1.5, None):
    add(
        G,
        f"to-{bad!r}",
        lambda bad=bad: kn.sharding.gather({"w": X}, to=bad),
        ValueError,
        r"kn\.sharding\.gather: to",
    )
add(G, "leaf-str", lambda: kn.sharding.gather({"w": "x"}), TypeError, r"kn\.sharding\.gather.*'w'")


# ------------------------------------------------------------------ state dicts and checkpoints
S = "state-dict"
like = {"w": np.ones((2, 2), F32)}
add(
    S,
    "list",
    lambda: checkpoint.from_state_dict([np.ones(2)], like=like),
    TypeError,
    r"state_dict must be a mapping",
)
add(
    S,
    "tuple-pairs",
    lambda: checkpoint.from_state_dict((("w", np.ones(2)),), like=like),
    TypeError,
    r"mapping",
)
add(
    S, "string-value", lambda: checkpoint.from_state_dict({"w": "weights"}, like=like), TypeError, r"'w'.*str"
)
add(S, "none-value", lambda: checkpoint.from_state_dict({"w": None}, like=like), TypeError, r"'w'.*None")
add(
    S,
    "object-array",
    lambda: checkpoint.from_state_dict({"w": np.array([object()])}, like=like),
    TypeError,
    r"'w'",
)
add(S, "int-key", lambda: checkpoint.from_state_dict({3: np.ones((2, 2), F32)}, like=like), TypeError, r"key")
add(
    S,
    "shape",
    lambda: checkpoint.from_state_dict({"w": np.ones(3, F32)}, like=like),
    ValueError,
    r"'?w'?.*shape|shape.*w",
)
add(
    S, "missing", lambda: checkpoint.from_state_dict({"v": np.ones((2, 2), F32)}, like=like), ValueError, r"w"
)
add(
    S,
    "rename-int",
    lambda: checkpoint.from_state_dict({"w": np.ones((2, 2), F32)}, like=like, rename=3),
    TypeError,
    r"rename",
)
add(
    S,
    "transpose-int",
    lambda: checkpoint.from_state_dict({"w": np.ones((2, 2), F32)}, like=like, transpose=3),
    TypeError,
    r"transpose",
)
add(
    S,
    "nested-str",
    lambda: checkpoint.from_state_dict({"a": {"w": "x"}}, like={"a": like}),
    TypeError,
    r"'a'",
)

K = "sharded"
add(
    K,
    "save-into-file",
    lambda: checkpoint.save_sharded(__file__, {"w": X}),
    (FileExistsError, NotADirectoryError),
    r"not a directory",
)
add(
    K,
    "save-string-leaf",
    lambda: checkpoint.save_sharded(os.path.join(scratch(), "c"), {"w": "x"}),
    TypeError,
    r"'w'",
)
add(
    K,
    "load-missing",
    lambda: checkpoint.load_sharded(os.path.join(scratch(), "none"), like={"w": X}),
    FileNotFoundError,
    r"none",
)
add(K, "save-path-int", lambda: checkpoint.save_sharded(3, {"w": X}), TypeError, r"save_sharded")

# ------------------------------------------------------------------ data position (resume)
D = "data"
add(D, "seek-bogus-position", lambda: data.of_array(X).seek("zz"), ValueError, r"data\.seek")
add(D, "seek-negative", lambda: data.of_array(X).seek({"pass": 0, "index": -1}), ValueError, r"data\.seek")


# ------------------------------------------------------------------ PyTorch programs (the interop extra)
def torch_cases() -> list[Case]:
    """The PyTorch-program cases (torch is an optional extra: built only when it is installed).
    Every failure must come when the module is imported, naming the construct and the module's
    line, never at the first call."""
    import torch  # noqa: PLC0415 - optional

    x = torch.ones(2, 4)

    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x

    class ItemLoop(torch.nn.Module):
        def forward(self, x):
            for _ in range(int(x.sum())):
                x = x + 1
            return x

    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    dropout = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    narrow = torch.nn.Linear(3, 2)
    tf, ir = kn.interop.torch_function, kn.ir
    cases = []

    def case(name, call, error, pattern):
        cases.append(Case("torch", name, call, error, pattern))

    bad = kn.ir.TorchImportError
    case(
        "cond", lambda: tf(Cond(), x), bad, r"torch\.cond in the top-level module at catalogue_round3\.py:\d+"
    )
    case(
        "data-dependent-if",
        lambda: tf(DataDependent(), x),
        bad,
        r"catalogue_round3\.py:\d+: if x\.sum\(\) > 0:\): data-dependent",
    )
    case("data-dependent-int", lambda: tf(ItemLoop(), x), bad, r"cannot export ItemLoop.*data-dependent")
    case("fft", lambda: tf(Spectrum(), x), bad, r"aten\._fft_r2c.* no mapping")
    case("train-mode-dropout", lambda: tf(dropout, x), bad, r"native_dropout in train mode.*module\.eval\(\)")
    case(
        "wrong-example-shape",
        lambda: tf(narrow, x),
        bad,
        r"cannot export Linear at example input shapes \[\[2, 4\]\]",
    )
    case("not-a-module", lambda: tf(lambda x: x, x), TypeError, r"torch\.nn\.Module")
    case("from-torch-not-program", lambda: ir.from_torch(3), TypeError, r"ExportedProgram")
    case("torch-inputs-not-program", lambda: ir.torch_inputs("p", x), TypeError, r"ExportedProgram")
    program = torch.export.export(narrow, (torch.ones(2, 3),))
    case("torch-inputs-too-few", lambda: ir.torch_inputs(program), bad, r"takes 1 user inputs, got 0")
    case("int64-overflow", lambda: ir.torch_inputs(program, torch.tensor([2**40])), bad, r"would wrap")
    fn, params = tf(narrow, torch.ones(2, 3))
    case("call-wrong-shape", lambda: fn(params, np.ones((2, 4), F32)), bad, r"exported for \[2, 3\]")
    case("call-too-few", lambda: fn(params), bad, r"fewer inputs")
    case("call-missing-param", lambda: fn({}, np.ones((2, 3), F32)), (KeyError, bad), r"weight")
    return cases

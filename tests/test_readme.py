"""The README's "Coming from PyTorch" example runs exactly as written and does what it says."""

from __future__ import annotations

import os
import re

import numpy as np

from kaun_ir import tree

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
HEADING = "## Coming from PyTorch"


def _examples() -> list[str]:
    """The ```python blocks of the section under the heading."""
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    pattern = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
    blocks = pattern.findall(text, start, end if end > 0 else len(text))
    assert blocks, f"no python block after {HEADING!r}"
    return blocks


def _example() -> str:
    """The first ```python block after the heading."""
    return _examples()[0]


def test_the_example_is_the_one_under_the_heading():
    code = _example()
    assert "train.fit" in code and "checkpoint.save" in code
    assert "loss=" in code and "lambda logits" not in code  # the explicit form first
    assert sum("lambda logits" in block for block in _examples()) == 1  # the closure form shown once


def test_coming_from_pytorch_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the example writes mlp.safetensors into the working directory
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(_example(), f"{README}:{HEADING}", "exec"), namespace)

    assert namespace["best"] >= 0.95, namespace["best"]
    assert re.search(r"test accuracy \d+\.\d%", capsys.readouterr().out)
    assert (tmp_path / "mlp.safetensors").is_file()
    # every batch of every epoch ran the one compiled training step
    assert namespace["trainer"].cache.step.trace_count == 1

    from kaun_ir import layer, train

    st, restored, model = namespace["st"], namespace["restored"], namespace["model"]
    x_test = namespace["x_test"]
    for a, b in zip(tree.flatten(restored.params)[0], tree.flatten(st.vars.params)[0]):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(
        np.asarray(layer.apply(model, restored, x_test)[0]),
        np.asarray(train.predict(namespace["trainer"], st, x_test)),
    )
    # the fresh initialisation really was different before the checkpoint was loaded
    fresh = namespace["fresh"]
    assert not np.array_equal(np.asarray(fresh.params[0]["weight"]), np.asarray(st.vars.params[0]["weight"]))

    # the closure-form example continues the same script; its loss is the explicit form's
    exec(compile(_examples()[1], f"{README}:{HEADING} (closure form)", "exec"), namespace)
    from kaun_ir import rng

    with rng.scope(0):
        again = train.init(namespace["trainer"])
    want, _ = train.step(namespace["trainer"], again, namespace["x_train"][:32], namespace["labels"])
    np.testing.assert_allclose(float(namespace["value"]), float(want), rtol=1e-6)

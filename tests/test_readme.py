"""The README's "Coming from PyTorch" example runs exactly as written and does what it says."""

from __future__ import annotations

import os
import re

import numpy as np

from kaun_ir import tree

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
HEADING = "## Coming from PyTorch"


def _example() -> str:
    """The first ```python block after the heading."""
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(HEADING)
    match = re.compile(r"^```python\n(.*?)^```", re.S | re.M).search(text, start)
    assert match is not None, f"no python block after {HEADING!r}"
    return match.group(1)


def test_the_example_is_the_one_under_the_heading():
    code = _example()
    assert "train.fit" in code and "checkpoint.save" in code


def test_coming_from_pytorch_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the example writes mlp.safetensors into the working directory
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(_example(), f"{README}:{HEADING}", "exec"), namespace)

    assert namespace["best"] >= 0.95, namespace["best"]
    assert re.search(r"test accuracy \d+\.\d%", capsys.readouterr().out)
    assert (tmp_path / "mlp.safetensors").is_file()
    # every batch of every epoch ran the one compiled training step
    assert namespace["trainer"]._step.trace_count == 1

    from kaun_ir import layer, train

    st, restored, model = namespace["st"], namespace["restored"], namespace["model"]
    x_test = namespace["x_test"]
    for a, b in zip(tree.flatten(restored.params)[0], tree.flatten(st.vars.params)[0]):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert np.array_equal(np.asarray(layer.apply(model, restored, x_test)[0]),
                          np.asarray(train.predict(namespace["trainer"], st, x_test)))
    # the fresh initialisation really was different before the checkpoint was loaded
    fresh = namespace["fresh"]
    assert not np.array_equal(np.asarray(fresh.params[0]["weight"]), np.asarray(st.vars.params[0]["weight"]))

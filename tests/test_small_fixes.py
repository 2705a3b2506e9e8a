"""Smaller things a user meets: ``dir()`` of the public namespaces shows their public names only,
``python -m kaun_ir.tools.viz.trace --png`` fails in one line without a browser, and a PyTorch
program imports without torch's internal FutureWarning and with a readable shape error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import kaun_ir as kn


def test_dir_of_ptree_holds_only_its_public_names():
    public = [name for name in dir(kn.ptree) if not name.startswith("_")]
    assert public == sorted(kn.ptree.__all__)
    assert not {"np", "math", "Any", "Callable"} & set(dir(kn.ptree))


def test_dir_of_every_public_namespace_is_its_all():
    leaky = {}
    for name in kn.__all__:
        module = getattr(kn, name)
        if not isinstance(module, types.ModuleType) or not hasattr(module, "__all__"):
            continue
        extra = sorted(n for n in dir(module) if not n.startswith("_") and n not in module.__all__)
        if extra:
            leaky[name] = extra
    # kn.errors has no helper imports to hide; every other namespace defines __dir__
    assert leaky == {}, f"dir() shows names outside __all__: {leaky}"


def test_viz_trace_png_without_a_browser_is_one_line(tmp_path):
    events = [{"ph": "X", "pid": 1, "tid": 2, "ts": 0.0, "dur": 5.0, "name": "k", "args": {"hlo_op": "f.1"}}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    env = dict(os.environ, KAUN_IR_CHROMIUM=str(tmp_path / "no-such-browser"))
    command = [sys.executable, "-m", "kaun_ir.tools.viz.trace", str(trace), "-o", str(tmp_path / "p.html")]
    result = subprocess.run(
        [*command, "--png", str(tmp_path / "p.png")], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("viz.trace: error: --png")
    assert (tmp_path / "p.html").exists()  # the page is written before the picture fails
    missing = subprocess.run(
        [*command[:3], str(tmp_path / "none.json"), *command[4:]], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "Traceback" not in missing.stderr and "none.json" in missing.stderr


@pytest.mark.interop
def test_torch_import_is_quiet_and_names_the_input():
    torch = pytest.importorskip("torch")
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    exported = torch.export.export(module, (torch.ones(2, 4),))  # the user's own call may warn
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn, params = kn.interop.torch_function(module, np.ones((2, 4), np.float32))
        kn.ir.from_torch(exported)
    assert not [w for w in seen if w.category is FutureWarning and "LeafSpec" in str(w.message)]
    # the filter is not left installed: the same warning raised afterwards is still shown
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
    assert len(after) == 1
    with pytest.raises(kn.ir.TorchImportError, match=r"torch_function: input 1 \('input' in the program\)"):
        fn(params, np.ones((3, 4), np.float32))

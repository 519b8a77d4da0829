"""`workbench estimate FILE.py` runs the file as `python FILE.py` would (its folder on sys.path), and takes a
module, `package.module[:function]`, as well."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent

NET = textwrap.dedent("""
    import torch
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 4)
        def forward(self, x):
            return self.lin(x)
""")
EST = textwrap.dedent("""
    import torch
    from netdef import Net
    def model():
        from netdef import Net as Again  # imported when called, too
        return Again()
    def batch(batch_size):
        return (torch.randn(batch_size, 16),)
    def optimizer(params):
        return torch.optim.SGD(params, lr=0.1)
    def other_model():
        return torch.nn.Sequential(Net(), torch.nn.Linear(4, 4))
""")


def _tree(tmp_path):
    pkg = tmp_path / "proj"
    (pkg / "mypkg").mkdir(parents=True)
    (pkg / "netdef.py").write_text(NET)
    (pkg / "est.py").write_text(EST)
    (pkg / "mypkg" / "__init__.py").write_text("")
    (pkg / "mypkg" / "steps.py").write_text(EST)
    return pkg


def _cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "workbench", "estimate", *args, "--json"], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)


def test_a_file_imports_the_module_next_to_it_from_any_folder(tmp_path):
    pkg = _tree(tmp_path)
    r = _cli([str(pkg / "est.py"), "--batch-size", "4"], cwd=tmp_path)  # not the file's folder
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["model"] == "Net"


def test_module_and_module_function_specs(tmp_path):
    pkg = _tree(tmp_path)
    r = _cli(["mypkg.steps", "--batch-size", "4"], cwd=pkg)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["model"] == "Net"
    r = _cli(["mypkg.steps:other_model", "--batch-size", "4"], cwd=pkg)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["meta"]["model"] == "Sequential"
    r = _cli(["no_such_pkg.steps"], cwd=pkg)
    assert r.returncode != 0 and "no module 'no_such_pkg'" in r.stderr and "Traceback" not in r.stderr


def test_sys_path_is_restored(tmp_path, monkeypatch):
    from workbench.capture.estimate import estimate, load_estimate_file

    pkg = _tree(tmp_path)
    monkeypatch.delitem(sys.modules, "netdef", raising=False)
    before = list(sys.path)
    f = load_estimate_file(pkg / "est.py")
    assert sys.path == before
    sys.modules.pop("netdef", None)  # model() imports it again when called: the folder is put back meanwhile
    w, c = f.step(batch_size=2)
    assert estimate(w, c).meta["model"] == "Net"
    assert sys.path == before
    sys.modules.pop("netdef", None)

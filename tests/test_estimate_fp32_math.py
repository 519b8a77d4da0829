"""fp32 is the user's fp32: the estimate reads torch's TF32 flags (cuDNN convolutions in TF32 by default, matmuls
in fp32), names the strict mode (strict_fp32 / --strict-fp32) and says which math it assumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from workbench.capture.estimate import estimate  # noqa: E402
from workbench.errors import BadArgument  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _cnn():
    return nn.Sequential(nn.Conv2d(8, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1))


def _img(bs):
    return (torch.randn(bs, 8, 32, 32),)


def _est(**kw):
    return estimate(_cnn, _img, None, batch_size=4, steps=1, cublas_workspace_bytes=0, **kw)


def test_default_fp32_is_an_untouched_script_tf32_convolutions_fp32_matmuls():
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32  # torch's defaults
    e = _est(precision="fp32")
    fm = e.meta["float32_math"]
    assert (fm["convolutions"], fm["matmuls"]) == ("tf32", "fp32") and "flags" in fm["source"]
    assert e.by_category["workspace"] > 0 or e.meta["conv_workspaces"]["calls"] > 0
    strict = _est(precision="fp32", strict_fp32=True)
    assert strict.meta["float32_math"]["convolutions"] == "fp32" and strict.meta.get("upper")
    # the TF32 rule takes the NHWC copies; strict fp32 takes none at its point estimate (and has the FFT bound)
    assert e.peak_reserved_bytes != strict.peak_reserved_bytes or e.peak_allocated_bytes > strict.peak_allocated_bytes
    assert e.to_dict() == _est(precision="fp32", strict_fp32=False).to_dict()


def test_the_flags_are_read_at_estimate_time(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    e = _est(precision="fp32")
    assert e.meta["float32_math"]["convolutions"] == "fp32"
    assert e.to_dict()["peak_reserved_bytes"] == _est(precision="fp32", strict_fp32=True).peak_reserved_bytes


def test_tf32_precision_and_the_harness_configurations():
    from workbench.capture.configurations import Workload, checkpointing, combine, fp32, tf32, tf32_setting

    assert _est(precision="tf32").meta["float32_math"] == {"convolutions": "tf32", "matmuls": "tf32",
                                                             "source": "precision tf32"}
    with pytest.raises(BadArgument, match="contradict"):
        _est(precision="tf32", strict_fp32=True)
    assert tf32_setting(fp32()) is False and tf32_setting(tf32()) is True
    assert tf32_setting(combine(fp32(), checkpointing(nn.Conv2d))) is False
    work = Workload(model=_cnn, batch=lambda n, d: _img(n), loss=lambda m, b: m(*b).pow(2).mean(), batch_size=4)
    e = estimate(work, fp32(), steps=1)
    assert e.meta["float32_math"]["convolutions"] == "fp32" and "fp32" in e.meta["float32_math"]["source"]
    assert estimate(work, steps=1).meta["float32_math"]["convolutions"] == "tf32"  # a bare Configuration: flags


def test_cli_says_which_math(tmp_path):
    f = tmp_path / "cnn.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def model():\n    return nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU())\n"
                 "def batch(n):\n    return (torch.randn(n, 8, 16, 16),)\n"
                 "def optimizer(p):\n    return torch.optim.SGD(p, lr=0.1)\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "workbench", "estimate", str(f), "--batch-size", "2", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=ROOT, timeout=300)
    r = run()
    assert r.returncode == 0, r.stderr
    assert "float32 math: convolutions TF32, matmuls FP32" in r.stdout and "between" in r.stdout
    r = run("--strict-fp32", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["meta"]["float32_math"]["convolutions"] == "fp32" and d["meta"]["reserved_range"]["wide"]

"""Capture on a machine without CUDA (real torch, CPU build): it says so and does nothing else; the
OOM observer never raises and never swallows; the sidecar is read back by the loader."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np

import pytest

torch = pytest.importorskip("torch")

from workbench import samples  # noqa: E402
from workbench.analysis.memory.oom import oom_postmortem  # noqa: E402
from workbench.capture.memory import OomCapture, capture_oom, cuda_available, record_memory_history  # noqa: E402
from workbench.io.snapshot import load_snapshot  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")


@no_cuda
def test_record_memory_history_without_cuda(tmp_path):
    assert cuda_available() is False
    out = tmp_path / "x.pickle.gz"
    with pytest.warns(RuntimeWarning, match="no CUDA device"):
        with record_memory_history(out, max_entries=1000) as rec:
            y = torch.ones(4) * 2  # the block runs
    assert float(y.sum()) == 8.0
    assert rec.path is None and not rec.enabled and not out.exists()
    with pytest.raises(Exception, match="no snapshot was recorded"):
        rec.load()


@no_cuda
def test_record_memory_history_does_not_swallow(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(ZeroDivisionError):
            with record_memory_history(tmp_path / "y.pickle.gz"):
                1 / 0


def test_bad_stacks_argument():
    with pytest.raises(ValueError, match="python"):
        record_memory_history(stacks="cpp")


@no_cuda
def test_capture_oom_without_cuda(tmp_path, caplog):
    d = tmp_path / "dumps"
    with pytest.warns(RuntimeWarning, match="capture_oom: no CUDA device"):
        h = capture_oom(d, max_dumps=2)
    assert isinstance(h, OomCapture) and not h.active
    assert not d.exists()  # nothing else happens: no folder, no observer
    assert any("no CUDA device" in r.message for r in caplog.records)
    h.remove()
    assert not h.active
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match="boom"):
            with capture_oom(d) as h2:
                raise RuntimeError("boom")
    assert h2.dumps == [] and h2.errors == []


@no_cuda
def test_observer_never_raises(tmp_path):
    """Armed by hand on CPU, the observer meets a real failure (no CUDA to snapshot) and records it
    instead of raising into the allocator."""
    h = OomCapture(directory=tmp_path, max_dumps=1, active=True)
    h._observe(0, 1 << 30, 4 << 30, 0)
    assert h.errors and h.dumps == []
    assert list(tmp_path.iterdir()) == []  # no half-written files


def test_note_exception_fills_the_sidecar(tmp_path):
    side = tmp_path / "oom-1.oom.json"
    side.write_text(json.dumps({"requested_bytes": 1 << 30, "torch_message": None}))
    h = OomCapture(directory=tmp_path, max_dumps=1, sidecars=[side])
    msg = "CUDA out of memory. Tried to allocate 1.00 GiB. ... 4.19 GiB allowed; 3.94 GiB allocated by PyTorch"
    h.note_exception(RuntimeError(msg))
    assert json.loads(side.read_text())["torch_message"] == msg
    assert not list(tmp_path.glob(".*tmp"))


def test_sidecar_is_read_with_the_snapshot(tmp_path):
    """capture_oom's layout (oom-....pickle.gz + oom-....oom.json) on the real OOM snapshot: the cap
    torch reported (4.19 GiB allowed) becomes the post-mortem's cap."""
    snap_path = tmp_path / "oom-20261202-000000-pid1-1.pickle.gz"
    shutil.copy(samples.path("h200_oom_snapshot"), snap_path)
    (tmp_path / "oom-20261202-000000-pid1-1.oom.json").write_text(json.dumps({
        "requested_bytes": 1 << 30,
        "torch_message": "Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 134.87 GiB "
                         "is free. 4.19 GiB allowed; 3.94 GiB allocated by PyTorch, and 255.59 MiB is reserved by "
                         "PyTorch but unallocated.",
    }))
    snap = load_snapshot(snap_path)
    assert snap.extra["oom"]["requested_bytes"] == 1 << 30
    r = oom_postmortem(snap)
    assert r.cap_bytes == int(4.19 * 2**30)
    assert r.torch_message.startswith("Tried to allocate")
    assert r.cause == "capacity"


def test_live_cpu_profile_memory_in_the_panel(tmp_path):
    """On a machine without a GPU: torch.profiler's CPU memory events of a real training step feed
    the same analysis and MemoryPanel."""
    pytest.importorskip("ipywidgets")
    from torch.profiler import ProfilerActivity, profile

    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.io.profiler_memory import load_profiler_memory
    from workbench.panels.memory import MemoryPanel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(32, 64)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()

    step()  # warm-up outside the profiler (STACK-NOTES: cold with_stack profiles can crash)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        for _ in range(2):
            step()
    path = tmp_path / "cpu.trace.json"
    prof.export_chrome_trace(str(path))
    snap = load_profiler_memory(path)
    assert snap.extra["device_type"] == "cpu" and len(snap.events) > 10
    a = analyze_snapshot(snap)
    assert np.array_equal(a.timeline["allocated_bytes"].to_numpy(), snap.extra["total_allocated_bytes"])
    # the activations of a forward pass (32 x 256 floats) were live at some point
    assert a.peak["allocated_bytes"] - a.timeline.attrs["start_allocated_bytes"] >= 32 * 256 * 4
    assert any(f.endswith("test_memory_capture.py") for f in snap.frames["filename"])
    p = MemoryPanel(snap)
    assert p.last_error is None and len(p.timeline.data) >= 1 and "allocated" in p.live.value

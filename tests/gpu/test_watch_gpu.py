"""The flight recorder (workbench.capture.watch) on a real GPU (run on the H200: `make test-gpu`, or
`pytest -m gpu tests/gpu/test_watch_gpu.py`).

One fresh process trains a small MLP on CUDA under `watch(...)`: a slowdown made on the GPU itself
(torch.cuda._sleep in the step: the host sees it only where it waits, at the loss logged every 10 steps;
the CUDA events see every slow step) triggers a capture, SIGUSR2 another,
then a per-process memory cap and a too-large allocation inside `w.step()` give an OOM: the original
OutOfMemoryError reaches the script, and the folder holds its allocator snapshot with the `.oom.json`
sidecar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    import torch
    from workbench import watch

    out = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device=dev)
    # 20 ms of GPU sleep: a step the host does not see as slow (launches return at once)
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1e3 * 0.02)  # kHz -> cycles in 20 ms

    def train_step(i, slow=False):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if slow:
            torch.cuda._sleep(cycles)
        if i % 10 == 9:  # the loss logged every 10 steps, as loops do (the host waits for the GPU there)
            loss.item()

    w = watch(out, capture_steps=3, slow_factor=3.0, warmup=20, slow_cooldown=1000, nvml_interval_s=0.1)
    for i in range(120):
        with w.step():
            train_step(i, slow=60 <= i < 80)
        if i == 100:
            os.kill(os.getpid(), signal.SIGUSR2)
    torch.cuda.synchronize()
    # the OOM: a cap just above what is in use, then an allocation far beyond it, inside w.step()
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + 256 * 2**20) / total))
    err = None
    try:
        with w.step():
            big = torch.empty(8 * 2**30, dtype=torch.uint8, device=dev)
    except torch.cuda.OutOfMemoryError as e:
        err = e
    torch.cuda.set_per_process_memory_fraction(1.0)
    w.close()
    print("RESULT " + json.dumps({"error_type": type(err).__name__, "message": str(err), "problems": w.problems,
                                 "captures": w.captures, "recent": len(w.recent_steps())}))
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("watch_gpu") / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(out)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return out, json.loads(line[len("RESULT "):])


def test_an_oom_inside_a_step_leaves_a_snapshot_and_the_original_exception(run):
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.io.snapshot import load_snapshot
    from workbench.io.watch import load_watch_index

    out, r = run
    assert r["error_type"] == "OutOfMemoryError" and "Tried to allocate" in r["message"]
    (oom,) = [c for c in load_watch_index(out).captures if c.reason == "oom"]
    assert oom.first_step == 120 and oom.rank == 0 and oom.snapshot and oom.trace is None
    snap = load_snapshot(out / oom.snapshot)
    side = snap.extra["oom"]
    assert side["requested_bytes"] == 8 * 2**30 and "Tried to allocate" in side["torch_message"]
    assert analyze_snapshot(snap).oom is not None


def test_a_slowdown_seen_only_on_the_gpu_triggers_a_capture(run):
    from workbench.io.trace import load_trace
    from workbench.io.watch import load_watch_index

    out, r = run
    caps = load_watch_index(out).captures
    assert [c.reason for c in caps] == ["baseline", "slow", "signal", "oom"], [c.as_dict() for c in caps]
    slow = caps[1]
    assert 60 <= slow.extra["trigger_step"] <= 62 and slow.extra["device"].startswith("cuda")
    captured = range(slow.first_step, slow.last_step + 1)
    assert slow.extra["trigger_ms"] >= 20 and all(60 <= s < 80 for s in captured), slow.as_dict()
    # the captured steps' times are the GPU's (CUDA events), not the host's, which returns before the sleep ends
    assert len(slow.extra["step_ms"]) == 3 and all(ms >= 20 for ms in slow.extra["step_ms"]), slow.as_dict()
    t = load_trace(out / slow.trace)
    assert len(t.kernels) > 0  # a CUDA trace
    for c in caps[:3]:  # every capture: a trace, an allocator snapshot, the NVML window
        assert c.trace and c.snapshot and c.nvml, c.as_dict()
        assert (out / c.trace).is_file() and (out / c.snapshot).is_file() and (out / c.nvml).is_file()
    assert r["problems"] == [] and r["recent"] > 50


def test_the_signal_capture_and_the_cli(run, capsys):
    from workbench.cli import main
    from workbench.io.nvml import load_nvml_session
    from workbench.io.watch import load_watch_index

    out, _ = run
    sig = [c for c in load_watch_index(out).captures if c.reason == "signal"][0]
    assert 100 < sig.first_step and sig.last_step <= 104
    assert len(load_nvml_session(out / sig.nvml)) > 0
    assert main(["watch", str(out)]) == 0
    text = capsys.readouterr().out
    assert "out of memory" in text.lower() or "Tried to allocate" in text
    assert main(["memory", str(out / sig.snapshot), "--json"]) == 0
    capsys.readouterr()
    base, slow = load_watch_index(out).captures[:2]
    assert main(["diff", str(out / base.trace), str(out / slow.trace), "--json"]) == 0
    (step,) = [c for c in json.loads(capsys.readouterr().out)["changes"] if c["key"] == "step"]
    assert step["test_us"] > step["base_us"] + 10_000


def test_a_capture_opens_on_one_clock_and_in_the_panels(run, capsys):
    from workbench.cli import main
    from workbench.io.watch import load_watch_index

    out, _ = run
    sig = [c for c in load_watch_index(out).captures if c.reason == "signal"][0]
    files = {k: str(out / v) for k, v in sig.files().items()}
    assert main(["timeline", "--trace", files["trace"], "--memory", files["snapshot"], "--nvml", files["nvml"],
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["clock"] == "unix_ns"
    pytest.importorskip("ipywidgets")
    from workbench.panels.memory import MemoryPanel
    from workbench.panels.profiler import ProfilerPanel

    assert ProfilerPanel(files["trace"]).last_error is None
    assert MemoryPanel(files["snapshot"]).last_error is None

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


def _run_script(script: str, out: Path) -> tuple[Path, dict]:
    """Run ``script`` in a fresh process (the allocator history is process-wide) with ``out`` as its argument;
    what its last ``RESULT`` line says."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return out, json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    return _run_script(SCRIPT, tmp_path_factory.mktemp("watch_gpu") / "run")


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
    # the default allocator history ('auto') may drop its stacks on this small step, and says so: nothing else
    assert [p for p in r["problems"] if "allocator history without stacks" not in p] == [] and r["recent"] > 50


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


# The allocator history's budget (memory_history='auto', the default): a host-bound step of many small ops
# loses its stacks at the warm-up's end, a GPU-bound step of a few big matmuls keeps them, and a mode named
# explicitly is kept whatever it costs. One fresh process (the history is process-wide), one recorder at a time.
BUDGET_SCRIPT = textwrap.dedent("""
    import gzip, json, pickle, sys
    import torch
    from workbench import watch

    out = sys.argv[1]
    torch.manual_seed(0)
    dev = "cuda"
    # host-bound: 24 tiny layers, forward, backward, SGD: hundreds of small allocations, a few ms a step
    small = torch.nn.Sequential(*[m for _ in range(24) for m in (torch.nn.Linear(64, 64), torch.nn.GELU())]).to(dev)
    opt = torch.optim.SGD(small.parameters(), lr=1e-3)
    xs = torch.randn(16, 64, device=dev)

    def host_step():
        opt.zero_grad(set_to_none=True)
        small(xs).square().mean().backward()
        opt.step()

    # GPU-bound: four 8192^2 fp32 matmuls, four allocations, tens of ms
    a, b = torch.randn(8192, 8192, device=dev), torch.randn(8192, 8192, device=dev)

    def gpu_step():
        for _ in range(4):
            c = a @ b
        c.sum()

    def run(name, step, steps=30, **kw):
        w = watch(f"{out}/{name}", capture_steps=3, slow_factor=None, warmup=10, nvml=False, handle_signal=False, **kw)
        for i in range(steps):
            with w.step():
                step()
            if i % 5 == 4:
                torch.cuda.synchronize()  # as a loop that logs its loss every few steps
        w.close()
        return {"mode_at_end": w.captures[-1]["history"]["mode"] if w.captures else None,
                "history_cost": {k: v for k, v in (w.history_cost or {}).items()}, "problems": w.problems,
                "captures": w.captures, "mode_after_close": w.history_mode}

    for _ in range(3):
        host_step(); gpu_step()
    torch.cuda.synchronize()
    r = {"host": run("host", host_step), "gpu": run("gpu", gpu_step, steps=20),
         "host_explicit": run("host_explicit", host_step, memory_history=True)}
    # the host-bound run's baseline snapshot: stacks before the switch, none after it
    snap_name = r["host"]["captures"][0]["snapshot"]
    with gzip.open(f"{out}/host/{snap_name}", "rb") as f:
        snap = pickle.load(f)
    traces = snap.get("device_traces") or [[]]
    allocs = [bool(e.get("frames")) for e in traces[0] if e["action"] == "alloc"]
    r["host_snapshot"] = {"allocs": len(allocs), "with_frames": sum(allocs),
                          "last_with_frames": allocs[-1] if allocs else None,
                          "segments": len(snap.get("segments") or [])}
    print("RESULT " + json.dumps(r, default=str))
""")


@pytest.fixture(scope="module")
def budget(tmp_path_factory) -> tuple[Path, dict]:
    return _run_script(BUDGET_SCRIPT, tmp_path_factory.mktemp("watch_budget"))


def test_a_host_bound_step_loses_the_stacks_and_says_so(budget, capsys):
    from workbench.capture.watch_history import history_cost
    from workbench.cli import main

    out, r = budget
    host = r["host"]
    est = host["history_cost"]
    mode = est["mode"]
    assert mode in ("sizes", "off") and host["mode_at_end"] == mode, host
    assert est["allocs_per_step"] > 100 and est["stacks_us"] > est["sizes_us"] > 0, est
    assert est["cost_pct"] is None or est["cost_pct"] > 1.0, est
    assert est["step_time"] == "cuda events" and est["decided_at_step"] >= 10, est
    # the decision is the model's: the same inputs give the same mode (the ring without stacks kept only
    # when it fits the budget)
    again = history_cost(est["allocs_per_step"], est["step_ms"], est["stacks_us"], est["sizes_us"],
                         off_us=est["off_us"])
    assert again["mode"] == mode and est["off_us"] is not None and est["off_us"] <= est["sizes_us"], (again, est)
    assert (est["sizes_cost_pct"] <= 1.0) == (mode == "sizes"), est
    said = [p for p in host["problems"] if p.startswith("watch rank 0: allocator history")]
    assert len(said) == 1 and "allocations a step" in said[0], host["problems"]
    base = host["captures"][0]
    assert base["reason"] == "baseline" and base["history"]["auto"] is True and base["history"]["mode"] == mode
    snap = r["host_snapshot"]
    if mode == "sizes":  # the ring kept the warm-up's stacks; what came after the switch has none
        assert "without stacks" in said[0]
        assert snap["with_frames"] > 0 and snap["last_with_frames"] is False, snap
    else:  # no history any more; the snapshot still has the segments (what an OOM leaves)
        assert "allocator history off" in said[0] and "memory_history='sizes'" in said[0]
        assert snap["allocs"] == 0 and snap["segments"] > 0, snap
    assert host["mode_after_close"] is None
    assert main(["watch", str(out / "host")]) == 0
    words = {"sizes": "without stacks: stacks would cost", "off": "off: stacks would cost"}[mode]
    assert f"allocator history, rank 0: {words}" in capsys.readouterr().out


def test_a_gpu_bound_step_keeps_the_stacks(budget):
    _, r = budget
    gpu = r["gpu"]
    est = gpu["history_cost"]
    assert est["mode"] == "python" and gpu["mode_at_end"] == "python", gpu
    assert est["allocs_per_step"] < 50 and est["step_ms"] > 10 and est["cost_pct"] < 1.0, est
    assert gpu["problems"] == [], gpu["problems"]


def test_a_mode_named_explicitly_is_kept(budget):
    _, r = budget
    explicit = r["host_explicit"]
    assert explicit["history_cost"] == {} and explicit["mode_at_end"] == "python", explicit
    assert explicit["captures"][0]["history"] == {"mode": "python", "auto": False}
    assert explicit["problems"] == []

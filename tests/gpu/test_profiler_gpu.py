"""Profiling real CUDA steps (run on the H200: `python -m pytest -m gpu -s tests/gpu/test_profiler_gpu.py`).

Skipped with the reason where there is no CUDA device or no NVML (tests/conftest.py). `-s` shows the
measured full-detail cost and the busy-time agreement, which go into the report.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


class MatmulStep:
    """A GPU-bound step: back-to-back fp32 matmuls (~20-30 ms on an H200), bracketed by CUDA events
    so the test has an independent GPU timing of every call."""

    def __init__(self, n: int = 4096, reps: int = 10):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        g = torch.Generator(device="cuda").manual_seed(0)
        self.a = torch.randn(n, n, device="cuda", generator=g)
        self.b = torch.randn(n, n, device="cuda", generator=g)
        self.reps = reps
        self.events: list[tuple] = []  # (start, end) per call

    def __call__(self):
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        x = self.a
        for _ in range(self.reps):
            x = torch.mm(x, self.b)
            x = x * (1.0 / 64.0)  # keep values finite; a short elementwise kernel between GEMMs
        end.record()
        self.events.append((start, end))
        return x

    def event_ms(self) -> list[float]:
        import torch

        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in self.events]


def test_profile_steps_on_cuda_records_kernels_and_steps(tmp_path):
    from workbench.analysis import gpu_busy, kernel_summary, step_summary
    from workbench.capture.profiler import profile_steps

    step = MatmulStep()
    res = profile_steps(step, steps=3, detail="light", out_dir=tmp_path, verbose=False)
    assert res.device.startswith("cuda") and res.steps == 3 and res.complete
    tr = res.load()
    assert "H200" in tr.device or "NVIDIA" in tr.device, tr.device
    ks = kernel_summary(tr)
    assert len(ks) > 0
    gemm = ks[ks["name"].str.contains("gemm|sgemm|xmma|cutlass|Kernel", case=False, regex=True)]
    assert gemm["count"].sum() >= 3 * step.reps, ks.head()
    steps = step_summary(tr)
    assert list(steps["step"]) == [2, 3, 4]
    assert (steps["kernel_count"] >= 2 * step.reps).all()
    assert gpu_busy(tr).busy_us > 0


def test_gpu_busy_of_profiled_steps_agrees_with_cuda_events(tmp_path):
    from workbench.analysis import gpu_busy, step_summary
    from workbench.capture.profiler import profile_steps

    step = MatmulStep()
    res = profile_steps(step, steps=3, wait=1, warmup=1, detail="light", out_dir=tmp_path, verbose=False)
    ms = step.event_ms()
    # calls: 1 warm-up outside the profiler, 3 timed without it (the unprofiled step time stamped into the
    # trace), 1 wait, 1 warmup, then the 3 recorded ones
    assert len(ms) == 9
    assert res.load().metadata.get("workbench_unprofiled_step_ms") > 0
    active_us = [m * 1e3 for m in ms[-3:]]
    tr = res.load()
    steps = step_summary(tr)
    busy = steps["gpu_busy_us"].tolist()
    print(f"\nCUDA events per step (us): {[round(v) for v in active_us]}; "
          f"trace GPU busy per step (us): {[round(v) for v in busy]}")
    for b, e in zip(busy, active_us):
        assert b == pytest.approx(e, rel=0.05)
    assert gpu_busy(tr).busy_us == pytest.approx(sum(active_us), rel=0.05)


def test_full_detail_cost_is_measured_and_printed(tmp_path, capsys):
    from workbench.capture.profiler import profile_steps

    step = MatmulStep(reps=4)
    res = profile_steps(step, steps=3, detail="full", out_dir=tmp_path)
    out = capsys.readouterr().out
    assert res.cost is not None and res.cost.baseline_ms > 0 and res.cost.profiled_ms > 0
    assert "full detail" in out and " ms to " in out
    with capsys.disabled():
        print(f"\n[H200] {res.cost}")
    tr = res.load()
    cats = set(tr.events["cat"].astype(str))
    assert {"kernel", "cuda_runtime", "python_function"} <= cats


def test_profile_block_on_cuda_and_exception_keeps_kernels(tmp_path):
    import torch

    from workbench.capture.profiler import profile

    step = MatmulStep(reps=3)
    step()  # warm-up outside the profiler
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="stop here"):
        with profile(out_dir=tmp_path, detail="standard") as session:
            step()
            session.step()
            step()
            raise RuntimeError("stop here")
    res = session.result
    assert res is not None and not res.complete and res.device.startswith("cuda")
    tr = res.load()
    names = set(tr.events["name"].astype(str))
    assert {"ProfilerStep#0", "ProfilerStep#1"} <= names
    assert (tr.events["cat"].astype(str) == "kernel").sum() >= 2 * 3


def test_profiler_panel_from_a_live_cuda_step(tmp_path):
    pytest.importorskip("anywidget", reason="the panels draw with an anywidget")
    pytest.importorskip("ipywidgets")
    from workbench.panels.profiler import ProfilerPanel

    p = ProfilerPanel.from_step(MatmulStep(reps=4), steps=2, detail="standard", out_dir=tmp_path, verbose=False)
    assert p.last_error is None
    assert len(p.figures["kernels"].data) == 1 and len(p.table_frames["kernels"]) > 0
    assert "kernels" in p.status.value


def test_cuda_capture_is_quiet_and_a_session_of_three_steps_has_three(tmp_path):
    """On the GPU (CUPTI on): no USDT profiler_start/stop lines on stderr, and three session.step()
    calls give three ProfilerSteps in the loaded trace."""
    import os
    import subprocess
    import sys

    code = f"""
import torch
from workbench.capture.profiler import profile, profile_steps
from workbench.io import load_trace
from workbench.analysis import step_summary
x = torch.randn(1024, 1024, device="cuda")
with profile(out_dir={str(tmp_path)!r}) as s:
    for _ in range(3):
        x @ x
        s.step()
print("session", s.result.steps, len(step_summary(load_trace(s.result.path))))
r = profile_steps(lambda: x @ x, steps=3, out_dir={str(tmp_path)!r}, verbose=False, progress=False)
t = load_trace(r.path)
print("steps", r.steps, len(step_summary(t)), int((t.events["cat"].astype(str) == "kernel").sum() > 0))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "WORKBENCH_KINETO_LOG")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["session 3 3", "steps 3 3 1"]
    assert "USDT" not in proc.stderr and "profiler_start" not in proc.stderr, proc.stderr

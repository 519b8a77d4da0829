"""Trace findings on real CUDA traces recorded here (run on the H200:
`python -m pytest -m gpu -s tests/gpu/test_trace_gpu.py`; WORKBENCH_GPU_KEEP=DIR keeps the traces).

Each test profiles a small, deliberately lopsided loop with torch.profiler (CPU + CUDA, a
wait/warmup/active schedule), loads the trace with workbench.io.load_trace and checks that the
finding built for that bottleneck fires with numbers that match what the loop did, and that the
others stay quiet where they should. `-s` prints the findings for the report.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _profile(step, tmp_path, active: int = 4, name: str = "t"):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from workbench.io import load_trace

    path = tmp_path / f"{name}.trace.json"
    step()  # warm up outside the profiler (cuBLAS handles, allocator)
    torch.cuda.synchronize()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=active),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(2 + active):
            step()
            prof.step()
    torch.cuda.synchronize()
    keep = os.environ.get("WORKBENCH_GPU_KEEP")  # a folder: keep the traces (the what-ifs studied afterwards)
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    trace = load_trace(path)
    assert "NVIDIA" in trace.device, trace.device
    return trace


def _ids(trace):
    from workbench.analysis import findings

    fs = findings(trace)
    for f in fs:
        print(f"  [{f.severity}] {f.id}: {f.message}")
    return {f.id: f for f in fs}


def test_fp32_matmul_fires_for_fp32_and_not_for_bf16(tmp_path):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")

    def fp32():
        for _ in range(4):
            torch.mm(a, b)

    def bf16():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(4):
                torch.mm(a, b)

    f32 = _ids(_profile(fp32, tmp_path, name="fp32"))
    assert "fp32_matmul" in f32 and f32["fp32_matmul"].evidence["fp32_gemm_fraction"] > 0.8
    assert "TF32" in f32["fp32_matmul"].message
    half = _ids(_profile(bf16, tmp_path, name="bf16"))
    assert "fp32_matmul" not in half
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32 = _ids(_profile(fp32, tmp_path, name="tf32"))
    assert "fp32_matmul" not in tf32  # TF32 GEMMs run on tensor cores
    torch.backends.cuda.matmul.allow_tf32 = False


def test_sync_bound_fires_for_item_in_the_loop(tmp_path):
    import torch

    x = torch.randn(2048, 2048, device="cuda")

    def step(read=True):
        for _ in range(10):
            y = torch.mm(x, x)
            s = y.sum()
            if read:
                v = s.item()  # blocks the host until the GPU is done
                assert v == v
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 5e-4:  # host work that now cannot overlap the GPU
                pass

    def timed(read):  # the step without the profiler, to the GPU's end
        ms = []
        for _ in range(15):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(read)
            torch.cuda.synchronize()
            ms.append((time.perf_counter() - t0) * 1e3)
        return sorted(ms)[len(ms) // 2]

    fs = _ids(_profile(step, tmp_path, name="sync"))
    f = fs["sync_bound"]
    # ~0.3 ms of fp32 GEMM then 0.5 ms of host work, ten times a step: without the sync they overlap
    assert f.evidence["sync_calls_per_step"] >= 10 * 0.8
    assert "input_bound" not in fs
    # the what-if against the fix timed: the same loop without .item()
    with_sync, without = timed(True), timed(False)
    measured = 1 - without / with_sync
    predicted = f.what_if["saved_fraction"]
    print(f"sync what-if: predicted saves {predicted:.1%}, measured {with_sync:.2f} -> {without:.2f} ms "
          f"(saves {measured:.1%})")
    assert abs(predicted - measured) <= 0.25 * measured, (predicted, measured, with_sync, without)


def test_input_bound_fires_for_a_slow_single_process_dataloader(tmp_path):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            time.sleep(0.02)  # decoding on the main process: the GPU has nothing queued
            return torch.ones(16)

    it = iter(DataLoader(Slow(), batch_size=1, num_workers=0))
    x = torch.randn(4096, 4096, device="cuda")

    def step():
        next(it)
        for _ in range(3):
            torch.mm(x, x)

    fs = _ids(_profile(step, tmp_path, name="input"))
    f = fs["input_bound"]
    assert f.what_if["saved_fraction"] > 0.4 and f.severity == "critical"
    assert f.evidence["dataloader_per_step_us"] > 15_000
    assert "sync_bound" not in fs


def test_a_host_sleep_is_host_work_not_input(tmp_path):
    import torch

    x = torch.randn(4096, 4096, device="cuda")

    def step():
        time.sleep(0.02)  # host work that is not data loading
        for _ in range(3):
            torch.mm(x, x)

    fs = _ids(_profile(step, tmp_path, name="host"))
    assert "input_bound" not in fs
    assert fs["host_bound"].what_if["saved_fraction"] > 0.4


def test_launch_bound_fires_for_many_tiny_kernels(tmp_path):
    import torch

    x = torch.randn(1024, device="cuda")

    def step():
        y = x
        for _ in range(500):
            y = y + 1.0  # ~2 us kernels, each costing the host more to launch than the GPU to run
        return y

    fs = _ids(_profile(step, tmp_path, name="launch"))
    f = fs["launch_bound"]
    assert f.evidence["kernel_count"] >= 500 * 4
    assert f.evidence["median_kernel_us"] < 10
    assert f.what_if["saved_fraction"] > 0.25 and f.severity == "critical"


def test_memcpy_heavy_fires_for_pageable_uploads(tmp_path):
    import torch

    host = torch.randn(64 * 1024 * 1024)  # 256 MiB, pageable
    w = torch.randn(1024, 1024, device="cuda")

    def step():
        d = host.to("cuda")
        torch.mm(w, w)
        return d

    fs = _ids(_profile(step, tmp_path, name="memcpy"))
    f = fs["memcpy_heavy"]
    assert f.evidence["by_kind"]["HtoD"]["bytes"] >= 4 * 256 * 2**20
    assert f.evidence["pageable_copies_per_step"] >= 1
    assert "pin_memory" in f.message


def test_busy_time_agrees_with_cuda_events_within_5_percent(tmp_path):
    import torch

    from workbench.analysis import step_summary

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(4096, 4096, device="cuda")
    events = []

    def step():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(8):
            torch.mm(a, a)
        e.record()
        torch.cuda.synchronize()  # keep each step's GPU work inside its ProfilerStep span
        events.append((s, e))

    steps = step_summary(_profile(step, tmp_path, name="busy"))
    measured = [s.elapsed_time(e) * 1e3 for s, e in events[-len(steps):]]
    print("  busy us per step:", [round(x) for x in steps["gpu_busy_us"]], "CUDA events us:", [round(x) for x in measured])
    for busy, ev in zip(steps["gpu_busy_us"], measured):
        assert busy == pytest.approx(ev, rel=0.05)

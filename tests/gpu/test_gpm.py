"""GPM counters read live by NvmlSampler move the right way (run on the H200; < 60 s).

NVML's utilization says only that a kernel ran: a bf16 GEMM and a device-to-device copy both read ~100%.
The GPM counters tell them apart: tensor-core activity is high under the GEMM and low under the copy,
DRAM bandwidth the other way round. The thresholds are far from both (H200: GEMM tensor ~90%, DRAM ~16%;
copy tensor ~3%, DRAM ~85%), so any GPU that reads the counters at all passes or fails for real.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

PHASE_S = 1.5       # long enough for ~14 GPM pairs at the 0.1 s refresh
EDGE_S = 0.25       # a pair that straddles a phase change mixes both; leave those rows out


def _nvml_index_of_cuda_device(torch) -> int:
    """NVML's index of the CUDA device torch uses (CUDA_VISIBLE_DEVICES may renumber them)."""
    import pynvml

    from workbench.capture.nvml import open_nvml

    open_nvml()
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", ""))
    for i in range(pynvml.nvmlDeviceGetCount()):
        nv_uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        nv_uuid = nv_uuid.decode() if isinstance(nv_uuid, bytes) else nv_uuid
        if uuid and nv_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
            return i
    return 0


def _busy(torch, fn, seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def _phase_rows(frame, marks, label):
    times = {m["label"]: m["t_s"] for m in marks}
    start = times[label]
    ends = sorted(t for t in times.values() if t > start)
    end = ends[0] if ends else frame.t_s.max()
    inside = frame[(frame.t_s > start + EDGE_S) & (frame.t_s < end - 0.05)]
    return inside


def test_gpm_tensor_activity_high_under_bf16_gemm_low_under_copy():
    torch = pytest.importorskip("torch")
    from workbench.capture.nvml import NvmlSampler

    gpu = _nvml_index_of_cuda_device(torch)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(2**28, device="cuda", dtype=torch.float32)   # 1 GiB
    dst = torch.empty_like(src)
    _busy(torch, lambda: a @ b, 0.2)      # cuBLAS handle, workspace and clocks up before sampling
    _busy(torch, lambda: dst.copy_(src), 0.1)

    sampler = NvmlSampler(interval_s=0.05, gpus=[gpu], slow_interval_s=None)
    with sampler:
        if not sampler.gpm_supported:
            name = torch.cuda.get_device_name()
            assert not any(k in name for k in ("H100", "H200", "H800", "H20", "GH200", "B200", "B100")), (
                f"{name} should read GPM counters: {sampler.notes}")
            pytest.skip(f"no GPM here: {sampler.notes}")
        time.sleep(0.3)
        wall_ns_at_mark = time.time_ns()
        sampler.mark("gemm")
        _busy(torch, lambda: a @ b, PHASE_S)
        sampler.mark("copy")
        _busy(torch, lambda: dst.copy_(src), PHASE_S)
        sampler.mark("idle")
        time.sleep(0.5)
    frame = sampler.frame()
    marks = sampler.marks()
    gemm, copy = _phase_rows(frame, marks, "gemm"), _phase_rows(frame, marks, "copy")
    assert len(gemm) >= 10 and len(copy) >= 10, (len(gemm), len(copy))

    def mean(rows, col):
        return float(np.nanmean(rows[col].to_numpy(dtype=float)))

    report = {phase: {c: round(mean(rows, c), 1) for c in ("util_gpu_pct", "gpm_sm_util_pct", "gpm_sm_occupancy_pct",
                                                             "gpm_tensor_util_pct", "gpm_dram_bw_util_pct")}
              for phase, rows in (("gemm", gemm), ("copy", copy))}
    print("GPM phase means:", report, "notes:", sampler.notes, "cadence:", sampler.cadence().to_dict("records"))

    # the counters tell the two apart; NVML's utilization does not (both near 100%)
    assert report["gemm"]["gpm_tensor_util_pct"] > 50, report
    assert report["copy"]["gpm_tensor_util_pct"] < 20, report
    assert report["gemm"]["gpm_tensor_util_pct"] > 3 * report["copy"]["gpm_tensor_util_pct"], report
    assert report["copy"]["gpm_dram_bw_util_pct"] > 50, report
    assert report["copy"]["gpm_dram_bw_util_pct"] > 2 * report["gemm"]["gpm_dram_bw_util_pct"], report
    assert report["gemm"]["gpm_sm_util_pct"] > 50 and report["copy"]["gpm_sm_util_pct"] > 50, report

    # paced at the refresh interval: no pair read too close (those read 0 under a busy GEMM)
    tensor = gemm["gpm_tensor_util_pct"].to_numpy(dtype=float)
    assert np.nanmin(tensor) > 10, tensor.tolist()
    vals = frame["gpm_tensor_util_pct"].to_numpy(dtype=float)
    new_value = np.isfinite(vals[1:]) & np.isfinite(vals[:-1]) & (vals[1:] != vals[:-1])
    changes = frame["t_s"].to_numpy()[1:][new_value]
    assert len(changes) >= 2 and np.min(np.diff(changes)) >= 0.05 - 0.01, np.diff(changes).tolist()

    # every row carries Unix time on the same clock as time.time_ns()
    ns = frame["time_ns"].to_numpy(dtype=np.int64)
    mark_t = {m["label"]: m["t_s"] for m in marks}["gemm"]
    row = int(np.argmin(np.abs(frame["t_s"].to_numpy() - mark_t)))
    predicted_ns = ns[row] + (mark_t - frame["t_s"].iloc[row]) * 1e9
    assert abs(predicted_ns - wall_ns_at_mark) < 20e6, (predicted_ns - wall_ns_at_mark) / 1e6
    assert np.all(np.diff(ns) > 0)


def test_trace_snapshot_and_nvml_of_one_run_share_one_clock(tmp_path):
    """Profile + allocator history + NVML/GPM together; on the shared clock the allocator peak falls
    inside the step that made it, and the snapshot's segment allocations sit on the trace's cudaMalloc
    calls (to ~ms)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import record_function

    from workbench.analysis.timeline import align, timeline_summary
    from workbench.capture.memory import record_memory_history
    from workbench.capture.nvml import NvmlSampler
    from workbench.capture.profiler import profile
    from workbench.io import load_nvml_session, load_snapshot, load_trace

    gpu = _nvml_index_of_cuda_device(torch)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 2048, device="cuda")

    def step(i):
        with record_function(f"train_step#{i}"):
            loss = model(x).square().mean()
            if i == 2:  # this step makes the peak: a 3 GiB temporary
                big = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
                big.fill_(1)
                del big
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    step(0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()   # the 3 GiB block must be a fresh cudaMalloc inside step 2
    sampler = NvmlSampler(interval_s=0.05, gpus=[gpu], slow_interval_s=None)
    with sampler:
        time.sleep(0.2)
        with record_memory_history(tmp_path / "run.snapshot.pickle.gz") as rec:
            with profile(tmp_path / "run.pt.trace.json.gz", detail="light") as session:
                for i in range(5):
                    step(i)
                    session.step()
        time.sleep(0.2)
    sampler.save(tmp_path / "run.nvml.jsonl.gz")

    tl = align(load_trace(session.result.path), load_snapshot(rec.path), load_nvml_session(tmp_path / "run.nvml.jsonl.gz"))
    doc = timeline_summary(tl)
    assert doc["clock"] == "unix_ns" and all(s["aligned"] for s in doc["sources"]), doc["sources"]
    assert doc["memory"]["peak_annotation"] == "train_step#2", doc["memory"]
    steps = tl.annotations[tl.annotations.kind == "step"]
    peak_ns = doc["memory"]["peak_time_ns"]
    assert ((steps.start_ns <= peak_ns) & (steps.end_ns >= peak_ns)).sum() == 1, (steps, peak_ns)

    # the snapshot's segment_alloc events against the trace's cudaMalloc calls: nearest call, in ms
    ev = load_trace(session.result.path).events
    mallocs = ev[ev.name.astype(str) == "cudaMalloc"]
    off = [p for p in tl.placements if p.kind == "trace"][0].offset_ns
    m_start = np.round(mallocs.ts_us.to_numpy() * 1000).astype(np.int64) + off
    m_end = m_start + np.round(mallocs.dur_us.to_numpy() * 1000).astype(np.int64)
    snap = load_snapshot(rec.path).events
    seg_ns = snap[snap.action.astype(str) == "segment_alloc"].time_us.to_numpy(dtype=np.int64) * 1000
    assert len(m_start) and len(seg_ns), (len(m_start), len(seg_ns))
    gaps = [min(np.min(np.maximum(0, np.maximum(m_start - t, t - m_end))), 1e12) for t in seg_ns]
    assert np.median(gaps) < 2e6, np.array(gaps) / 1e6
    # the NVML rows cover the run on the same clock
    assert doc["nvml"]["first_ns"] < doc["annotations"][0]["start_ns"] < doc["nvml"]["last_ns"]

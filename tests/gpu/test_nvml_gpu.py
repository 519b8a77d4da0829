"""The real NVML sampler on a CUDA machine (run on the H200: `python -m pytest -m gpu tests/gpu/test_nvml_gpu.py`).

Skipped with the reason where there is no CUDA device or no NVML (tests/conftest.py).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MIB = 2**20
GIB = 2**30


def _workbench_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("workbench") and t.is_alive()]


def _nvml_index_of_cuda0() -> int:
    """NVML numbers GPUs by PCI order, CUDA may not (CUDA_VISIBLE_DEVICES): match by UUID."""
    import torch

    from workbench.capture.nvml import NvmlSampler

    def hex32(text):
        m = re.search(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", str(text).lower())
        return m.group(0).replace("-", "") if m else None

    devs = NvmlSampler().devices()
    want = hex32(getattr(torch.cuda.get_device_properties(0), "uuid", ""))
    if want:
        for row in devs.itertuples():
            if hex32(row.uuid) == want:
                return int(row.gpu)
    assert len(devs) == 1, f"cannot tell which NVML device is cuda:0 among {devs.to_dict('records')}"
    return 0


def _median_between(frame, gpu, col, t0, t1):
    g = frame[(frame.gpu == gpu) & (frame.t_s >= t0) & (frame.t_s <= t1)]
    assert len(g) >= 3, f"too few samples between t={t0:.2f} and {t1:.2f} s"
    return float(g[col].median())


def test_utilization_rises_under_matmul_and_memory_tracks_torch():
    import torch

    from workbench.capture.nvml import NvmlSampler

    idx = _nvml_index_of_cuda0()
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    s = NvmlSampler(interval_s=0.05, slow_interval_s=0.5)
    with s:
        time.sleep(1.0)                         # idle baseline
        t_load = s.mark("matmul loop")
        a = torch.randn(8192, 8192, device=dev)
        b = torch.randn(8192, 8192, device=dev)
        torch.cuda.synchronize()
        end = time.perf_counter() + 4.0
        while time.perf_counter() < end:
            for _ in range(8):
                c = a @ b
            torch.cuda.synchronize()
        t_done = s.mark("loop done")
        del c
        torch.cuda.synchronize()
        reserved0 = torch.cuda.memory_reserved(dev)
        time.sleep(0.6)
        t_m0 = s.mark("before 4 GiB")
        big = torch.empty(4 * GIB, dtype=torch.uint8, device=dev)
        big.fill_(1)
        torch.cuda.synchronize()
        reserved1 = torch.cuda.memory_reserved(dev)
        t_m1 = s.mark("after 4 GiB")
        time.sleep(0.6)
        t_end = s.mark("end")
    assert not s.running and _workbench_threads() == [] and s.error is None

    f = s.frame()
    assert set(f.gpu) == set(s.gpus) and idx in s.gpus
    g = f[f.gpu == idx]
    assert len(g) >= 100  # ~7.5 s at 20 Hz

    # utilization: the loop keeps the GPU busy; before it, it was not (much) busy
    busy = _median_between(f, idx, "util_gpu_pct", t_load + 1.0, t_done)
    idle = _median_between(f, idx, "util_gpu_pct", 0.0, t_load)
    assert busy >= 80, f"median utilization during the matmul loop: {busy}%"
    assert busy > idle + 30, (busy, idle)
    assert _median_between(f, idx, "power_w", t_load + 1.0, t_done) > _median_between(f, idx, "power_w", 0.0, t_load)

    # memory: NVML's device-wide 'used' = torch's reserved pool + the CUDA context (~500 MiB on an
    # H200) + whatever else runs there; be generous on the absolute, strict on the difference
    used0 = _median_between(f, idx, "mem_used_bytes", t_done + 0.3, t_m0)
    context_and_rest = used0 - reserved0
    assert 100 * MIB < context_and_rest < 4 * GIB, (
        f"NVML used {used0 / GIB:.2f} GiB vs torch reserved {reserved0 / GIB:.2f} GiB")
    used1 = _median_between(f, idx, "mem_used_bytes", t_m1 + 0.2, t_end)
    assert abs((used1 - used0) - (reserved1 - reserved0)) < 256 * MIB, (
        f"NVML grew {(used1 - used0) / GIB:.2f} GiB, torch reserved grew {(reserved1 - reserved0) / GIB:.2f} GiB")
    assert g.mem_total_bytes.iloc[-1] > 100 * GIB or g.mem_total_bytes.iloc[-1] > used1

    # every fast metric answered on this GPU; reasons decoded to names (possibly empty), not missing
    for col in ("util_gpu_pct", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz"):
        assert g[col].notna().all(), col
    assert g.throttle_reasons.map(lambda r: isinstance(r, str)).all()
    # slow cadence: energy counter filled and not decreasing, PCIe filled or reported unsupported
    e = g.energy_j.dropna()
    assert len(e) > 0 and (np.diff(e.to_numpy()) >= 0).all() and e.iloc[-1] > e.iloc[0]
    assert g.pcie_tx_bytes_per_s.notna().any() or (idx, "pcie_tx") in s.unsupported
    del big, a, b
    torch.cuda.empty_cache()


def test_not_supported_metric_is_a_missing_value_on_real_hardware():
    from workbench.capture.nvml import nvml_query, open_nvml

    nv = open_nvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    kinds = []
    fan = nvml_query(nv.nvmlDeviceGetFanSpeed, h, on_error=lambda k, e: kinds.append(k))
    assert (isinstance(fan, (int, float)) and not kinds) or (math.isnan(fan) and kinds == ["unsupported"])


def test_hundred_hz_on_every_gpu_and_restart_cycles():
    from workbench.capture.nvml import NvmlSampler

    s = NvmlSampler(interval_s=0.01, slow_interval_s=None)
    with s:
        time.sleep(2.0)
    st = s.stats()
    per_gpu = s.frame().groupby("gpu").size()
    assert len(per_gpu) == len(s.gpus) >= 1
    assert per_gpu.min() >= 150, f"{per_gpu.to_dict()} rows in 2 s at 100 Hz ({st})"
    assert st["cpu_fraction"] < 0.25, st  # the benchmark measures the real figure (target < 1%)
    for _ in range(50):
        s.start()
        s.stop()
    assert _workbench_threads() == []
    assert s.frame().t_s.is_monotonic_increasing


def test_panel_and_cli_on_real_nvml(tmp_path):
    from workbench.capture.nvml import NvmlSampler
    from workbench.io.nvml import load_nvml_session
    from workbench.panels.nvml import LiveGpuPanel

    p = LiveGpuPanel(refresh_s=0.1)
    try:
        assert isinstance(p.sampler, NvmlSampler)
        time.sleep(1.0)
        assert p.status.value.startswith("NVML, ")
        assert p.redraws >= 3 and len(p.figure.data[0].x) > 0
    finally:
        p.close()
    assert not p.sampler.running and _workbench_threads() == []

    out = tmp_path / "gpu.csv"
    r = subprocess.run([sys.executable, "-m", "workbench", "monitor", "--duration", "2", "--interval", "0.5",
                        "--csv", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("gpu") >= 3 and " MHz" in r.stdout
    assert len(load_nvml_session(out)) >= 3


def test_direct_reads_agree_with_pynvml_on_real_hardware():
    """The sampler's ctypes reads and pynvml's own functions read the same GPU state."""
    from workbench.capture.nvml import _direct_reads, _pynvml_reads, open_nvml
    from workbench.capture.sampler import RING_COLUMNS

    nv = open_nvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    direct = _direct_reads(nv, h)
    assert direct is not None, "libnvidia-ml could not be called directly"
    assert [r.name for r in direct] == [r.name for r in _pynvml_reads(nv, h)]

    def row(reads):
        out = {}
        for r in reads:
            rc = r.call(*r.args)
            assert rc == 0 or r.name not in ("memory", "utilization", "power", "temperature"), (r.name, rc)
            if rc == 0:
                out.update({RING_COLUMNS[col]: getattr(obj, attr) * scale for col, obj, attr, scale in r.outs})
        return out

    a, b = row(direct), row(_pynvml_reads(nv, h))
    assert a.keys() == b.keys()
    assert a["mem_total_bytes"] == b["mem_total_bytes"] == nv.nvmlDeviceGetMemoryInfo(h).total
    assert abs(a["mem_used_bytes"] - b["mem_used_bytes"]) < 256 * MIB
    assert abs(a["temp_c"] - b["temp_c"]) <= 3
    assert a["mem_clock_mhz"] == b["mem_clock_mhz"]
    assert 0 < a["power_w"] < 2000 and 0 < b["power_w"] < 2000
    assert 0 <= a["util_gpu_pct"] <= 100


def test_cadence_follows_the_driver_and_rows_carry_values():
    from workbench.capture.nvml import NvmlSampler

    s = NvmlSampler(interval_s=0.01, slow_interval_s=None)
    with s:
        time.sleep(1.5)
    cad = s.cadence().set_index("metric")
    every = cad["every_s"]
    # NVML's own reads go through the ctypes fast path; the GPM counters (Hopper+) through pynvml's API
    assert set(cad.loc[~cad.index.str.startswith("gpm"), "reader"]) == {"direct"}
    assert every["memory"] == pytest.approx(0.01) and every["throttle"] == pytest.approx(0.01)
    assert every["temperature"] == pytest.approx(0.1)
    refresh = cad["driver_refresh_s"]
    for metric in ("power", "utilization"):  # the driver keeps samples of both on an H200
        assert 0 < refresh[metric] <= 1.0, cad
        assert every[metric] == pytest.approx(max(0.01, round(refresh[metric] / 0.01) * 0.01))
    f = s.frame()
    # a metric read every k-th tick still has a value on every row
    for col in ("util_gpu_pct", "power_w", "temp_c", "mem_clock_mhz", "mem_used_bytes"):
        assert f[col].notna().all(), col
    # and utilization really is read less often than rows are written: fewer distinct runs than rows
    runs = (f.util_gpu_pct.diff() != 0).sum()
    assert runs <= len(f) / 2 + 1
    s2 = NvmlSampler(interval_s=0.01, slow_interval_s=None, cadence_s={"utilization": 0.0})
    with s2:
        time.sleep(0.2)
    assert s2.cadence().set_index("metric").loc["utilization", "every_s"] == pytest.approx(0.01)


def test_processes_lists_this_process_with_its_memory():
    """gpu_processes: after this process holds 1 GiB on cuda:0, NVML lists its PID on that GPU with at
    least that much GPU memory (when the driver reports it) and its command line."""
    import os

    import torch

    from workbench.capture.nvml import gpu_processes

    x = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    gpu = _nvml_index_of_cuda0()
    mine = [p for p in gpu_processes() if p["pid"] == os.getpid() and p["gpu"] == gpu]
    del x
    if not mine:
        pytest.skip("NVML lists no process of this PID namespace (a container shows host PIDs)")
    p = mine[0]
    assert p["kind"] == "compute" and "python" in p["name"]
    assert math.isnan(p["used_bytes"]) or p["used_bytes"] >= GIB


def test_monitor_screen_in_a_pty_on_real_nvml():
    """In a pseudo-terminal, `workbench monitor` draws its screen with the NVML GPUs and the processes table."""
    import os
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "workbench", "monitor", "--duration", "2", "--interval", "0.5"],
                         stdout=slave, stdin=slave, stderr=subprocess.PIPE, close_fds=True)
    os.close(slave)
    buf = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        buf += data
    p.wait(timeout=60)
    os.close(master)
    text = buf.decode(errors="replace")
    assert p.returncode == 0, p.stderr.read()
    assert "workbench monitor" in text and "NVML" in text and "gpu0" in text and "power" in text
    assert "session peaks:" in text and ("processes on the GPUs (NVML)" in text or "no processes" in text)

"""GPM columns without a GPU: the shared H200 NVML+GPM recording through `workbench monitor` (lines, --csv,
--prometheus), the live panel's counters row, and the sampler's checks that need no device (DCGM detection
on a real process, the pacing floor). Live GPM values on the H200: tests/gpu/test_gpm.py."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from testdata import default_sigint

from workbench import samples
from workbench.io.nvml import GPM_COLUMNS, load_nvml_session

GPM = samples.path("h200_gpm_session")
EXE = [sys.executable, "-m", "workbench", "monitor"]


def _rows():
    with gzip.open(GPM, "rt") as f:
        return [json.loads(line) for line in f]


def test_monitor_lines_and_csv_carry_the_gpm_columns(tmp_path):
    out = tmp_path / "s.jsonl.gz"
    r = subprocess.run(EXE + ["--replay", str(GPM), "--speed", "20", "--interval", "0.05", "--csv", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(re.search(r"SM +\d+% occ +\d+% tensor +\d+% dram +\d+%$", line) for line in lines), lines[:3]
    back, rows = load_nvml_session(out), _rows()
    assert len(back) == len(rows)
    # bytes/s from the recording's MiB/s; percentages as recorded
    np.testing.assert_allclose(back["gpm_tensor_util_pct"], [r["gpm_any_tensor_util"] for r in rows])
    np.testing.assert_allclose(back["gpm_pcie_rx_bytes_per_s"], [r["gpm_pcie_rx_per_sec"] * 2**20 for r in rows])
    np.testing.assert_allclose(back["time_ns"].to_numpy(dtype=float), [r["time_ns"] for r in rows], rtol=0, atol=512)
    assert [m["label"] for m in back.attrs["marks"]][:2] == ["idle", "tiny_kernels"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_serves_the_gpm_gauges():
    port = _free_port()
    p = subprocess.Popen(EXE + ["--replay", str(GPM), "--loop", "--speed", "4", "--interval", "0.1", "--prometheus",
                                str(port), "--bind", "127.0.0.1", "--quiet", "--duration", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    seen: dict[str, list[float]] = {}
    try:
        deadline = time.time() + 40
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
                for name, v in re.findall(r'^(workbench_gpu_\w+)\{gpu="0"\} (\S+)$', text, re.M):
                    seen.setdefault(name, []).append(float(v))
                if max(seen.get("workbench_gpu_tensor_activity_percent", [0])) > 50 and max(
                        seen.get("workbench_gpu_dram_bandwidth_percent", [0])) > 50:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    # the GEMM phase's tensor activity and the copy phase's DRAM bandwidth both reached the scraper
    assert max(seen["workbench_gpu_tensor_activity_percent"]) > 50
    assert max(seen["workbench_gpu_dram_bandwidth_percent"]) > 50
    assert "workbench_gpu_sm_activity_percent" in seen and "workbench_gpu_sm_occupancy_percent" in seen


def test_the_live_panel_draws_a_counters_row_when_the_session_has_them():
    from workbench.capture.sampler import ReplaySampler
    from workbench.panels.nvml import LiveGpuPanel

    s = ReplaySampler(GPM, speed=1000)
    s.start()
    assert s.wait(timeout=20)
    p = LiveGpuPanel(s, window_s=60, autostart=False)
    try:
        ref = s.frame()
        assert p.counters
        by_col = {t.meta["column"]: t for t in p.figure.data}
        assert {"gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct"} <= set(by_col)
        np.testing.assert_allclose(by_col["gpm_tensor_util_pct"].y, ref["gpm_tensor_util_pct"])
        titles = [a.text for a in p.figure.fig.layout.annotations]
        assert any(t.startswith("GPM counters") for t in titles)
        assert re.search(r"SM \d+% tensor \d+% DRAM \d+%", p.status.value)
    finally:
        p.close()
    # a session without GPM values keeps the four rows
    from workbench.figures.nvml import live_gpu_figure

    plain = live_gpu_figure(load_nvml_session(samples.path("h200_nvml_session")))
    assert not any(t.meta["column"] in GPM_COLUMNS for t in plain.data)


def test_dcgm_host_engine_is_noticed_in_the_process_table(tmp_path):
    from workbench.capture.nvml import dcgm_processes

    if not os.path.isdir("/proc"):
        pytest.skip("no /proc on this system")
    exe = tmp_path / "nv-hostengine"           # a real process whose name is DCGM's host engine
    shutil.copy2(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "30"])
    try:
        deadline = time.time() + 5
        while f"nv-hostengine (pid {proc.pid})" not in dcgm_processes() and time.time() < deadline:
            time.sleep(0.05)
        assert f"nv-hostengine (pid {proc.pid})" in dcgm_processes()
    finally:
        proc.kill()
        proc.wait()
    assert f"nv-hostengine (pid {proc.pid})" not in dcgm_processes()


def test_gpm_pairs_closer_than_50_ms_are_refused():
    from workbench.capture.nvml import NvmlSampler
    from workbench.errors import BadArgument

    with pytest.raises(BadArgument, match="at least 0.05 s"):
        NvmlSampler(gpm_interval_s=0.02)
    s = NvmlSampler(gpm=False)   # nothing opened: NVML is touched on start() only
    assert s.gpm is False and s.notes == [] and not s.gpm_supported

"""Alerts and the per-GPU summary, on the H200 recording and on frames built to hit each threshold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.analysis.nvml import ALERT_COLUMNS, AlertThresholds, gpu_alerts, gpu_summary
from workbench.io.nvml import load_nvml_session

GIB = 2**30


@pytest.fixture(scope="module")
def h200():
    return load_nvml_session(samples.path("h200_nvml_session"))


def _runs_below(t, u, limit):
    """Independent loop: (start, end) of each run of samples with u < limit."""
    runs, start, prev = [], None, None
    for ti, ui in zip(t, u):
        if ui < limit:
            if start is None:
                start = ti
            prev = ti
        elif start is not None:
            runs.append((start, prev))
            start = None
    if start is not None:
        runs.append((start, prev))
    return runs


def test_recording_has_no_alert_with_default_thresholds(h200):
    a = gpu_alerts(h200)
    assert a.empty and list(a.columns) == ALERT_COLUMNS


def test_low_utilization_runs_match_an_independent_count(h200):
    th = AlertThresholds(low_util_pct=60, low_util_s=3.0)
    a = gpu_alerts(h200, th)
    expected = [(s, e) for s, e in _runs_below(h200.t_s, h200.util_gpu_pct, 60) if e - s >= 3.0]
    assert len(expected) >= 2  # idle start and idle end of the recording
    got = a[a.kind == "low_utilization"]
    assert list(zip(got.start_s, got.end_s)) == expected
    last = got.iloc[-1]
    assert bool(last.ongoing) == (last.end_s == h200.t_s.iloc[-1])
    first = got.iloc[0]
    window = h200[(h200.t_s >= first.start_s) & (h200.t_s <= first.end_s)]
    assert first.value == pytest.approx(window.util_gpu_pct.mean())
    assert "below 60%" in first.message and first.severity == "warning"


def _frame(n=11, dt=1.0, gpu=0, **cols):
    base = {
        "t_s": np.arange(n) * dt, "gpu": gpu, "util_gpu_pct": 95.0, "util_mem_pct": 20.0,
        "mem_used_bytes": 10 * GIB, "mem_total_bytes": 100 * GIB, "power_w": 300.0, "temp_c": 60.0,
        "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0, "throttle_reasons": "",
    }
    base.update(cols)
    return pd.DataFrame(base)


def test_sustained_low_utilization_needs_the_full_duration():
    # 10 samples a minute apart below 60% span 9 minutes; 5 minutes is the default
    f = _frame(n=10, dt=60.0, util_gpu_pct=[10.0] * 10)
    a = gpu_alerts(f)
    assert a.kind.tolist() == ["low_utilization"] and a.duration_s.iloc[0] == 540.0
    assert "9.0 min" in a.message.iloc[0]
    # 4 minutes is not enough; a high sample in the middle splits the run
    assert gpu_alerts(_frame(n=5, dt=60.0, util_gpu_pct=[10.0] * 5)).empty
    split = [10.0] * 4 + [99.0] + [10.0] * 5
    assert gpu_alerts(_frame(n=10, dt=60.0, util_gpu_pct=split)).empty
    # a missing value breaks the run too (unknown is not low)
    gap = [10.0] * 4 + [np.nan] + [10.0] * 5
    assert gpu_alerts(_frame(n=10, dt=60.0, util_gpu_pct=gap)).empty
    # a threshold can be turned off
    assert gpu_alerts(f, AlertThresholds(low_util_pct=None)).empty


def test_memory_above_90_percent():
    used = [10 * GIB] * 5 + [92 * GIB, 99 * GIB, 91 * GIB] + [10 * GIB] * 3
    a = gpu_alerts(_frame(mem_used_bytes=used))
    assert a.kind.tolist() == ["memory_high"]
    r = a.iloc[0]
    assert (r.start_s, r.end_s) == (5.0, 7.0) and r.value == pytest.approx(99.0)
    assert r.severity == "critical" and "99.0% full (99.0/100.0 GiB)" in r.message and not r.ongoing
    assert gpu_alerts(_frame(mem_used_bytes=used), AlertThresholds(mem_high_pct=99.5)).empty
    assert gpu_alerts(_frame(mem_used_bytes=used), AlertThresholds(mem_high_s=5.0)).empty


def test_throttling_power_and_thermal_but_not_idle():
    reasons = ["", "gpu_idle", "gpu_idle", "sw_power_cap", "sw_power_cap", "", "", "sw_thermal,sw_power_cap",
               "hw_thermal", None, "applications_clocks"]
    a = gpu_alerts(_frame(throttle_reasons=reasons))
    assert a.kind.tolist() == ["throttling", "throttling"]
    assert (a.start_s.tolist(), a.end_s.tolist()) == ([3.0, 7.0], [4.0, 8.0])
    assert a.severity.tolist() == ["warning", "critical"]
    assert "sw_power_cap, sw_thermal" in a.message.iloc[1] and "hw_thermal" in a.message.iloc[1]
    only_thermal = AlertThresholds(throttle_reasons=("hw_thermal",))
    assert gpu_alerts(_frame(throttle_reasons=reasons), only_thermal).start_s.tolist() == [8.0]


def test_temperature_threshold_is_opt_in():
    temps = [60.0] * 8 + [88.0, 90.0, 87.0]
    assert gpu_alerts(_frame(temp_c=temps)).empty
    a = gpu_alerts(_frame(temp_c=temps), AlertThresholds(temp_c=85))
    assert a.kind.tolist() == ["temperature_high"] and a.value.iloc[0] == 90.0 and a.ongoing.iloc[0]


def test_gpus_are_judged_separately():
    low = _frame(n=10, dt=60.0, gpu=0, util_gpu_pct=[5.0] * 10)
    busy = _frame(n=10, dt=60.0, gpu=1, util_gpu_pct=[5.0] * 2 + [99.0] * 8)
    a = gpu_alerts(pd.concat([busy, low]))
    assert a.gpu.tolist() == [0]


def test_summary_energy_and_peaks(h200):
    s = gpu_summary(h200).iloc[0]
    assert s.samples == 427
    assert s.mem_used_peak_bytes == h200.mem_used_bytes.max()
    assert s.power_peak_w == pytest.approx(h200.power_w.max())
    # no energy counter in this recording: the integral of power over time
    t, p = h200.t_s.to_numpy(), h200.power_w.to_numpy()
    assert s.energy_j == pytest.approx(float(np.sum((p[1:] + p[:-1]) / 2 * np.diff(t))))
    # with the counter, its difference wins
    f = _frame(energy_j=np.linspace(1000.0, 1250.0, 11), throttle_reasons=[""] * 8 + ["sw_power_cap"] * 3)
    s2 = gpu_summary(f).iloc[0]
    assert s2.energy_j == pytest.approx(250.0)
    assert s2.throttled_fraction == pytest.approx(3 / 11)


@pytest.fixture(scope="module")
def h200_gpm():
    return load_nvml_session(samples.path("h200_gpm_session"))


def test_low_sm_activity_catches_the_tiny_kernel_loop_that_utilization_passes(h200_gpm):
    # the shipped GPM session: the tiny-kernel loop keeps NVML utilization around 20% (so a 15% limit
    # passes it) while SM activity stays near 0; the SM-activity alert covers it, the utilization one not
    th = AlertThresholds(low_util_pct=15, low_util_s=2.0, low_sm_pct=60, low_sm_s=2.0)
    a = gpu_alerts(h200_gpm, th)
    marks = {m["label"]: m["t_s"] for m in h200_gpm.attrs["marks"] if m["label"] != "idle"}
    tiny = (marks["tiny_kernels"] + 0.5, marks["bf16_gemm"] - 0.1)
    inside = h200_gpm[(h200_gpm.t_s >= tiny[0]) & (h200_gpm.t_s <= tiny[1])]
    assert inside.util_gpu_pct.median() > 15 and inside.gpm_sm_util_pct.max() < 1  # the recording says so

    def covers(rows):
        return any(r.start_s <= tiny[0] and r.end_s >= tiny[1] for r in rows.itertuples())

    assert covers(a[a.kind == "low_sm_activity"])
    assert not covers(a[a.kind == "low_utilization"])
    first = a[a.kind == "low_sm_activity"].iloc[0]
    window = h200_gpm[(h200_gpm.t_s >= first.start_s) & (h200_gpm.t_s <= first.end_s)]
    assert first.value == pytest.approx(window.gpm_sm_util_pct.mean())
    assert "SM activity" in first.message and "NVML utilization read" in first.message
    # the GEMM and copy phases (SM activity ~96%) are never inside an episode
    busy = h200_gpm[(h200_gpm.t_s > marks["bf16_gemm"] + 0.5) & (h200_gpm.t_s < marks["copy_bound"] - 0.1)]
    for r in a[a.kind == "low_sm_activity"].itertuples():
        assert not ((busy.t_s >= r.start_s) & (busy.t_s <= r.end_s)).any()


def test_low_sm_activity_needs_gpm_and_the_full_duration(h200):
    # no GPM columns' values (the NVML-only session): no SM alert, whatever the threshold
    assert "low_sm_activity" not in gpu_alerts(h200, AlertThresholds(low_sm_pct=100, low_sm_s=0)).kind.tolist()
    f = _frame(n=11, dt=60.0, gpm_sm_util_pct=[5.0] * 6 + [90.0] + [5.0] * 4)
    a = gpu_alerts(f)   # defaults: 60% for 5 minutes; runs of 5 min (0..300 s) and 3 min
    got = a[a.kind == "low_sm_activity"]
    assert list(zip(got.start_s, got.end_s)) == [(0.0, 300.0)]
    assert gpu_alerts(f, AlertThresholds(low_sm_pct=None)).query("kind == 'low_sm_activity'").empty

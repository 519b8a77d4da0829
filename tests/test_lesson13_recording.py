"""The H200 recording of notebook 13 (monitoring): what the notebook claims about it holds in the files.

``workbench/samples/results/h200_lesson13.json`` (the recorder's summary), the session it sampled
(sample ``h200_monitoring_session``) and the energy counter read at ~100 Hz
(``results/h200_lesson13_energy.json.gz``), all from ``benchmarks/record_lesson13_h200.py``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.nvml import AlertThresholds, gpu_alerts, gpu_summary, interval_stats
from workbench.capture.nvml import ReplaySampler
from workbench.io.nvml import load_nvml_session
from workbench.lessons import RESULTS

SESSION = Path(samples.__file__).parent / "h200_monitoring_session.jsonl.gz"   # sample h200_monitoring_session
pytestmark = pytest.mark.skipif(
    not all(p.exists() for p in (RESULTS / "h200_lesson13.json", RESULTS / "h200_lesson13_energy.json.gz", SESSION)),
    reason="the H200 recording of notebook 13 is pending (benchmarks/record_lesson13_h200.py)")

PHASES = ["idle", "tiny_kernels", "tiny_graph", "bf16_gemm", "copy", "memory_full", "idle_end"]
_trapz = getattr(np, "trapezoid", None) or np.trapz


@pytest.fixture(scope="module")
def rec():
    return json.loads((RESULTS / "h200_lesson13.json").read_text())


@pytest.fixture(scope="module")
def session():
    return load_nvml_session(SESSION)


@pytest.fixture(scope="module")
def fast():
    with gzip.open(RESULTS / "h200_lesson13_energy.json.gz", "rt") as f:
        d = json.load(f)
    return {k: np.asarray(v, float) for k, v in d.items()}


@pytest.fixture(scope="module")
def phases(rec):
    return {p["name"]: p for p in rec["phases"]}


def rows(frame, rec, p, edge=True):
    lo, hi = (p["start_s"] + rec["edge_s"], p["end_s"] - rec["tail_s"]) if edge else (p["start_s"], p["end_s"])
    return frame[(frame.t_s >= lo) & (frame.t_s <= hi)]


def test_a_real_h200_run_with_every_phase(rec, phases):
    assert not rec["smoke"] and not rec["errors"], rec["errors"]
    assert "H200" in rec["env"]["nvml_gpu"] and rec["gpm_supported"]
    assert list(phases) == PHASES and not rec["skipped"]
    starts = [p["start_s"] for p in rec["phases"]]
    ends = [p["end_s"] for p in rec["phases"]]
    assert all(e - s >= 8.0 for s, e in zip(starts, ends))
    assert all(e <= s2 for e, s2 in zip(ends, starts[1:]))       # in order, no overlap


def test_no_local_paths_in_the_files(rec):
    text = json.dumps(rec) + SESSION.read_bytes().decode("latin-1")
    for prefix in ("/home/", "/tmp/", "/root/", "/work/", "/Users/"):
        assert prefix not in text


def test_session_is_the_sampler_format_with_gpm_and_the_phase_marks(rec, session, phases):
    assert SESSION.stat().st_size < 2_000_000
    assert session.gpm_sm_util_pct.notna().mean() > 0.9 and session.time_ns.notna().all()
    marks = {m["label"]: m["t_s"] for m in session.attrs["marks"]}
    for name, p in phases.items():
        assert marks[name] == pytest.approx(p["start_s"], abs=1e-3)
    # 20 Hz rows, one GPU
    assert np.median(np.diff(session.t_s)) == pytest.approx(0.05, rel=0.2) and set(session.gpu) == {0}
    replay = ReplaySampler(SESSION, speed=1e6)
    assert replay.has_gpm and len(replay.gpus) == 1


def test_phase_medians_follow_from_the_session(rec, session, phases):
    cols = {"nvml_util_pct": "util_gpu_pct", "sm_activity_pct": "gpm_sm_util_pct",
            "tensor_activity_pct": "gpm_tensor_util_pct", "dram_activity_pct": "gpm_dram_bw_util_pct",
            "power_w": "power_w"}
    for name, p in phases.items():
        inner = rows(session, rec, p)
        assert len(inner) >= 100          # 20 Hz over more than 7 s
        for key, col in cols.items():
            assert rec["phase_stats"][name][key] == pytest.approx(inner[col].median(), rel=1e-6, abs=1e-6), (name, key)


def test_tiny_kernels_read_busy_to_nvml_and_idle_to_gpm(rec):
    st = rec["phase_stats"]
    tiny = max(("tiny_kernels", "tiny_graph"), key=lambda n: st[n]["nvml_util_pct"])
    assert st[tiny]["nvml_util_pct"] >= 50 and st[tiny]["sm_activity_pct"] < 5
    g, c = st["bf16_gemm"], st["copy"]
    assert g["nvml_util_pct"] >= 90 and g["sm_activity_pct"] >= 80 and g["tensor_activity_pct"] >= 50
    assert c["tensor_activity_pct"] < 5 and c["dram_activity_pct"] > 50
    assert g["power_w"] > 2 * st[tiny]["power_w"]


def test_memory_phase_alone_is_above_90_percent(rec, session, phases):
    for name, p in phases.items():
        whole = rows(session, rec, p, edge=False)
        pct = 100 * whole.mem_used_bytes.max() / whole.mem_total_bytes.max()
        assert (pct > 90) == (name == "memory_full"), (name, pct)
    info = rec["memory_full"]
    assert info["allocated_bytes"] > 0 and info["nvml_used_after_bytes"] > 0.9 * info["total_bytes"]


def test_energy_counter_over_phases_and_short_windows(rec, session, phases, fast):
    t, e, p = fast["t_s"], fast["energy_mj"] / 1e3, fast["power_mw"] / 1e3
    assert (np.diff(e) >= 0).all() and (np.diff(t) > 0).all()
    bounds = {(b["phase"], b["at"]): b for b in rec["energy"]["boundaries"]}
    for name, ph in phases.items():
        row = rec["energy"]["by_phase"][name]
        b0, b1 = bounds[(name, "start")], bounds[(name, "end")]
        assert row["counter_j"] == pytest.approx((b1["energy_mj"] - b0["energy_mj"]) / 1e3)
        m = (t >= ph["start_s"]) & (t <= ph["end_s"])
        assert row["fast_power_integral_j"] == pytest.approx(_trapz(p[m], t[m]), rel=1e-9)
        # a whole phase: power x time and the counter agree within 5%
        assert abs(row["fast_power_integral_j"] / row["counter_j"] - 1) < 0.05, name
        # gpu_summary on the session's rows: its energy column (read every 0.25 s) vs its power integral
        whole = rows(session, rec, ph, edge=False)
        from_counter = gpu_summary(whole).energy_j.iloc[0]
        from_power = gpu_summary(whole.drop(columns="energy_j")).energy_j.iloc[0]
        assert abs(from_counter / from_power - 1) < 0.1, name
    # the counter moves in steps, slower than it was read
    changes = t[1:][np.diff(e) != 0]
    assert np.median(np.diff(changes)) == pytest.approx(rec["energy"]["counter_updates"]["update_interval_median_s"], rel=1e-6)
    assert np.median(np.diff(changes)) > 2 * np.median(np.diff(t))
    # short windows misread: 0.5 s windows stray further than any whole phase
    half = rec["energy"]["windows"]["0.5"]["abs_err_max_pct"]
    worst_phase = max(abs(r["fast_power_integral_j"] / r["counter_j"] - 1) * 100 for r in rec["energy"]["by_phase"].values())
    assert half > 3 * worst_phase


def test_power_under_the_enforced_limit(rec, session):
    pw = rec["power"]
    assert pw["enforced_limit_w"] > 0 and pw["default_limit_w"] > 0
    assert session.power_w.max() <= 1.05 * pw["enforced_limit_w"]


def test_alerts_sm_rule_covers_the_tiny_kernels_the_utilization_rule_passes(rec, session, phases):
    a = gpu_alerts(session, AlertThresholds(low_util_s=5.0, low_sm_s=5.0))
    st = rec["phase_stats"]
    tiny = max(("tiny_kernels", "tiny_graph"), key=lambda n: st[n]["nvml_util_pct"])

    def covering(kind, name):
        inner = rows(session, rec, phases[name])
        k = a[a.kind == kind]
        return k[(k.start_s <= inner.t_s.min()) & (k.end_s >= inner.t_s.max())]

    assert len(covering("low_sm_activity", tiny)) == 1 and covering("low_utilization", tiny).empty
    assert covering("low_sm_activity", "bf16_gemm").empty and covering("low_utilization", "bf16_gemm").empty
    mem = a[a.kind == "memory_high"]
    assert len(mem) == 1 and len(covering("memory_high", "memory_full")) == 1
    assert mem.start_s.iloc[0] >= phases["memory_full"]["start_s"]
    assert mem.end_s.iloc[0] <= phases["idle_end"]["start_s"] + 0.5
    assert gpu_alerts(session).query("kind in ['low_utilization', 'low_sm_activity']").empty  # 5 min defaults
    # the monitor's interval means say the same as the medians about the tiny phase
    s = interval_stats(rows(session, rec, phases[tiny])).iloc[0]
    assert s.util_gpu_mean_pct > 10 * s.gpm_sm_util_mean_pct

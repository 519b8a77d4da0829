"""The H200 recording of notebook 13 (monitoring): what the notebook claims about it holds in the files.

``workbench/samples/results/h200_lesson13.json`` (the recorder's summary), the session it sampled
(sample ``h200_monitoring_session``) and the energy counter read at ~100 Hz
(``results/h200_lesson13_energy.json.gz``), all from ``benchmarks/record_lesson13_h200.py``.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.nvml import AlertThresholds, gpu_alerts, gpu_summary, interval_stats
from workbench.capture.sampler import ReplaySampler
from workbench.io.nvml import load_nvml_session
from workbench.lessons import RESULTS

SESSION = samples.path("h200_monitoring_session")


def test_the_recording_is_shipped():
    # the notebook reads these three files; without them it cannot run
    for p in (RESULTS / "h200_lesson13.json", RESULTS / "h200_lesson13_energy.json.gz", SESSION):
        assert p.is_file() and p.stat().st_size > 1000, p
    assert "h200_monitoring_session" in samples.names("nvml")


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


def _counter_steps(fast):
    t, e = fast["t_s"], fast["energy_mj"] / 1e3
    at = np.flatnonzero(np.diff(e)) + 1
    return t, e, at


def test_energy_counter_steps_every_tenth_of_a_second(rec, fast):
    t, e, at = _counter_steps(fast)
    assert (np.diff(e) >= 0).all() and (np.diff(t) > 0).all()
    assert np.median(np.diff(t)) == pytest.approx(0.01, abs=0.001)          # read ~100 times a second
    upd = np.median(np.diff(t[at]))
    assert upd == pytest.approx(rec["energy"]["counter_updates"]["update_interval_median_s"], rel=1e-6)
    assert upd == pytest.approx(0.1, abs=0.005) and upd > 5 * np.median(np.diff(t))
    assert rec["energy"]["trace_errors"] == 0 and rec["instant_power"] == "read"


def _window_rows(fast, w):
    """Windows of w s laid end to end (as the recorder): |counter / power-reading integral - 1| in %, the
    counter's steps in the window, and the error with the counter interpolated between its updates."""
    t, e, at = _counter_steps(fast)
    p = fast["power_mw"] / 1e3
    out, start = [], t[0]
    while start + w <= t[-1]:
        i0, i1 = np.searchsorted(t, [start, start + w])
        i1 = min(i1, len(t) - 1)
        if i1 - i0 >= 2:
            integ = _trapz(p[i0:i1 + 1], t[i0:i1 + 1])
            if integ > 0:
                ei = np.interp([t[i0], t[i1]], t[at], e[at])
                out.append((abs((e[i1] - e[i0]) / integ - 1) * 100, int(((at > i0) & (at <= i1)).sum()),
                            abs((ei[1] - ei[0]) / integ - 1) * 100))
        start += w
    return np.asarray(out)


def test_short_windows_alias_with_the_counters_steps(rec, fast):
    # the recorder's table, recomputed from the 100 Hz trace
    for key, r in rec["energy"]["windows"].items():
        d = _window_rows(fast, float(key))
        assert len(d) == r["windows"] and np.median(d[:, 0]) == pytest.approx(r["abs_err_median_pct"], rel=1e-9)
    # 0.25 s windows hold 2 or 3 of the 0.1 s steps: 20% low or high; interpolating removes it
    d = _window_rows(fast, 0.25)
    assert set(d[:, 1].astype(int)) == {2, 3}
    assert 15 < np.median(d[:, 0]) < 25 and np.median(d[:, 2]) < 1
    # windows off the multiples of 0.1 s alias too; multiples hold exactly w / 0.1 steps
    for w in (0.15, 0.55, 1.05):
        d = _window_rows(fast, w)
        assert len(set(d[:, 1].astype(int))) == 2 and np.median(d[:, 0]) > 2 and np.median(d[:, 2]) < 1, w
    for w in (0.5, 2.0):
        assert set(_window_rows(fast, w)[:, 1].astype(int)) == {round(w / 0.1)}, w


def test_power_reading_is_a_one_second_running_mean(fast):
    t, p, q = fast["t_s"], fast["power_mw"] / 1e3, fast["power_instant_mw"] / 1e3
    assert np.isfinite(q).all()
    cum = np.concatenate([[0.0], np.cumsum(0.5 * (q[1:] + q[:-1]) * np.diff(t))])
    rms = {}
    for tau in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0):
        keep = t >= t[0] + tau
        mean = (cum - np.interp(t - tau, t, cum)) / tau
        rms[tau] = np.sqrt(np.mean((mean[keep] - p[keep]) ** 2))
    best = min(rms, key=rms.get)
    assert 0.75 <= best <= 1.25, rms
    assert rms[best] < 0.5 * np.sqrt(np.mean((q - p) ** 2))


def test_energy_over_whole_phases(rec, session, phases, fast):
    t, p = fast["t_s"], fast["power_mw"] / 1e3
    bounds = {(b["phase"], b["at"]): b for b in rec["energy"]["boundaries"]}
    stepped = set()
    for name, ph in phases.items():
        row = rec["energy"]["by_phase"][name]
        b0, b1 = bounds[(name, "start")], bounds[(name, "end")]
        assert row["counter_j"] == pytest.approx((b1["energy_mj"] - b0["energy_mj"]) / 1e3)
        m = (t >= ph["start_s"]) & (t <= ph["end_s"])
        assert row["fast_power_integral_j"] == pytest.approx(_trapz(p[m], t[m]), rel=1e-9)
        err = row["fast_power_integral_j"] / row["counter_j"] - 1
        step = p[m][0] - rec["phase_stats"][name]["power_w"]      # the load change the running mean remembers
        if abs(step) < 50:
            assert abs(err) < 0.01, name                            # steady: power x time = counter
        elif abs(step) > 300:
            stepped.add(name)
            assert abs(err) > 0.05 and np.sign(err) == np.sign(step), name
            # about step x tau/2 with tau ~ 1 s
            lag = (row["fast_power_integral_j"] - row["counter_j"]) / (step * 0.5)
            assert 1 / 1.5 < lag < 1.5, (name, lag)
            assert abs(row["fast_instant_power_integral_j"] / row["counter_j"] - 1) < abs(err), name
        # the median power times the duration, and gpu_summary on the session's energy column
        assert abs(row["median_power_x_duration_j"] / row["counter_j"] - 1) < 0.05, name
        whole = rows(session, rec, ph, edge=False)
        assert abs(gpu_summary(whole).energy_j.iloc[0] / row["counter_j"] - 1) < 0.05, name
    assert stepped == {"idle", "bf16_gemm", "memory_full"}


def test_power_under_the_enforced_limit_and_the_gemm_at_the_cap(rec, session):
    pw = rec["power"]
    assert pw["enforced_limit_w"] > 0 and pw["default_limit_w"] > 0
    assert session.power_w.max() <= pw["enforced_limit_w"]
    g = rec["phase_stats"]["bf16_gemm"]
    reasons = g["clocks_event_reasons"]
    assert g["power_w"] > 0.95 * pw["enforced_limit_w"] and reasons.get("sw_power_cap", 0) > 0.5 * sum(reasons.values())
    assert g["sm_clock_mhz"] < 0.8 * pw["max_sm_clock_mhz"]
    c = rec["phase_stats"]["copy"]
    assert c["sm_clock_mhz"] == pw["max_sm_clock_mhz"] and c["power_w"] < g["power_w"]


def test_alerts_sm_rule_covers_the_tiny_kernels_the_utilization_rule_passes(rec, session, phases):
    a = gpu_alerts(session, AlertThresholds(low_util_s=5.0, low_sm_s=5.0))
    st = rec["phase_stats"]
    tiny = max(("tiny_kernels", "tiny_graph"), key=lambda n: st[n]["nvml_util_pct"])

    def covering(kind, name):
        inner = rows(session, rec, phases[name])
        k = a[a.kind == kind]
        return k[(k.start_s <= inner.t_s.min()) & (k.end_s >= inner.t_s.max())]

    assert len(covering("low_sm_activity", tiny)) == 1 and covering("low_utilization", tiny).empty
    # the eager loop launches too slowly to keep NVML busy: both rules cover it
    assert st["tiny_kernels"]["nvml_util_pct"] < 60 < st["tiny_graph"]["nvml_util_pct"]
    assert len(covering("low_sm_activity", "tiny_kernels")) == 1 and len(covering("low_utilization", "tiny_kernels")) == 1
    assert covering("low_sm_activity", "bf16_gemm").empty and covering("low_utilization", "bf16_gemm").empty
    mem = a[a.kind == "memory_high"]
    assert len(mem) == 1 and len(covering("memory_high", "memory_full")) == 1
    assert mem.start_s.iloc[0] >= phases["memory_full"]["start_s"]
    assert mem.end_s.iloc[0] <= phases["idle_end"]["start_s"] + 0.5
    assert gpu_alerts(session).query("kind in ['low_utilization', 'low_sm_activity']").empty  # 5 min defaults
    # the monitor's interval means say the same as the medians about the tiny phase
    s = interval_stats(rows(session, rec, phases[tiny])).iloc[0]
    assert s.util_gpu_mean_pct > 10 * s.gpm_sm_util_mean_pct

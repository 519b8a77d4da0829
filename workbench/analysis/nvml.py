"""What NVML samples say about a GPU: alerts with configurable thresholds, and a per-GPU summary.

Both take a session frame (:data:`workbench.io.nvml.NVML_COLUMNS`: ``t_s``, ``gpu``,
``util_gpu_pct``, ``mem_used_bytes``, ``mem_total_bytes``, ``throttle_reasons``...) from a live
sampler or a file, and return frames. Nothing here knows which.

The default thresholds follow common GPU-monitoring practice: utilization below 60 % sustained for
5 minutes (an idle or input-starved GPU), memory above 90 % of the device (one allocation from an
OOM), and any power or thermal clock throttling. Where the session has the GPM counters (Hopper and
newer), SM activity below 60 % sustained for 5 minutes too: NVML's utilization counts the time *a*
kernel ran, so a GPU kept busy by tiny kernels reads ~100 % there while most SMs sit idle; the SM
activity counter sees that.

>>> from workbench import samples
>>> from workbench.io.nvml import load_nvml_session
>>> df = load_nvml_session(samples.path("h200_nvml_session"))
>>> gpu_alerts(df).empty   # 25 s of a healthy H200: nothing sustained for 5 minutes
True
>>> gpu_alerts(df, AlertThresholds(low_util_s=3.0)).kind.unique().tolist()
['low_utilization']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "interval_stats",
    "AlertThresholds",
    "ALERT_COLUMNS",
    "gpu_alerts",
    "gpu_summary",
    "THROTTLING_REASONS",
]

# clocks-event reasons that mean "the GPU is being slowed down", as opposed to idle or app settings
THROTTLING_REASONS: tuple[str, ...] = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")

ALERT_COLUMNS = ["gpu", "kind", "severity", "start_s", "end_s", "duration_s", "value", "ongoing", "message"]


@dataclass(frozen=True)
class AlertThresholds:
    """When a condition becomes an alert. Durations are seconds the condition must hold without a break.

    ``None`` turns an alert off (``temp_c`` is off unless set).
    """

    low_util_pct: float | None = 60.0        # utilization below this ...
    low_util_s: float = 300.0                # ... for at least this long
    low_sm_pct: float | None = 60.0          # GPM SM activity below this (sessions with GPM only) ...
    low_sm_s: float = 300.0                  # ... for at least this long
    mem_high_pct: float | None = 90.0        # memory used above this % of the device ...
    mem_high_s: float = 0.0                  # ... for at least this long (0: any sample)
    throttle_reasons: tuple[str, ...] | None = THROTTLING_REASONS   # any of these ...
    throttle_s: float = 0.0                  # ... for at least this long
    temp_c: float | None = None              # temperature above this ...
    temp_s: float = 0.0


def _episodes(t: np.ndarray, cond: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) row index of each run of True in ``cond``."""
    if not cond.any():
        return []
    c = cond.astype(np.int8)
    edges = np.diff(np.concatenate(([0], c, [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1) - 1
    return list(zip(starts.tolist(), ends.tolist()))


def gpu_alerts(frame: pd.DataFrame, thresholds: AlertThresholds | None = None) -> pd.DataFrame:
    """One row per alert episode: ``gpu``, ``kind`` (``low_utilization``, ``low_sm_activity``,
    ``memory_high``, ``throttling``, ``temperature_high``), ``severity`` (``warning``/``critical``), ``start_s``,
    ``end_s``, ``duration_s``, ``value`` (mean utilization or SM activity %, peak memory %, peak
    temperature; for throttling the number of samples), ``ongoing`` (still true at the last sample) and a ``message``
    with the numbers. Sorted by start time. A missing value breaks an episode (unknown is not low).
    """
    th = thresholds or AlertThresholds()
    out: list[dict] = []
    if frame is None or len(frame) == 0:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    for gpu, g in frame.groupby("gpu", sort=True):
        g = g.sort_values("t_s", kind="stable")
        t = g["t_s"].to_numpy(dtype=float)
        last = len(g) - 1

        def add(kind, severity, i, j, value, message):
            out.append({
                "gpu": int(gpu), "kind": kind, "severity": severity, "start_s": t[i], "end_s": t[j],
                "duration_s": t[j] - t[i], "value": value, "ongoing": j == last, "message": message,
            })

        if th.low_util_pct is not None and "util_gpu_pct" in g:
            u = g["util_gpu_pct"].to_numpy(dtype=float)
            for i, j in _episodes(t, u < th.low_util_pct):  # NaN < x is False: unknown breaks a run
                if t[j] - t[i] >= th.low_util_s:
                    m = float(np.mean(u[i:j + 1]))
                    add("low_utilization", "warning", i, j, m,
                        f"gpu{gpu}: utilization {m:.0f}% on average, below {th.low_util_pct:g}% for "
                        f"{_dur(t[j] - t[i])} (from t={t[i]:.1f} s)")
        if th.low_sm_pct is not None and "gpm_sm_util_pct" in g:
            sm = g["gpm_sm_util_pct"].to_numpy(dtype=float)  # NaN without GPM: never an episode
            for i, j in _episodes(t, sm < th.low_sm_pct):
                if t[j] - t[i] >= th.low_sm_s:
                    m = float(np.mean(sm[i:j + 1]))
                    u = g["util_gpu_pct"].to_numpy(dtype=float)[i:j + 1] if "util_gpu_pct" in g else np.array([])
                    u = u[~np.isnan(u)]
                    beside = f" while NVML utilization read {np.mean(u):.0f}%" if len(u) else ""
                    add("low_sm_activity", "warning", i, j, m,
                        f"gpu{gpu}: SM activity {m:.0f}% on average{beside}, below {th.low_sm_pct:g}% for "
                        f"{_dur(t[j] - t[i])} (from t={t[i]:.1f} s)")
        if th.mem_high_pct is not None and {"mem_used_bytes", "mem_total_bytes"} <= set(g.columns):
            pct = 100.0 * g["mem_used_bytes"].to_numpy(dtype=float) / g["mem_total_bytes"].to_numpy(dtype=float)
            for i, j in _episodes(t, pct > th.mem_high_pct):
                if t[j] - t[i] >= th.mem_high_s:
                    k = i + int(np.nanargmax(pct[i:j + 1]))
                    used = g["mem_used_bytes"].iloc[k] / 2**30
                    total = g["mem_total_bytes"].iloc[k] / 2**30
                    add("memory_high", "critical" if pct[k] > 98 else "warning", i, j, float(pct[k]),
                        f"gpu{gpu}: memory {pct[k]:.1f}% full ({used:.1f}/{total:.1f} GiB), above "
                        f"{th.mem_high_pct:g}% for {_dur(t[j] - t[i])} (from t={t[i]:.1f} s)")
        if th.throttle_reasons and "throttle_reasons" in g:
            wanted = set(th.throttle_reasons)
            # a session holds a handful of distinct reason strings: judge each once, not each row
            codes, uniques = pd.factorize(g["throttle_reasons"], use_na_sentinel=True)
            sets = [set(r.split(",")) & wanted if isinstance(r, str) and r else set() for r in uniques] + [set()]
            cond = np.array([bool(x) for x in sets], dtype=bool)[codes]
            for i, j in _episodes(t, cond):
                if t[j] - t[i] >= th.throttle_s:
                    names = sorted(set().union(*(sets[c] for c in np.unique(codes[i:j + 1]))))
                    thermal = any("thermal" in n for n in names)
                    add("throttling", "critical" if thermal else "warning", i, j, float(j - i + 1),
                        f"gpu{gpu}: clocks throttled ({', '.join(names)}) for {_dur(t[j] - t[i])} "
                        f"over {j - i + 1} samples (from t={t[i]:.1f} s)")
        if th.temp_c is not None and "temp_c" in g:
            temp = g["temp_c"].to_numpy(dtype=float)
            for i, j in _episodes(t, temp > th.temp_c):
                if t[j] - t[i] >= th.temp_s:
                    peak = float(np.nanmax(temp[i:j + 1]))
                    add("temperature_high", "warning", i, j, peak,
                        f"gpu{gpu}: temperature up to {peak:.0f} C, above {th.temp_c:g} C for "
                        f"{_dur(t[j] - t[i])} (from t={t[i]:.1f} s)")
    if not out:
        return pd.DataFrame(columns=ALERT_COLUMNS)
    return pd.DataFrame(out, columns=ALERT_COLUMNS).sort_values(["start_s", "gpu"], kind="stable").reset_index(drop=True)


_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy < 2 has only trapz


def _dur(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.1f} s"


def gpu_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: ``samples``, ``duration_s``, ``util_gpu_mean_pct``, ``mem_used_peak_bytes``,
    ``mem_total_bytes``, ``power_mean_w``, ``power_peak_w``, ``temp_peak_c``, ``sm_clock_mean_mhz``,
    ``energy_j`` (from the energy counter when present, else the integral of power),
    ``throttled_fraction`` (share of samples with a throttling reason)."""
    cols = ["gpu", "samples", "duration_s", "util_gpu_mean_pct", "mem_used_peak_bytes", "mem_total_bytes",
            "power_mean_w", "power_peak_w", "temp_peak_c", "sm_clock_mean_mhz", "energy_j", "throttled_fraction"]
    rows = []
    if frame is None or len(frame) == 0:
        return pd.DataFrame(columns=cols)
    for gpu, g in frame.groupby("gpu", sort=True):
        g = g.sort_values("t_s", kind="stable")
        t = g["t_s"].to_numpy(dtype=float)
        p = g["power_w"].to_numpy(dtype=float) if "power_w" in g else np.full(len(g), np.nan)
        e = g["energy_j"].dropna() if "energy_j" in g else pd.Series(dtype=float)
        if len(e) >= 2:
            energy = float(e.iloc[-1] - e.iloc[0])
        else:
            ok = ~np.isnan(p)
            energy = float(_trapezoid(p[ok], t[ok])) if ok.sum() >= 2 else np.nan
        if "throttle_reasons" in g:
            known = [r for r in g["throttle_reasons"] if isinstance(r, str)]
            thr = (sum(bool(set(r.split(",")) & set(THROTTLING_REASONS)) for r in known) / len(known)) if known else np.nan
        else:
            thr = np.nan
        rows.append({
            "gpu": int(gpu), "samples": len(g), "duration_s": float(t[-1] - t[0]),
            "util_gpu_mean_pct": g["util_gpu_pct"].mean(), "mem_used_peak_bytes": g["mem_used_bytes"].max(),
            "mem_total_bytes": g["mem_total_bytes"].max(), "power_mean_w": float(np.nanmean(p)) if (~np.isnan(p)).any() else np.nan,
            "power_peak_w": float(np.nanmax(p)) if (~np.isnan(p)).any() else np.nan,
            "temp_peak_c": g["temp_c"].max(), "sm_clock_mean_mhz": g["sm_clock_mhz"].mean(),
            "energy_j": energy, "throttled_fraction": thr,
        })
    return pd.DataFrame(rows, columns=cols)


INTERVAL_COLUMNS = ["gpu", "t_s", "samples", "util_gpu_mean_pct", "util_gpu_max_pct", "util_mem_mean_pct",
                    "mem_used_max_bytes", "mem_total_bytes", "power_mean_w", "power_max_w", "temp_max_c",
                    "sm_clock_mhz", "throttle_reasons", "gpm_sm_util_mean_pct", "gpm_sm_occupancy_mean_pct",
                    "gpm_tensor_util_mean_pct", "gpm_dram_bw_util_mean_pct"]


def interval_stats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, what happened over one display interval (the samples of ``frame``), rather than the
    newest sample alone: ``samples``, ``t_s`` (the last), GPU utilisation mean and max, memory
    utilisation mean, memory used max, power mean and max, temperature max, the last SM clock, and the
    throttle reasons seen in any sample (comma-joined, ``gpu_idle`` left out), the GPM counters' means
    (SM activity, occupancy, tensor, DRAM bandwidth; NaN without GPM). One row per GPU
    (columns :data:`INTERVAL_COLUMNS`)."""
    if frame is None or len(frame) == 0:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    rows = []

    def stat(g, col, how):
        if col not in g:
            return np.nan
        v = pd.to_numeric(g[col], errors="coerce").to_numpy(dtype=float)
        v = v[~np.isnan(v)]
        if not v.size:
            return np.nan
        return float({"mean": np.mean, "max": np.max, "last": lambda a: a[-1]}[how](v))

    for gpu, g in frame.groupby("gpu", sort=True):
        g = g.sort_values("t_s", kind="stable")
        reasons: dict[str, None] = {}
        for r in g["throttle_reasons"] if "throttle_reasons" in g else ():
            if isinstance(r, str):
                reasons.update(dict.fromkeys(x for x in r.split(",") if x and x != "gpu_idle"))
        rows.append({
            "gpu": int(gpu), "t_s": float(g["t_s"].iloc[-1]), "samples": len(g),
            "util_gpu_mean_pct": stat(g, "util_gpu_pct", "mean"), "util_gpu_max_pct": stat(g, "util_gpu_pct", "max"),
            "util_mem_mean_pct": stat(g, "util_mem_pct", "mean"),
            "mem_used_max_bytes": stat(g, "mem_used_bytes", "max"), "mem_total_bytes": stat(g, "mem_total_bytes", "max"),
            "power_mean_w": stat(g, "power_w", "mean"), "power_max_w": stat(g, "power_w", "max"),
            "temp_max_c": stat(g, "temp_c", "max"), "sm_clock_mhz": stat(g, "sm_clock_mhz", "last"),
            "throttle_reasons": ",".join(reasons),
            # GPM counters (Hopper+; NaN elsewhere): the interval's mean
            **{f"{c.removesuffix('_pct')}_mean_pct": stat(g, c, "mean")
               for c in ("gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct")},
        })
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)

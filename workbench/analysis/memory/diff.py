"""Two allocator snapshots on one axis: the before/after of a memory change (fp32 vs bf16, a smaller
batch, checkpointing).

    >>> d = memory_diff(analyze_snapshot(load_snapshot(a)), analyze_snapshot(load_snapshot(b)))  # doctest: +SKIP
    >>> d.summary()["by_category"]                                                               # doctest: +SKIP

The axis: each run's history is cut into steps (:func:`workbench.analysis.memory.steps.step_boundaries`:
``ProfilerStep#N`` annotations, the optimizer's ranges, or the allocation pattern) and every event is
placed at ``step number + fraction of its step`` (the "step axis"), so step 2 of the one run lies over
step 2 of the other even when their steps take different times. Without step boundaries in both, the
axis is milliseconds from each history's first event. Peaks are compared at each run's own peak of
allocated memory: by category and by the user's frame, with deltas (test − base).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.memory.allocations import group_live
from workbench.analysis.memory.steps import event_phases, step_boundaries

__all__ = ["MemoryDiff", "memory_diff", "aligned_timeline"]


def aligned_timeline(analysis, steps: dict | None = None) -> pd.DataFrame:
    """The analysis's timeline with ``x`` (the step axis, or ms from the first event when no boundaries
    are known), ``step`` (1-based; 0 before the first boundary) and ``axis`` in ``attrs``."""
    tl = analysis.timeline
    if steps is None:
        steps = step_boundaries(analysis.snap, analysis.device, event_phases(analysis.snap, analysis.device))
    n = len(tl)
    idx = np.arange(n)
    t = tl["time_us"].to_numpy().astype(np.float64)
    starts = np.asarray(steps.get("starts") or [], dtype=np.int64)
    out = tl[["index", "time_us", "allocated_bytes", "reserved_bytes"]].copy()
    if steps.get("method") and len(starts) >= 1 and n:
        k = np.searchsorted(starts, idx, side="right")  # 1-based step of each event, 0 before the first
        bounds = np.r_[starts, n]
        lo = bounds[np.maximum(k - 1, 0)]
        hi = bounds[np.minimum(k, len(bounds) - 1)]
        t_lo = t[np.minimum(lo, n - 1)]
        t_hi = np.where(hi < n, t[np.minimum(hi, n - 1)], t[-1])
        span = np.where(t_hi > t_lo, t_hi - t_lo, 1.0)
        frac = np.clip((t - t_lo) / span, 0, 1)
        out["x"] = np.where(k >= 1, (k - 1) + frac, (t - t[starts[0]]) / max(t[starts[0]] - t[0], 1.0))
        out["step"] = k
        out.attrs["axis"] = "step"
    else:
        out["x"] = (t - (t[0] if n else 0.0)) / 1e3
        out["step"] = 0
        out.attrs["axis"] = "ms"
    out.attrs["steps"] = steps
    return out


def _side(analysis, steps: dict, tl: pd.DataFrame) -> dict:
    pk = analysis.peak
    per_step = []
    starts = list(steps.get("starts") or [])
    if steps.get("method") and starts:
        a = tl["allocated_bytes"].to_numpy()
        r = tl["reserved_bytes"].to_numpy()
        bounds = starts + [len(tl)]
        for i in range(len(starts)):
            s, e = bounds[i], bounds[i + 1]
            if e > s:
                per_step.append({"step": i + 1, "name": steps["names"][i] if i < len(steps.get("names", [])) else None,
                                 "peak_allocated_bytes": int(a[s:e].max()), "peak_reserved_bytes": int(r[s:e].max())})
    return {
        "path": analysis.snap.source,
        "events": int(len(analysis.timeline)),
        "peak_allocated_bytes": int(pk["allocated_bytes"]),
        "peak_reserved_bytes": int(tl["reserved_bytes"].max()) if len(tl) else int(pk["reserved_bytes"]),
        "reserved_at_peak_bytes": int(pk["reserved_bytes"]),
        "peak_index": int(pk["index"]),
        "peak_x": float(tl["x"].iloc[pk["index"]]) if pk["index"] >= 0 and len(tl) else None,
        "peak_step": int(tl["step"].iloc[pk["index"]]) if pk["index"] >= 0 and len(tl) else None,
        "steps": len(starts) if steps.get("method") else 0,
        "steps_method": steps.get("method"),
        "per_step": per_step,
        "expandable_segments": bool(analysis.snap.allocator_settings.get("expandable_segments", False)),
    }


@dataclass
class MemoryDiff:
    """Two snapshots compared (bytes; deltas are test − base)."""

    base: object  # MemoryAnalysis
    test: object
    base_timeline: pd.DataFrame  # aligned_timeline()
    test_timeline: pd.DataFrame
    axis: str  # 'step' or 'ms'
    base_side: dict
    test_side: dict
    by_category: pd.DataFrame  # category, base_bytes, test_bytes, delta_bytes
    by_frame: pd.DataFrame  # frame, base_bytes, test_bytes, delta_bytes, base_count, test_count

    def summary(self, top: int | None = 15) -> dict:
        """The ``workbench diff A.pickle.gz B.pickle.gz --json`` record (docs/json.md)."""
        frames = self.by_frame if top is None else self.by_frame.head(top)
        return {
            "kind": "memory",
            "axis": self.axis,
            "base": self.base_side,
            "test": self.test_side,
            "peak_allocated_delta_bytes": self.test_side["peak_allocated_bytes"] - self.base_side["peak_allocated_bytes"],
            "peak_reserved_delta_bytes": self.test_side["peak_reserved_bytes"] - self.base_side["peak_reserved_bytes"],
            "by_category": [{k: (int(v) if k != "category" else str(v)) for k, v in r.items()}
                            for r in self.by_category.to_dict("records")],
            "by_frame": [{k: (int(v) if k != "frame" else str(v)) for k, v in r.items()}
                         for r in frames.to_dict("records")],
        }


def _merge(base: pd.DataFrame, test: pd.DataFrame, key: str) -> pd.DataFrame:
    b = base[[key, "bytes", "count"]].rename(columns={"bytes": "base_bytes", "count": "base_count"})
    t = test[[key, "bytes", "count"]].rename(columns={"bytes": "test_bytes", "count": "test_count"})
    m = b.merge(t, on=key, how="outer")
    for c in ("base_bytes", "test_bytes", "base_count", "test_count"):
        m[c] = m[c].fillna(0).astype(np.int64)
    m[key] = m[key].astype(str)
    m["delta_bytes"] = m["test_bytes"] - m["base_bytes"]
    order = np.lexsort((m[key].to_numpy(), -np.abs(m["delta_bytes"].to_numpy())))
    m = m.iloc[order].reset_index(drop=True)
    return m[[key, "base_bytes", "test_bytes", "delta_bytes", "base_count", "test_count"]]


def memory_diff(base, test) -> MemoryDiff:
    """Compare two :class:`~workbench.analysis.memory.oom.MemoryAnalysis` (peak vs peak, one axis)."""
    sb = step_boundaries(base.snap, base.device, event_phases(base.snap, base.device))
    st = step_boundaries(test.snap, test.device, event_phases(test.snap, test.device))
    if not (sb.get("method") and st.get("method")):  # one axis for both: ms when either lacks steps
        sb, st = dict(sb, method=None), dict(st, method=None)
    tb, tt = aligned_timeline(base, sb), aligned_timeline(test, st)
    live_b = base.live_at(base.peak["index"]) if base.peak["index"] >= 0 else base.live_at(-1)
    live_t = test.live_at(test.peak["index"]) if test.peak["index"] >= 0 else test.live_at(-1)
    cat = _merge(group_live(live_b, base.labels, "category"), group_live(live_t, test.labels, "category"), "category")
    cat = cat[["category", "base_bytes", "test_bytes", "delta_bytes"]]
    frame = _merge(group_live(live_b, base.labels, "frame"), group_live(live_t, test.labels, "frame"), "frame")
    return MemoryDiff(base, test, tb, tt, tb.attrs["axis"], _side(base, sb, tb), _side(test, st, tt), cat, frame)

"""What a timeline figure shows, computed here so that figures only draw.

- :func:`trace_window`: the events of a Kineto trace overlapping a time window, the longest
  ``max_events`` of them when there are more (the rest reappear when the window narrows), with the
  trace's time origin.
- :func:`event_range`: the first and last event index of an allocator timeline inside a time window.
- :func:`segment_blocks`: the segments at one moment cut into blocks and holes, each block attributed to
  the allocation live at its address (the segment map).
- :func:`allocation_groups` and :class:`GroupSeries`: the allocations of a snapshot put into groups
  (category, the user's frame or function; the top groups by bytes live at the peak, the rest
  "other"), and the bytes live per group at any event index, from sorted alloc/free indices (no
  events x groups array), so a stacked memory timeline of a 1.6M-event snapshot stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analysis.memory import CATEGORIES

__all__ = ["TraceWindow", "trace_window", "event_range", "allocation_groups", "GroupSeries", "SegmentBlocks",
           "segment_blocks"]


@dataclass(frozen=True)
class TraceWindow:
    """``events``: the rows of ``Trace.events`` to draw (trace order); ``origin_us``: time 0 of the axis
    (the trace's start); ``n_window``: how many events overlapped the window before the cut."""

    events: pd.DataFrame
    origin_us: float
    n_window: int


def trace_window(trace, start_us: float | None = None, end_us: float | None = None,
                 max_events: int = 20_000) -> TraceWindow:
    """Events overlapping [start_us, end_us] (the trace's clock; None: open), 'Trace' spans left out;
    the longest ``max_events`` when more overlap it."""
    ev = trace.events if hasattr(trace, "events") else trace
    meta = getattr(trace, "metadata", {}) or {}
    keep = (ev["cat"].astype(str) != "Trace").to_numpy().copy()
    ts = ev["ts_us"].to_numpy(dtype=float)
    dur = np.nan_to_num(ev["dur_us"].to_numpy(dtype=float), nan=0.0)
    origin = meta.get("trace_start_us")
    if origin is None or not np.isfinite(origin):
        origin = float(np.nanmin(ts[keep])) if keep.any() else 0.0
    if start_us is not None:
        keep &= ts + dur >= float(start_us)
    if end_us is not None:
        keep &= ts <= float(end_us)
    n_window = int(keep.sum())
    idx = np.flatnonzero(keep)
    max_events = max(1, int(max_events))
    if len(idx) > max_events:
        part = np.argpartition(-dur[idx], max_events - 1)[:max_events]
        idx = np.sort(idx[part])
    return TraceWindow(ev.iloc[idx], float(origin), n_window)


def event_range(timeline: pd.DataFrame, start_us=None, end_us=None) -> tuple[int, int]:
    """First and last event index whose ``time_us`` lies in [start_us, end_us] (absolute µs);
    ``(0, -1)`` when none does."""
    t = timeline["time_us"].to_numpy()
    n = len(t)
    if n == 0:
        return 0, -1
    sorted_ok = bool(np.all(t[1:] >= t[:-1])) if n > 1 else True
    if sorted_ok:
        lo = 0 if start_us is None else int(np.searchsorted(t, start_us, side="left"))
        hi = n - 1 if end_us is None else int(np.searchsorted(t, end_us, side="right")) - 1
    else:
        m = np.ones(n, dtype=bool)
        if start_us is not None:
            m &= t >= start_us
        if end_us is not None:
            m &= t <= end_us
        idx = np.flatnonzero(m)
        lo, hi = (int(idx[0]), int(idx[-1])) if len(idx) else (0, -1)
    return lo, hi


class GroupSeries:
    """Bytes live per group at any event index, from sorted alloc/free indices."""

    def __init__(self, allocs: pd.DataFrame, group_codes: np.ndarray, ngroups: int, n: int):
        a = allocs["alloc_index"].to_numpy()
        f = allocs["free_index"].to_numpy()
        s = allocs["size_bytes"].to_numpy()
        self.parts = []
        for g in range(ngroups):
            m = group_codes == g
            base = int(s[m & (a < 0)].sum())
            ma = m & (a >= 0)
            oa = np.argsort(a[ma], kind="stable")
            A, SA = a[ma][oa], np.r_[0, np.cumsum(s[ma][oa])]
            mf = m & (f < n)
            of = np.argsort(f[mf], kind="stable")
            F, SF = f[mf][of], np.r_[0, np.cumsum(s[mf][of])]
            self.parts.append((base, A, SA, F, SF))

    def at(self, g: int, idx: np.ndarray) -> np.ndarray:
        base, A, SA, F, SF = self.parts[g]
        return base + SA[np.searchsorted(A, idx, side="right")] - SF[np.searchsorted(F, idx, side="right")]


def allocation_groups(analysis, by: str, top: int) -> tuple[np.ndarray, list[str]]:
    """``(codes, names)``: each allocation's group number and the group names. ``by='category'``: the
    allocator categories in :data:`CATEGORIES` order; ``'frame'`` / ``'function'``: the ``top`` groups
    with most bytes live at the peak, then ``"other"`` (the last name) for the rest."""
    allocs = analysis.allocs
    if by == "category":
        return allocs["category"].cat.codes.to_numpy(), list(CATEGORIES)
    if by not in ("frame", "function"):
        raise ValueError("by must be 'category', 'frame', 'function' or 'total'")
    lbl = np.asarray(analysis.labels[by] + ["(no stack)"], dtype=object)
    sid = allocs["alloc_stack_id"].to_numpy()
    keys = lbl[np.where(sid >= 0, sid, len(lbl) - 1)]
    live = analysis.live_at(analysis.peak["index"])
    lsid = live["alloc_stack_id"].to_numpy()
    lkeys = lbl[np.where(lsid >= 0, lsid, len(lbl) - 1)]
    order = pd.Series(live["size_bytes"].to_numpy()).groupby(lkeys).sum().sort_values(ascending=False)
    names = list(order.index[:top])
    pos = {k: i for i, k in enumerate(names)}
    codes = np.array([pos.get(k, len(names)) for k in keys], dtype=np.int64)
    names.append("other")
    return codes, names


@dataclass(frozen=True)
class SegmentBlocks:
    """The allocator's segments at one moment, for a segment map.

    ``blocks``: :func:`~workbench.analysis.memory.segment_layout`'s rows of the ``segments`` shown, plus
    ``category`` (the live allocation at that address, ``free`` for holes, ``unknown`` when none) and
    ``frame`` (its user frame, ``free`` for holes); at most ``max_blocks`` rows (the largest blocks and
    every hole). ``segment_bytes``: each segment's size; ``segments``: the segments shown, largest first."""

    blocks: pd.DataFrame
    segment_bytes: pd.Series
    segments: list


def segment_blocks(analysis, index: int | None = None, max_segments: int = 120,
                   max_blocks: int = 25_000) -> SegmentBlocks:
    """Blocks and holes of the largest ``max_segments`` segments just after event ``index`` (default:
    snapshot time), each block attributed to the allocation live at its address."""
    from workbench.analysis.memory import segment_layout

    lay = segment_layout(analysis.snap, analysis.allocs, index)
    if not len(lay):
        return SegmentBlocks(lay.assign(category=[], frame=[]), pd.Series(dtype="int64"), [])
    seg_sizes = lay.drop_duplicates("segment").set_index("segment")["segment_bytes"]
    keep = list(seg_sizes.sort_values(ascending=False, kind="stable").index[:max_segments])
    lay = lay[lay["segment"].isin(keep)]
    a = analysis.allocs
    at = len(analysis.timeline) - 1 if index is None else index
    live = a[(a["alloc_index"].to_numpy() <= at) & (a["free_index"].to_numpy() > at)]
    addr_cat = pd.Series(live["category"].astype(str).to_numpy(), index=live["addr"].to_numpy())
    addr_cat = addr_cat[~addr_cat.index.duplicated()]
    abs_addr = lay["segment_address"].to_numpy() + lay["offset_bytes"].to_numpy()
    is_free = lay["free"].to_numpy()
    cat = np.where(is_free, "free", addr_cat.reindex(abs_addr).fillna("unknown").to_numpy().astype(object))
    lbl = np.asarray(analysis.labels["frame"] + ["(no stack)"], dtype=object)
    sid = lay["alloc_stack_id"].to_numpy()
    frame = np.where(is_free, "free", lbl[np.where(sid >= 0, sid, len(lbl) - 1)])
    lay = lay.assign(category=cat, frame=frame)
    if len(lay) > max_blocks:  # keep the largest blocks and every hole
        big = np.argsort(-lay["size_bytes"].to_numpy())[:max_blocks]
        rows = np.zeros(len(lay), dtype=bool)
        rows[big] = True
        rows |= lay["free"].to_numpy()
        lay = lay[rows]
    return SegmentBlocks(lay, seg_sizes, keep)

"""What a timeline figure shows, computed here so that figures only draw.

- :func:`trace_window`: the events of a Kineto trace overlapping a time window, picked by what is in
  view: every GPU event (kernels, copies) of the window when they fit the budget, host events after
  them; when a side does not fit, one event per lane, category and pixel column (the longest there), so
  no lane goes blank where it had work and short kernels stay; the rest reappear when the window
  narrows. :func:`flow_pairs`: launch -> GPU work arrows (by correlation id) among those events.
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

from workbench.analysis.memory.allocations import CATEGORIES

__all__ = ["TraceWindow", "trace_window", "flow_pairs", "GPU_CATS", "event_range", "allocation_groups", "GroupSeries", "SegmentBlocks",
           "segment_blocks"]


@dataclass(frozen=True)
class TraceWindow:
    """``events``: the rows of ``Trace.events`` to draw (trace order); ``origin_us``: time 0 of the axis
    (the trace's start); ``n_window``: how many events overlapped the window; ``n_gpu_window`` /
    ``n_gpu``: GPU events (kernel, memcpy, memset) in the window / kept; ``thinned``: True when some
    events of the window were left out (one per lane, category and pixel column kept)."""

    events: pd.DataFrame
    origin_us: float
    n_window: int
    n_gpu_window: int = 0
    n_gpu: int = 0
    thinned: bool = False

    @property
    def all_gpu(self) -> bool:
        """Every GPU event of the window is shown."""
        return self.n_gpu == self.n_gpu_window


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _thin(idx: np.ndarray, lane: np.ndarray, ts: np.ndarray, dur: np.ndarray, lo: float, hi: float,
          budget: int, resolution: int) -> np.ndarray:
    """At most ``budget`` of ``idx``: the longest event of each (lane, pixel column) where an event
    starts, the pixel columns halved until they fit; what budget is left goes to the longest of the
    rest. ``lane`` codes lane x category, aligned with ``idx``."""
    if len(idx) <= budget:
        return idx
    if budget <= 0:
        return idx[:0]
    span = max(hi - lo, 1e-9)
    start = np.clip(ts[idx], lo, hi)
    d = dur[idx]
    bins = max(1, int(resolution))
    keep = None
    while True:
        col = np.minimum(((start - lo) / span * bins).astype(np.int64), bins - 1)
        group = lane.astype(np.int64) * bins + col
        order = np.lexsort((-d, group))          # by group, longest first
        first = np.ones(len(order), dtype=bool)
        first[1:] = group[order][1:] != group[order][:-1]
        keep = order[first]
        if len(keep) <= budget or bins == 1:
            break
        bins = max(1, bins // 2)
    if len(keep) > budget:  # more lanes than budget: the longest
        keep = keep[np.argsort(-d[keep], kind="stable")[:budget]]
    elif len(keep) < budget:  # room left: more detail, longest first
        taken = np.zeros(len(idx), dtype=bool)
        taken[keep] = True
        rest = np.flatnonzero(~taken)
        n_more = budget - len(keep)
        part = np.argpartition(-d[rest], n_more - 1)[:n_more] if n_more < len(rest) else np.arange(len(rest))
        more = rest[part]
        keep = np.concatenate([keep, more])
    return idx[np.sort(keep)]


def trace_window(trace, start_us: float | None = None, end_us: float | None = None,
                 max_events: int = 20_000, resolution: int = 2_000) -> TraceWindow:
    """The events to draw for [start_us, end_us] (the trace's clock; None: open), 'Trace' spans left out.

    Picked by what is in view, not by length alone: all of the window's events when they fit
    ``max_events``; else every GPU event (kernels, copies: the GPU lanes are what one reads) when they
    fit, and the host events in the budget left; a side that does not fit is thinned to the longest event
    of each lane, category and pixel column (``resolution`` columns across the window, halved until it
    fits), then topped up with the longest of the rest, so every stretch of a lane that had work keeps
    a mark and short kernels do not vanish behind long host spans. A narrower window has fewer events,
    so zooming in brings the detail back."""
    ev = trace.events if hasattr(trace, "events") else trace
    meta = getattr(trace, "metadata", {}) or {}
    cat = ev["cat"].astype(str).to_numpy()
    keep = cat != "Trace"
    ts = ev["ts_us"].to_numpy(dtype=float)
    dur = np.nan_to_num(ev["dur_us"].to_numpy(dtype=float), nan=0.0)
    origin = meta.get("trace_start_us")
    if origin is None or not np.isfinite(origin):
        origin = float(np.nanmin(ts[keep])) if keep.any() else 0.0
    if start_us is not None:
        keep &= ts + dur >= float(start_us)
    if end_us is not None:
        keep &= ts <= float(end_us)
    idx = np.flatnonzero(keep)
    n_window = len(idx)
    is_gpu = np.isin(cat, GPU_CATS)
    n_gpu_window = int(is_gpu[idx].sum())
    max_events = max(1, int(max_events))
    if n_window <= max_events:
        return TraceWindow(ev.iloc[idx], float(origin), n_window, n_gpu_window, n_gpu_window, False)
    lo = float(start_us) if start_us is not None else float(ts[idx].min())
    hi = float(end_us) if end_us is not None else float((ts[idx] + dur[idx]).max())
    # lane x category code: GPU work by (device, stream), host work by (pid, tid)
    stream = ev["stream"].to_numpy(dtype="float64", na_value=np.nan) if "stream" in ev else np.full(len(ev), np.nan)
    pid = ev["pid"].to_numpy(dtype=np.int64)
    tid = ev["tid"].to_numpy(dtype=np.int64)
    lane = np.zeros(len(idx), dtype=np.int64)
    cat_codes = ev["cat"].cat.codes.to_numpy() if hasattr(ev["cat"], "cat") else pd.factorize(cat)[0]
    for part in (pid[idx], np.where(np.isnan(stream[idx]), tid[idx], -(10**12)),
                 np.nan_to_num(stream[idx], nan=-1).astype(np.int64), cat_codes[idx]):
        codes, uniques = pd.factorize(part)
        lane = lane * max(len(uniques), 1) + codes
    lane = pd.factorize(lane)[0]
    g = is_gpu[idx]
    gi, hi_ = idx[g], idx[~g]
    kept_g = _thin(gi, lane[g], ts, dur, lo, hi, max_events, resolution)
    kept_h = _thin(hi_, lane[~g], ts, dur, lo, hi, max_events - len(kept_g), resolution)
    chosen = np.sort(np.concatenate([kept_g, kept_h]))
    return TraceWindow(ev.iloc[chosen], float(origin), n_window, n_gpu_window, len(kept_g), True)


def flow_pairs(window_events: pd.DataFrame, trace=None) -> pd.DataFrame:
    """Launch -> GPU work arrows among ``window_events``: for each kernel/memcpy/memset whose
    correlation id matches a runtime/driver call (``cuda_runtime``, ``cuda_driver``) of the same
    events (or, with ``trace``, of the whole trace), one row ``launch_ts_us, launch_pid, launch_tid,
    gpu_ts_us, gpu_index, launch_index, correlation`` (indices: labels of ``trace.events``)."""
    cols = ["correlation", "launch_index", "gpu_index", "launch_ts_us", "gpu_ts_us"]
    ev = window_events
    if ev is None or ev.empty or "correlation" not in ev:
        return pd.DataFrame(columns=cols)
    cat = ev["cat"].astype(str)
    gpu = ev[cat.isin(GPU_CATS).to_numpy() & ev["correlation"].notna().to_numpy()]
    src = trace.events if trace is not None and hasattr(trace, "events") else ev
    scat = src["cat"].astype(str)
    launches = src[scat.isin(("cuda_runtime", "cuda_driver")).to_numpy() & src["correlation"].notna().to_numpy()]
    if gpu.empty or launches.empty:
        return pd.DataFrame(columns=cols)
    l = pd.DataFrame({"correlation": launches["correlation"].astype("int64").to_numpy(),
                      "launch_index": launches.index.to_numpy(),
                      "launch_ts_us": launches["ts_us"].to_numpy(dtype=float)})
    l = l.drop_duplicates("correlation", keep="first")
    k = pd.DataFrame({"correlation": gpu["correlation"].astype("int64").to_numpy(),
                      "gpu_index": gpu.index.to_numpy(), "gpu_ts_us": gpu["ts_us"].to_numpy(dtype=float)})
    out = k.merge(l, on="correlation", how="inner")
    return out[cols].sort_values(["gpu_ts_us", "correlation"], kind="stable").reset_index(drop=True)


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
    allocator categories in :data:`CATEGORIES` order; ``'frame'`` / ``'function'`` / ``'module'`` (the
    ``nn.Module`` path, see ``analysis.memory.user_frame_labels``): the ``top`` groups
    with most bytes live at the peak, then ``"other"`` (the last name) for the rest."""
    allocs = analysis.allocs
    if by == "category":
        return allocs["category"].cat.codes.to_numpy(), list(CATEGORIES)
    if by not in ("frame", "function", "module"):
        raise ValueError("by must be 'category', 'frame', 'function', 'module' or 'total'")
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

    ``blocks``: :func:`~workbench.analysis.memory.segments.segment_layout`'s rows of the ``segments`` shown, plus
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
    from workbench.analysis.memory.segments import segment_layout

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

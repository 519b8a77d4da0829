"""Allocator state from a snapshot: its segments at any moment cut into blocks and holes, fragmentation.

Built on the event clock and allocation lifetimes of :mod:`workbench.analysis.memory.allocations` (``index`` is
an event's row within its device; :func:`~workbench.analysis.memory.allocations.allocations` gives the blocks);
the pool rules are those of :mod:`workbench.analysis.memory.allocator_model` (requests up to ``SMALL_SIZE``
go to the small pool, whose segments are ``SMALL_BUFFER`` bytes).

- free in reserved: reserved minus allocated, i.e. the holes inside segments.
- largest free block: the largest hole inside one segment (per pool: a request > 1 MiB is served
  from the large pool only).
Fragmentation, defined once (docs/memory.md; the JSON, the panel and the report use these names):

- **external fragmentation** (``external_fragmentation``, also ``fragmentation``):
  ``1 - largest_free_block / free_in_reserved`` (0 when nothing is free). 0: all free reserved memory
  is one hole; near 1: it is scattered in many small holes. It says whether a large request can be
  served from what is free, not how much is free: a healthy training step that leaves many small
  holes reads 0.9 while wasting little.
- **cached-unused share** (``cached_unused_share``): ``(reserved - allocated) / reserved`` (0 when
  nothing is reserved): the part of what the process holds from the GPU that no tensor uses. This is
  the number the operators' rule of thumb alarms on at 25% (:data:`CACHED_UNUSED_ALARM`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from workbench.analysis.memory.allocator_model import SMALL_BUFFER, SMALL_SIZE
from workbench.analysis.memory.allocations import _codes, _default_device, _end_segments, _pair, device_events, live_allocations
from workbench.io.snapshot import Action

__all__ = [
    "AllocatorState",
    "allocator_state",
    "allocator_state_timeline",
    "segment_layout",
    "SMALL_REQUEST_BYTES",
    "CACHED_UNUSED_ALARM",
]

SMALL_REQUEST_BYTES = SMALL_SIZE  # requests up to 1 MiB go to the small pool (2 MiB segments)
# The seeds' and operators' rule of thumb: worry when a quarter of reserved memory holds no tensor.
CACHED_UNUSED_ALARM = 0.25


@dataclass(frozen=True)
class AllocatorState:
    """The caching allocator at one moment (all byte counts)."""

    index: int
    time_us: int | None
    allocated_bytes: int
    reserved_bytes: int
    free_in_reserved_bytes: int
    largest_free_block_bytes: int
    large_pool_free_bytes: int
    large_pool_largest_free_bytes: int
    small_pool_free_bytes: int
    segments: int
    free_blocks: int
    fragmentation: float  # external fragmentation: 1 - largest_free_block / free_in_reserved (0 if none free)
    external_fragmentation: float = 0.0  # the same number under its full name
    cached_unused_share: float = 0.0  # (reserved - allocated) / reserved (0 when nothing is reserved)

    def to_dict(self) -> dict:
        return asdict(self)


def _segment_intervals(snap, device, ev):
    """Every segment seen in the window or at snapshot time: (addr, size, open_index, close_index,
    {address: is_small})."""
    n = len(ev)
    codes = _codes(ev)
    addr = ev["addr"].to_numpy()
    size = ev["size_bytes"].to_numpy()
    io_ = np.flatnonzero((codes == Action.SEGMENT_ALLOC) | (codes == Action.SEGMENT_MAP))
    ic = np.flatnonzero((codes == Action.SEGMENT_FREE) | (codes == Action.SEGMENT_UNMAP))
    opens, closes, orphan_idx, orphan_addr, _ = _pair(io_, addr[io_], ic, addr[ic], n)
    seg_addr = [addr[opens], orphan_addr]
    seg_size = [size[opens], size[orphan_idx]]
    seg_open = [opens, np.full(len(orphan_idx), -1)]
    seg_close = [closes, orphan_idx]
    end = _end_segments(snap, device)
    types = {}
    expandable = bool((codes == Action.SEGMENT_MAP).any()) or (len(end) and bool(end["is_expandable"].any()))
    if len(end):
        pre = ~np.isin(end["address"].to_numpy(), addr[io_])
        e = end[pre]
        ea, es = e["address"].to_numpy(), e["total_size_bytes"].to_numpy()
        if expandable and len(opens):
            # an expandable segment at snapshot time is the union of mapped pieces; the pieces mapped in
            # the window (and still mapped at its end) are already counted: only the rest of its range
            # predates the window
            still = closes >= n
            pa, ps = addr[opens][still], size[opens][still]
            o = np.argsort(pa)
            pa, ps = pa[o], ps[o]
            ra, rs = [], []
            for a0, s0 in zip(ea.tolist(), es.tolist()):
                cur, stop = a0, a0 + s0
                for p0, q0 in zip(pa.tolist(), ps.tolist()):
                    if p0 + q0 <= cur or p0 >= stop:
                        continue
                    if p0 > cur:
                        ra.append(cur); rs.append(p0 - cur)
                    cur = max(cur, p0 + q0)
                if cur < stop:
                    ra.append(cur); rs.append(stop - cur)
            ea, es = np.asarray(ra, dtype=np.int64), np.asarray(rs, dtype=np.int64)
        types = dict(zip(end["address"].to_numpy().tolist(), (end["segment_type"] == "small").tolist()))
        seg_addr.append(ea)
        seg_size.append(es)
        seg_open.append(np.full(len(ea), -1))
        seg_close.append(np.full(len(ea), n))
    return (np.concatenate(seg_addr), np.concatenate(seg_size), np.concatenate(seg_open),
            np.concatenate(seg_close), types, expandable)


def _segments_at(intervals, index):
    """Segments (addr, size, is_small) that exist just after event ``index``."""
    sa, ss, so, sc, types, expandable = intervals
    live = (so <= index) & (sc > index)
    sa, ss = sa[live], ss[live]
    order = np.argsort(sa)
    sa, ss = sa[order], ss[order]
    # expandable segments grow by mapping adjacent pieces: merge touching pieces into one segment
    # (only then: separate cudaMalloc segments can be adjacent in the address space too)
    first_size = ss
    if expandable and len(sa) > 1:
        touch = np.r_[False, sa[1:] == (sa[:-1] + ss[:-1])]
        if touch.any():
            grp = np.cumsum(~touch) - 1
            first_size = ss[~touch]
            sa = sa[~touch]
            ss = np.bincount(grp, weights=ss).astype(np.int64)
    if expandable and types:
        # the pool of a merged expandable segment: that of a snapshot-time segment inside its range
        ta = np.asarray(sorted(types), dtype=np.int64)
        tv = np.asarray([types[int(a)] for a in ta], dtype=bool)
        small = []
        for a, s, f in zip(sa.tolist(), ss.tolist(), first_size.tolist()):
            j = np.searchsorted(ta, a, side="left")
            small.append(bool(tv[j]) if j < len(ta) and ta[j] < a + s else types.get(int(a), int(f) == SMALL_BUFFER))
        small = np.asarray(small, dtype=bool)
    else:
        small = np.array([types.get(int(a), int(s) == SMALL_BUFFER) for a, s in zip(sa, ss)], dtype=bool)
    return sa, ss, small


def segment_layout(snap, allocs: pd.DataFrame, index: int | None = None, device: int | None = None,
                   _intervals=None) -> pd.DataFrame:
    """Every segment cut into used blocks and free holes just after event ``index`` (default: the
    last event, i.e. snapshot time): ``segment``, ``segment_address``, ``segment_bytes``, ``small``
    (small pool), ``offset_bytes``, ``size_bytes``, ``free`` (bool), ``alloc_stack_id``."""
    device = allocs.attrs.get("device", _default_device(snap)) if device is None else device
    n = int(allocs.attrs.get("n_events", 0))
    if index is None:
        index = n - 1
    if _intervals is None:
        _intervals = _segment_intervals(snap, device, device_events(snap, device))
    sa, ss, small = _segments_at(_intervals, index)
    live = live_allocations(allocs, index)
    la = live["addr"].to_numpy()
    ls = live["size_bytes"].to_numpy()
    lst = live["alloc_stack_id"].to_numpy()
    o = np.argsort(la)
    la, ls, lst = la[o], ls[o], lst[o]
    seg_of = np.searchsorted(sa, la, side="right") - 1
    inside = (seg_of >= 0) & (la < sa[np.maximum(seg_of, 0)] + ss[np.maximum(seg_of, 0)]) if len(sa) else \
        np.zeros(len(la), dtype=bool)
    la, ls, lst, seg_of = la[inside], ls[inside], lst[inside], seg_of[inside]
    rows_seg, rows_off, rows_size, rows_free, rows_stack = [], [], [], [], []
    # holes: between consecutive blocks of one segment, before the first and after the last
    starts = np.searchsorted(seg_of, np.arange(len(sa)), side="left")
    ends = np.searchsorted(seg_of, np.arange(len(sa)), side="right")
    for s in range(len(sa)):
        cur = sa[s]
        for j in range(starts[s], ends[s]):
            if la[j] > cur:
                rows_seg.append(s); rows_off.append(cur - sa[s]); rows_size.append(la[j] - cur)
                rows_free.append(True); rows_stack.append(-1)
            rows_seg.append(s); rows_off.append(la[j] - sa[s]); rows_size.append(ls[j])
            rows_free.append(False); rows_stack.append(lst[j])
            cur = max(cur, la[j] + ls[j])
        end_addr = sa[s] + ss[s]
        if end_addr > cur:
            rows_seg.append(s); rows_off.append(cur - sa[s]); rows_size.append(end_addr - cur)
            rows_free.append(True); rows_stack.append(-1)
    seg = np.asarray(rows_seg, dtype=np.int64)
    return pd.DataFrame({
        "segment": seg,
        "segment_address": sa[seg] if len(seg) else np.empty(0, np.int64),
        "segment_bytes": ss[seg] if len(seg) else np.empty(0, np.int64),
        "small": small[seg] if len(seg) else np.empty(0, bool),
        "offset_bytes": np.asarray(rows_off, dtype=np.int64),
        "size_bytes": np.asarray(rows_size, dtype=np.int64),
        "free": np.asarray(rows_free, dtype=bool),
        "alloc_stack_id": np.asarray(rows_stack, dtype=np.int32),
    })


def _state_from_layout(layout: pd.DataFrame, index: int, time_us) -> AllocatorState:
    free = layout[layout["free"].to_numpy()]
    used = layout[~layout["free"].to_numpy()]
    reserved = int(layout.drop_duplicates("segment")["segment_bytes"].sum()) if len(layout) else 0
    free_total = int(free["size_bytes"].sum())
    largest = int(free["size_bytes"].max()) if len(free) else 0
    lp = free[~free["small"].to_numpy()]
    sp = free[free["small"].to_numpy()]
    return AllocatorState(
        index=int(index),
        time_us=None if time_us is None else int(time_us),
        allocated_bytes=int(used["size_bytes"].sum()),
        reserved_bytes=reserved,
        free_in_reserved_bytes=free_total,
        largest_free_block_bytes=largest,
        large_pool_free_bytes=int(lp["size_bytes"].sum()),
        large_pool_largest_free_bytes=int(lp["size_bytes"].max()) if len(lp) else 0,
        small_pool_free_bytes=int(sp["size_bytes"].sum()),
        segments=int(layout["segment"].nunique()) if len(layout) else 0,
        free_blocks=len(free),
        fragmentation=float(1 - largest / free_total) if free_total else 0.0,
        external_fragmentation=float(1 - largest / free_total) if free_total else 0.0,
        cached_unused_share=float(free_total / reserved) if reserved else 0.0,
    )


def allocator_state(snap, allocs: pd.DataFrame, index: int | None = None, _ctx=None) -> AllocatorState:
    """Reserved vs allocated, free inside reserved, largest hole and fragmentation just after event
    ``index`` (default: snapshot time)."""
    device = allocs.attrs.get("device", _default_device(snap))
    if _ctx is None:
        ev = device_events(snap, device)
        _ctx = (ev, _segment_intervals(snap, device, ev))
    ev, intervals = _ctx
    if index is None:
        index = len(ev) - 1
    layout = segment_layout(snap, allocs, index, device, _intervals=intervals)
    t = int(ev["time_us"].iloc[index]) if 0 <= index < len(ev) else None
    return _state_from_layout(layout, index, t)


def allocator_state_timeline(snap, allocs: pd.DataFrame, points: int = 200,
                             start_index: int | None = None, end_index: int | None = None,
                             extra_indices=()) -> pd.DataFrame:
    """:class:`AllocatorState` at ``points`` evenly spaced event indices (plus ``extra_indices``, e.g.
    the peak) between ``start_index`` and ``end_index``: fragmentation over time, not only at the end."""
    n = int(allocs.attrs.get("n_events", 0))
    lo = 0 if start_index is None else max(0, start_index)
    hi = n - 1 if end_index is None else min(n - 1, end_index)
    if hi < lo:
        return pd.DataFrame(columns=list(AllocatorState.__dataclass_fields__))
    idx = np.unique(np.r_[np.linspace(lo, hi, min(points, hi - lo + 1)).astype(np.int64),
                          [i for i in extra_indices if lo <= i <= hi]]).astype(np.int64)
    device = allocs.attrs.get("device", _default_device(snap))
    ev = device_events(snap, device)
    ctx = (ev, _segment_intervals(snap, device, ev))
    rows = [allocator_state(snap, allocs, int(i), _ctx=ctx).to_dict() for i in idx]
    return pd.DataFrame(rows)

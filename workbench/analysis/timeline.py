"""One clock for a Kineto trace, an allocator snapshot and NVML samples of the same run: Unix epoch ns.

The three artifacts keep time differently, and all of them can be put on Unix time:

- a Kineto trace: event ``ts`` in microseconds relative to ``baseTimeNanoseconds`` (trace metadata, Unix
  ns; torch >= 2.0), so ``unix_ns = ts_us * 1000 + baseTimeNanoseconds``;
- an allocator snapshot's history: ``time_us`` of each event is Unix epoch microseconds (torch converts its
  steady clock when the snapshot is taken);
- an NVML session: ``time_ns`` of each row is ``time.time_ns()`` (:class:`~workbench.capture.nvml.NvmlSampler`
  writes it beside ``t_s``).

On the H200 the three agree to about a millisecond (checked in ``tests/test_timeline.py`` on a real
recording: the snapshot's ``segment_alloc`` events against the trace's ``cudaMalloc`` calls, the recorder's
``time.time_ns()`` phase marks against the trace's ``record_function`` ranges). A file that cannot be put
on Unix time (a trace without ``baseTimeNanoseconds``, a snapshot without times, a session without
``time_ns``) is placed by its first event at the first event of the files that can, with a note saying
so; when none can, every file starts at 0 and the clock is ``"first_event"``.

>>> from workbench.analysis.timeline import UNIX_NS_RANGE
>>> UNIX_NS_RANGE[0] < 1_796_254_659_394_468_290 < UNIX_NS_RANGE[1]
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.memory.allocations import memory_timeline, peak_memory

__all__ = [
    "UNIX_NS_RANGE",
    "Placement",
    "AlignedTimeline",
    "trace_placement",
    "memory_placement",
    "nvml_placement",
    "align",
    "timeline_summary",
    "GPU_CATEGORIES",
    "annotation_lanes",
    "kernel_segments",
    "activity_by_annotation",
    "ACTIVITY_COLUMNS",
]

# Unix ns of 2001-09-09 .. 2100-01-01: a time outside is not Unix epoch time (a steady clock, zero)
UNIX_NS_RANGE = (1_000_000_000_000_000_000, 4_102_444_800_000_000_000)

# Kineto categories of device activity (the kernel lanes)
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def _unix(ns) -> bool:
    return ns is not None and not (isinstance(ns, float) and math.isnan(ns)) and UNIX_NS_RANGE[0] <= ns <= UNIX_NS_RANGE[1]


@dataclass(frozen=True)
class Placement:
    """How one file's own times map onto the shared clock: ``unix_ns = own_ns + offset_ns``.

    ``method``: ``baseTimeNanoseconds`` / ``ts_unix`` (trace), ``time_us`` (snapshot), ``time_ns`` (NVML),
    or ``first_event`` (could not be aligned; ``note`` says why). ``first_ns`` is the file's first event on
    its own clock, in ns."""

    kind: str                 # "trace" | "memory" | "nvml"
    name: str                 # the file name (no folders) or a description of the object
    method: str
    offset_ns: int
    first_ns: int
    note: str | None = None

    @property
    def aligned(self) -> bool:
        return self.method != "first_event"


def _name(obj, fallback: str) -> str:
    for attr in ("path", "source"):
        v = getattr(obj, attr, None) if not isinstance(obj, pd.DataFrame) else obj.attrs.get(attr)
        if v:
            return Path(str(v)).name
    return fallback


def trace_placement(trace) -> Placement:
    """Where a loaded :class:`~workbench.io.trace.Trace` sits on Unix time."""
    ev = trace.events
    name = _name(trace, "trace")
    first_us = float(ev["ts_us"].min()) if len(ev) else 0.0
    first_ns = int(round(first_us * 1000))
    base = trace.metadata.get("baseTimeNanoseconds")
    try:
        base = int(base) if base is not None else None
    except (TypeError, ValueError):
        base = None
    if base is not None and _unix(first_ns + base):
        return Placement("trace", name, "baseTimeNanoseconds", base, first_ns)
    if _unix(first_ns):  # some producers write Unix microseconds directly
        return Placement("trace", name, "ts_unix", 0, first_ns)
    why = ("no baseTimeNanoseconds in its metadata (a trace from torch < 2.0 or another producer)"
           if base is None else f"baseTimeNanoseconds={base} does not give Unix time")
    return Placement("trace", name, "first_event", 0, first_ns, why)


def memory_placement(snapshot, timeline: pd.DataFrame | None = None, trace: Placement | None = None) -> Placement:
    """Where an allocator snapshot's history sits on Unix time (its ``time_us`` are Unix µs when set).

    The ``[memory]`` events of a trace (``io.load_profiler_memory``, ``layout == "profiler"``; CPU or CUDA)
    are on that trace's clock: they take the trace's placement ``trace`` when it is given."""
    name = _name(snapshot, "snapshot")
    if timeline is None:
        timeline = memory_timeline(snapshot)
    t = timeline["time_us"].to_numpy()
    t = t[t > 0] if len(t) else t
    if not len(t):
        why = ("no allocation history (record it with record_memory_history / "
               "torch.cuda.memory._record_memory_history)" if not len(timeline) else "its events carry no time_us")
        return Placement("memory", name, "first_event", 0, 0, why)
    first_ns = int(t.min()) * 1000
    if getattr(snapshot, "layout", None) == "profiler":
        if trace is not None and trace.aligned:
            return Placement("memory", name, "trace_ts", trace.offset_ns, first_ns)
        if not _unix(first_ns):
            return Placement("memory", name, "first_event", 0, first_ns,
                             "its [memory] events are on a trace's clock; give that trace too (--trace)")
    if _unix(first_ns):
        return Placement("memory", name, "time_us", 0, first_ns)
    return Placement("memory", name, "first_event", 0, first_ns,
                     "its time_us are not Unix time (a snapshot from an old torch)")


def nvml_placement(frame: pd.DataFrame) -> Placement:
    """Where an NVML session frame sits on Unix time (``time_ns`` of its rows)."""
    name = _name(frame, "NVML session")
    t_first = float(frame["t_s"].min()) if len(frame) else 0.0
    ns = frame["time_ns"] if "time_ns" in frame else None
    if ns is not None and ns.notna().any():
        ok = ns.notna().to_numpy()
        t_s = frame["t_s"].to_numpy(dtype=float)[ok]
        vals = ns[ok].to_numpy(dtype=np.int64)
        # offset from the session's own t_s (as ns) to Unix ns, taken at its first timed row, so that the
        # session's first event lands exactly on that row's time_ns (the rows keep their own time_ns)
        k = int(np.argmin(t_s))
        first_ns = int(round(t_s[k] * 1e9))
        offset = int(vals[k]) - first_ns
        if _unix(first_ns + offset):
            return Placement("nvml", name, "time_ns", offset, first_ns)
        return Placement("nvml", name, "first_event", 0, first_ns, "its time_ns are not Unix time")
    return Placement("nvml", name, "first_event", 0, int(round(t_first * 1e9)),
                     "its rows carry no time_ns (a session recorded before time_ns was written)")


@dataclass
class AlignedTimeline:
    """Everything on one clock (``clock``: ``"unix_ns"``, or ``"first_event"`` when no file carried absolute
    time). Every ``*_ns`` column is on that clock; ``origin_ns`` is the first event of all (figures show
    time relative to it)."""

    clock: str
    origin_ns: int
    placements: list[Placement]
    annotations: pd.DataFrame          # name, kind (step|user), start_ns, end_ns
    kernels: pd.DataFrame              # lane (stream N), name, cat, start_ns, end_ns
    memory: pd.DataFrame | None        # time_ns, allocated_bytes, reserved_bytes
    memory_peak: dict | None           # bytes, time_ns, reserved_bytes
    nvml: pd.DataFrame | None          # the session frame + a ns column on the clock
    notes: list[str] = field(default_factory=list)
    per_step: dict | None = None       # the trace's step numbers (tables.step_numbers: the one definition)

    @property
    def end_ns(self) -> int:
        ends = [self.origin_ns]
        if len(self.annotations):
            ends.append(int(self.annotations["end_ns"].max()))
        if len(self.kernels):
            ends.append(int(self.kernels["end_ns"].max()))
        if self.memory is not None and len(self.memory):
            ends.append(int(self.memory["time_ns"].max()))
        if self.nvml is not None and len(self.nvml):
            ends.append(int(self.nvml["ns"].max()))
        return max(ends)

    def annotation_at(self, ns: int) -> dict | None:
        """The innermost (shortest) annotation whose range holds ``ns``: the step or range that was running."""
        a = self.annotations
        if not len(a):
            return None
        inside = a[(a["start_ns"] <= ns) & (a["end_ns"] >= ns)]
        if not len(inside):
            return None
        row = inside.loc[(inside["end_ns"] - inside["start_ns"]).idxmin()]
        return {"name": str(row["name"]), "start_ns": int(row["start_ns"]), "end_ns": int(row["end_ns"])}


def _trace_frames(trace, offset_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    ev = trace.events
    name = ev["name"].astype(str)
    cat = ev["cat"].astype(str)
    start = np.round(ev["ts_us"].to_numpy(dtype=float) * 1000).astype(np.int64) + offset_ns
    end = start + np.round(ev["dur_us"].to_numpy(dtype=float) * 1000).astype(np.int64)
    is_step = name.str.startswith("ProfilerStep#").to_numpy()
    is_ann = (cat == "user_annotation").to_numpy() | (is_step & (cat != "gpu_user_annotation").to_numpy())
    ann = pd.DataFrame({"name": name.to_numpy()[is_ann], "kind": np.where(is_step[is_ann], "step", "user"),
                        "start_ns": start[is_ann], "end_ns": end[is_ann]})
    ann = ann.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable").reset_index(drop=True)
    gpu = cat.isin(GPU_CATEGORIES).to_numpy()
    stream = ev["stream"].to_numpy()[gpu] if "stream" in ev else np.full(int(gpu.sum()), pd.NA)
    lanes = np.array([f"stream {int(s)}" if not pd.isna(s) else "gpu" for s in stream], dtype=object)
    ker = pd.DataFrame({"lane": lanes, "name": name.to_numpy()[gpu], "cat": cat.to_numpy()[gpu],
                        "start_ns": start[gpu], "end_ns": end[gpu]})
    ker = ker.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return ann, ker


def align(trace=None, memory=None, nvml: pd.DataFrame | None = None) -> AlignedTimeline:
    """Put a loaded trace, snapshot and NVML session frame (any of them may be None) on one clock."""
    if trace is None and memory is None and nvml is None:
        from workbench.errors import BadArgument

        raise BadArgument("align(): give at least one of trace=, memory=, nvml=")
    tl_mem = memory_timeline(memory) if memory is not None else None
    places: dict[str, Placement] = {}
    if trace is not None:
        places["trace"] = trace_placement(trace)
    if memory is not None:
        places["memory"] = memory_placement(memory, tl_mem, places.get("trace"))
    if nvml is not None:
        places["nvml"] = nvml_placement(nvml)
    aligned = [p for p in places.values() if p.aligned]
    clock = "unix_ns" if aligned else "first_event"
    reference = min((p.first_ns + p.offset_ns for p in aligned), default=0)
    notes = []
    for key, p in list(places.items()):
        if p.aligned:
            continue
        # placed by its first event at the first event of the aligned files (or at 0)
        places[key] = Placement(p.kind, p.name, p.method, reference - p.first_ns, p.first_ns, p.note)
        where = ("at the first event of " + ", ".join(q.name for q in aligned)) if aligned else "at 0"
        notes.append(f"{p.name}: cannot be put on Unix time: {p.note}; aligned by its first event {where}, "
                     "so its times against the other files are approximate")

    ann = pd.DataFrame(columns=["name", "kind", "start_ns", "end_ns"])
    ker = pd.DataFrame(columns=["lane", "name", "cat", "start_ns", "end_ns"])
    if trace is not None:
        ann, ker = _trace_frames(trace, places["trace"].offset_ns)
    mem = peak = None
    if tl_mem is not None:
        off = places["memory"].offset_ns
        mem = pd.DataFrame({"time_ns": tl_mem["time_us"].to_numpy(dtype=np.int64) * 1000 + off,
                            "allocated_bytes": tl_mem["allocated_bytes"].to_numpy(),
                            "reserved_bytes": tl_mem["reserved_bytes"].to_numpy()})
        pk = peak_memory(tl_mem)
        if pk["time_us"] is not None and len(tl_mem):
            peak = {"bytes": int(pk["allocated_bytes"]), "time_ns": int(pk["time_us"]) * 1000 + off,
                    "reserved_bytes": int(pk["reserved_bytes"])}
        else:
            peak = {"bytes": int(pk["allocated_bytes"]), "time_ns": None, "reserved_bytes": int(pk["reserved_bytes"])}
    nv = None
    if nvml is not None:
        nv = nvml.copy()
        ns = np.round(nv["t_s"].to_numpy(dtype=float) * 1e9).astype(np.int64) + places["nvml"].offset_ns
        if places["nvml"].method == "time_ns":  # the rows' own Unix times, exact, where they have them
            own = nv["time_ns"]
            ns = np.where(own.notna().to_numpy(), own.fillna(0).to_numpy(dtype=np.int64), ns)
        nv["ns"] = ns
        nv.attrs.update(nvml.attrs)
    firsts = []
    if mem is not None and len(mem):
        firsts.append(int(mem["time_ns"].min()))
    if nv is not None and len(nv):
        firsts.append(int(nv["ns"].min()))
    if len(ann):
        firsts.append(int(ann["start_ns"].min()))
    if len(ker):
        firsts.append(int(ker["start_ns"].min()))
    if not firsts:
        firsts = [p.first_ns + p.offset_ns for p in places.values()]
    per_step = None
    if trace is not None:
        from workbench.analysis.trace.tables import step_numbers

        per_step = step_numbers(trace).as_dict()
    return AlignedTimeline(clock, min(firsts), list(places.values()), ann, ker, mem, peak, nv, notes, per_step)


def _int_or_none(v):
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return None
    return int(v)


def timeline_summary(tl: AlignedTimeline) -> dict:
    """The ``workbench timeline --json`` document (keys in docs/json.md)."""
    doc: dict = {
        "clock": tl.clock,
        "origin_ns": int(tl.origin_ns),
        "end_ns": int(tl.end_ns),
        "sources": [{"kind": p.kind, "name": p.name, "method": p.method, "offset_ns": int(p.offset_ns),
                     "aligned": p.aligned} for p in tl.placements],
        "notes": list(tl.notes),
        "per_step": tl.per_step,
        "annotations": [{"name": r.name, "kind": r.kind, "start_ns": int(r.start_ns), "end_ns": int(r.end_ns)}
                        for r in tl.annotations.itertuples(index=False)],
        "kernels": {"count": int(len(tl.kernels)), "lanes": sorted(set(tl.kernels["lane"])) if len(tl.kernels) else []},
        "memory": None,
        "nvml": None,
    }
    if tl.memory_peak is not None:
        at = tl.annotation_at(tl.memory_peak["time_ns"]) if tl.memory_peak["time_ns"] is not None else None
        doc["memory"] = {"peak_bytes": tl.memory_peak["bytes"], "peak_time_ns": tl.memory_peak["time_ns"],
                         "peak_reserved_bytes": tl.memory_peak["reserved_bytes"],
                         "peak_annotation": at["name"] if at else None, "events": int(len(tl.memory))}
    if tl.nvml is not None and len(tl.nvml):
        nv = tl.nvml
        used = nv["mem_used_bytes"].to_numpy(dtype=float)
        peak_t = _int_or_none(nv["ns"].iloc[int(np.nanargmax(used))]) if np.isfinite(used).any() else None
        gpm = [c for c in nv.columns if c.startswith("gpm_") and nv[c].notna().any()]
        doc["nvml"] = {"first_ns": int(nv["ns"].min()), "last_ns": int(nv["ns"].max()), "rows": int(len(nv)),
                       "gpus": sorted(int(g) for g in nv["gpu"].unique()),
                       "peak_mem_used_bytes": _int_or_none(np.nanmax(used)) if np.isfinite(used).any() else None,
                       "peak_mem_used_time_ns": peak_t, "gpm_columns": gpm}
    act = activity_by_annotation(tl)
    doc["activity"] = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
                       for rec in act.to_dict("records")]
    return doc


# --------------------------------------------------------------------------------------------------
# what the one-clock figure shows (so the figure only draws)


def annotation_lanes(annotations: pd.DataFrame) -> np.ndarray:
    """A lane number for each annotation so that ranges in one lane never overlap: ProfilerSteps in lane
    0, the other ranges greedily from lane 1 (a range nested in another lands below it)."""
    n = len(annotations)
    lanes = np.zeros(n, dtype=np.int64)
    if not n:
        return lanes
    order = np.lexsort((-annotations["end_ns"].to_numpy(), annotations["start_ns"].to_numpy()))
    starts = annotations["start_ns"].to_numpy()
    ends = annotations["end_ns"].to_numpy()
    kind = annotations["kind"].to_numpy()
    lane_end: list[int] = []          # user lanes 1.. : the end of the last range put there
    for i in order:
        if kind[i] == "step":
            continue
        for k, e in enumerate(lane_end):
            if e <= starts[i]:
                lane_end[k] = ends[i]
                lanes[i] = k + 1
                break
        else:
            lane_end.append(ends[i])
            lanes[i] = len(lane_end)
    return lanes


def kernel_segments(kernels: pd.DataFrame, start_ns: int | None = None, end_ns: int | None = None,
                    max_segments: int = 4_000) -> pd.DataFrame:
    """The GPU lanes inside a window, at most ``max_segments`` segments in all: per lane, kernels closer
    than the window's length / (``max_segments`` / lanes) are merged into one busy segment (what a
    pixel shows anyway). Columns ``lane``, ``start_ns``, ``end_ns``, ``count`` (kernels merged),
    ``busy_ns`` (their summed time), ``name`` (the kernel's name when alone, else the longest one's)."""
    cols = ["lane", "start_ns", "end_ns", "count", "busy_ns", "name"]
    if not len(kernels):
        return pd.DataFrame(columns=cols)
    k = kernels
    lo = int(k["start_ns"].min()) if start_ns is None else int(start_ns)
    hi = int(k["end_ns"].max()) if end_ns is None else int(end_ns)
    k = k[(k["end_ns"] >= lo) & (k["start_ns"] <= hi)]
    if not len(k):
        return pd.DataFrame(columns=cols)
    lanes = sorted(k["lane"].unique())
    per_lane = max(1, int(max_segments) // max(1, len(lanes)))
    gap = max(1, (hi - lo) // per_lane)
    out = []
    for lane in lanes:
        g = k[k["lane"] == lane].sort_values("start_ns", kind="stable")
        s = np.maximum(g["start_ns"].to_numpy(dtype=np.int64), lo)
        e = np.minimum(g["end_ns"].to_numpy(dtype=np.int64), hi)
        run_end = np.maximum.accumulate(e)
        new = np.r_[True, s[1:] - run_end[:-1] >= gap]
        group = np.cumsum(new) - 1
        n = int(group[-1]) + 1
        seg_s = s[new]
        seg_e = np.zeros(n, dtype=np.int64)
        np.maximum.at(seg_e, group, e)
        count = np.bincount(group, minlength=n)
        busy = np.bincount(group, weights=(e - s).astype(float), minlength=n)
        dur = e - s
        names = g["name"].to_numpy()
        longest = pd.Series(dur).groupby(group).idxmax().to_numpy()
        out.append(pd.DataFrame({"lane": lane, "start_ns": seg_s, "end_ns": seg_e, "count": count,
                                 "busy_ns": busy.astype(np.int64), "name": names[longest]}))
    return pd.concat(out, ignore_index=True)[cols]


ACTIVITY_COLUMNS = ("util_gpu_pct", "gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct",
                    "gpm_dram_bw_util_pct")


def activity_by_annotation(tl: AlignedTimeline, top: int = 10, min_rows: int = 1) -> pd.DataFrame:
    """What the GPU did during each of the ``top`` longest annotations: the mean of NVML utilization and
    the GPM counters over the NVML rows whose interval (from the previous row of that GPU to the row)
    lies inside the annotation. Ranges shorter than a sample period have no such row (NaN, ``rows`` 0).
    Columns ``name``, ``start_ns``, ``end_ns``, ``gpu``, ``rows`` and :data:`ACTIVITY_COLUMNS`."""
    cols = ["name", "start_ns", "end_ns", "gpu", "rows", *ACTIVITY_COLUMNS]
    if tl.nvml is None or not len(tl.nvml) or not len(tl.annotations):
        return pd.DataFrame(columns=cols)
    a = tl.annotations.assign(dur=tl.annotations["end_ns"] - tl.annotations["start_ns"])
    a = a.sort_values(["dur", "start_ns"], ascending=[False, True], kind="stable").head(int(top))
    out = []
    for gpu, g in tl.nvml.groupby("gpu"):
        g = g.sort_values("ns", kind="stable")
        end = g["ns"].to_numpy(dtype=np.int64)
        start = np.r_[end[0] - (np.median(np.diff(end)) if len(end) > 1 else 0), end[:-1]].astype(np.int64)
        for r in a.itertuples(index=False):
            m = (start >= r.start_ns) & (end <= r.end_ns)
            row = {"name": r.name, "start_ns": int(r.start_ns), "end_ns": int(r.end_ns), "gpu": int(gpu),
                   "rows": int(m.sum())}
            for c in ACTIVITY_COLUMNS:
                v = g[c].to_numpy(dtype=float)[m] if c in g else np.empty(0)
                v = v[np.isfinite(v)]
                row[c] = float(v.mean()) if len(v) >= min_rows else math.nan
            out.append(row)
    return pd.DataFrame(out, columns=cols)

"""A model of a profiled step that answers "what if": its dependency graph, a replay, the critical path.

The graph is read from a Kineto trace:

* **host points**: the CUDA runtime/driver calls of the process that drives the GPU, on all its
  threads (the main thread and autograd's device thread run one after the other, so they are merged
  into one host timeline in time order), plus a mark at each ``ProfilerStep#N`` start. Between two
  points lies a *gap*: host time spent in Python, op dispatch, data loading or the profiler itself.
  A point is a *launch* (it has GPU work with its correlation id), a *sync* (cudaStreamSynchronize,
  cudaDeviceSynchronize, cudaEventSynchronize, blocking cudaMemcpy: the host waits for the GPU), a
  *blocking copy* (a copy from pageable memory: the host waits for that copy) or *other* host work.
* **GPU ops**: kernels, memcpys and memsets, in order on their stream; each starts no earlier than its
  launch (plus the launch latency seen in the trace), the end of the previous op on its stream, and the
  op on another stream it waited for (inferred where the trace shows an op starting late with the
  other stream's op ending just before: the event waits of copy and communication streams).

:func:`replay` walks the graph in host order, each point after its gap, each sync waiting for the GPU
work launched before it, and returns when every step would end. A counterfactual is the same graph
with some gaps, durations or points changed (:mod:`workbench.analysis.trace.diagnosis` builds them); the
step time it predicts is compared with the replay of the unchanged graph, so systematic errors of the
model cancel. :func:`critical_path` says what the host and GPU time on the path of the last step was.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from workbench.analysis import _intervals as iv
from workbench.analysis.trace import tables as ta
__all__ = ["StepGraph", "build_graph", "replay", "critical_path", "LOADER_RE", "detail_of"]

# point kinds
OTHER, LAUNCH, SYNC, BLOCKING_COPY, MARK = 0, 1, 2, 3, 4
KIND_NAMES = {OTHER: "host call", LAUNCH: "launch", SYNC: "sync", BLOCKING_COPY: "blocking copy", MARK: "step"}

LOADER_RE = re.compile(r"DataLoader|dataloader|_MultiProcessingDataLoaderIter|_SingleProcessDataLoaderIter")
_HOST_SYNC_RE = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|Memcpy2D|MemcpyDtoH|MemcpyFromSymbol)$"
    r"|^cu(CtxSynchronize|StreamSynchronize|EventSynchronize|MemcpyDtoH(_v2)?)$"
)
# host calls too short to be dispatch of their own (CUPTI's bookkeeping calls); kept as "other"
LATE_START_US = 20.0   # a GPU op that starts this much after its launch and its stream's previous op waited
XSTREAM_TOL_US = 8.0   # ... for an op on another stream that ended at most this long before it started


@dataclass
class StepGraph:
    """The dependency graph of the profiled steps (arrays, one row per host point / GPU op)."""

    # host points, in time order
    h_ts: np.ndarray
    h_dur: np.ndarray
    h_kind: np.ndarray
    h_gap: np.ndarray           # host time between the previous point's end and this point's start
    h_loader: np.ndarray        # the part of that gap spent inside data-loading spans
    h_ops: np.ndarray           # recorded host ops (cpu_op) starting in the gap
    h_annotations: np.ndarray   # recorded user annotations (record_function) starting in the gap
    h_python: np.ndarray        # recorded python_function events starting in the gap (with_stack)
    h_name: np.ndarray
    # GPU ops
    g_host: np.ndarray          # index of the launching host point, -1 if unknown
    g_stream: np.ndarray
    g_ts: np.ndarray
    g_dur: np.ndarray
    g_cat: np.ndarray           # "kernel" / "gpu_memcpy" / "gpu_memset"
    g_name: np.ndarray
    g_bytes: np.ndarray
    g_xdep: np.ndarray          # GPU op on another stream this one waited for, -1 if none
    # steps: host point index of each ProfilerStep mark and the step numbers
    step_points: np.ndarray
    step_numbers: np.ndarray
    launch_latency_us: float
    detail: str
    device: str
    t0: float                   # start of the first step (trace us)
    t_end: float                # end of the window (trace us)
    notes: list = field(default_factory=list)
    g_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # each GPU op's row in the events

    @property
    def n_steps(self) -> int:
        return max(len(self.step_points), 1)

    def copy(self, **changes) -> "StepGraph":
        g = replace(self, **changes)
        return g


def detail_of(trace) -> str:
    """The profiling detail a trace was recorded at: ``full`` (stacks or memory), ``standard`` (shapes),
    ``light``; from the trace's own flags, else from what it holds."""
    md = {} if isinstance(trace, pd.DataFrame) else (getattr(trace, "metadata", {}) or {})
    ev = ta._events(trace)
    if md.get("with_stack") or md.get("profile_memory"):
        return "full"
    if bool(ta._cat_mask(ev, "python_function").any()):
        return "full"
    if md.get("record_shapes"):
        return "standard"
    if "input_dims" in ev.columns and ev["input_dims"].notna().any():
        return "standard"
    return "light"


def _count_in(starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many of the sorted ``starts`` fall in [lo, hi) for each pair."""
    return np.searchsorted(starts, hi, "left") - np.searchsorted(starts, lo, "left")


def build_graph(trace) -> StepGraph:
    """Read the dependency graph of a trace's profiled steps (see the module docstring)."""
    ev = ta._events(trace)
    ts = ev["ts_us"].to_numpy(float)
    dur = np.nan_to_num(ev["dur_us"].to_numpy(float))
    names = ev["name"]
    is_rt = ta._cat_mask(ev, ta.RUNTIME)
    is_gpu = ta._cat_mask(ev, ta.GPU_ACTIVITY)
    steps = ta._steps(ev)

    # the process that drives the GPU: the one with the most runtime calls
    pids = ev["pid"].to_numpy()
    if is_rt.any():
        vals, counts = np.unique(pids[is_rt], return_counts=True)
        main_pid = vals[np.argmax(counts)]
    else:
        main_pid = pids[0] if len(pids) else 0
    rt_idx = np.flatnonzero(is_rt & (pids == main_pid))
    # drop runtime calls nested inside another runtime call of the same thread
    rt_idx = rt_idx[np.argsort(ts[rt_idx], kind="stable")]
    if rt_idx.size and _any_nested(ev["tid"].to_numpy()[rt_idx], ts[rt_idx], dur[rt_idx]):
        tids = ev["tid"].to_numpy()[rt_idx].tolist()
        keep = np.ones(rt_idx.size, bool)
        last_end: dict = {}
        for j, (t, e, tid) in enumerate(zip(ts[rt_idx].tolist(), (ts[rt_idx] + dur[rt_idx]).tolist(), tids)):
            le = last_end.get(tid, -np.inf)
            if t < le:
                keep[j] = False
            else:
                last_end[tid] = e
        rt_idx = rt_idx[keep]

    rt_names = ta._row_texts(names, rt_idx) if rt_idx.size else np.array([], dtype=object)
    corr = ev["correlation"].to_numpy(dtype="float64", na_value=np.nan) if "correlation" in ev else np.full(len(ev), np.nan)

    # GPU ops and their launching calls
    g_idx = np.flatnonzero(is_gpu)
    g_idx = g_idx[np.argsort(ts[g_idx], kind="stable")]
    rt_corr = corr[rt_idx]
    order = np.argsort(rt_corr, kind="stable")
    sorted_corr = rt_corr[order]
    g_corr = corr[g_idx]
    pos = np.searchsorted(sorted_corr, g_corr)
    pos_c = np.clip(pos, 0, max(len(sorted_corr) - 1, 0))
    found = (len(sorted_corr) > 0) & (sorted_corr[pos_c] == g_corr) if len(sorted_corr) else np.zeros(g_idx.size, bool)
    g_rt = np.where(found, order[pos_c] if len(order) else -1, -1)  # index into rt_idx

    # host points = runtime calls + step marks, in time order
    mark_ts = steps["start_us"].to_numpy(float) if len(steps) else np.array([], float)
    p_ts = np.concatenate([ts[rt_idx], mark_ts])
    p_dur = np.concatenate([dur[rt_idx], np.zeros(mark_ts.size)])
    p_kind = np.concatenate([np.full(rt_idx.size, OTHER), np.full(mark_ts.size, MARK)])
    p_name = np.concatenate([rt_names.astype(object), np.array([f"ProfilerStep#{s}" for s in steps["step"]] if len(steps) else [], dtype=object)])
    src = np.concatenate([np.arange(rt_idx.size), np.full(mark_ts.size, -1)])
    order_p = np.lexsort((p_kind != MARK, p_ts))  # a mark goes before a call at the same time
    p_ts, p_dur, p_kind, p_name, src = p_ts[order_p], p_dur[order_p], p_kind[order_p], p_name[order_p], src[order_p]
    rt_to_point = np.full(rt_idx.size, -1)
    rt_to_point[src[src >= 0]] = np.flatnonzero(src >= 0)

    # kinds: launch if it has GPU work, sync by name, blocking copy if its copy is from/to pageable memory
    # (no runtime calls at all: nothing to index, every GPU event is unlaunched)
    g_host = np.where(g_rt >= 0, rt_to_point[np.maximum(g_rt, 0)], -1) if rt_idx.size else np.full(g_rt.size, -1)
    g_cat = ta._row_texts(ev["cat"], g_idx) if g_idx.size else np.array([], dtype=object)
    g_name = ta._row_texts(names, g_idx) if g_idx.size else np.array([], dtype=object)
    has_gpu = np.zeros(p_ts.size, bool)
    has_gpu[g_host[g_host >= 0]] = True
    is_sync_name = _name_test(p_name, lambda n: bool(_HOST_SYNC_RE.match(n))) & (p_kind != MARK)
    pageable = _name_test(g_name, lambda n: "Pageable" in n)
    blocking_copy_pts = np.unique(g_host[(g_host >= 0) & pageable & (g_cat == "gpu_memcpy")])
    p_kind = np.where(p_kind == MARK, MARK, np.where(has_gpu, LAUNCH, OTHER))
    p_kind[is_sync_name & ~has_gpu] = SYNC
    p_kind[blocking_copy_pts] = BLOCKING_COPY
    # a synchronous cudaMemcpy with GPU work is a copy the host waits for
    p_kind[is_sync_name & has_gpu] = BLOCKING_COPY

    # gaps, merged over threads: time from the furthest end so far to this point's start
    ends = p_ts + p_dur
    ends[p_kind == MARK] = p_ts[p_kind == MARK]
    prev_end = np.concatenate([[p_ts[0] if p_ts.size else 0.0], np.maximum.accumulate(ends)[:-1]])
    gap = np.maximum(p_ts - prev_end, 0.0)
    lo, hi = np.minimum(prev_end, p_ts), p_ts

    # what the host did in each gap: data loading spans (union), recorded events by kind
    host_mask = (pids == main_pid)
    # (category masks found once per events frame, shared with the tables)
    ann = np.flatnonzero(host_mask & ta._cat_mask(ev, ("user_annotation", "cpu_op")))
    is_loader = ta._by_name(names.iloc[ann], lambda s: s.str.contains(LOADER_RE)).astype(bool) if ann.size else np.zeros(0, bool)
    li = ann[is_loader]
    if li.size:
        ls, le = iv.merge(ts[li], ts[li] + dur[li])
        loader = _overlap(lo, hi, ls, le)
    else:
        loader = np.zeros(p_ts.size)

    def counts(mask):
        s = np.sort(ts[mask])
        return _count_in(s, lo, hi) if s.size else np.zeros(p_ts.size, int)

    h_ops = counts(host_mask & ta._cat_mask(ev, "cpu_op"))
    h_ann = counts(host_mask & ta._cat_mask(ev, "user_annotation"))
    h_py = counts(host_mask & ta._cat_mask(ev, "python_function"))

    # launch latency: launch start -> GPU start, for ops whose stream was idle
    g_ts = ts[g_idx]
    g_dur = dur[g_idx]
    g_stream = ev["stream"].to_numpy(dtype="float64", na_value=-1)[g_idx] if "stream" in ev else np.zeros(g_idx.size)
    # the latest end of the earlier ops on the same stream (-inf for a stream's first op)
    prev_same = np.full(g_idx.size, -np.inf)
    g_end_all = g_ts + g_dur
    if np.isnan(g_end_all).any():  # Python's max() skips a NaN where numpy's keeps it: one by one
        last: dict = {}
        for j, (s, e) in enumerate(zip(g_stream.tolist(), g_end_all.tolist())):
            if s in last:
                prev_same[j] = last[s]
            last[s] = max(last.get(s, -np.inf), e)
    else:
        for s in np.unique(g_stream):
            on = np.flatnonzero(g_stream == s)
            prev_same[on[1:]] = np.maximum.accumulate(g_end_all[on])[:-1]
    lt = np.where(g_host >= 0, p_ts[np.maximum(g_host, 0)], np.nan) if p_ts.size else np.full(g_host.size, np.nan)
    idle_stream = (g_host >= 0) & (prev_same < lt)
    lat = g_ts[idle_stream] - lt[idle_stream]
    lat = lat[(lat >= 0) & (lat < 200)]
    launch_latency = float(np.clip(np.median(lat), 1.0, 50.0)) if lat.size else 5.0

    # cross-stream waits: an op that started late although its launch and its stream were ready
    ready = np.maximum(np.where(np.isnan(lt), -np.inf, lt + launch_latency), prev_same)
    late = np.flatnonzero(g_ts - ready > LATE_START_US)
    g_xdep = np.full(g_idx.size, -1)
    if late.size:
        g_end = g_ts + g_dur
        by_end = np.argsort(g_end, kind="stable")
        ends_sorted = g_end[by_end]
        for j in late:
            k = np.searchsorted(ends_sorted, g_ts[j], "right") - 1
            while k >= 0 and ends_sorted[k] >= g_ts[j] - XSTREAM_TOL_US:
                cand = by_end[k]
                if g_stream[cand] != g_stream[j]:
                    g_xdep[j] = cand
                    break
                k -= 1

    step_points = np.flatnonzero(p_kind == MARK)
    gs, ge = ta._gpu_intervals(ev)
    w0, w1 = ta._window(ev, gs, ge)
    notes = []
    if not len(steps):
        notes.append("no ProfilerStep marks: the whole trace is treated as one step")
    return StepGraph(
        h_ts=p_ts, h_dur=p_dur, h_kind=p_kind, h_gap=gap, h_loader=np.minimum(loader, gap), h_ops=h_ops,
        h_annotations=h_ann, h_python=h_py, h_name=p_name,
        g_host=g_host, g_stream=g_stream, g_ts=g_ts, g_dur=g_dur, g_cat=g_cat, g_name=g_name,
        g_bytes=(ev["bytes"].to_numpy(dtype="float64", na_value=np.nan)[g_idx] if "bytes" in ev else np.full(g_idx.size, np.nan)),
        g_xdep=g_xdep, step_points=step_points,
        step_numbers=steps["step"].to_numpy() if len(steps) else np.array([], int),
        launch_latency_us=launch_latency, detail=detail_of(trace), device=_device_name(trace),
        t0=float(p_ts[step_points[0]]) if step_points.size else float(w0), t_end=float(w1), notes=notes,
        g_row=g_idx.astype(np.int64),
    )


def _any_nested(tids: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> bool:
    """Whether a call (in time order) may start before an earlier call of its thread ended (then the
    calls are walked one by one). Without negative or missing times, the first such call is always
    right after the one it overlaps in its thread's order, so pairs of neighbours tell."""
    if np.isnan(ts).any() or np.isnan(dur).any() or (dur < 0).any():
        return True
    o = np.argsort(tids, kind="stable")  # by thread, in time order within each
    t, e, g = ts[o], (ts + dur)[o], tids[o]
    return bool(((g[1:] == g[:-1]) & (t[1:] < e[:-1])).any())


def _name_test(names: np.ndarray, test) -> np.ndarray:
    """``test(name)`` for each of ``names`` (bool), run once per distinct name."""
    if len(names) == 0:
        return np.zeros(0, bool)
    texts = names.tolist() if isinstance(names, np.ndarray) else list(names)
    answer = {n: bool(test(n)) for n in dict.fromkeys(texts)}  # (the texts of _row_texts: str, never missing)
    return np.fromiter(map(answer.__getitem__, texts), bool, len(texts))


def _device_name(trace) -> str:
    if isinstance(trace, pd.DataFrame):
        return ""
    return str(getattr(trace, "device", "") or "")


def _overlap(lo, hi, s, e):
    """Length of [lo, hi) covered by the disjoint sorted intervals [s, e), per pair."""
    cum = np.concatenate([[0.0], np.cumsum(e - s)])

    def covered_until(x):
        k = np.searchsorted(s, x, "right")  # intervals starting at or before x
        full = cum[np.maximum(k - 1, 0)] * (k > 0)
        part = np.where(k > 0, np.clip(x - s[np.maximum(k - 1, 0)], 0, (e - s)[np.maximum(k - 1, 0)]), 0.0)
        return full + part

    return np.maximum(covered_until(hi) - covered_until(lo), 0.0)


@dataclass(frozen=True)
class Replay:
    """When each step would end, and where the time went on the way (from :func:`replay`)."""

    step_ms: float              # makespan of the profiled steps / number of steps
    makespan_us: float
    host_end_us: float
    gpu_end_us: float
    h_start: np.ndarray
    g_start: np.ndarray
    g_end: np.ndarray
    sync_wait_us: float
    step_end_us: np.ndarray = None


def _replay_plan(g: StepGraph) -> dict:
    """What every replay of ``g`` reads the same way, as plain lists (computed once per graph)."""
    plan = g.__dict__.get("_plan")
    if plan is None:
        n = g.h_ts.size
        order = np.argsort(g.g_host, kind="stable")
        hosts = g.g_host[order]
        plan = {
            "first": np.searchsorted(hosts, np.arange(n), "left").tolist(),
            "last": np.searchsorted(hosts, np.arange(n), "right").tolist(),
            "order": order.tolist(),
            # (op, its stream, its launching point, the op it waits for) in replay order
            "ops": list(zip(order.tolist(), g.g_stream[order].tolist(), hosts.tolist(), g.g_xdep[order].tolist())),
            "streams": g.g_stream.tolist(),
            "g_ts": g.g_ts.tolist(),
            "unlaunched": np.flatnonzero(g.g_host < 0).tolist(),
            # the graph's own point kinds (most replays keep them): as a list, and the points that wait
            "kinds": g.h_kind.tolist(),
            "waits": np.flatnonzero((g.h_kind == SYNC) | (g.h_kind == BLOCKING_COPY)).tolist(),
        }
        g.__dict__["_plan"] = plan
    return plan


def replay(g: StepGraph, gap=None, dur=None, g_dur=None, kind=None, gpu_keep=None) -> Replay:
    """Replay the graph, optionally with changed host gaps, point durations, GPU op durations, point
    kinds or GPU ops dropped (``gpu_keep`` False), and return when the steps would end."""
    gap = g.h_gap if gap is None else gap
    dur = g.h_dur if dur is None else dur
    gd = g.g_dur if g_dur is None else g_dur
    own_kinds = kind is None or kind is g.h_kind
    kind = g.h_kind if kind is None else np.asarray(kind)
    n = g.h_ts.size
    m = g.g_ts.size
    plan = _replay_plan(g)
    first, last, orderl, ops = plan["first"], plan["last"], plan["order"], plan["ops"]
    streams, g_ts = plan["streams"], plan["g_ts"]
    # plain Python lists in the loop: indexing numpy arrays element by element costs ~10x more
    gs = [float("nan")] * m
    ge = [float("nan")] * m
    stream_end: dict = {}
    lat = float(g.launch_latency_us)
    gdl = np.asarray(gd, dtype=float).tolist()
    keepl = [True] * m if gpu_keep is None else np.asarray(gpu_keep, dtype=bool).tolist()
    # GPU work already running when the first step starts (launched before the trace): keep its times
    for j in plan["unlaunched"]:
        if keepl[j]:
            gs[j], ge[j] = g_ts[j], g_ts[j] + gdl[j]
            s = streams[j]
            stream_end[s] = max(stream_end.get(s, -np.inf), ge[j])
    sync_wait = 0.0
    t = g.t0
    h_start = np.empty(n)
    if n:
        gapf = np.asarray(gap, dtype=float)
        durf = np.asarray(dur, dtype=float)
        # the host runs on by itself (each point after its gap, then its call) up to a point that waits for
        # the GPU (a sync, a blocking copy): between those, its times are one running sum
        step = np.empty(2 * n)
        step[0::2] = gapf
        step[1::2] = np.where(kind == MARK, 0.0, durf)
        if own_kinds:
            waits, kindl = plan["waits"], plan["kinds"]
        else:
            waits = np.flatnonzero((kind == SYNC) | (kind == BLOCKING_COPY)).tolist()
            kindl = kind.tolist()
        durl = durf.tolist()
        lo = 0
        t = float(g.h_ts[0])  # the first point keeps its time
        for b in waits + [n - 1]:
            if b < lo:
                continue
            seg = step[2 * lo: 2 * b + 1].copy()
            seg[0] = t if lo == 0 else t + seg[0]
            run = np.add.accumulate(seg)
            h_start[lo: b + 1] = run[0::2]
            hs = run[0::2].tolist()
            # the GPU ops launched by these points, in host order
            for j, s, h, x in ops[first[lo]:last[b]]:
                if not keepl[j]:
                    continue
                st = hs[h - lo] + lat
                se = stream_end.get(s)
                if se is not None and se > st:
                    st = se
                if x >= 0 and keepl[x]:
                    xe = ge[x]
                    if xe == xe and xe > st:  # not NaN
                        st = xe
                gs[j] = st
                e = st + gdl[j]
                ge[j] = e
                stream_end[s] = e
            k = kindl[b]
            tb = hs[-1]
            d = durl[b]
            if k == SYNC:
                done = max(stream_end.values()) if stream_end else tb
                end = max(tb + d if d < 5.0 else tb + min(d, 5.0), done + 2.0)
                sync_wait += max(0.0, end - (tb + min(d, 5.0)))
                t = end
            elif k == BLOCKING_COPY:
                op_end = tb + d
                for jj in range(first[b], last[b]):
                    j = orderl[jj]
                    if keepl[j] and ge[j] > op_end:
                        op_end = ge[j]
                t = max(tb + min(d, 5.0), op_end)
            else:  # the last point
                t = tb if k == MARK else tb + d
            lo = b + 1
    g_start = np.asarray(gs, dtype=float)
    g_end = np.asarray(ge, dtype=float)
    gpu_end = float(np.nanmax(g_end)) if np.isfinite(g_end).any() else t
    start = g.t0
    makespan = max(t, gpu_end) - start
    ends = step_ends(g, h_start, g_end, t)
    if ends.size >= 2:
        step_us = (ends[-1] - ends[0]) / (ends.size - 1)
    else:
        step_us = makespan / g.n_steps
    return Replay(step_ms=step_us / 1e3, makespan_us=makespan, host_end_us=t - start,
                  gpu_end_us=gpu_end - start, h_start=h_start, g_start=g_start, g_end=g_end, sync_wait_us=sync_wait,
                  step_end_us=ends)


def step_ends(g: StepGraph, h_start: np.ndarray, g_end: np.ndarray, host_final: float) -> np.ndarray:
    """When each step ends: the later of the host reaching the next step's mark (or the end) and the
    last GPU op launched during the step finishing. A step time is the distance between two ends, so
    work queued before the first step (the host runs ahead of a GPU-bound step) does not count."""
    sp = g.step_points
    if sp.size == 0:
        return np.array([])
    host_next = np.append(h_start[sp[1:]], host_final)
    step_of_point = np.searchsorted(sp, np.arange(g.h_ts.size), "right") - 1
    gpu_end = np.full(sp.size, -np.inf)
    ok = (g.g_host >= 0) & np.isfinite(g_end)
    if ok.any():
        st = step_of_point[g.g_host[ok]]
        valid = st >= 0
        np.maximum.at(gpu_end, st[valid], g_end[ok][valid])
    return np.maximum(host_next, gpu_end)


def critical_path(g: StepGraph, r: Replay | None = None) -> dict:
    """What the time on the critical path of the replayed steps was, in microseconds per step:
    ``gpu`` (kernels/copies the host or the end waited for), ``launch`` (launch calls and the short
    dispatch gaps between them), ``host`` (longer host gaps: Python and CPU work), ``input`` (data
    loading), ``sync`` (host blocked in a sync beyond the GPU work it waited for). Found by walking back
    from the end: through host gaps and calls while the host was the later party, and through the GPU
    op a sync or the end waited for (then its stream predecessors or its launch) otherwise."""
    r = r or replay(g)
    n = g.h_ts.size
    out = {"gpu": 0.0, "launch": 0.0, "host": 0.0, "input": 0.0, "sync": 0.0}
    if n == 0:
        return out
    m = g.g_ts.size
    # plain lists: the walk reads one element at a time
    g_start, g_end = r.g_start.tolist(), r.g_end.tolist()
    g_dur, g_host, g_xdep = g.g_dur.tolist(), g.g_host.tolist(), g.g_xdep.tolist()
    h_kind, h_dur, h_gap, h_loader = g.h_kind.tolist(), g.h_dur.tolist(), g.h_gap.tolist(), g.h_loader.tolist()
    h_start = r.h_start.tolist()
    # each GPU op's predecessor on its stream, in replayed order (-1: the first, or not replayed)
    order = np.argsort(r.g_start, kind="stable")
    order = order[np.isfinite(r.g_start[order])]
    prev_arr = np.full(m, -1, np.int64)
    for s in np.unique(g.g_stream[order]):
        on = order[g.g_stream[order] == s]
        prev_arr[on[1:]] = on[:-1]
    prev_on_stream = prev_arr.tolist()
    finite_end = np.isfinite(r.g_end)
    host_end = g.t0 + r.host_end_us
    gpu_end = g.t0 + r.gpu_end_us
    i = n - 1
    j = int(np.nanargmax(r.g_end)) if finite_end.any() and gpu_end > host_end else None
    lat = g.launch_latency_us
    guard = 0
    while guard < 4 * (n + m) + 10:
        guard += 1
        if j is not None:
            # walk the GPU chain back: stream predecessor that ended when this op started, else its launch
            out["gpu"] += g_dur[j]
            p = prev_on_stream[j]
            x = g_xdep[j]
            st = g_start[j]
            if p >= 0 and abs(g_end[p] - st) < 1e-6:
                j = p
                continue
            if x >= 0 and math.isfinite(g_end[x]) and abs(g_end[x] - st) < 1e-6:
                j = int(x)
                continue
            h = g_host[j]
            if h < 0:
                break
            out["launch"] += lat
            i, j = int(h) - 1, None
            if i < 0:
                break
            continue
        if i < 0:
            break
        k = h_kind[i]
        if k == SYNC:
            # the sync ended when the GPU was done: continue on the GPU's last op
            ends = r.g_end
            cand = np.flatnonzero(finite_end & (ends <= (h_start[i + 1] if i + 1 < n else np.inf)))
            if cand.size and ends[cand].max() > h_start[i] + min(h_dur[i], 5.0):
                j = int(cand[np.argmax(ends[cand])])
                out["sync"] += 2.0
                continue
        if k == LAUNCH or k == OTHER or k == BLOCKING_COPY:
            out["launch" if k == LAUNCH else "host"] += h_dur[i]
        gp = h_gap[i]
        ld = h_loader[i]
        out["input"] += ld
        if gp - ld <= LAUNCH_GAP_US and k == LAUNCH:
            out["launch"] += gp - ld
        else:
            out["host"] += gp - ld
        i -= 1
    return {k: v / g.n_steps for k, v in out.items()}


LAUNCH_GAP_US = ta.LAUNCH_GAP_US

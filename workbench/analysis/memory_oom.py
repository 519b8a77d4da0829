"""OOM post-mortem and the one-call snapshot summary behind ``workbench memory``.

Cause, as decided here (docs/architecture.md repeats it):

- ``fragmentation``: the memory free inside reserved segments of the pool the request goes to is at
  least the request, but no single hole is large enough (so the request needed a new segment and the
  cap refused it).
- ``capacity``: everything else: the request is larger than all the free reserved memory put
  together, so only freeing live tensors (or a larger cap) could help.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis.allocator_segments import SMALL_REQUEST_BYTES, allocator_state
from workbench.analysis.memory import (
    allocation_categories,
    allocations,
    device_events,
    group_live,
    live_allocations,
    memory_timeline,
    peak_memory,
    surviving_allocations,
    user_frame_labels,
)
from workbench.io.snapshot import Action
from workbench.units import format_bytes  # re-exported: its old home

__all__ = [
    "OomReport",
    "oom_postmortem",
    "memory_summary",
    "MemoryAnalysis",
    "analyze_snapshot",
    "format_bytes",
]

@dataclass
class MemoryAnalysis:
    """Everything derived once from a snapshot (the panel, the CLI and the report share it)."""

    snap: object
    device: int
    allocs: pd.DataFrame  # with category/confidence/reason
    timeline: pd.DataFrame
    labels: dict
    peak: dict

    def live_at(self, index: int) -> pd.DataFrame:
        """Allocations live just after event ``index`` with their user frame and category."""
        live = live_allocations(self.allocs, index)
        lbl = np.asarray(self.labels["frame"] + ["(no stack)"], dtype=object)
        sid = live["alloc_stack_id"].to_numpy()
        return live.assign(frame=lbl[np.where(sid >= 0, sid, len(lbl) - 1)])


def analyze_snapshot(snap, device: int | None = None) -> MemoryAnalysis:
    """Lifetimes, categories, timeline and peak of one device's history."""
    allocs = allocations(snap, device)
    device = allocs.attrs["device"]
    allocs = allocation_categories(snap, allocs)
    timeline = memory_timeline(snap, device, allocs=allocs)
    labels = user_frame_labels(snap)
    return MemoryAnalysis(snap, device, allocs, timeline, labels, peak_memory(timeline))


@dataclass
class OomReport:
    """Why an allocation failed, with numbers (bytes)."""

    requested_bytes: int
    cap_bytes: int | None  # per-process limit or device total, when recorded (capture_oom's sidecar)
    allocated_bytes: int
    reserved_bytes: int
    free_in_reserved_bytes: int
    largest_free_block_bytes: int  # in the pool the request goes to
    pool: str  # 'large' or 'small'
    cause: str  # 'capacity' or 'fragmentation'
    shortfall_bytes: int  # how much more memory the request needed than was obtainable
    device_free_bytes: int | None
    time_us: int | None
    index: int
    by_category: dict = field(default_factory=dict)
    top_live: list = field(default_factory=list)
    advice: list = field(default_factory=list)
    torch_message: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> dict:
        """The keys every consumer reads first (docs/json.md), then the extras."""
        d = self.to_dict()
        keys = ["requested_bytes", "allocated_bytes", "reserved_bytes", "free_in_reserved_bytes",
                "largest_free_block_bytes", "cause", "advice"]
        return {**{k: d[k] for k in keys}, **{k: v for k, v in d.items() if k not in keys}}


_ALLOWED_RE = re.compile(r"([\d.]+) (GiB|MiB|KiB) allowed")


def _cap_from_sidecar(extra: dict) -> tuple[int | None, str | None]:
    side = (extra or {}).get("oom") or {}
    cap = side.get("limit_bytes")
    msg = side.get("torch_message")
    if cap is None and msg:
        m = _ALLOWED_RE.search(msg)
        if m:
            try:
                v = float(m.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)]
            except ValueError:  # "1.2.3 GiB allowed"
                v = float("nan")
            cap = int(v) if 0 < v < 2**63 else None  # a message from a file: inf/nan/huge are no cap
    return (int(cap) if cap is not None else None), msg


def oom_postmortem(snap, analysis: MemoryAnalysis | None = None, top: int = 5) -> OomReport | None:
    """The post-mortem of the last OOM in the snapshot, or None when it holds none.

    The allocator state is reconstructed just before the ``oom`` event (torch has already released
    its unused cached segments by then, as it does before raising).
    """
    ev = snap.events
    codes = ev["action"].cat.codes.to_numpy()
    if not (codes == Action.OOM).any():
        return None
    if analysis is None:
        analysis = analyze_snapshot(snap)
    dev_ev = device_events(snap, analysis.device)
    dcodes = dev_ev["action"].cat.codes.to_numpy()
    oom_rows = np.flatnonzero(dcodes == Action.OOM)
    if not len(oom_rows):
        return None
    k = int(oom_rows[-1])
    row = dev_ev.iloc[k]
    requested = int(row["size_bytes"])
    state = allocator_state(snap, analysis.allocs, k)
    pool = "small" if requested <= SMALL_REQUEST_BYTES else "large"
    pool_free = state.small_pool_free_bytes if pool == "small" else state.large_pool_free_bytes
    if pool == "large":
        largest = state.large_pool_largest_free_bytes
    else:
        largest = state.largest_free_block_bytes
    cause = "fragmentation" if (pool_free >= requested and largest < requested) else "capacity"
    cap, msg = _cap_from_sidecar(snap.extra)
    headroom = max(cap - state.reserved_bytes, 0) if cap is not None else 0
    shortfall = max(requested - max(largest, headroom), 0) if cause == "fragmentation" else \
        max(requested - pool_free - headroom, 0)
    live = analysis.live_at(k)
    by_cat = {str(c): int(b) for c, b in live.groupby("category", observed=True)["size_bytes"].sum().items()}
    conf = {str(c): round(float(v), 2) for c, v in live.groupby("category", observed=True)["confidence"].mean().items()}
    top_rows = [
        {"bytes": int(r.size_bytes), "category": str(r.category), "confidence": round(float(r.confidence), 2),
         "frame": r.frame, "stack": snap.stack_text(int(r.alloc_stack_id), limit=8)}
        for r in live.head(top).itertuples()
    ]
    rep = OomReport(
        requested_bytes=requested,
        cap_bytes=cap,
        allocated_bytes=state.allocated_bytes,
        reserved_bytes=state.reserved_bytes,
        free_in_reserved_bytes=state.free_in_reserved_bytes,
        largest_free_block_bytes=largest,
        pool=pool,
        cause=cause,
        shortfall_bytes=int(shortfall),
        device_free_bytes=int(row["device_free_bytes"]) if int(row["device_free_bytes"]) >= 0 else None,
        time_us=int(row["time_us"]),
        index=k,
        by_category={c: {"bytes": b, "confidence": conf.get(c)} for c, b in by_cat.items()},
        top_live=top_rows,
        torch_message=msg,
    )
    rep.advice = _advice(rep, live, analysis)
    return rep


def _advice(rep: OomReport, live: pd.DataFrame, analysis: MemoryAnalysis) -> list[str]:
    fb = format_bytes
    out = []
    cat = {c: v["bytes"] for c, v in rep.by_category.items()}
    acts = cat.get("activations", 0)
    if rep.cause == "fragmentation":
        out.append(
            f"Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call: "
            f"{fb(rep.free_in_reserved_bytes)} is free inside reserved segments but the largest hole is "
            f"{fb(rep.largest_free_block_bytes)}, smaller than the {fb(rep.requested_bytes)} requested; "
            "expandable segments map memory into one growing segment instead of leaving holes.")
        out.append(
            "Or allocate the large, long-lived tensors first (and the short-lived ones after), or cap "
            f"splitting with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{max(1, rep.requested_bytes // 2**20)} "
            "so big blocks are not carved up by small requests.")
    else:
        need = rep.shortfall_bytes
        out.append(
            f"The request for {fb(rep.requested_bytes)} exceeds all free reserved memory "
            f"({fb(rep.free_in_reserved_bytes)})"
            + (f" plus the headroom under the {fb(rep.cap_bytes)} cap" if rep.cap_bytes else "")
            + f": at least {fb(need)} of live tensors must go (live: {fb(rep.allocated_bytes)}).")
        if acts > 0:
            pct = min(100, math.ceil(100 * need / acts)) if need else 0
            if pct and pct < 100:
                out.append(
                    f"Reduce the batch size by at least {pct}%: activations live at the OOM are "
                    f"{fb(acts)} and scale with the batch (needed {fb(need)}).")
            out.append(
                f"Activation checkpointing (torch.utils.checkpoint around each block) keeps only block "
                f"inputs instead of the {fb(acts)} of activations live at the OOM.")
            out.append(
                f"Mixed precision (torch.autocast with bfloat16) roughly halves activation memory: about "
                f"{fb(acts / 2)} saved here.")
        if rep.free_in_reserved_bytes >= 0.05 * rep.requested_bytes and rep.free_in_reserved_bytes > 0:
            out.append(
                f"{fb(rep.free_in_reserved_bytes)} is reserved but unallocated; "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator reuse it for large requests.")
    grads = cat.get("gradients", 0)
    if grads:
        out.append(f"{fb(grads)} of gradients are live: call optimizer.zero_grad(set_to_none=True) before "
                   "the forward pass so they are freed while activations grow.")
    opt = cat.get("optimizer_state", 0)
    if opt:
        out.append(f"Optimizer state holds {fb(opt)}: a foreach=False/fused optimizer, an 8-bit optimizer or "
                   "sharding (FSDP/ZeRO) reduces it.")
    if rep.top_live:
        t = rep.top_live[0]
        out.append(f"Largest live allocation: {fb(t['bytes'])} ({t['category']}) from {t['frame']}; "
                   f"the top {len(rep.top_live)} hold {fb(sum(x['bytes'] for x in rep.top_live))}.")
    return out


def _finding(fid, severity, message, **evidence):
    return {"id": fid, "severity": severity, "message": message, "evidence": evidence}


def memory_summary(snap, top: int = 10, analysis: MemoryAnalysis | None = None,
                   profiler_timeline: pd.DataFrame | None = None) -> dict:
    """The ``workbench memory --json`` record (every key in docs/json.md).

    ``profiler_timeline``: torch.profiler's category timeline of the same run
    (``io.load_memory_timeline``); its peak per category is added as ``profiler_categories`` (the
    profiler tracks tensors itself, so those categories are certain where the stack-based ones are
    inferred)."""
    a = analysis or analyze_snapshot(snap)
    fb = format_bytes
    seg = snap.segments
    seg_d = seg[seg["device"].to_numpy() == a.device] if len(seg) else seg
    n = len(a.timeline)
    pk = a.peak
    live = a.live_at(pk["index"])
    top_allocs = [
        {"bytes": int(r.size_bytes), "category": str(r.category), "confidence": round(float(r.confidence), 2),
         "frame": r.frame, "alloc_index": int(r.alloc_index),
         "stack": snap.stack_text(int(r.alloc_stack_id), limit=8)}
        for r in live.head(top).itertuples()
    ]
    by_frame = group_live(live, a.labels, "frame", top).to_dict("records")
    by_function = group_live(live, a.labels, "function", top).to_dict("records")
    by_cat = group_live(live, a.labels, "category").to_dict("records")
    state_end = allocator_state(snap, a.allocs)
    state_peak = allocator_state(snap, a.allocs, pk["index"]) if pk["index"] >= 0 else state_end
    oom = oom_postmortem(snap, a)
    surv = surviving_allocations(a.allocs, a.labels)
    findings = []
    if oom is not None:
        findings.append(_finding(
            f"oom_{oom.cause}", "critical",
            f"Out of memory ({oom.cause}): {fb(oom.requested_bytes)} requested with {fb(oom.allocated_bytes)} "
            f"allocated, {fb(oom.reserved_bytes)} reserved, largest free block {fb(oom.largest_free_block_bytes)}",
            requested_bytes=oom.requested_bytes, free_in_reserved_bytes=oom.free_in_reserved_bytes))
    if state_peak.free_in_reserved_bytes > 256 * 2**20 and state_peak.fragmentation > 0.5:
        findings.append(_finding(
            "fragmentation", "warning",
            f"At the peak {fb(state_peak.free_in_reserved_bytes)} is free inside reserved segments but the "
            f"largest hole is {fb(state_peak.largest_free_block_bytes)} (fragmentation "
            f"{state_peak.fragmentation:.2f}); consider PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            fragmentation=round(state_peak.fragmentation, 3),
            free_in_reserved_bytes=state_peak.free_in_reserved_bytes,
            largest_free_block_bytes=state_peak.largest_free_block_bytes))
    if state_end.reserved_bytes > 2 * max(pk["allocated_bytes"], 1) and state_end.reserved_bytes > 512 * 2**20:
        findings.append(_finding(
            "cache_overhead", "info",
            f"Reserved {fb(state_end.reserved_bytes)} is more than twice the peak allocated "
            f"{fb(pk['allocated_bytes'])}: the cache holds memory other processes cannot use",
            reserved_bytes=state_end.reserved_bytes, peak_allocated_bytes=pk["allocated_bytes"]))
    leaks = surv[surv["leak_like"]]
    if len(leaks):
        r = leaks.iloc[0]
        findings.append(_finding(
            "growing_allocations", "warning",
            f"{int(r['count'])} allocations ({fb(int(r['bytes']))}) from {r['frame']} were made across the "
            "window and never freed: a leak across steps, or state that grows (e.g. a list of losses kept "
            "on the GPU)",
            frame=r["frame"], bytes=int(r["bytes"]), count=int(r["count"])))
    pre_freed = int((a.allocs["preexisting"] & (a.allocs["free_index"] < n)).sum())
    if n and pre_freed:
        findings.append(_finding(
            "history_truncated", "info",
            f"The history starts mid-run ({pre_freed} frees of tensors allocated before the first recorded "
            "event): the ring buffer wrapped or recording began late; raise max_entries for the full picture",
            preexisting_freed=pre_freed))
    if not n:
        findings.append(_finding(
            "no_history", "info",
            "The snapshot holds no allocation history (only the state at snapshot time); record with "
            "workbench.capture.record_memory_history() to get a timeline",
        ))
    prof = None
    if profiler_timeline is not None:
        from workbench.analysis.memory import profiler_category_peak

        prof = profiler_category_peak(profiler_timeline)
    t0 = int(a.timeline["time_us"].iloc[0]) if n else None
    t1 = int(a.timeline["time_us"].iloc[-1]) if n else None
    return {
        "source": {"path": snap.source, "layout": snap.layout, "device": a.device, "devices": snap.devices,
                   "start_time_us": t0, "end_time_us": t1,
                   "expandable_segments": bool(snap.allocator_settings.get("expandable_segments", False))},
        "events": int(len(snap.events)),
        "segments": int(len(seg_d)),
        "peak": {
            "allocated_bytes": int(pk["allocated_bytes"]),
            "reserved_bytes": int(pk["reserved_bytes"]),
            "time_us": pk["time_us"],
            "index": int(pk["index"]),
            "top_allocations": top_allocs,
            "by_frame": by_frame,
            "by_function": by_function,
            "by_category": by_cat,
            "fragmentation": round(state_peak.fragmentation, 4),
            "free_in_reserved_bytes": state_peak.free_in_reserved_bytes,
            "largest_free_block_bytes": state_peak.largest_free_block_bytes,
        },
        "allocated_bytes": int(seg_d["allocated_size_bytes"].sum()) if len(seg_d) else state_end.allocated_bytes,
        "reserved_bytes": int(seg_d["total_size_bytes"].sum()) if len(seg_d) else state_end.reserved_bytes,
        "free_in_reserved_bytes": state_end.free_in_reserved_bytes,
        "largest_free_block_bytes": state_end.largest_free_block_bytes,
        "fragmentation": round(state_end.fragmentation, 4),
        "surviving_allocations": surv.head(top).to_dict("records"),
        "oom": oom.to_json() if oom is not None else None,
        "findings": findings,
        "profiler_categories": prof,
    }

"""OOM post-mortem and the one-call snapshot summary behind ``workbench memory``.

Cause, as decided here (docs/memory.md repeats it):

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
from functools import cached_property

import numpy as np
import pandas as pd

from workbench.analysis.memory.segments import (
    CACHED_UNUSED_ALARM,
    SMALL_REQUEST_BYTES,
    AllocatorState,
    allocator_state,
)
from workbench.analysis.findings import Finding
from workbench.analysis.memory.allocations import (
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
from workbench.analysis.memory.findings import memory_findings
from workbench.analysis.memory.steps import event_phases, oom_position
from workbench.analysis.memory.whatif import whatif_advice
from workbench.io.snapshot import Action
from workbench.units import format_bytes

__all__ = [
    "allocator_settings_summary",
    "OomReport",
    "oom_postmortem",
    "memory_summary",
    "MemoryAnalysis",
    "analyze_snapshot",
]


@dataclass
class MemoryAnalysis:
    """Everything derived once from a snapshot (the panel, the CLI and the report share it): the
    allocations, the timeline and the peak; on first use, the allocator state at the peak and at the
    end, the OOM post-mortem, the surviving allocations and the ``findings``."""

    snap: object
    device: int
    allocs: pd.DataFrame  # with category/confidence/reason
    timeline: pd.DataFrame
    labels: dict
    peak: dict

    @classmethod
    def from_snapshot(cls, snap, device: int | None = None) -> "MemoryAnalysis":
        """The analysis of a loaded snapshot (``load_snapshot``), the same as :func:`analyze_snapshot`."""
        return analyze_snapshot(snap, device=device)

    def live_at(self, index: int) -> pd.DataFrame:
        """Allocations live just after event ``index`` with their user frame and category."""
        live = live_allocations(self.allocs, index)
        lbl = np.asarray(self.labels["frame"] + ["(no stack)"], dtype=object)
        sid = live["alloc_stack_id"].to_numpy()
        return live.assign(frame=lbl[np.where(sid >= 0, sid, len(lbl) - 1)])

    # computed once, on first use, and shared by the findings, the JSON summary and the panel

    @cached_property
    def settings(self) -> dict:
        """:func:`allocator_settings_summary` of the snapshot."""
        return allocator_settings_summary(self.snap.allocator_settings)

    @cached_property
    def state_end(self) -> AllocatorState:
        """The allocator state after the last event."""
        return allocator_state(self.snap, self.allocs)

    @cached_property
    def state_peak(self) -> AllocatorState:
        """The allocator state at the peak of allocated memory (the end's when there is no history)."""
        k = self.peak["index"]
        return allocator_state(self.snap, self.allocs, k) if k >= 0 else self.state_end

    @cached_property
    def oom(self) -> OomReport | None:
        """:func:`oom_postmortem` of the last OOM (without a batch size), or None."""
        return oom_postmortem(self.snap, self)

    @cached_property
    def surviving(self) -> pd.DataFrame:
        """:func:`~workbench.analysis.memory.allocations.surviving_allocations`: what the window never frees, by frame."""
        return surviving_allocations(self.allocs, self.labels)

    @cached_property
    def findings(self) -> tuple[Finding, ...]:
        """The memory findings (:mod:`workbench.analysis.memory.findings`), in the JSON's order."""
        return memory_findings(self)


def analyze_snapshot(snap, device: int | None = None) -> MemoryAnalysis:
    """Lifetimes, categories, timeline and peak of one device's history."""
    allocs = allocations(snap, device)
    device = allocs.attrs["device"]
    allocs = allocation_categories(snap, allocs)
    timeline = memory_timeline(snap, device, allocs=allocs)
    labels = user_frame_labels(snap)
    return MemoryAnalysis(snap, device, allocs, timeline, labels, peak_memory(timeline))


def allocator_settings_summary(settings: dict | None) -> dict:
    """The four caching-allocator settings a post-mortem needs, from a snapshot's ``allocator_settings``
    (torch 2.5+; older snapshots have none and every value is None = not recorded).

    ``expandable_segments`` (bool), ``max_split_size_bytes`` (None: not set, torch's default of no
    limit), ``garbage_collection_threshold`` (None: not set), ``roundup_power2_divisions`` (None: not
    set; an int when one value applies to every size, else ``{size MiB: divisions}``), ``conf`` (the
    PYTORCH_CUDA_ALLOC_CONF string the process saw), ``recorded`` (whether the snapshot had them)."""
    st = settings if isinstance(settings, dict) else {}
    out = {"recorded": bool(st), "conf": st.get("PYTORCH_CUDA_ALLOC_CONF") or None}
    exp = st.get("expandable_segments")
    out["expandable_segments"] = bool(exp) if exp is not None else None
    mss = st.get("max_split_size")
    try:
        mss = int(mss) if mss is not None else None
    except (TypeError, ValueError):
        mss = None
    out["max_split_size_bytes"] = mss if mss is not None and 0 < mss < 2**62 else None
    gc = st.get("garbage_collection_threshold")
    try:
        gc = float(gc) if gc is not None else None
    except (TypeError, ValueError):
        gc = None
    out["garbage_collection_threshold"] = gc if gc else None
    rd = st.get("roundup_power2_divisions")
    div = None
    if isinstance(rd, dict):
        vals = {str(k): int(v) for k, v in rd.items() if isinstance(v, (int, float)) and v}
        if vals:
            div = next(iter(vals.values())) if len(set(vals.values())) == 1 and len(vals) == len(rd) else vals
    elif isinstance(rd, (int, float)) and rd:
        div = int(rd)
    out["roundup_power2_divisions"] = div
    return out


def _settings_text(st: dict) -> str:
    if not st.get("recorded"):
        return "allocator settings: not recorded in this snapshot (torch < 2.5)"
    parts = [f"expandable_segments {'on' if st['expandable_segments'] else 'off'}",
             "max_split_size " + (format_bytes(st["max_split_size_bytes"]) if st["max_split_size_bytes"] else "not set"),
             "garbage_collection_threshold " + (f"{st['garbage_collection_threshold']:g}"
                                                if st["garbage_collection_threshold"] else "not set"),
             "roundup_power2_divisions " + (str(st["roundup_power2_divisions"]) if st["roundup_power2_divisions"]
                                            else "not set")]
    return "allocator settings: " + ", ".join(parts)


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
    advice: list = field(default_factory=list)  # memory.whatif.whatif_advice items: {id, text, what_if, ...}
    torch_message: str | None = None
    allocator_settings: dict = field(default_factory=dict)  # allocator_settings_summary()
    position: dict = field(default_factory=dict)  # steps.oom_position(): phase, step, block
    step_need: dict = field(default_factory=dict)  # what the whole step needs and the batch that fits
    step_model: dict | None = None  # memory.whatif.StepMemoryModel.summary(): the step by kind

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


def oom_postmortem(snap, analysis: MemoryAnalysis | None = None, top: int = 5,
                   batch_size: int | None = None) -> OomReport | None:
    """The post-mortem of the last OOM in the snapshot, or None when it holds none.

    The allocator state is reconstructed just before the ``oom`` event (torch has already released
    its unused cached segments by then, as it does before raising). ``batch_size``: the batch the
    failing step ran with, to turn the fraction of the batch that fits into a number.
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
        allocator_settings=allocator_settings_summary(snap.allocator_settings),
    )
    try:
        rep.position = oom_position(snap, analysis, k, event_phases(snap, analysis.device))
    except (ValueError, IndexError, KeyError):  # an odd history: the rest of the post-mortem stands
        rep.position = {}
    rep.advice, model = whatif_advice(analysis, rep, batch_size)
    rep.step_model = model.summary() if model is not None else None
    _blocks_from_model(rep.position, model)  # one block count before anything reads the position's total
    rep.step_need = _step_need(rep, analysis, k, headroom, batch_size)
    if rep.top_live:  # the largest live allocation, as evidence of the first item
        t = rep.top_live[0]
        note = (f"largest live allocation: {format_bytes(t['bytes'])} ({t['category']}) from {t['frame']}; the top "
                f"{len(rep.top_live)} hold {format_bytes(sum(x['bytes'] for x in rep.top_live))}")
        if rep.advice:
            rep.advice[0]["evidence"].append(note)
    return rep


def _blocks_from_model(pos: dict, model) -> None:
    """One block count: the step model's (blocks counted from the module structure the frames name) replaces
    the position's count from parameter-size multiples, where the model has one."""
    if not pos or model is None or not getattr(model, "n_blocks", 0):
        return
    n = int(model.n_blocks)
    pos["layers"], pos["layers_reason"] = n, model.blocks_method
    if pos.get("layer") is None:
        return
    if pos.get("prefix_bytes") is not None and pos.get("block_bytes") is not None:
        pos["forward_total_bytes"] = int(pos["prefix_bytes"] + n * pos["block_bytes"])
    if pos["layer"] > n:  # the repeating pattern is finer than a block
        pos["confidence"] = min(pos.get("confidence") or 0.0, 0.3)
    pos["text"] = f"forward of block {min(pos['layer'], n)} of {n}, step {pos['step']}"


def _step_need(rep: OomReport, analysis: MemoryAnalysis, k: int, headroom: int, batch_size: int | None) -> dict:
    """What the whole training step needs, from the live memory at the OOM and the forward's blocks so far.

    A step has two peaks (the ones :func:`workbench.capture.estimate.estimate` finds):

    - the activation peak, early in the backward, when the forward has kept all its activations and
      the backward makes its first gradients of them: static (does not grow with the batch) =
      parameters + optimizer state (live, or assumed Adam-style, 2 x the parameters, when the OOM
      fell before the optimizer's first step) + gradients live at the OOM (kept across steps when
      ``zero_grad(set_to_none=False)``; none otherwise: they are made as the activations are freed)
      + other live memory that is neither in this forward nor an input (workspaces, buffers);
      scaling (grows with the batch) = the forward's full size (prefix + blocks x bytes one block
      keeps, :func:`oom_position`) + this step's inputs + the backward's transient: the gradients of
      one block's activations, about as large as what the block keeps, made while all the
      blocks still hold theirs (none added when the block size comes from the partial block the OOM
      fell in: what it holds at the OOM includes its in-flight temporaries). The share of the batch that fits is ``(budget - static) / scaling``.
    - the optimizer peak, independent of the batch: parameters + all gradients (one per parameter)
      + optimizer state + the optimizer's temporaries (a foreach Adam makes one parameter-sized
      temporary per parameter; assumed with the state). When it alone exceeds the budget, no batch fits.

    budget = the cap when one is known (what the allocator may hold in all), else reserved at the OOM.
    """
    pos = rep.position or {}
    a = analysis.allocs
    live = a[(a["alloc_index"] <= k) & (a["free_index"] > k)]
    cat = live["category"].astype(str).to_numpy()
    sizes = live["size_bytes"].to_numpy()
    params = int(sizes[cat == "parameters"].sum())
    opt = int(sizes[cat == "optimizer_state"].sum())
    grads = int(sizes[cat == "gradients"].sum())
    assumed = False
    if opt == 0 and params and pos.get("step") == 1 and pos.get("phase") in ("forward", "backward"):
        opt, assumed = 2 * params, True
    budget = rep.cap_bytes if rep.cap_bytes else rep.reserved_bytes + headroom
    out = {"budget_bytes": int(budget), "parameters_bytes": params, "optimizer_state_bytes": opt,
           "optimizer_state_assumed": assumed, "gradients_live_bytes": grads, "other_bytes": None,
           "forward_bytes": None, "backward_transient_bytes": None, "static_bytes": None,
           "scaling_bytes": None, "step_bytes": None, "optimizer_peak_bytes": None, "batch_fraction": None,
           "batch_cut_pct": None, "batch_size": batch_size, "largest_batch": None, "method": None}
    fwd_total = pos.get("forward_total_bytes")
    if not fwd_total:
        return out
    phases = event_phases(analysis.snap, analysis.device)
    ai = live["alloc_index"].to_numpy()
    ph = np.where(ai >= 0, phases[np.maximum(ai, 0)], "")
    in_fwd_now = (ph == "forward")
    fixed = np.isin(cat, ["parameters", "optimizer_state", "gradients"])
    # inputs: made in the window outside forward/backward/optimizer and not a parameter, grad or state
    inputs = int(sizes[(ai >= 0) & (ph == "") & ~fixed].sum())
    other = max(int(sizes[~in_fwd_now & ~fixed].sum()) - inputs, 0)
    # a block measured from complete blocks keeps only what survives it; a block taken from the partial
    # one (no complete block yet: a lower bound) holds its in-flight temporaries, the failing request
    # among them, which stand in for the transient
    transient = 0 if pos.get("block_bytes_is_lower_bound") else int(pos.get("block_bytes") or 0)
    static = params + opt + grads + other
    scaling = int(fwd_total) + inputs + transient
    # the optimizer's peak: every gradient + its temporaries (as large as the parameters when the
    # state is Adam-style: assumed, or twice the parameters)
    opt_tmp = params if (assumed or (params and opt >= 2 * params)) else 0
    opt_peak = params + max(grads, params) + opt + opt_tmp + other
    frac = max(0.0, (out["budget_bytes"] - static) / scaling) if scaling > 0 else None
    if frac is not None and opt_peak > out["budget_bytes"]:
        frac = 0.0  # the optimizer step alone does not fit: no batch does
    out.update(other_bytes=other, forward_bytes=int(fwd_total), backward_transient_bytes=transient,
               static_bytes=int(static), scaling_bytes=scaling, step_bytes=int(max(static + scaling, opt_peak)),
               optimizer_peak_bytes=int(opt_peak),
               batch_fraction=round(frac, 4) if frac is not None else None,
               method="activation peak: parameters + optimizer state + forward blocks so far x blocks in the "
                      "model + one block's backward; optimizer peak: + all gradients + its temporaries")
    if frac is not None and frac < 1:
        out["batch_cut_pct"] = round(100 * (1 - frac), 1)
        if batch_size:
            out["largest_batch"] = int(math.floor(batch_size * frac + 1e-9))
    return out


def _top_allocations(snap, live: pd.DataFrame, top: int) -> list[dict]:
    return [
        {"bytes": int(r.size_bytes), "category": str(r.category), "confidence": round(float(r.confidence), 2),
         "frame": r.frame, "alloc_index": int(r.alloc_index),
         "stack": snap.stack_text(int(r.alloc_stack_id), limit=8)}
        for r in live.head(top).itertuples()
    ]


def _peak_block(a: MemoryAnalysis, top: int) -> dict:
    """The summary's ``peak``: what was live at the peak of allocated memory and the allocator state there."""
    pk, st = a.peak, a.state_peak
    live = a.live_at(pk["index"])
    return {
        "allocated_bytes": int(pk["allocated_bytes"]),
        "reserved_bytes": int(pk["reserved_bytes"]),
        "time_us": pk["time_us"],
        "index": int(pk["index"]),
        "top_allocations": _top_allocations(a.snap, live, top),
        "by_frame": group_live(live, a.labels, "frame", top).to_dict("records"),
        "by_function": group_live(live, a.labels, "function", top).to_dict("records"),
        "by_category": group_live(live, a.labels, "category").to_dict("records"),
        "fragmentation": round(st.fragmentation, 4),
        "external_fragmentation": round(st.external_fragmentation, 4),
        "cached_unused_share": round(st.cached_unused_share, 4),
        "free_in_reserved_bytes": st.free_in_reserved_bytes,
        "largest_free_block_bytes": st.largest_free_block_bytes,
    }


def _source_block(a: MemoryAnalysis) -> dict:
    snap, tl = a.snap, a.timeline
    return {"path": snap.source, "layout": snap.layout, "device": a.device, "devices": snap.devices,
            "start_time_us": int(tl["time_us"].iloc[0]) if len(tl) else None,
            "end_time_us": int(tl["time_us"].iloc[-1]) if len(tl) else None,
            "expandable_segments": bool(snap.allocator_settings.get("expandable_segments", False))}


def memory_summary(snap, top: int = 10, analysis: MemoryAnalysis | None = None,
                   profiler_timeline: pd.DataFrame | None = None, batch_size: int | None = None) -> dict:
    """The ``workbench memory --json`` record (every key in docs/json.md).

    ``findings`` are ``analysis.findings`` (:mod:`workbench.analysis.memory.findings`) as dicts.
    ``profiler_timeline``: torch.profiler's category timeline of the same run
    (``io.load_memory_timeline``); its peak per category is added as ``profiler_categories`` (the
    profiler tracks tensors itself, so those categories are certain where the stack-based ones are
    inferred). ``batch_size``: as for :func:`oom_postmortem` (the OOM advice names the largest batch)."""
    a = analysis or analyze_snapshot(snap)
    seg = snap.segments
    seg_d = seg[seg["device"].to_numpy() == a.device] if len(seg) else seg
    end = a.state_end
    oom = a.oom if batch_size is None else oom_postmortem(snap, a, batch_size=batch_size)
    prof = None
    if profiler_timeline is not None:
        from workbench.analysis.memory.allocations import profiler_category_peak

        prof = profiler_category_peak(profiler_timeline)
    return {
        "source": _source_block(a),
        "events": int(len(snap.events)),
        "segments": int(len(seg_d)),
        "peak": _peak_block(a, top),
        "allocated_bytes": int(seg_d["allocated_size_bytes"].sum()) if len(seg_d) else end.allocated_bytes,
        "reserved_bytes": int(seg_d["total_size_bytes"].sum()) if len(seg_d) else end.reserved_bytes,
        "free_in_reserved_bytes": end.free_in_reserved_bytes,
        "largest_free_block_bytes": end.largest_free_block_bytes,
        "fragmentation": round(end.fragmentation, 4),
        "external_fragmentation": round(end.external_fragmentation, 4),
        "cached_unused_share": round(end.cached_unused_share, 4),
        "cached_unused_alarm": CACHED_UNUSED_ALARM,
        "allocator_settings": dict(a.settings),
        "surviving_allocations": a.surviving.head(top).to_dict("records"),
        "oom": oom.to_json() if oom is not None else None,
        "findings": [f.as_dict() for f in a.findings],
        "profiler_categories": prof,
    }

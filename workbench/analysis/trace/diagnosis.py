"""Diagnosis with what-if: the limiter of a profiled step and what each fix would save.

Every cause is a counterfactual on the step's dependency graph (:mod:`workbench.analysis.trace.step_model`):
the graph is edited the way the fix would change the program and replayed; the saving is
``1 - replayed(fixed) / replayed(as recorded)``. The profiler's own host work is removed first, so the
other fixes are judged on the step as it runs without the profiler.

=====================  ===================================================================================
``profiler``           the profiler's own host cost: a measured one when the trace carries it (traces
                       written by :func:`workbench.capture.profiler.profile_steps` record the unprofiled
                       step time in their metadata), else an estimate per recorded event
                       (:data:`EVENT_COST_US`, measured on an H200; approximate, see docs/diagnosis.md)
``input``              data loading (DataLoader ``__next__`` spans) overlapped with the previous step, as
                       enough DataLoader workers would do
``sync``               the host no longer blocks in synchronising calls (``.item()``, ``.cpu()``, ...)
``launch``             launches cost nothing and short dispatch gaps vanish (CUDA graphs, fewer kernels)
``host``               the longer host gaps that are not data loading vanish (Python / CPU work moved
                       off the step or compiled away)
``memcpy``             pageable copies pinned (non_blocking, at the device's pinned bandwidth), and
                       host<->device copies removed (the data kept on the GPU)
=====================  ===================================================================================

:func:`diagnose` returns a :class:`Diagnosis`: the bound (the cause whose fix saves the most, if it
saves at least :data:`BOUND_MIN_SAVING`; else ``gpu``), the step time as recorded and without the
profiler, GPU busy time per step, and one :class:`WhatIf` per cause.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis import _intervals as iv
from workbench.analysis.trace import step_model as sm
__all__ = ["WhatIf", "Diagnosis", "FIX_CODE", "fix_code", "diagnose", "diagnose_cpu", "gpu_what_if", "gpu_what_ifs",
           "fewer_launches_what_if", "EVENT_COST_US", "BOUND_MIN_SAVING", "PINNED_GBPS"]

# The profiler's host cost per recorded event, in microseconds, by detail level (light: ops and runtime
# calls; standard adds shapes to each op; full adds Python stacks and memory events). Median over the
# H200 recordings in tests/data/h200_pairs (a 3.4 GHz-class host): 1.9-7 us per event depending on the
# workload, so a trace without a measured cost gets an estimate, labelled as such.
EVENT_COST_US = {"light": 3.6, "standard": 4.2, "full": 5.2}
PYTHON_EVENT_COST_US = 0.0  # python_function events: their cost is inside the ops' figure for "full"
BOUND_MIN_SAVING = 0.10     # a cause is the bound only if fixing it saves at least this share
REPORT_MIN_SAVING = 0.03    # smaller savings are not reported as findings
# Pinned host<->device bandwidth (GB/s) used when the trace has no pinned copy of its own to measure:
# measured 54 GB/s for a 64 MiB pinned copy on the H200 here (PCIe Gen5 x16); Gen4 x16 ~ 25, Gen3 ~ 12.
PINNED_GBPS = (("H200", 54.0), ("H100", 50.0), ("GH200", 50.0), ("B200", 50.0), ("L40S", 25.0), ("L4", 25.0),
               ("A100", 25.0), ("A10", 25.0), ("MI300", 50.0), ("MI250", 25.0), ("V100", 12.0), ("T4", 12.0))
DEFAULT_PINNED_GBPS = 25.0
QUEUE_FULL_US = 1000.0  # a launch call this long waited for room in the launch queue (a GPU-bound stream)
TIE = 0.02  # savings this close count as equal; then the easier fix is named
EASE = ("profiler", "sync", "input", "memcpy_pinned", "memcpy", "launch", "host")


@dataclass(frozen=True)
class WhatIf:
    """One counterfactual: the step as recorded, the step with the fix, the saving and the change."""

    cause: str
    step_ms: float
    step_ms_if_fixed: float
    saved_fraction: float
    change: str
    evidence: dict = field(default_factory=dict)
    measured: bool = False  # True when the saving comes from a measurement in the trace, not the model
    fix_code: str = ""  # the fix as one line of code (:func:`fix_code`); filled from the cause when not given

    def __post_init__(self):
        if not self.fix_code:
            object.__setattr__(self, "fix_code", fix_code(self.cause, self.evidence))

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("cause")
        d.pop("evidence")
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


# The fix of each cause as one line a user can paste (the panels and the reports show it with a copy
# button; the JSON carries it as ``what_if.fix_code``). ``{workers}``: the DataLoader workers the input
# what-if assumes.
FIX_CODE = {
    "profiler": 'profile_steps(step, detail="light")  # then time the step without the profiler',
    "input": "DataLoader(dataset, num_workers={workers}, pin_memory=True, persistent_workers=True)",
    "sync": "running_loss += loss.detach()  # no .item()/.cpu() in the loop: read it every N steps",
    "launch": 'model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs: one launch for many kernels',
    "host": "model = torch.compile(model)  # and move logging/metrics out of the step",
    "memcpy_pinned": 'x = x.pin_memory().to("cuda", non_blocking=True)  # or DataLoader(..., pin_memory=True)',
    "memcpy": 'x = torch.empty(shape, device="cuda")  # make or keep the data on the GPU, no host copy',
    "tf32": "torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True",
    "bf16": 'with torch.autocast("cuda", dtype=torch.bfloat16):  # around the forward and the loss',
    "fp16": 'with torch.autocast("cuda", dtype=torch.float16):  # with torch.amp.GradScaler("cuda")',
    "bf16_channels_last": 'model = model.to(memory_format=torch.channels_last)  # + x.to(memory_format=...), autocast bf16',
    "launch_fused": "optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)  # one kernel per group",
}


def fix_code(cause: str, evidence: dict | None = None) -> str:
    """The fix of ``cause`` as one line of code (:data:`FIX_CODE`), the DataLoader workers taken from the
    input what-if's evidence; empty for a cause without one."""
    ev = evidence or {}
    workers = ev.get("workers") or ev.get("workers_needed") or 4
    code = FIX_CODE.get(cause, "").format(workers=max(int(workers), 1))
    if cause == "input" and "loader" in ev:  # a CPU-only step: nothing to pin
        code = code.replace(", pin_memory=True", "")
    return code


@dataclass(frozen=True)
class Diagnosis:
    """The limiter of the step (``bound``: gpu, host, input, launch, sync, memcpy, profiler) and the
    what-if of every cause, largest saving first."""

    bound: str
    step_ms: float
    step_ms_unprofiled: float
    gpu_busy_ms: float
    what_ifs: tuple
    detail: str
    steps: int
    critical_path_ms: dict
    notes: tuple = ()
    step_ms_model: float = float("nan")  # the model's replay of the step as recorded (what-ifs are ratios to it)

    def what_if(self, cause: str) -> WhatIf | None:
        return next((w for w in self.what_ifs if w.cause == cause), None)

    def as_dict(self) -> dict:
        return {
            "bound": self.bound,
            # not rounded: the trace's per_step numbers, identical in every front (docs/definitions.md)
            "step_ms": float(self.step_ms),
            "step_ms_model": None if not math.isfinite(self.step_ms_model) else round(self.step_ms_model, 4),
            "step_ms_unprofiled": round(self.step_ms_unprofiled, 4),
            "gpu_busy_ms": float(self.gpu_busy_ms),
            "detail": self.detail,
            "steps": self.steps,
            "critical_path_ms": {k: round(v, 4) for k, v in self.critical_path_ms.items()},
            "what_if": {w.cause: w.as_dict() for w in self.what_ifs},
            "notes": list(self.notes),
        }


def _pinned_gbps(g: sm.StepGraph) -> tuple[float, str]:
    """Pinned host<->device bandwidth: the trace's own large pinned copies if it has any, else the table."""
    pinned = sm._name_test(g.g_name, lambda n: "Pinned" in n and ("HtoD" in n or "DtoH" in n))
    big = pinned & (np.nan_to_num(g.g_bytes) >= 2**20) & (g.g_dur > 0)
    if big.any():
        return float(np.median(g.g_bytes[big] / g.g_dur[big] / 1e3)), "measured on this trace's pinned copies"
    for key, v in PINNED_GBPS:
        if key.lower() in g.device.lower():
            return v, f"table value for {key}"
    return DEFAULT_PINNED_GBPS, "default (PCIe Gen4 x16)"


def _unprofiled_graph(g: sm.StepGraph, cost_us: float | None = None):
    """Gaps and durations with the profiler's own host work taken out: ``cost_us`` per recorded event
    (default: the estimate for the trace's detail level)."""
    c = EVENT_COST_US.get(g.detail, EVENT_COST_US["light"]) if cost_us is None else cost_us
    over = c * (g.h_ops + g.h_annotations) + PYTHON_EVENT_COST_US * g.h_python
    # a runtime call carries the cost of its own record
    dur = np.where(g.h_kind == sm.MARK, 0.0, np.maximum(g.h_dur - c, np.minimum(g.h_dur, 1.0)))
    gap = np.maximum(g.h_gap - over, 0.0)
    return gap, dur


def _last_sync_before_marks(g: sm.StepGraph) -> np.ndarray:
    """Index of the last synchronising call before each step mark (host points are in time order)."""
    out = []
    prev = -1
    for m in np.flatnonzero(g.h_kind == sm.MARK):
        seg = np.flatnonzero(g.h_kind[prev + 1:m] == sm.SYNC)
        if seg.size:
            out.append(prev + 1 + int(seg[-1]))
        prev = m
    return np.asarray(out, dtype=np.int64)


def _fit_event_cost(g: sm.StepGraph, target_ms: float, hi: float = 100.0) -> float:
    """The per-event profiler cost whose removal makes the replayed step match a measured unprofiled
    step (bisection: the replayed step only shrinks as the cost grows). When even ``hi`` leaves the
    step longer than the measurement (the GPU limits it), ``hi`` is returned."""
    def step(c):
        gap, dur = _unprofiled_graph(g, c)
        return sm.replay(g, gap=gap, dur=dur).step_ms

    lo = 0.0
    if step(lo) <= target_ms:
        return lo
    if step(hi) >= target_ms:
        return hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if step(mid) > target_ms:
            lo = mid
        else:
            hi = mid
        if hi - lo < 0.01:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class _Baseline:
    step_ms: float          # the replayed step as recorded
    unprof: float           # the step without the profiler (measured when the trace carries it)
    gap0: np.ndarray        # host gaps without the profiler's own work
    dur0: np.ndarray        # host call durations without it
    ref: float              # replay of (gap0, dur0): every other fix is judged against it
    scale: float            # unprof / ref: reports fixed times on the unprofiled scale
    profiler: WhatIf
    notes: tuple = ()
    replayed: float = float("nan")  # the model's replay of the step as recorded
    r0: object = None               # the replay of (gap0, dur0)


def _baseline(trace, g: sm.StepGraph, numbers=None) -> _Baseline:
    """The step as recorded and without the profiler: the reference every what-if is measured from.
    The step as recorded is the trace's median step (``numbers``: :func:`~workbench.analysis.trace.tables.step_numbers`,
    the definition every front shows); the model's replays give the ratios applied to it. Kept on the
    graph for its trace: the diagnosis and the roofline's what-ifs of one trace share it."""
    kept = g.__dict__.get("_baseline")
    if kept is not None and kept[0]() is trace:
        return kept[1]
    base = _baseline_of(trace, g, numbers)
    try:
        g.__dict__["_baseline"] = (weakref.ref(trace), base)
    except TypeError:  # not weakly referable: not kept
        pass
    return base


def _baseline_of(trace, g: sm.StepGraph, numbers=None) -> _Baseline:
    md = {} if hasattr(trace, "columns") else (getattr(trace, "metadata", {}) or {})
    replayed = sm.replay(g).step_ms
    if numbers is None:
        from workbench.analysis.trace.tables import step_numbers

        numbers = step_numbers(trace)
    measured_step = numbers.step_ms
    step_ms = measured_step if measured_step > 0 and math.isfinite(measured_step) else replayed
    to_model = replayed / step_ms if step_ms > 0 else 1.0  # recorded ms -> the model's replayed ms
    # -- profiler: measured cost when the capture recorded it, else the per-event estimate ------------
    measured_unprof = md.get("workbench_unprofiled_step_ms")
    try:
        measured_unprof = float(measured_unprof) if measured_unprof is not None else None
    except (TypeError, ValueError):
        measured_unprof = None
    gap0, dur0 = _unprofiled_graph(g)
    # the model's ratio (without / with the profiler) applied to the recorded step
    r0 = sm.replay(g, gap=gap0, dur=dur0)
    est_unprof = r0.step_ms / to_model
    notes = []
    ref = est_unprof * to_model  # the replay of the step without the profiler: every ratio is taken to it
    if measured_unprof is not None and measured_unprof > 0:
        unprof = min(measured_unprof, step_ms)
        how = "measured by the capture: the same step timed without the profiler"
        # the per-event cost fitted so that the replay without the profiler matches the measurement
        cost = _fit_event_cost(g, unprof * to_model)
        gap0, dur0 = _unprofiled_graph(g, cost)
        r0 = sm.replay(g, gap=gap0, dur=dur0)
        ref = r0.step_ms
        notes.append(f"profiler cost fitted to the measured unprofiled step: {cost:.2f} us per recorded event")
    else:
        # the model's step without the profiler, never below GPU busy nor above the step as recorded
        unprof = min(max(est_unprof, numbers.gpu_busy_ms), step_ms)
        how = (f"estimated at {EVENT_COST_US.get(g.detail, 3.6):.1f} us of host time per recorded event "
               f"({g.detail} detail); time the step without the profiler to confirm")
    n_events = float((g.h_ops + g.h_annotations + g.h_python).sum() + (g.h_kind != sm.MARK).sum()) / g.n_steps
    prof = WhatIf(
        "profiler", step_ms, unprof, _saving(step_ms, unprof),
        f"the same step without the profiler ({how})",
        {"detail": g.detail, "recorded_host_events_per_step": int(round(n_events)),
         "estimated_unprofiled_step_us": round(est_unprof * 1e3, 1),
         "measured_unprofiled_step_us": None if measured_unprof is None else round(measured_unprof * 1e3, 1)},
        measured=measured_unprof is not None,
    )
    # every other fix is judged on the step without the profiler's host cost
    scale = unprof / ref if ref > 0 else 1.0
    return _Baseline(step_ms, unprof, gap0, dur0, ref, scale, prof, tuple(notes), replayed, r0)


def gpu_what_if(trace, cause: str, rows, durations_us, change: str, evidence: dict | None = None,
                graph: sm.StepGraph | None = None) -> WhatIf | None:
    """The step if the GPU ops at ``rows`` (positions in ``trace.events``) took ``durations_us`` instead:
    the step model replayed with those durations, judged like every other fix (on the step without the
    profiler). Used by the roofline's precision what-ifs (fp32 GEMMs on TF32 or bf16)."""
    out = gpu_what_ifs(trace, [(cause, rows, durations_us, change, evidence)], graph=graph)
    return out[0] if out else None


def gpu_what_ifs(trace, scenarios, graph: sm.StepGraph | None = None) -> list[WhatIf]:
    """:func:`gpu_what_if` for several ``(cause, rows, durations_us, change, evidence)`` at once (one
    graph, one baseline)."""
    g = graph or sm.build_graph(trace)
    if g.g_ts.size == 0 or g.h_ts.size == 0:
        return []
    base = _baseline(trace, g)
    where = pd.Series(np.arange(g.g_row.size), index=g.g_row)
    # A launch call that lasted long was the launch queue being full (the host waiting for a GPU-bound
    # stream); with faster kernels it would not wait, so those calls take a typical launch's time in
    # both replays (the GPU's stream order still paces the step).
    dur = base.dur0.copy()
    launches = g.h_kind == sm.LAUNCH
    blocked = launches & (dur > QUEUE_FULL_US)
    if blocked.any():
        typical = dur[launches & ~blocked]
        dur[blocked] = float(np.median(typical)) if typical.size else 5.0
    ref = sm.replay(g, gap=base.gap0, dur=dur).step_ms
    out = []
    for cause, rows, durations_us, change, evidence in scenarios:
        pos = where.reindex(np.asarray(rows, np.int64)).to_numpy()
        ok = ~np.isnan(pos)
        gd = g.g_dur.copy()
        gd[pos[ok].astype(np.int64)] = np.asarray(durations_us, float)[ok]
        r = sm.replay(g, gap=base.gap0, dur=dur, g_dur=gd)
        saved = _saving(ref, r.step_ms)
        ev = dict(evidence or {})
        ev["launch_calls_blocked_per_step"] = round(float(blocked.sum()) / g.n_steps, 1)
        out.append(WhatIf(cause, base.unprof, base.unprof * (1 - saved), saved, change, ev))
    return out

def diagnose(trace, graph: sm.StepGraph | None = None, numbers=None) -> Diagnosis | None:
    """The diagnosis of a trace with GPU activity (None for a trace without kernels). ``numbers``: the
    trace's :func:`~workbench.analysis.trace.tables.step_numbers` (computed here when not given): the step
    as recorded and GPU busy a step are those; no what-if predicts a step below GPU busy."""
    g = graph or sm.build_graph(trace)
    if g.g_ts.size == 0 or g.h_ts.size == 0:
        return None
    if numbers is None:
        from workbench.analysis.trace.tables import step_numbers

        numbers = step_numbers(trace)
    base = _baseline(trace, g, numbers)
    step_ms, unprof, gap0, dur0, ref, scale = base.step_ms, base.unprof, base.gap0, base.dur0, base.ref, base.scale
    md = {} if hasattr(trace, "columns") else (getattr(trace, "metadata", {}) or {})
    notes = list(g.notes) + list(base.notes)
    # GPU busy a step: the union over streams of the work the profiled steps launched (step_numbers)
    gpu_busy_ms = numbers.gpu_busy_ms
    kernel_busy_ms = numbers.kernel_busy_us_per_step / 1e3
    what_ifs: list[WhatIf] = [base.profiler]

    def add(cause, gap=None, dur=None, g_dur=None, kind=None, gpu_keep=None, change="", evidence=None, r=None):
        if r is None:  # (r: the replay of these changes when the caller already made it)
            r = sm.replay(g, gap=gap0 if gap is None else gap, dur=dur0 if dur is None else dur, g_dur=g_dur,
                          kind=kind, gpu_keep=gpu_keep)
        # a host-side fix leaves the GPU's work as it is: the step cannot get shorter than GPU busy
        # (removing copies leaves the kernels)
        floor = kernel_busy_ms if cause.startswith("memcpy") else gpu_busy_ms
        what_ifs.append(_clamped(cause, unprof, unprof * (1 - _saving(ref, r.step_ms)), floor, change,
                                 evidence or {}))

    # input: data loading overlapped with the previous step
    loader_ms = float(g.h_loader.sum()) / g.n_steps / 1e3
    if loader_ms > 0:
        r_in = sm.replay(g, gap=np.maximum(gap0 - g.h_loader, 0.0), dur=dur0)
        rest_ms = r_in.step_ms
        workers = max(1, math.ceil(loader_ms / max(rest_ms, 1e-3)))
        add("input", r=r_in,
            change=(f"data loading ({loader_ms:.2f} ms a step on the main process) overlapped with compute: "
                    f"DataLoader(num_workers>={workers}, pin_memory=True, persistent_workers=True)"),
            evidence={"dataloader_per_step_us": round(loader_ms * 1e3, 1),
                      "step_without_loading_us": round(rest_ms * scale * 1e3, 1), "workers_needed": workers})

    # sync: the host stops waiting in synchronising calls
    syncs = g.h_kind == sm.SYNC
    # a blocking device-to-host copy (.item(), .cpu(), .tolist()) waits like a sync
    dtoh = np.zeros(g.h_ts.size, bool)
    dtoh[g.g_host[(g.g_cat == "gpu_memcpy") & (g.g_host >= 0) & sm._name_test(g.g_name, lambda n: "DtoH" in n)]] = True
    syncs = syncs | (dtoh & (g.h_kind == sm.BLOCKING_COPY))
    if md.get("workbench_synchronized_steps") is True:
        # profile_steps ends every step with a device synchronise of its own (it times the step): that one
        # is the harness's, not the program's, so it is not a sync the user could remove
        harness = _last_sync_before_marks(g)
        syncs[harness] = False
        if harness.size:
            notes.append("the capture's own synchronise at the end of each step is not counted as a sync")
    if syncs.any():
        kind = g.h_kind.copy()
        kind[syncs] = np.where(g.h_kind[syncs] == sm.BLOCKING_COPY, sm.LAUNCH, sm.OTHER)
        dur = dur0.copy()
        dur[syncs] = np.minimum(dur[syncs], 5.0)
        calls = {}
        for n in g.h_name[syncs]:
            calls[str(n)] = calls.get(str(n), 0) + 1
        add("sync", dur=dur, kind=kind,
            change="no synchronising call in the loop (read .item()/.cpu() values every N steps, "
                   "non_blocking copies, no torch.cuda.synchronize())",
            evidence={"sync_calls_per_step": round(float(syncs.sum()) / g.n_steps, 2), "calls": calls,
                      "host_blocked_per_step_us": round(float(g.h_dur[syncs].sum()) / g.n_steps, 1)})

    # launch: free launches, no short dispatch gaps between them
    launches = g.h_kind == sm.LAUNCH
    if launches.any():
        short = launches & (gap0 - g.h_loader <= sm.LAUNCH_GAP_US)
        gap = gap0.copy()
        gap[short] = g.h_loader[short]
        dur = dur0.copy()
        dur[launches] = 0.0
        add("launch", gap=gap, dur=dur,
            change="kernels launched at no host cost (CUDA graphs, torch.compile(mode='reduce-overhead'), "
                   "fused/foreach ops)",
            evidence={"launches_per_step": round(float(launches.sum()) / g.n_steps, 1),
                      "launch_calls_per_step_us": round(float(g.h_dur[launches].sum()) / g.n_steps, 1)})

    # host: long host gaps that are not data loading vanish
    long_gap = (gap0 - g.h_loader > sm.LAUNCH_GAP_US) | (g.h_kind != sm.LAUNCH)
    gap = gap0.copy()
    gap[long_gap] = np.minimum(gap0, g.h_loader)[long_gap]
    host_ms = float((gap0 - gap).sum()) / g.n_steps / 1e3
    if host_ms > 0:
        add("host", gap=gap,
            change="the Python/CPU work between launches that is not data loading moved off the step "
                   "(torch.compile, fewer host-side metrics/logging, work done once)",
            evidence={"host_work_per_step_us": round(host_ms * scale * 1e3, 1)})

    # memcpy: pin pageable copies; keep data on the GPU
    is_copy = (g.g_cat == "gpu_memcpy")
    h2d = is_copy & sm._name_test(g.g_name, lambda n: "HtoD" in n or "DtoH" in n)
    if h2d.any():
        gbps, gb_how = _pinned_gbps(g)
        lc = g.h_dur[g.h_kind == sm.LAUNCH]
        launch_us = float(np.median(lc)) if lc.size else 5.0
        pageable = h2d & sm._name_test(g.g_name, lambda n: "Pageable" in n)
        if pageable.any():
            gd = g.g_dur.copy()
            gd[pageable] = np.nan_to_num(g.g_bytes[pageable]) / (gbps * 1e3)
            kind = g.h_kind.copy()
            pts = np.unique(g.g_host[pageable & (g.g_host >= 0)])
            kind[pts] = sm.LAUNCH
            dur = dur0.copy()
            dur[pts] = np.minimum(dur[pts], launch_us)  # an async copy call costs what a launch costs
            r = sm.replay(g, gap=gap0, dur=dur, g_dur=gd, kind=kind)
            saved = _saving(ref, r.step_ms)
            what_ifs.append(_clamped(
                "memcpy_pinned", unprof, unprof * (1 - saved), kernel_busy_ms,
                f"pageable host copies pinned (pin_memory(), non_blocking=True) at {gbps:.0f} GB/s ({gb_how})",
                {"pageable_copies_per_step": round(float(pageable.sum()) / g.n_steps, 2),
                 "pageable_copies_per_step_us": round(float(g.g_dur[pageable].sum()) / g.n_steps, 1),
                 "pinned_gbps": round(gbps, 1)}))
        kind = g.h_kind.copy()
        pts = np.unique(g.g_host[h2d & (g.g_host >= 0)])
        kind[pts] = sm.LAUNCH
        dur = dur0.copy()
        dur[pts] = 0.0
        add("memcpy", kind=kind, dur=dur, gpu_keep=~h2d,
            change="the host<->device copies removed (data generated or kept on the GPU)",
            evidence={"copies_per_step": round(float(h2d.sum()) / g.n_steps, 2),
                      "copies_per_step_us": round(float(g.g_dur[h2d].sum()) / g.n_steps, 1),
                      "bytes_per_step": int(np.nan_to_num(g.g_bytes[h2d]).sum() / g.n_steps)})

    cp = sm.critical_path(g, base.r0)
    cp_ms = {k: float(v) / 1e3 for k, v in cp.items()}
    # largest saving first; within TIE of each other the easier fix first (EASE)
    ordered = tuple(sorted(what_ifs, key=lambda w: (-round(w.saved_fraction / TIE), EASE.index(w.cause))))
    others = [w for w in ordered if w.cause != "profiler"]
    prof = what_ifs[0]
    bound = "gpu"
    if others and others[0].saved_fraction >= BOUND_MIN_SAVING:
        bound = {"memcpy_pinned": "memcpy"}.get(others[0].cause, others[0].cause)
    elif prof.saved_fraction >= BOUND_MIN_SAVING:
        bound = "profiler"  # without the profiler nothing outside the kernels would matter
    if prof.saved_fraction >= BOUND_MIN_SAVING:
        # said first: every other number describes the step as it runs without the profiler
        ordered = (prof,) + tuple(w for w in ordered if w is not prof)
    return Diagnosis(bound=bound, step_ms=step_ms, step_ms_unprofiled=unprof, gpu_busy_ms=gpu_busy_ms,
                     what_ifs=ordered, detail=g.detail, steps=g.n_steps, critical_path_ms=cp_ms, notes=tuple(notes),
                     step_ms_model=base.replayed)


def fewer_launches_what_if(trace, g: sm.StepGraph, d: Diagnosis, in_owner: np.ndarray, launches_after: int,
                           cause: str, change: str, evidence: dict | None = None) -> WhatIf | None:
    """The step with one owner's launches (the host points ``in_owner``: the launch calls inside its ranges)
    cut to ``launches_after`` a step, as a fused or multi-tensor rewrite of a per-item loop does:

    * host: the first ``launches_after`` launch calls of the owner in each step are kept, the others cost
      nothing, and the host time between the owner's points (the per-item Python and dispatch work) goes;
      the time before its first point (its prologue) and after its last stay;
    * GPU: a kernel costs a fixed start (the shortest of the owner's kernels) plus its work; the work is
      kept and the starts are paid once per remaining launch, the total shared by the kernels kept.

    Replayed like every other what-if (on the step without the profiler)."""
    if g.h_ts.size == 0:
        return None
    base = _baseline(trace, g)  # the diagnosis' own, kept on the graph
    launch = in_owner & (g.h_kind == sm.LAUNCH)
    if not launch.any() or launches_after <= 0:
        return None
    n = g.n_steps
    step_of = np.searchsorted(np.sort(g.h_ts[g.step_points]), g.h_ts, "right") - 1 if g.step_points.size else \
        np.zeros(g.h_ts.size, np.int64)
    idx = np.flatnonzero(launch)
    keep_point = np.zeros(g.h_ts.size, bool)
    first_point = np.zeros(g.h_ts.size, bool)
    for s in np.unique(step_of[idx]):
        mine = idx[step_of[idx] == s]
        keep_point[mine[:launches_after]] = True
        owner_pts = np.flatnonzero(in_owner & (step_of == s))
        if owner_pts.size:
            first_point[owner_pts[0]] = True
    dropped = launch & ~keep_point
    gap = base.gap0.copy()
    inner = in_owner & ~first_point
    gap[inner] = np.minimum(gap[inner], g.h_loader[inner])
    dur = base.dur0.copy()
    dur[dropped] = 0.0
    owner_k = (g.g_host >= 0) & launch[np.maximum(g.g_host, 0)]
    if not owner_k.any():
        return None
    d_old = g.g_dur[owner_k]
    start = float(np.nanmin(d_old))
    kept_k = owner_k & keep_point[np.maximum(g.g_host, 0)]
    gd = g.g_dur.copy()
    keep = ~(owner_k & ~kept_k)
    for s in np.unique(step_of[idx]):
        ks = kept_k & (step_of[np.maximum(g.g_host, 0)] == s)
        all_s = owner_k & (step_of[np.maximum(g.g_host, 0)] == s)
        if ks.any():
            work = float(np.nansum(np.maximum(g.g_dur[all_s] - start, 0.0))) + start * int(ks.sum())
            gd[ks] = work / int(ks.sum())
    r = sm.replay(g, gap=gap, dur=dur, g_dur=gd, gpu_keep=keep)
    removed_ms = float(np.nansum(g.g_dur[owner_k]) - np.nansum(gd[kept_k])) / n / 1e3
    floor = max(d.gpu_busy_ms - removed_ms, 0.0)
    ev = dict(evidence or {})
    ev.update({"launches_per_step_before": round(float(launch.sum()) / n, 1),
               "launches_per_step_after": int(launches_after),
               "owner_gpu_ms_per_step_before": round(float(np.nansum(d_old)) / n / 1e3, 4),
               "owner_gpu_ms_per_step_after": round(float(np.nansum(gd[kept_k])) / n / 1e3, 4),
               "kernel_start_us": round(start, 2)})
    unprof = d.step_ms_unprofiled
    return _clamped(cause, unprof, unprof * (1 - _saving(base.ref, r.step_ms)), floor, change, ev)


def _clamped(cause: str, before: float, after: float, floor: float, change: str, evidence: dict) -> WhatIf:
    """A what-if whose fixed step is no shorter than ``floor`` (GPU busy a step: a host-side fix leaves the
    GPU's own work), the evidence saying when the model's prediction was raised to it."""
    if after < floor <= before:
        evidence = dict(evidence, model_step_ms_if_fixed=round(after, 4), clamped_at_gpu_busy_ms=round(floor, 4))
        after = floor
    return WhatIf(cause, before, after, _saving(before, after), change, evidence)


def _saving(before: float, after: float) -> float:
    if not before or before <= 0 or not math.isfinite(after):
        return 0.0
    return float(max(0.0, 1.0 - after / before))


BOUND_LABELS = {
    "gpu": "GPU-bound: the kernels set the pace; look at precision and kernel efficiency",
    "profiler": "limited by the profiler's own overhead: without it nothing outside the kernels matters",
    "host": "host-bound: Python/CPU work between kernel launches",
    "input": "input-bound: data loading on the main process",
    "launch": "launch-bound: many small kernels, each waiting for its launch",
    "sync": "sync-bound: the host waits for the GPU inside the step",
    "memcpy": "copy-bound: host<->device copies",
    "communication": "communication-bound",
}


def summary_text(d: dict | Diagnosis) -> str:
    """One sentence for the top of a report: the bound, the step time as recorded and without the
    profiler, GPU busy time, and the largest saving (``d``: a Diagnosis or its ``as_dict()``)."""
    if isinstance(d, Diagnosis):
        d = d.as_dict()
    bound = d.get("bound", "gpu")
    cpu = (d.get("critical_path_ms") or {}).get("gpu") == 0.0 and not d.get("gpu_busy_ms") and \
        "communication" in (d.get("critical_path_ms") or {})
    text = (f"Diagnosis: {BOUND_LABELS.get(bound, bound)}. Step {d['step_ms']:,.2f} ms as recorded "
            f"({d.get('detail', '?')} detail), about {d['step_ms_unprofiled']:,.2f} ms without the profiler; "
            + ("no GPU activity (a CPU-only step)." if cpu else f"GPU busy {d['gpu_busy_ms']:,.2f} ms a step."))
    wis = d.get("what_if") or {}
    best = [(c, w) for c, w in wis.items() if c != "profiler" and w.get("saved_fraction", 0) >= REPORT_MIN_SAVING]
    if best:
        c, w = max(best, key=lambda cw: cw[1]["saved_fraction"])
        text += (f" Largest saving: {w['change']} -> {w['step_ms_if_fixed']:,.2f} ms "
                 f"(saves {100 * w['saved_fraction']:.0f}%).")
    return text


# ------------------------------------------------------------------------------------- CPU-only steps

MAX_WORKERS_SUGGESTED = 8  # the input what-if's worker count is capped here (the host's cores bound it too)
BOUND_LABELS["cpu"] = "CPU-bound: the ops on the host set the pace; look at the op table by CPU time"


def diagnose_cpu(trace, numbers=None) -> Diagnosis | None:
    """The diagnosis of a CPU-only training step (no GPU activity), with the same causes where they apply:
    ``profiler`` (the recorded events' host cost, measured when the capture stored the unprofiled step),
    ``input`` (the main process' data loading, ``DataLoader.__next__``, overlapped by ``N`` worker processes:
    the step becomes the larger of the rest of the step and loading / N). None without ProfilerStep
    annotations or host events.

    Per step (the median over the steps, on the step of :func:`~workbench.analysis.trace.tables.step_numbers`):
    loading is the union of the main thread's ``DataLoader`` spans inside the step; the profiler's cost is
    :data:`EVENT_COST_US` per recorded op or annotation (the same estimate the GPU model uses). The step's
    critical path is loading, communication (gloo collectives) and the rest (``host``)."""
    from workbench.analysis.trace import tables as ta

    ev = ta._events(trace)
    if numbers is None:
        numbers = ta.step_numbers(ev)
    steps = ta._steps(ev)
    if steps.empty or not numbers.delimited:
        return None
    md = {} if isinstance(trace, pd.DataFrame) else (getattr(trace, "metadata", {}) or {})
    detail = sm.detail_of(trace)
    cost = EVENT_COST_US.get(detail, EVENT_COST_US["light"])
    # the thread that runs the steps: the one of the ProfilerStep annotations
    is_step = ta._by_name(ev["name"], lambda s: s.str.match(ta._STEP_RE)).astype(bool) & \
        ev["cat"].isin(("user_annotation", "cpu_op")).to_numpy()
    pid = ev["pid"].to_numpy()[is_step][0]
    host = ev[ev["cat"].isin(ta.HOST_OPS).to_numpy() & (ev["pid"].to_numpy() == pid) & ~is_step]
    hs = host["ts_us"].to_numpy(np.float64)
    he = ta._end(host)
    is_loader = ta._by_name(host["name"], lambda s: s.str.contains(sm.LOADER_RE)).astype(bool)
    # with worker processes the main process' __next__ is a wait for them, not the loading itself
    has_workers = bool(ta._by_name(host["name"][is_loader],
                                   lambda s: s.str.contains("MultiProcessingDataLoaderIter")).any()) \
        if is_loader.any() else False
    ls, le = iv.merge(hs[is_loader], he[is_loader])
    a = steps["start_us"].to_numpy(np.float64)
    b = a + steps["dur_us"].to_numpy(np.float64)
    loader = iv.covered(ls, le, a, b) if ls.size else np.zeros(a.size)
    order = np.argsort(hs)
    hs_sorted = hs[order]
    events = np.searchsorted(hs_sorted, b, "left") - np.searchsorted(hs_sorted, a, "left")
    # recorded events inside the loading spans (the Dataset's own ops): their cost leaves the loading too
    in_loader = np.zeros(a.size)
    if ls.size:
        inside = iv.covered(ls, le, hs_sorted, hs_sorted + 1e-3) > 0
        starts_in = hs_sorted[inside]
        in_loader = (np.searchsorted(starts_in, b, "left") - np.searchsorted(starts_in, a, "left")).astype(float)
    step_i = np.asarray(numbers.step_us, np.float64)
    unprof_i = np.maximum(step_i - cost * events, 0.05 * step_i)
    loader_unprof_i = np.clip(loader - cost * in_loader, 0.0, None)
    step_ms = numbers.step_ms
    measured = md.get("workbench_unprofiled_step_ms")
    try:
        measured = float(measured) if measured is not None else None
    except (TypeError, ValueError):
        measured = None
    est_unprof = float(np.median(unprof_i)) / 1e3
    unprof = min(measured, step_ms) if measured and measured > 0 else min(est_unprof, step_ms)
    how = ("measured by the capture: the same step timed without the profiler" if measured else
           f"estimated at {cost:.1f} us of host time per recorded event ({detail} detail); time the step "
           "without the profiler to confirm")
    notes = ["CPU-only trace: the step is the host's; the diagnosis covers the profiler, data loading and "
             "communication (there is no GPU to wait for)"]
    prof = WhatIf("profiler", step_ms, unprof, _saving(step_ms, unprof), f"the same step without the profiler ({how})",
                  {"detail": detail, "recorded_host_events_per_step": int(np.median(events)),
                   "estimated_unprofiled_step_us": round(est_unprof * 1e3, 1),
                   "measured_unprofiled_step_us": None if measured is None else round(measured * 1e3, 1)},
                  measured=measured is not None)
    what_ifs = [prof]
    scale = unprof / est_unprof if est_unprof > 0 else 1.0  # onto the measured unprofiled step, when there is one
    loader_ms = float(np.median(loader_unprof_i)) / 1e3 * scale
    comm_ms = numbers.communication_ms
    rest_ms = max(unprof - loader_ms, 0.0)
    if loader_ms > 0:
        needed = max(1, math.ceil(loader_ms / max(rest_ms, 1e-3)))
        n = min(needed, MAX_WORKERS_SUGGESTED)

        def with_workers(k: int) -> float:
            # k processes each load a batch in loader_ms: one batch every loader_ms / k, the step no faster
            # than the rest of it (the model, forward, backward, optimizer)
            return max(rest_ms, loader_ms / k)

        fixed = with_workers(n)
        if has_workers:
            change = (f"the wait for DataLoader workers ({loader_ms:.2f} ms a step) hidden: more workers or faster "
                      "loading per batch (the trace does not say how many workers there are now)")
            ev = {"dataloader_per_step_us": round(loader_ms * 1e3, 1),
                  "step_without_loading_us": round(rest_ms * 1e3, 1), "workers_needed": needed,
                  "workers": None, "loader": "workers"}
            fixed = rest_ms
        else:
            change = (f"data loading ({loader_ms:.2f} ms a step on the main process) done by {n} DataLoader worker "
                      f"process{'es' if n > 1 else ''}: DataLoader(num_workers={n}, persistent_workers=True) "
                      "(when the loading waits on I/O, or the host has a free core per worker)")
            ev = {"dataloader_per_step_us": round(loader_ms * 1e3, 1),
                  "step_without_loading_us": round(rest_ms * 1e3, 1), "workers_needed": needed, "workers": n,
                  "loader": "main process",
                  "step_ms_with_workers": {str(k): round(with_workers(k), 4) for k in (1, 2, 4, 8)}}
        what_ifs.append(WhatIf("input", unprof, fixed, _saving(unprof, fixed), change, ev))
    ordered = tuple(sorted(what_ifs, key=lambda w: (-round(w.saved_fraction / TIE), EASE.index(w.cause))))
    others = [w for w in ordered if w.cause != "profiler"]
    bound = "cpu"
    if others and others[0].saved_fraction >= BOUND_MIN_SAVING:
        bound = others[0].cause
    elif prof.saved_fraction >= BOUND_MIN_SAVING:
        bound = "profiler"
    elif comm_ms >= 0.5 * unprof:
        bound = "communication"
    if prof.saved_fraction >= BOUND_MIN_SAVING:
        ordered = (prof,) + tuple(w for w in ordered if w is not prof)
    cp = {"input": loader_ms, "communication": min(comm_ms, max(unprof - loader_ms, 0.0)),
          "host": max(unprof - loader_ms - comm_ms, 0.0), "gpu": 0.0}
    return Diagnosis(bound=bound, step_ms=step_ms, step_ms_unprofiled=unprof, gpu_busy_ms=0.0, what_ifs=ordered,
                     detail=detail, steps=numbers.steps, critical_path_ms=cp, notes=tuple(notes))

"""Growth across training steps: allocations made in every step and never freed (a leak), found from the
step boundaries rather than from frames.

A CPU run profiled with ``profile_memory=True`` (``workbench.io.load_profiler_memory``) has no allocator
snapshot and coarse stacks (often one module-level frame for everything), so grouping the survivors by
frame (``memory.surviving_allocations``) cannot tell a leak from the optimizer state made in the first
step. Here the window is cut into steps (:func:`workbench.analysis.memory.steps.step_boundaries`:
``ProfilerStep#N`` ranges, optimizer ranges or the allocation pattern), and the survivors of each middle
step (not the first: state and caches are created lazily there; not the last: the window may end inside
it) are grouped by (frame, size). A group that survives from at least :data:`MIN_STEPS` steps, and from
at least half of the middle steps, grows with every step: a leak.
"""

from __future__ import annotations

import numpy as np

from workbench.analysis.memory.steps import event_phases, step_boundaries

__all__ = ["MIN_STEPS", "step_growth"]

MIN_STEPS = 2  # middle steps a (frame, size) group must survive from


def step_growth(analysis) -> dict | None:
    """The largest growth across steps of a :class:`~workbench.analysis.memory.oom.MemoryAnalysis`, or None:
    ``{frame, bytes_per_step, steps, middle_steps, total_bytes, count, method}``."""
    a = analysis.allocs
    n = int(a.attrs.get("n_events", 0))
    if n < 4:
        return None
    snap = analysis.snap
    phases = event_phases(snap, analysis.device)
    steps = step_boundaries(snap, analysis.device, phases)
    starts = list(steps["starts"])
    if len(starts) < MIN_STEPS + 2:
        return None
    ai = a["alloc_index"].to_numpy()
    fi = a["free_index"].to_numpy()
    size = a["size_bytes"].to_numpy()
    cat = a["category"].astype(str).to_numpy() if "category" in a else np.full(len(a), "unknown")
    sid = a["alloc_stack_id"].to_numpy()
    labels = analysis.labels["frame"]
    step_of = np.searchsorted(np.asarray(starts), ai, side="right")  # 1-based step of each allocation
    middle = set(range(2, len(starts)))  # steps 2 .. S-1
    surv = (ai >= 0) & (fi >= n) & np.isin(step_of, list(middle)) & (cat != "parameters")
    if not surv.any():
        return None
    groups: dict = {}
    for j in np.flatnonzero(surv):
        lbl = labels[sid[j]] if 0 <= sid[j] < len(labels) else "(no stack)"
        groups.setdefault((lbl, int(size[j])), []).append(j)
    best = None
    for (lbl, sz), js in groups.items():
        k = len(set(step_of[js].tolist()))
        if k < max(MIN_STEPS, len(middle) // 2):
            continue
        total = int(size[js].sum())
        per_step = np.bincount(step_of[js], weights=size[js].astype(np.float64))
        if best is None or total > best["total_bytes"]:
            best = {"frame": lbl, "bytes_per_step": int(np.median(per_step[per_step > 0])), "steps": k, "middle_steps": len(middle),
                    "total_bytes": total, "count": len(js), "method": steps["method"]}
    return best

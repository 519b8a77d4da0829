"""Memory findings: rules over a :class:`~workbench.analysis.memory.oom.MemoryAnalysis`.

Each rule reads what the analysis computes once (the OOM post-mortem, the allocator state at the peak
and at the end, the allocations that survive the window, the allocator settings) and returns at most
one :class:`~workbench.analysis.findings.Finding`. :data:`MEMORY_RULES` is their order in
``workbench memory --json``'s ``findings`` (docs/json.md); ``MemoryAnalysis.findings`` runs them.

Ids: ``oom_capacity`` / ``oom_fragmentation`` (critical), ``fragmentation`` and
``growing_allocations`` and ``leak_across_steps`` (warning), ``cache_overhead``, ``history_truncated`` and ``no_history`` (info).
"""

from __future__ import annotations


from workbench.analysis.memory.segments import CACHED_UNUSED_ALARM
from workbench.analysis.findings import Finding
from workbench.analysis.memory.growth import step_growth
from workbench.units import format_bytes as fb


__all__ = ["MEMORY_RULES", "memory_findings"]

FRAGMENTATION_MIN_FREE = 64 * 2**20        # bytes free in reserved segments below which nothing is reported
SCATTERED_FRAGMENTATION = 0.5               # external fragmentation above which the holes count as scattered
CACHE_OVERHEAD_RATIO = 2                    # reserved at the end vs the peak allocated
CACHE_OVERHEAD_MIN_BYTES = 512 * 2**20


def oom(a: MemoryAnalysis) -> Finding | None:
    """The snapshot ends in an OOM: its cause (capacity or fragmentation) and the allocator's numbers."""
    r = a.oom
    if r is None:
        return None
    return Finding(
        f"oom_{r.cause}", "critical",
        f"Out of memory ({r.cause}): {fb(r.requested_bytes)} requested with {fb(r.allocated_bytes)} "
        f"allocated, {fb(r.reserved_bytes)} reserved, largest free block {fb(r.largest_free_block_bytes)}",
        {"requested_bytes": r.requested_bytes, "free_in_reserved_bytes": r.free_in_reserved_bytes})


def fragmentation(a: MemoryAnalysis) -> Finding | None:
    """At the peak, reserved memory that holds no tensor is above the alarm."""
    st = a.state_peak
    if st.cached_unused_share < CACHED_UNUSED_ALARM or st.free_in_reserved_bytes <= FRAGMENTATION_MIN_FREE:
        return None
    if st.external_fragmentation > SCATTERED_FRAGMENTATION:
        fix = (f"; the holes are scattered (external fragmentation {st.external_fragmentation:.2f}): "
               + ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator reuse them"
                  if not a.settings.get("expandable_segments") else
                  "expandable_segments is already on; allocate long-lived tensors first"))
    else:
        fix = (f"; it is mostly one hole of {fb(st.largest_free_block_bytes)} (external fragmentation "
               f"{st.external_fragmentation:.2f}), reusable by any request up to that size")
    return Finding(
        "fragmentation", "warning",
        f"At the peak {100 * st.cached_unused_share:.0f}% of reserved memory "
        f"({fb(st.free_in_reserved_bytes)} of {fb(st.reserved_bytes)}) holds no tensor, above "
        f"the {100 * CACHED_UNUSED_ALARM:.0f}% alarm" + fix,
        {"cached_unused_share": round(st.cached_unused_share, 4),
         "external_fragmentation": round(st.external_fragmentation, 4),
         "fragmentation": round(st.fragmentation, 3),
         "free_in_reserved_bytes": st.free_in_reserved_bytes,
         "largest_free_block_bytes": st.largest_free_block_bytes})


def cache_overhead(a: MemoryAnalysis) -> Finding | None:
    """At the end the cache reserves far more than the program ever had allocated."""
    reserved, peak = a.state_end.reserved_bytes, a.peak["allocated_bytes"]
    if not (reserved > CACHE_OVERHEAD_RATIO * max(peak, 1) and reserved > CACHE_OVERHEAD_MIN_BYTES):
        return None
    return Finding(
        "cache_overhead", "info",
        f"Reserved {fb(reserved)} is more than twice the peak allocated "
        f"{fb(peak)}: the cache holds memory other processes cannot use",
        {"reserved_bytes": reserved, "peak_allocated_bytes": peak})


def growing_allocations(a: MemoryAnalysis) -> Finding | None:
    """One frame's allocations are made across the window and never freed (the largest such frame)."""
    leaks = a.surviving[a.surviving["leak_like"]]
    if not len(leaks):
        return None
    r = leaks.iloc[0]
    model = a.oom.step_model if a.oom is not None else None
    if model is not None and not (model.get("growth") or {}).get("frames"):
        # the step model found no tensor kept from one step to the next: what survives is the live state of
        # the step that failed (its forward's activations), not a leak
        return None
    return Finding(
        "growing_allocations", "warning",
        f"{int(r['count'])} allocations ({fb(int(r['bytes']))}) from {r['frame']} were made across the "
        "window and never freed: a leak across steps, or state that grows (e.g. a list of losses kept "
        "on the GPU)",
        {"frame": r["frame"], "bytes": int(r["bytes"]), "count": int(r["count"])})


def leak_across_steps(a: MemoryAnalysis) -> Finding | None:
    """Allocations of one frame and size made in every step and never freed (memory.growth.step_growth):
    found from the steps, so it also works on a CPU profile_memory trace, whose frames are coarse."""
    g = step_growth(a)
    if g is None:
        return None
    return Finding(
        "leak_across_steps", "warning",
        f"{fb(g['bytes_per_step'])} made at {g['frame']} in each of {g['steps']} of {g['middle_steps']} middle "
        f"steps is never freed ({fb(g['total_bytes'])} so far): a leak across steps (e.g. outputs or losses "
        "kept in a list; keep .item() or .detach().cpu() instead)",
        {"frame": g["frame"], "bytes_per_step": g["bytes_per_step"], "steps": g["steps"],
         "total_bytes": g["total_bytes"]})


def history_truncated(a: MemoryAnalysis) -> Finding | None:
    """The history frees tensors it never saw allocated: the ring buffer wrapped or recording began late."""
    n = len(a.timeline)
    pre_freed = int((a.allocs["preexisting"] & (a.allocs["free_index"] < n)).sum())
    if not (n and pre_freed):
        return None
    return Finding(
        "history_truncated", "info",
        f"The history starts mid-run ({pre_freed} frees of tensors allocated before the first recorded "
        "event): the ring buffer wrapped or recording began late; raise max_entries for the full picture",
        {"preexisting_freed": pre_freed})


def no_history(a: MemoryAnalysis) -> Finding | None:
    """The snapshot has segments but no allocation history."""
    if len(a.timeline):
        return None
    return Finding(
        "no_history", "info",
        "The snapshot holds no allocation history (only the state at snapshot time); record with "
        "workbench.capture.record_memory_history() to get a timeline")


# the order of ``findings`` in the JSON (the OOM first)
MEMORY_RULES = (oom, fragmentation, cache_overhead, growing_allocations, leak_across_steps, history_truncated,
                no_history)


def memory_findings(analysis: MemoryAnalysis) -> tuple[Finding, ...]:
    """Every rule of :data:`MEMORY_RULES` over ``analysis``, in that order (``MemoryAnalysis.findings``
    caches this)."""
    return tuple(f for f in (rule(analysis) for rule in MEMORY_RULES) if f is not None)

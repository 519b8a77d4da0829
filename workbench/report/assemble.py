"""The three HTML reports: one trace (or one per rank), one allocator snapshot, one before/after diff.

Each assembles the analysis tables and the figures into :func:`~workbench.report.html.write_report`'s
sections and returns the path written. The CLI's ``--html`` calls them, and so can a notebook::

    from workbench import load_trace, samples
    from workbench.report import trace_report
    trace_report(load_trace(samples.path("h200_train_step")), "step.html")

Figures only draw; the numbers come from :mod:`workbench.analysis` (the same summaries as ``--json``).
"""

from __future__ import annotations

import html

import os
from pathlib import Path

import pandas as pd

from workbench.figures.text import advice_html, findings_html
from workbench.report.html import Section, write_report

__all__ = ["trace_report", "memory_report", "diff_report", "memory_diff_report", "ranks_report"]


def _as_trace(t):
    if hasattr(t, "events"):
        return t
    from workbench.io import load_trace

    return load_trace(os.fspath(t))


def _as_trace_analysis(t, peak=None, step_ms=None, measured=None):
    from workbench.analysis.trace.analysis import TraceAnalysis

    if isinstance(t, TraceAnalysis):
        return t
    return TraceAnalysis(_as_trace(t), peak=peak, step_ms=step_ms, measured=measured)


def trace_report(traces, out, *, top: int = 10, summaries: list[dict] | None = None, peak=None,
                 step_ms: float | None = None, measured=None) -> Path:
    """A report of one trace, or of several (one per rank): overview, findings, kernels, operators,
    roofline, steps, idle gaps, memcpy and the timeline. ``traces``: a ``Trace``, a path, a
    :class:`~workbench.analysis.trace.analysis.TraceAnalysis` (what the CLI passes: its numbers are read,
    not computed again), or a list of them; ``summaries``: their
    :func:`~workbench.analysis.trace_summary` documents when already computed; ``peak`` / ``step_ms`` /
    ``measured``: as for ``trace_summary`` (peak overrides, the unprofiled step time MFU is computed on,
    measured ceilings), for the traces not given as a TraceAnalysis."""
    from workbench.analysis.trace.analysis import TraceAnalysis
    from workbench.figures import trace as tf

    if hasattr(traces, "events") or isinstance(traces, (str, os.PathLike, TraceAnalysis)):
        traces = [traces]
    analyses = [_as_trace_analysis(t, peak, step_ms, measured) for t in traces]
    if summaries is None:
        summaries = [a.summary(top) for a in analyses]
    sections = []
    for a, s in zip(analyses, summaries):
        t = a.trace
        prefix = f"rank {s['source']['rank']}: " if len(traces) > 1 and s["source"].get("rank") is not None else ""
        gpu = s["gpu"]
        overview = pd.DataFrame([{
            "device": s["source"]["device"], "events": s["source"]["events"],
            "profiled window (ms)": (gpu.get("window_us") or 0) / 1e3,
            "GPU busy over the window (ms)": gpu["busy_us"] / 1e3,
            "GPU idle over the window": f"{100 * gpu['idle_fraction']:.1f}%", "kernels over the window": gpu["kernel_count"],
        }])
        from workbench.analysis.trace.tables import per_step_text

        # the one definition of step, busy, idle and communication (the text `workbench trace` prints)
        per_step = f"<p class='wb-per-step'>{html.escape(per_step_text(s['per_step']))}</p>" if s.get("per_step") else ""
        sections.append(Section(f"{prefix}Overview", [overview] + ([per_step] if per_step else []), raw_html=True))
        sections.append(Section(f"{prefix}Diagnosis and findings", [findings_html(s["findings"], s.get("diagnosis"))],
                                raw_html=True))
        kernels, ops, steps, gaps = a.kernels, a.ops, a.steps, a.gaps
        sections.append(Section(f"{prefix}Kernels", [tf.breakdown_figure(s["breakdown"]),
                                                     tf.kernel_summary_figure(kernels, top=top), kernels.head(top)]))
        sections.append(Section(f"{prefix}Operators", [tf.op_summary_figure(ops, top=top), ops.head(top)]))
        if gpu["kernel_count"]:
            sections.append(_roofline_section(a, s, prefix, top))
        if len(steps):
            sections.append(Section(f"{prefix}Steps", [tf.step_figure(steps), steps]))
        if len(gaps):
            by_cause = gaps.groupby("cause")["dur_us"].agg(["count", "sum"]).reset_index()
            sections.append(Section(f"{prefix}Idle gaps", [tf.idle_gap_figure(gaps), by_cause]))
        if s.get("memcpy"):
            sections.append(Section(f"{prefix}Memcpy / memset", [pd.DataFrame(s["memcpy"])]))
        sections.append(Section(f"{prefix}Timeline", [tf.timeline_figure(t)]))
    title = f"Trace: {summaries[0]['source']['path']}" if len(summaries) == 1 else f"Traces: {len(summaries)} files"
    return write_report(out, title, sections, subtitle="made with gpu-workbench")


def _roofline_section(a, s: dict, prefix: str, top: int) -> Section:
    from workbench.analysis.trace.roofline import display_table, summary_text
    from workbench.figures.roofline import roofline_figure

    rl = a.roofline
    blocks: list = [summary_text(s.get("roofline") or rl)]
    if rl.costs.has_shapes:
        blocks += [roofline_figure(rl.ops, rl.peak, rl.measured), display_table(rl.ops.head(top))]
    return Section(f"{prefix}Roofline", blocks)


def memory_report(source, out, *, top: int = 10, device: int | None = None, summary: dict | None = None,
                  analysis=None) -> Path:
    """A report of one allocator snapshot: the OOM post-mortem when it holds one, the findings (as the
    panels show them: :func:`~workbench.figures.text.findings_html`), the timeline by category, the
    segment map, what was live at the peak. ``source``: a snapshot path or a
    ``MemorySnapshot``; ``analysis`` / ``summary``: the :func:`~workbench.analysis.memory.oom.analyze_snapshot`
    and :func:`~workbench.analysis.memory.oom.memory_summary` results when already computed."""
    from workbench.analysis.memory.oom import analyze_snapshot, memory_summary
    from workbench.analysis.memory.whatif import unseen_note
    from workbench.units import format_bytes as fb
    from workbench.figures import memory as mfig

    snap = source
    if not hasattr(snap, "events"):
        from workbench.io.snapshot import load_snapshot

        snap = load_snapshot(os.fspath(source), progress=False)
    if analysis is None:
        analysis = analyze_snapshot(snap, device)
    if summary is None:
        summary = memory_summary(snap, top=top, analysis=analysis)
    figs = [mfig.memory_timeline_figure(analysis, by="category"), mfig.segment_map_figure(analysis),
            mfig.top_allocations_figure(summary)]
    sections = []
    oom = summary["oom"]
    if oom:
        alloc = (f"requested {fb(oom['requested_bytes'])}; allocated {fb(oom['allocated_bytes'])}; reserved "
                 f"{fb(oom['reserved_bytes'])}; free in reserved {fb(oom['free_in_reserved_bytes'])}; largest free "
                 f"block {fb(oom['largest_free_block_bytes'])}")
        # the advice as the panel shows it (figures.text.advice_html): peak vs cap per fix, the fix to copy
        note = unseen_note(oom.get("step_model"))  # an OOM in the first forward: what follows the blocks
        card = advice_html(oom["advice"], headline=f"Out of memory: {oom['cause']}",
                           details=f"<div>{html.escape(alloc)}</div>"
                           + (f"<div>note: {html.escape(note)}</div>" if note else ""))
        sections.append(Section(f"OOM post-mortem: {oom['cause']}", [
            card or f"<p>{html.escape(alloc)}</p>",
            "<p>" + html.escape(f"where: {oom['position']['text']} (confidence {oom['position']['confidence']:.1f})"
                                if (oom.get("position") or {}).get("text") else "where: not determined") + "</p>",
            pd.DataFrame(oom["top_live"]).drop(columns=["stack"], errors="ignore"),
        ], raw_html=True))
    if summary["findings"]:
        sections.append(Section("Findings", [findings_html(summary["findings"])], raw_html=True))
    sections.append(Section("Timeline and allocator state", figs[:2] + [pd.DataFrame([{
        "allocated": fb(summary["allocated_bytes"]), "reserved": fb(summary["reserved_bytes"]),
        "peak allocated": fb(summary["peak"]["allocated_bytes"]),
        "free in reserved": fb(summary["free_in_reserved_bytes"]),
        "largest free block": fb(summary["largest_free_block_bytes"]),
        "external fragmentation (1 - largest free / free)": summary["external_fragmentation"],
        "cached-unused share ((reserved - allocated) / reserved) at the peak": summary["peak"]["cached_unused_share"],
    }])]))
    sections.append(Section("Live at the peak", figs[2:] + [
        pd.DataFrame(summary["peak"]["by_category"]),
        pd.DataFrame(summary["peak"]["by_frame"]),
    ]))
    return write_report(out, f"Memory: {snap.source}", sections,
                        subtitle=f"{summary['events']:,} events, {summary['segments']} segments")


def diff_report(diff, out, *, top: int = 15, test=None, normalize: str = "total") -> Path:
    """A before/after report that leads with what changed: the headline, the step time and the GPU time
    breakdown (compute, memcpy/memset, communication, idle; a base-vs-test bar), the findings resolved,
    new or changed, then the largest kernel and operator changes and what appeared or disappeared.
    Every number is in the diff's unit (``d.unit``). ``diff``: a
    :func:`~workbench.analysis.trace.diff.trace_diff` result, or the base trace (``Trace``, path or
    ``TraceAnalysis``) with ``test`` the other one (then ``normalize`` as in ``trace_diff``)."""
    from workbench.figures.compare import (
        breakdown_change_figure,
        changes_html,
        findings_change_html,
        kernel_delta_figure,
        readable_delta_table,
    )

    d = diff
    if test is not None:
        from workbench.analysis.trace.diff import trace_diff

        d = trace_diff(_as_trace_analysis(diff), _as_trace_analysis(test), normalize=normalize)
    sections = [
        Section("What changed", [changes_html(d), breakdown_change_figure(d)], raw_html=True),
        Section("Findings", [findings_change_html(d)], raw_html=True),
        Section(f"Kernels ({d.unit})", [kernel_delta_figure(d.kernels, top=top),
                                        readable_delta_table(d.kernels.head(top))]),
        Section(f"Operators ({d.unit})", [
            kernel_delta_figure(d.ops, top=top, value="delta_cpu_us", title="op CPU time change (test − base)"),
            readable_delta_table(d.ops.head(top)),
        ]),
    ]
    gone_new = pd.DataFrame(
        [{"what": "kernel", "change": "appeared", "name": n} for n in d.appeared_kernels]
        + [{"what": "kernel", "change": "disappeared", "name": n} for n in d.disappeared_kernels]
        + [{"what": "op", "change": "appeared", "name": n} for n in d.appeared_ops]
        + [{"what": "op", "change": "disappeared", "name": n} for n in d.disappeared_ops]
    )
    if len(gone_new):
        sections.append(Section("Appeared and disappeared", [gone_new]))
    return write_report(out, f"Diff: {d.base.path} → {d.test.path}", sections,
                        subtitle=f"base {d.base.device}, test {d.test.device}; deltas are test − base; {d.unit}")


def ranks_report(view, out) -> Path:
    """A report of the cross-rank view: the straggler verdict and findings, each rank's time, the
    collectives' skew vs transfer and the per-rank collective timeline. ``view``: a
    :class:`~workbench.analysis.trace.ranks.RanksView`, or what :func:`~workbench.analysis.trace.ranks.load_ranks`
    takes (files, a folder or a glob)."""
    from workbench.analysis.trace.ranks import RANK_KEYS, load_ranks, ranks_summary
    from workbench.figures import ranks as rf

    if not hasattr(view, "ranks"):
        view = load_ranks(view)
    doc = ranks_summary(view)
    s = doc["straggler"]
    if s is None and doc.get("unread"):
        verdict = (f"straggler: not judged ({len(doc['unread'])} rank trace(s) could not be read; the missing rank "
                   "may be the one the others wait for)")
    else:
        verdict = ("no straggler: no rank makes the others wait" if s is None else
                   f"straggler: rank {s['rank']}, the others wait {s['wait_ms_per_step']:.1f} ms per step for it")
    sections = [
        Section("Verdict and findings", [f"<p><b>{verdict}</b></p>", findings_html(doc["findings"])], raw_html=True),
        Section("Time per rank", [rf.rank_time_figure(view), view.ranks[RANK_KEYS]]),
        Section("Collectives", [rf.collective_skew_figure(view), rf.rank_timeline_figure(view),
                                pd.DataFrame(doc["collectives"])]),
    ]
    if doc["skipped"]:
        sections.append(Section("Skipped files", [pd.DataFrame(doc["skipped"])]))
    return write_report(out, f"Ranks: {len(doc['ranks'])} of world size {doc['world_size']}", sections,
                        subtitle="made with gpu-workbench")


def memory_diff_report(diff, out, *, top: int = 15, test=None) -> Path:
    """Two allocator snapshots on one axis: both timelines, peak vs peak by category and by the user's
    frame with deltas. ``diff``: a :func:`~workbench.analysis.memory.diff.memory_diff` result, or the
    base snapshot (path, ``MemorySnapshot`` or ``MemoryAnalysis``) with ``test`` the other one."""
    from workbench.analysis.memory.diff import memory_diff
    from workbench.figures.memory import memory_compare_figure
    from workbench.units import format_bytes as fb

    d = diff
    if test is not None:
        d = memory_diff(_as_analysis(diff), _as_analysis(test))
    s = d.summary(top)
    head = pd.DataFrame([
        {"": "peak allocated", "base": fb(s["base"]["peak_allocated_bytes"]), "test": fb(s["test"]["peak_allocated_bytes"]),
         "change": fb(s["peak_allocated_delta_bytes"])},
        {"": "peak reserved", "base": fb(s["base"]["peak_reserved_bytes"]), "test": fb(s["test"]["peak_reserved_bytes"]),
         "change": fb(s["peak_reserved_delta_bytes"])},
        {"": "steps", "base": str(s["base"]["steps"]), "test": str(s["test"]["steps"]), "change": ""},
    ])
    sections = [
        Section("Peak vs peak", [head, memory_compare_figure(d)]),
        Section("By category at each peak", [pd.DataFrame(s["by_category"])]),
        Section("By the user's frame at each peak", [pd.DataFrame(s["by_frame"])]),
    ]
    return write_report(out, f"Memory diff: {s['base']['path']} → {s['test']['path']}", sections,
                        subtitle=f"axis: {d.axis}; deltas are test − base")


def _as_analysis(x):
    from workbench.analysis.memory.oom import MemoryAnalysis, analyze_snapshot

    if isinstance(x, MemoryAnalysis):
        return x
    if not hasattr(x, "events"):
        from workbench.io.snapshot import load_snapshot

        x = load_snapshot(os.fspath(x), progress=False)
    return analyze_snapshot(x)

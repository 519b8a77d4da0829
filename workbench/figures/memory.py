"""Allocator snapshot analyses -> plotly figures: stacked timeline, segment map, top allocations,
allocator state over time, OOM picture.

Every figure takes a :class:`workbench.analysis.memory.oom.MemoryAnalysis` (or a table from it) and
ships at most :data:`~workbench.figures._downsample.MAX_POINTS` points whatever the snapshot: the
time range is cut first (``start_us``/``end_us``), then the total is min/max-downsampled and every
stacked series is evaluated at those same moments (exact values, not re-binned), so peaks survive
and the stack stays consistent. Times are shown in milliseconds from the first recorded event.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.memory.allocations import CATEGORIES
from workbench.errors import BadArgument
from workbench.analysis.windows import GroupSeries, allocation_groups, event_range, segment_blocks
from workbench.figures._downsample import MAX_POINTS, minmax_downsample
from workbench.figures._style import legend_below
from workbench.io.snapshot import Action

__all__ = [
    "memory_timeline_figure",
    "segment_map_figure",
    "top_allocations_figure",
    "allocator_state_figure",
    "oom_figure",
    "memory_compare_figure",
    "CATEGORY_COLORS",
]

CATEGORY_COLORS = {  # Okabe-Ito, colour-blind safe
    "parameters": "#009E73",
    "optimizer_state": "#E69F00",
    "gradients": "#0072B2",
    "activations": "#D55E00",
    "temporaries": "#CC79A7",
    "unknown": "#999999",
    "other": "#BBBBBB",
    "free": "#EEEEEE",
}
_PALETTE = ["#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
            "#8C564B", "#17BECF", "#7F7F7F", "#BCBD22"]
_GIB = 2**30


def _groups(analysis, by: str, top: int):
    """Group codes and names (computed in :mod:`workbench.analysis.windows`) with their colours."""
    codes, names = allocation_groups(analysis, by, top)
    if by == "category":
        return codes, names, [CATEGORY_COLORS[c] for c in names]
    colors = [_PALETTE[i % len(_PALETTE)] for i in range(len(names) - 1)] + [CATEGORY_COLORS["other"]]
    return codes, names, colors


def memory_timeline_figure(analysis, by: str = "category", start_us=None, end_us=None,
                           max_points: int = MAX_POINTS, top: int = 8, show_reserved: bool = True,
                           marker_index: int | None = None) -> go.Figure:
    """Allocated memory over time, stacked by ``category``, by the user's ``frame`` / ``function``
    (top ``top`` at the peak, the rest as 'other'), or one ``total`` line; reserved memory dashed.
    Only the window [start_us, end_us] is drawn, downsampled so the figure holds <= ``max_points``."""
    tl = analysis.timeline
    lo, hi = event_range(tl, start_us, end_us)
    fig = go.Figure()
    if hi < lo:
        fig.update_layout(title="Allocated memory: no events in this range")
        return fig
    t0 = int(tl["time_us"].iloc[0])
    alloc = tl["allocated_bytes"].to_numpy()[lo:hi + 1]
    idx_all = np.arange(lo, hi + 1)
    if by == "total":
        ngroups = 0
    else:
        codes, names, colors = _groups(analysis, by, top)
        ngroups = len(names)
    per_trace = max(4, max_points // (ngroups + 2))
    idx, _ = minmax_downsample(idx_all, alloc, per_trace)
    # always keep the window's edges and, inside it, the peak
    extra = [lo, hi]
    if lo <= analysis.peak["index"] <= hi:
        extra.append(analysis.peak["index"])
    if marker_index is not None and lo <= marker_index <= hi:
        extra.append(marker_index)
    idx = np.unique(np.r_[idx, extra]).astype(np.int64)
    x_ms = (tl["time_us"].to_numpy()[idx] - t0) / 1e3
    if by == "total":
        fig.add_trace(go.Scatter(x=x_ms, y=alloc[idx - lo] / _GIB, name="allocated", mode="lines",
                                 line=dict(color="#0072B2"), fill="tozeroy"))
    else:
        series = GroupSeries(analysis.allocs, codes, ngroups, len(tl))
        for g, (name, color) in enumerate(zip(names, colors)):
            y = series.at(g, idx)
            if not y.any():
                continue
            fig.add_trace(go.Scatter(x=x_ms, y=y / _GIB, name=str(name)[:60], mode="lines", stackgroup="a",
                                     line=dict(width=0.5, color=color), hovertemplate="%{y:.3f} GiB"))
    if show_reserved:
        fig.add_trace(go.Scatter(x=x_ms, y=tl["reserved_bytes"].to_numpy()[idx] / _GIB, name="reserved",
                                 mode="lines", line=dict(color="#444444", dash="dash", width=1)))
    pk = analysis.peak
    oom = np.flatnonzero(tl["action"].cat.codes.to_numpy()[lo:hi + 1] == Action.OOM)
    if lo <= pk["index"] <= hi:
        # an OOM right after the peak puts its label at the same spot: the peak's goes one line lower
        fig.add_vline(x=(pk["time_us"] - t0) / 1e3, line=dict(color="#D55E00", dash="dot", width=1),
                      annotation_text=f"peak {pk['allocated_bytes'] / _GIB:.2f} GiB", annotation_position="top left",
                      annotation_yshift=-16 if len(oom) else 0)
    if marker_index is not None and lo <= marker_index <= hi:
        fig.add_vline(x=(int(tl["time_us"].iloc[marker_index]) - t0) / 1e3, line=dict(color="#000000", width=1))
    for k in oom[-3:]:
        fig.add_vline(x=(int(tl["time_us"].iloc[lo + k]) - t0) / 1e3, line=dict(color="#CC0000", width=2),
                      annotation_text="OOM", annotation_position="top right")
    title = {"category": "by category", "frame": "by the user's frame", "function": "by function", "module": "by module",
             "total": "total"}[by]
    fig.update_layout(
        title=f"Allocated memory {title}", xaxis_title="time since first event (ms)", yaxis_title="GiB",
        hovermode="x unified", legend=dict(font=dict(size=10)), margin=dict(l=60, r=20, t=50, b=40),
        meta={"points": int(sum(len(tr.x) for tr in fig.data)), "window": [int(lo), int(hi)]},
    )
    return fig


def segment_map_figure(analysis, index: int | None = None, max_segments: int = 120,
                       max_blocks: int = MAX_POINTS // 2) -> go.Figure:
    """Each segment as a bar, its blocks coloured by category and its holes (free inside reserved) in
    light grey, just after event ``index`` (default: snapshot time). The largest ``max_segments``
    segments are drawn."""
    sb = segment_blocks(analysis, index, max_segments=max_segments, max_blocks=max_blocks)
    fig = go.Figure()
    if sb.blocks.empty:
        fig.update_layout(title="Segments: none")
        return fig
    lay, seg_sizes, keep = sb.blocks, sb.segment_bytes, sb.segments
    order = {seg: i for i, seg in enumerate(keep)}
    cat = lay["category"].to_numpy().astype(object)
    frame = lay["frame"].to_numpy().astype(object)
    ylab = np.array([f"#{order[seg]} {'S' if sm else 'L'} {seg_sizes[seg] / 2**20:,.0f} MiB"
                     for seg, sm in zip(lay["segment"].to_numpy(), lay["small"].to_numpy())], dtype=object)
    for c in list(CATEGORIES) + ["free"]:
        m = cat == c
        if not m.any():
            continue
        sub = lay[m]
        fig.add_trace(go.Bar(
            y=ylab[m], x=sub["size_bytes"].to_numpy() / 2**20, base=sub["offset_bytes"].to_numpy() / 2**20,
            orientation="h", name=c, marker=dict(color=CATEGORY_COLORS[c], line=dict(width=0.3, color="#555")),
            customdata=np.stack([frame[m], sub["size_bytes"].to_numpy()], axis=1),
            hovertemplate="%{customdata[1]:,} B<br>%{customdata[0]}<extra>" + c + "</extra>",
        ))
    free = lay[lay["free"].to_numpy()]
    fig.update_layout(
        barmode="overlay", title=(f"Segments: {len(keep)} shown, {free['size_bytes'].sum() / 2**20:,.1f} MiB free "
                                  f"in {len(free)} holes (largest {free['size_bytes'].max() / 2**20 if len(free) else 0:,.1f} MiB)"),
        xaxis_title="offset in segment (MiB)", yaxis=dict(autorange="reversed", type="category"),
        height=min(1600, 140 + 18 * len(keep)), margin=dict(l=130, r=20, t=50, b=40),
    )
    return fig


def top_allocations_figure(source, top: int = 20) -> go.Figure:
    """The largest allocations live at one moment: ``source`` is a frame from
    ``MemoryAnalysis.live_at`` or the ``workbench memory`` summary dict (its peak's top allocations)."""
    if isinstance(source, dict):
        rows = pd.DataFrame(source["peak"]["top_allocations"])
        if len(rows):
            rows = rows.rename(columns={"bytes": "size_bytes"})
    else:
        rows = source
    fig = go.Figure()
    if rows is None or not len(rows):
        fig.update_layout(title="No live allocations")
        return fig
    rows = rows.sort_values("size_bytes", ascending=False).head(top)
    cats = rows["category"].astype(str).to_numpy() if "category" in rows else np.full(len(rows), "unknown")
    labels = [f"{i + 1}. {str(f)[:70]}" for i, f in enumerate(rows["frame"].to_numpy())]
    fig.add_trace(go.Bar(
        y=labels, x=rows["size_bytes"].to_numpy() / 2**20, orientation="h",
        marker=dict(color=[CATEGORY_COLORS.get(c, "#999999") for c in cats]),
        customdata=cats, hovertemplate="%{x:,.1f} MiB (%{customdata})<extra></extra>",
    ))
    fig.update_layout(title=f"Top {len(rows)} live allocations", xaxis_title="MiB",
                      yaxis=dict(autorange="reversed"), height=140 + 22 * len(rows),
                      margin=dict(l=320, r=20, t=50, b=40))
    return fig


def allocator_state_figure(states: pd.DataFrame, t0_us: int | None = None) -> go.Figure:
    """From ``allocator_state_timeline``: free inside reserved vs the largest free block (GiB, left
    axis) and the fragmentation ratio (right axis) over time."""
    fig = go.Figure()
    if not len(states):
        fig.update_layout(title="Allocator state: no events")
        return fig
    t = states["time_us"].astype("float64").to_numpy()
    t0 = t0_us if t0_us is not None else np.nanmin(t)
    x = (t - t0) / 1e3
    fig.add_trace(go.Scatter(x=x, y=states["reserved_bytes"] / _GIB, name="reserved", line=dict(color="#444", dash="dash")))
    fig.add_trace(go.Scatter(x=x, y=states["allocated_bytes"] / _GIB, name="allocated", line=dict(color="#0072B2")))
    fig.add_trace(go.Scatter(x=x, y=states["free_in_reserved_bytes"] / _GIB, name="free in reserved",
                             line=dict(color="#E69F00")))
    fig.add_trace(go.Scatter(x=x, y=states["largest_free_block_bytes"] / _GIB, name="largest free block",
                             line=dict(color="#009E73")))
    fig.add_trace(go.Scatter(x=x, y=states["fragmentation"], name="external fragmentation", yaxis="y2",
                             line=dict(color="#CC79A7", width=1),
                             hovertemplate="%{y:.0%} = 1 - largest free block / free<extra></extra>"))
    if "cached_unused_share" in states:
        fig.add_trace(go.Scatter(x=x, y=states["cached_unused_share"], name="cached-unused share", yaxis="y2",
                                 line=dict(color="#000000", width=1, dash="dot"),
                                 hovertemplate="%{y:.0%} = (reserved - allocated) / reserved<extra></extra>"))
    from workbench.analysis.memory.segments import CACHED_UNUSED_ALARM

    fig.add_hline(y=CACHED_UNUSED_ALARM, yref="y2", line=dict(color="#000000", width=1, dash="dash"),
                  annotation_text=f"{CACHED_UNUSED_ALARM:.0%} alarm (cached-unused share)",
                  annotation_position="top left")
    fig.update_layout(title="Allocator state over time", xaxis_title="time since first event (ms)",
                      yaxis=dict(title="GiB", automargin=True),
                      yaxis2=dict(title="share (0-100%)", overlaying="y", side="right", range=[0, 1],
                                  tickformat=".0%", dtick=0.25, showgrid=False, automargin=True),
                      hovermode="x unified", margin=dict(l=60, r=70))
    # a legend at the right would cover the fragmentation axis: it goes under the time axis
    return legend_below(fig, 360, len(fig.data), per_row=3)


def oom_figure(report) -> go.Figure:
    """The OOM in one picture: what was requested next to the largest free block, the free memory
    inside reserved segments, and what was live by category (``report`` is an ``OomReport``)."""
    r = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    fig = go.Figure()
    bars = [("requested", r["requested_bytes"], "#CC0000"),
            ("largest free block", r["largest_free_block_bytes"], "#009E73"),
            ("free in reserved", r["free_in_reserved_bytes"], "#E69F00")]
    if r.get("cap_bytes"):
        bars.append(("cap - reserved", max(r["cap_bytes"] - r["reserved_bytes"], 0), "#56B4E9"))
    fig.add_trace(go.Bar(x=[b[0] for b in bars], y=[b[1] / _GIB for b in bars], marker_color=[b[2] for b in bars],
                         name="the request", showlegend=False, hovertemplate="%{y:.3f} GiB<extra></extra>"))
    for c, v in r.get("by_category", {}).items():
        fig.add_trace(go.Bar(x=["live (allocated)"], y=[v["bytes"] / _GIB], name=c,
                             marker_color=CATEGORY_COLORS.get(c, "#999"), hovertemplate="%{y:.3f} GiB<extra>" + c + "</extra>"))
    fig.update_layout(barmode="stack", title=f"OOM: {r['cause']} (requested {r['requested_bytes'] / _GIB:.2f} GiB)",
                      yaxis_title="GiB", margin=dict(l=60, r=20, t=50, b=40))
    return fig


def memory_compare_figure(diff, max_points: int = MAX_POINTS // 2, labels=("base", "test")) -> go.Figure:
    """Two snapshots on one axis (a :class:`~workbench.analysis.memory.diff.MemoryDiff`): allocated
    (solid) and reserved (dotted) of each, on the step axis (step number + fraction of the step) when both
    have step boundaries, else ms from each history's first event; each run's peak is marked."""
    fig = go.Figure()
    colors = ("#0072B2", "#D55E00")
    for tl, side, name, color in ((diff.base_timeline, diff.base_side, labels[0], colors[0]),
                                  (diff.test_timeline, diff.test_side, labels[1], colors[1])):
        if not len(tl):
            continue
        x = tl["x"].to_numpy()
        a = tl["allocated_bytes"].to_numpy()
        keep = _minmax_indices(a, max_points)
        fig.add_trace(go.Scatter(x=x[keep], y=a[keep] / _GIB, name=f"{name} allocated", line=dict(color=color),
                                 hovertemplate="%{y:.3f} GiB<extra>" + name + " allocated</extra>"))
        r = tl["reserved_bytes"].to_numpy()
        fig.add_trace(go.Scatter(x=x[keep], y=r[keep] / _GIB, name=f"{name} reserved",
                                 line=dict(color=color, dash="dot", width=1),
                                 hovertemplate="%{y:.3f} GiB<extra>" + name + " reserved</extra>"))
        if side.get("peak_x") is not None:
            fig.add_trace(go.Scatter(x=[side["peak_x"]], y=[side["peak_allocated_bytes"] / _GIB], mode="markers",
                                     marker=dict(color=color, size=9, symbol="diamond"), name=f"{name} peak",
                                     hovertemplate="peak %{y:.3f} GiB<extra>" + name + "</extra>"))
    axis = "step (aligned at step starts)" if diff.axis == "step" else "time since first event (ms)"
    fig.update_layout(title="Two snapshots on one axis: allocated (solid) and reserved (dotted)",
                      xaxis_title=axis, yaxis=dict(title="GiB", automargin=True), hovermode="x unified")
    if diff.axis == "step":
        fig.update_xaxes(dtick=1)
    return legend_below(fig, 400, len(fig.data), per_row=3)


def _minmax_indices(y, max_points: int) -> np.ndarray:
    """Indices keeping each bucket's min and max of ``y`` (at most ``max_points``), in order."""
    n = len(y)
    if n <= max_points:
        return np.arange(n)
    per = int(np.ceil(n / max(max_points // 2, 1)))
    pad = (-n) % per
    yy = np.r_[y, np.full(pad, y[-1])].reshape(-1, per)
    base = np.arange(yy.shape[0]) * per
    idx = np.unique(np.r_[base + yy.argmin(axis=1), base + yy.argmax(axis=1), n - 1])
    return idx[idx < n]

"""One run on one clock: annotations, GPU kernel lanes, the allocator's curve and NVML/GPM curves as rows
of one figure sharing its x axis (seconds since the first event of all files; zoom one row, all follow).

The input is an :class:`~workbench.analysis.timeline.AlignedTimeline` (``analysis.timeline.align``); what each
row shows is decided there (``annotation_lanes``, ``kernel_segments``), this module only draws.

>>> from workbench import samples
>>> from workbench.io import load_trace
>>> from workbench.analysis.timeline import align
>>> fig = aligned_timeline_figure(align(load_trace(samples.path("h200_timeline_trace"))))
>>> [a.text for a in fig.layout.annotations][:2]
['annotations', 'GPU kernels']
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.timeline import annotation_lanes, kernel_segments
from workbench.figures._downsample import MAX_POINTS, minmax_downsample
from workbench.units import format_bytes, short_name

__all__ = ["aligned_timeline_figure", "ROW_TITLES", "ACTIVITY_SERIES"]

GIB = 2.0**30
ROW_TITLES = {"annotations": "annotations", "kernels": "GPU kernels", "memory": "allocator (GiB)",
              "activity": "GPU activity (%): NVML utilization and GPM counters"}
# (column, legend name, colour, dash)
ACTIVITY_SERIES = (
    ("util_gpu_pct", "NVML util", "#777777", "dot"),
    ("gpm_sm_util_pct", "SM active", "#0072B2", "solid"),
    ("gpm_tensor_util_pct", "tensor cores", "#D55E00", "solid"),
    ("gpm_dram_bw_util_pct", "DRAM bandwidth", "#E69F00", "solid"),
    ("gpm_sm_occupancy_pct", "SM occupancy", "#009E73", "dash"),
)
_STEP_COLOR, _USER_COLOR, _KERNEL_COLOR, _MERGED_COLOR = "#56B4E9", "#CC79A7", "#009E73", "#006B4E"
MAX_ANNOTATIONS = 3_000


def _segments(x0, x1, y):
    n = len(x0)
    xs, ys = np.empty(3 * n), np.empty(3 * n)
    xs[0::3], xs[1::3], xs[2::3] = x0, x1, np.nan
    ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
    return xs, ys


def _hover(texts):
    h = np.empty(3 * len(texts), dtype=object)
    h[0::3], h[1::3], h[2::3] = texts, texts, ""
    return h


def _ms(ns) -> str:
    ms = ns / 1e6
    return f"{ms:,.3f} ms" if ms < 10 else f"{ms:,.1f} ms"


def aligned_timeline_figure(tl, start_ns: int | None = None, end_ns: int | None = None, *,
                            max_segments: int = 4_000, max_points: int = 4_000, title: str | None = None,
                            height: int | None = None) -> go.Figure:
    """The rows the timeline has data for, top to bottom: annotations (``ProfilerStep#N`` and
    ``record_function`` ranges, one lane per nesting level), GPU kernel lanes (one per stream; kernels
    closer than a pixel merged, see ``kernel_segments``), the allocator's allocated/reserved bytes with
    its peak marked (and NVML's memory used, device-wide), and NVML utilization with the GPM counters.

    ``start_ns``/``end_ns`` (on the timeline's clock) pick the window the kernel lanes are computed for
    and the x range; x is seconds since ``tl.origin_ns``."""
    o = tl.origin_ns
    rows = []
    if len(tl.annotations):
        rows.append("annotations")
    if len(tl.kernels):
        rows.append("kernels")
    nv = tl.nvml
    if tl.memory is not None or (nv is not None and nv["mem_used_bytes"].notna().any()):
        rows.append("memory")
    if nv is not None and any(c in nv and nv[c].notna().any() for c, *_ in ACTIVITY_SERIES):
        rows.append("activity")
    if not rows:
        rows = ["annotations"]
    heights = {"annotations": 1.0, "kernels": 0.8, "memory": 1.2, "activity": 1.2}
    # the memory row's unit follows the largest value shown (a CPU run's MiB, a GPU run's GiB)
    top = max([float(tl.memory["reserved_bytes"].max()) if tl.memory is not None and len(tl.memory) else 0.0,
               float(nv["mem_used_bytes"].max()) if nv is not None and nv["mem_used_bytes"].notna().any() else 0.0])
    unit, scale = next(((u, 2.0**p) for u, p in (("GiB", 30), ("MiB", 20), ("KiB", 10)) if top >= 2.0**p), ("B", 1.0))
    titles = [ROW_TITLES[r] if r != "memory" else f"allocator ({unit})" for r in rows]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=titles, row_heights=[heights[r] for r in rows])
    row_of = {r: i + 1 for i, r in enumerate(rows)}
    sec = lambda ns: (np.asarray(ns, dtype=np.float64) - o) / 1e9  # noqa: E731

    if "annotations" in row_of:
        a = tl.annotations
        if start_ns is not None or end_ns is not None:
            lo = -np.inf if start_ns is None else start_ns
            hi = np.inf if end_ns is None else end_ns
            a = a[(a["end_ns"] >= lo) & (a["start_ns"] <= hi)]
        lanes = annotation_lanes(a)
        if len(lanes) and not (a["kind"] == "step").any():
            lanes = lanes - 1  # no ProfilerStep lane: the ranges start at the top
        if len(a) > MAX_ANNOTATIONS:  # the longest ones (steps first)
            keep = np.argsort(-(a["end_ns"] - a["start_ns"]).to_numpy() - (a["kind"] == "step").to_numpy() * 1e18,
                              kind="stable")[:MAX_ANNOTATIONS]
            a, lanes = a.iloc[np.sort(keep)], lanes[np.sort(keep)]
        for kind, color, label in (("step", _STEP_COLOR, "ProfilerStep"), ("user", _USER_COLOR, "record_function")):
            m = (a["kind"] == kind).to_numpy()
            if not m.any():
                continue
            s, e = a["start_ns"].to_numpy()[m], a["end_ns"].to_numpy()[m]
            xs, ys = _segments(sec(s), sec(e), lanes[m].astype(float))
            texts = [f"{short_name(str(n), 80)}<br>{_ms(d)}" for n, d in zip(a["name"].to_numpy()[m], e - s)]
            fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name=label, line={"color": color, "width": 10},
                                       hovertext=_hover(texts), hoverinfo="text", connectgaps=False,
                                       legendgroup="annotations"), row=row_of["annotations"], col=1)
        # labels on the ranges wide enough to hold one (at most 40, widest first)
        if len(a):
            s_all, e_all = a["start_ns"].to_numpy(), a["end_ns"].to_numpy()
            lo_w = start_ns if start_ns is not None else o
            hi_w = end_ns if end_ns is not None else tl.end_ns
            vis_s, vis_e = np.maximum(s_all, lo_w), np.minimum(e_all, hi_w)
            wide = np.flatnonzero((vis_e - vis_s) > 0.06 * max(1, hi_w - lo_w))
            wide = wide[np.argsort(-(vis_e - vis_s)[wide], kind="stable")][:40]
            if len(wide):
                fig.add_trace(go.Scatter(
                    # above the bar: the WebGL bars are drawn over the SVG text layer
                    x=sec((vis_s[wide] + vis_e[wide]) / 2), y=lanes[wide].astype(float) - 0.42, mode="text",
                    textposition="middle center",
                    text=[short_name(str(n), 28) for n in a["name"].to_numpy()[wide]], textfont={"size": 10},
                    hoverinfo="skip", showlegend=False, name="labels"), row=row_of["annotations"], col=1)
        n_lanes = int(lanes.max()) + 1 if len(lanes) else 1
        # lane 0 on top (a reversed range), room above each bar for its label
        fig.update_yaxes(autorange=False, showticklabels=False, showgrid=False, zeroline=False,
                         range=[n_lanes - 0.4, -1.0], row=row_of["annotations"], col=1)

    if "kernels" in row_of:
        seg = kernel_segments(tl.kernels, start_ns, end_ns, max_segments=min(max_segments, MAX_POINTS // 3))
        lane_names = sorted(seg["lane"].unique()) if len(seg) else []
        y = seg["lane"].map({n: i for i, n in enumerate(lane_names)}).to_numpy(dtype=float) if len(seg) else []
        for merged, color, label in ((False, _KERNEL_COLOR, "kernel"), (True, _MERGED_COLOR, "kernels (merged)")):
            m = (seg["count"].to_numpy() > 1) == merged if len(seg) else np.zeros(0, bool)
            if not m.any():
                continue
            s, e = seg["start_ns"].to_numpy()[m], seg["end_ns"].to_numpy()[m]
            xs, ys = _segments(sec(s), sec(e), np.asarray(y)[m])
            texts = [(f"{short_name(str(n), 80)}<br>{_ms(b)}" if c == 1 else
                      f"{c:,} kernels, {_ms(b)} busy of {_ms(en - st)}<br>longest: {short_name(str(n), 60)}")
                     for n, c, b, st, en in zip(seg["name"].to_numpy()[m], seg["count"].to_numpy()[m],
                                                seg["busy_ns"].to_numpy()[m], s, e)]
            fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name=label, line={"color": color, "width": 10},
                                       hovertext=_hover(texts), hoverinfo="text", connectgaps=False,
                                       legendgroup="kernels"), row=row_of["kernels"], col=1)
        fig.update_yaxes(tickmode="array", tickvals=list(range(len(lane_names))), ticktext=lane_names,
                         autorange="reversed", showgrid=False, zeroline=False, row=row_of["kernels"], col=1)

    if "memory" in row_of:
        r = row_of["memory"]
        if tl.memory is not None and len(tl.memory):
            m = tl.memory
            x = sec(m["time_ns"].to_numpy())
            for col, name, color in (("allocated_bytes", "allocated", "#0072B2"), ("reserved_bytes", "reserved", "#999999")):
                xd, yd = minmax_downsample(x, m[col].to_numpy(dtype=float) / scale, max_points)
                fig.add_trace(go.Scattergl(x=xd, y=yd, mode="lines", line={"color": color, "width": 2, "shape": "hv"},
                                           name=name, legendgroup="memory",
                                           hovertemplate=f"{name}: %{{y:.3f}} {unit}<extra></extra>"), row=r, col=1)
        peak = tl.memory_peak
        if peak is not None and peak.get("time_ns") is not None:
            at = tl.annotation_at(peak["time_ns"])
            where = f" in {short_name(at['name'], 40)}" if at else ""
            fig.add_trace(go.Scatter(x=[sec(peak["time_ns"])], y=[peak["bytes"] / scale], mode="markers+text",
                                     marker={"color": "#D55E00", "size": 10, "symbol": "diamond"},
                                     text=[f"peak {format_bytes(peak['bytes'], significant=3)}{where}"],
                                     textposition="top right", name="allocated peak", legendgroup="memory",
                                     hovertemplate=f"allocated peak %{{y:.3f}} {unit}<extra></extra>"), row=r, col=1)
        if nv is not None and nv["mem_used_bytes"].notna().any():
            for gpu, g in nv.groupby("gpu"):
                xd, yd = minmax_downsample(sec(g["ns"].to_numpy()), g["mem_used_bytes"].to_numpy(dtype=float) / scale,
                                           max_points)
                fig.add_trace(go.Scatter(x=xd, y=yd, mode="lines", line={"color": "#009E73", "dash": "dot"},
                                         name=f"NVML mem used gpu{gpu}", legendgroup="memory",
                                         hovertemplate=f"NVML used %{{y:.3f}} {unit}<extra></extra>"), row=r, col=1)
        fig.update_yaxes(rangemode="tozero", row=r, col=1)

    if "activity" in row_of:
        r = row_of["activity"]
        for gpu, g in nv.groupby("gpu"):
            suffix = f" gpu{gpu}" if nv["gpu"].nunique() > 1 else ""
            for col, name, color, dash in ACTIVITY_SERIES:
                if col not in g or not g[col].notna().any():
                    continue
                ok = g[col].notna().to_numpy()
                xd, yd = minmax_downsample(sec(g["ns"].to_numpy()[ok]), g[col].to_numpy(dtype=float)[ok], max_points)
                # a value is the average over the interval that ends at its row (GPM: between two samples;
                # NVML utilization: the driver's last period), so it is drawn over the interval before it
                fig.add_trace(go.Scatter(x=xd, y=yd, mode="lines",
                                         line={"color": color, "dash": dash, "width": 2, "shape": "vh"},
                                         name=name + suffix, legendgroup="activity",
                                         hovertemplate=f"{name}: %{{y:.1f}}%<extra></extra>"), row=r, col=1)
        fig.update_yaxes(range=[0, 105], row=r, col=1)

    if start_ns is not None or end_ns is not None:
        lo = sec(start_ns if start_ns is not None else o)
        hi = sec(end_ns if end_ns is not None else tl.end_ns)
        fig.update_xaxes(range=[float(lo), float(hi)])
    clock = "Unix time" if tl.clock == "unix_ns" else "each file's first event (no absolute time)"
    fig.update_xaxes(title_text=f"seconds since the first event (one clock: {clock})", row=len(rows), col=1)
    if height is None:
        height = int(140 + sum(170 * heights[r] for r in rows))
    fig.update_layout(height=height, title=title, hovermode="closest", uirevision="timeline",
                      margin={"l": 70, "r": 30, "t": 60 if title else 30, "b": 110},
                      legend={"orientation": "h", "x": 0, "y": -0.12, "yanchor": "top", "font": {"size": 11}})
    return fig

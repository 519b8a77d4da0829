"""Trace analysis tables -> plotly figures (kernel and op bars, breakdown, steps, timeline, idle gaps).

Each function takes what :mod:`workbench.analysis` returns (or a :class:`workbench.io.Trace` for the
timeline) and returns a ``go.Figure``; nothing is displayed here. Bar figures draw the rows in the
order of the table they get (the caller sorts and filters), the first row on top. Times are shown in
milliseconds; the tables keep microseconds (``*_us``). An empty table gives a figure that says so
instead of an error (a CPU-only trace has no kernels).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.windows import flow_pairs, trace_window
from workbench.figures._downsample import MAX_POINTS
from workbench.figures._style import legend_below
from workbench.units import short_name

__all__ = [
    "kernel_summary_figure",
    "op_summary_figure",
    "breakdown_figure",
    "step_figure",
    "timeline_figure",
    "idle_gap_figure",
    "distinct_labels",
]

# Okabe-Ito: distinguishable for colour-blind readers
_COLORS = {
    "kernel": "#0072B2",
    "gpu_memcpy": "#E69F00",
    "gpu_memset": "#F0E442",
    "gpu_user_annotation": "#999999",
    "cpu_op": "#009E73",
    "user_annotation": "#CC79A7",
    "cuda_runtime": "#D55E00",
    "cuda_driver": "#8C3A00",  # darker than cuda_runtime: two legend entries, two colours
    "python_function": "#56B4E9",
    "cuda_sync": "#000000",
}
_OTHER_COLOR = "#777777"
_BREAKDOWN = [  # key, label, colour
    ("compute_us", "compute", "#0072B2"),
    ("communication_us", "communication", "#CC79A7"),
    ("memory_us", "memcpy / memset", "#E69F00"),
    ("idle_us", "idle", "#BBBBBB"),
]
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
# vertical offset of each category inside its lane, so nested CPU ranges do not hide each other
_LANE_OFFSET = {
    "user_annotation": 0.3,
    "gpu_user_annotation": 0.3,
    "python_function": 0.15,
    "cpu_op": 0.0,
    "cuda_runtime": -0.25,
    "cuda_driver": -0.25,
    "kernel": 0.0,
    "gpu_memcpy": -0.15,
    "gpu_memset": -0.15,
    "cuda_sync": 0.3,
}
_HEIGHT_PER_BAR = 22


def _empty(fig: go.Figure, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, template="plotly_white", height=height,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def _bar_height(n: int) -> int:
    return int(min(900, max(300, 90 + _HEIGHT_PER_BAR * n)))


def _col(table: pd.DataFrame, *names: str):
    for n in names:
        if n in table.columns:
            return n
    return None


# --------------------------------------------------------------------------------------------------
# tables


def kernel_summary_figure(table: pd.DataFrame, top: int = 15, title: str = "Top GPU kernels by total time") -> go.Figure:
    """Horizontal bars of the first ``top`` rows of a ``kernel_summary`` table: total time (ms), with
    count, mean and percent of all kernel time in the hover."""
    fig = go.Figure()
    rows = table.head(int(top)) if table is not None else pd.DataFrame()
    if rows.empty:
        return _layout(_empty(fig, "no GPU kernels in this trace"), title, 260)
    names = rows["name"].astype(str).tolist()
    labels = distinct_labels(names)
    total_ms = rows["total_us"].to_numpy(dtype=float) / 1e3
    custom = np.column_stack([
        names,
        rows["count"].to_numpy() if "count" in rows else np.full(len(rows), np.nan),
        rows["mean_us"].to_numpy(dtype=float) if "mean_us" in rows else np.full(len(rows), np.nan),
        rows["percent"].to_numpy(dtype=float) if "percent" in rows else np.full(len(rows), np.nan),
    ])
    text = [f"{p:.1f}%" for p in rows["percent"]] if "percent" in rows else None
    fig.add_trace(go.Bar(
        x=total_ms, y=labels, orientation="h", name="total", marker_color=_COLORS["kernel"],
        text=text, textposition="auto", customdata=custom,
        hovertemplate="%{customdata[0]}<br>total %{x:.3f} ms · %{customdata[1]} calls"
                      " · mean %{customdata[2]:.1f} µs · %{customdata[3]:.1f}% of kernel time<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed", title_text="kernel")
    fig.update_xaxes(title_text="total time (ms)")
    return _layout(fig, title, _bar_height(len(rows)))


def op_summary_figure(table: pd.DataFrame, top: int = 15, title: str = "Top operators") -> go.Figure:
    """Grouped horizontal bars of the first ``top`` rows of an ``op_summary`` table: CPU self time,
    CPU total time and device (GPU) time of each op, in ms. Rows by input shape get the shape in
    their label."""
    fig = go.Figure()
    rows = table.head(int(top)) if table is not None else pd.DataFrame()
    if rows.empty:
        return _layout(_empty(fig, "no operators in this trace"), title, 260)
    labels = [short_name(n, 50) for n in rows["name"].astype(str)]
    shape_col = _col(rows, "input_shapes", "input_dims")
    if shape_col is not None:
        shapes = rows[shape_col].astype("string").fillna("").tolist()
        labels = [f"{lab} {s}" if s else lab for lab, s in zip(labels, shapes)]
    labels = _unique(labels)
    counts = rows["count"].to_numpy() if "count" in rows else np.full(len(rows), np.nan)
    series = [
        ("cpu_self_us", "CPU self", "#009E73"),
        ("cpu_total_us", "CPU total", "#8FD3B6"),
        ("device_total_us", "GPU (device) total", "#0072B2"),
    ]
    for col, name, color in series:
        if col not in rows:
            continue
        vals = rows[col].to_numpy(dtype=float, na_value=np.nan) / 1e3
        fig.add_trace(go.Bar(
            x=vals, y=labels, orientation="h", name=name, marker_color=color, customdata=counts,
            hovertemplate="%{y}<br>" + name + " %{x:.3f} ms · %{customdata} calls<extra></extra>",
        ))
    fig.update_layout(barmode="group")
    fig.update_yaxes(autorange="reversed", title_text="operator")
    fig.update_xaxes(title_text="time (ms)")
    height = _bar_height(len(rows) * 2) + 40
    return legend_below(_layout(fig, title, height), height, len(fig.data))


def _with_templates(name: str, width: int = 60) -> str:
    """The name without ``void`` and its argument list but with its template arguments (which tell
    ``cutlass::Kernel2<..._128x256_...>`` from ``cutlass::Kernel2<..._256x128_...>``), cut to ``width``."""
    s = str(name)
    if s.startswith("void "):
        s = s[5:]
    depth = 0
    for i in range(len(s) - 1, -1, -1):  # drop a trailing "(...)"
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                s = s[:i] if i > 0 else s
                break
    s = s.strip()
    if len(s) > width:  # namespaces go first (the full name is in the hover): the template arguments stay
        s = re.sub(r"(?:[A-Za-z_]\w*::)+", "", s.replace("(anonymous namespace)::", "")).replace("> >", ">>")
    return s if len(s) <= width else s[: width - 1] + "…"


def distinct_labels(names: list[str], width: int = 60) -> list[str]:
    """Short names, except where two rows would get the same one: those keep their template
    arguments (cut to ``width``); what still collides is numbered by :func:`_unique`."""
    short = [short_name(n, width) for n in names]
    counts: dict[str, int] = {}
    for lab in short:
        counts[lab] = counts.get(lab, 0) + 1
    out = [_with_templates(n, width) if counts[lab] > 1 else lab for n, lab in zip(names, short)]
    # still equal once cut to width: keep what differs (after the group's common prefix) instead
    groups: dict[str, list[int]] = {}
    for i, lab in enumerate(out):
        groups.setdefault(lab, []).append(i)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        full = [_with_templates(names[i], 10_000) for i in idx]
        common = len(os.path.commonprefix(full))
        for i, f in zip(idx, full):
            if common >= len(f):
                lab = f
            elif not short[i].endswith("…") and "<" in f[: common + 1]:
                lab = f"{short[i]}<…{f[common:]}"  # kernel<…what differs>
            else:  # as much of the start as fits, then what differs
                tail = f[common:]
                tail = tail if len(tail) <= width // 2 else tail[: width // 2 - 1] + "…"
                lab = f"{f[: max(8, width - 1 - len(tail))]}…{tail}"
            out[i] = lab if len(lab) <= width else lab[: width - 1] + "…"
    return _unique(out)


def _unique(labels: list[str]) -> list[str]:
    """Plotly merges bars with equal category labels; number repeats so each row keeps its bar."""
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        k = seen.get(lab, 0)
        seen[lab] = k + 1
        out.append(lab if k == 0 else f"{lab} [{k + 1}]")
    return out


def _breakdown_rows(breakdown) -> pd.DataFrame:
    if isinstance(breakdown, pd.DataFrame):
        return breakdown
    if isinstance(breakdown, pd.Series):
        return breakdown.to_frame().T
    if isinstance(breakdown, Mapping):
        return pd.DataFrame([dict(breakdown)])
    if hasattr(breakdown, "__dataclass_fields__"):
        return pd.DataFrame([{k: getattr(breakdown, k) for k in breakdown.__dataclass_fields__}])
    raise TypeError(f"breakdown_figure takes a dict, Series, DataFrame or dataclass, not {type(breakdown).__name__}")


def breakdown_figure(breakdown, title: str = "Where the GPU time went") -> go.Figure:
    """Stacked horizontal bar(s) of the temporal breakdown: compute, communication (NCCL),
    memcpy/memset and idle, in ms, with each part's share of the window in the label.

    ``breakdown`` is the dict / one-row frame of ``temporal_breakdown``; a frame of several rows
    (e.g. one per rank or step) gives one bar per row, labelled by its ``rank``/``step`` column or index.
    """
    rows = _breakdown_rows(breakdown)
    fig = go.Figure()
    present = [(k, lab, c) for k, lab, c in _BREAKDOWN if k in rows.columns]
    if rows.empty or not present:
        return _layout(_empty(fig, "no GPU activity to break down"), title, 260)
    label_col = _col(rows, "rank", "step", "label")
    if label_col is not None:
        ylabels = [str(v) for v in rows[label_col]]
    elif len(rows) == 1:
        ylabels = ["profiled window"]
    else:
        ylabels = [str(i) for i in rows.index]
    total = rows[[k for k, _, _ in present]].to_numpy(dtype=float).sum(axis=1)
    if not (total > 0).any():
        return _layout(_empty(fig, "no GPU activity to break down"), title, 260)
    for key, label, color in present:
        vals = rows[key].to_numpy(dtype=float)
        share = np.divide(vals, total, out=np.zeros_like(vals), where=total > 0) * 100
        fig.add_trace(go.Bar(
            x=vals / 1e3, y=ylabels, orientation="h", name=label, marker_color=color,
            text=[f"{label} {s:.0f}%" for s in share], textposition="inside", insidetextanchor="middle",
            customdata=share, hovertemplate=label + ": %{x:.3f} ms (%{customdata:.1f}%)<extra></extra>",
        ))
    fig.update_layout(barmode="stack", legend={"traceorder": "normal"})  # legend left to right like the bar
    fig.update_xaxes(title_text="time (ms)")
    fig.update_yaxes(autorange="reversed")
    height = int(max(280, 180 + 50 * len(rows)))
    return legend_below(_layout(fig, title, height), height, len(fig.data))


def step_figure(steps: pd.DataFrame, title: str = "Profiler steps: step time and GPU busy time") -> go.Figure:
    """Grouped bars per ``ProfilerStep``: wall time of the step and the GPU busy time inside it (ms);
    the GPU idle fraction is in the hover and on the busy bar."""
    fig = go.Figure()
    if steps is None or steps.empty:
        return _layout(_empty(fig, "no ProfilerStep annotations in this trace"), title, 260)
    x = [f"step {s}" if not str(s).startswith("ProfilerStep") else str(s) for s in steps["step"]]
    # the step by the one definition (until its GPU work is done: docs/definitions.md) when the table has it
    col = "step_us" if "step_us" in steps else "dur_us"
    fig.add_trace(go.Bar(x=x, y=steps[col].to_numpy(dtype=float) / 1e3, name="step time",
                         marker_color="#009E73",
                         hovertemplate="%{x}: step %{y:.3f} ms<extra></extra>"))
    if "gpu_busy_us" in steps:
        idle = (steps["gpu_idle_fraction"].to_numpy(dtype=float, na_value=np.nan) * 100
                if "gpu_idle_fraction" in steps else np.full(len(steps), np.nan))
        fig.add_trace(go.Bar(
            x=x, y=steps["gpu_busy_us"].to_numpy(dtype=float, na_value=np.nan) / 1e3, name="GPU busy",
            marker_color="#0072B2", customdata=idle,
            text=[f"{v:.0f}% idle" if not math.isnan(v) else "" for v in idle], textposition="outside",
            hovertemplate="%{x}: GPU busy %{y:.3f} ms, idle %{customdata:.1f}%<extra></extra>",
        ))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="time (ms)")
    return legend_below(_layout(fig, title), 420, len(fig.data))


# half-decade bins from 1 µs to 10 s
_GAP_EDGES = 10.0 ** np.arange(0, 7.5, 0.5)


def _edge_label(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3g} s"
    if v >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.3g} µs"


def idle_gap_figure(gaps: pd.DataFrame, title: str = "GPU idle gaps by length and cause") -> go.Figure:
    """Histogram of idle-gap lengths in half-decade bins (1 µs, 3.2 µs, 10 µs, ...), stacked by the
    gap's likely ``cause``; the hover gives the gaps' summed idle time per bin."""
    fig = go.Figure()
    if gaps is None or gaps.empty:
        return _layout(_empty(fig, "no GPU idle gaps"), title, 260)
    dur = gaps["dur_us"].to_numpy(dtype=float)
    lo = max(0.0, math.floor(np.log10(max(dur.min(), 1.0)) * 2) / 2)
    hi = math.ceil(np.log10(max(dur.max(), 1.0)) * 2 + 1e-9) / 2
    edges = 10.0 ** np.arange(lo, max(hi, lo + 0.5) + 0.25, 0.5)
    labels = [f"{_edge_label(a)}–{_edge_label(b)}" for a, b in zip(edges[:-1], edges[1:])]
    idx = np.clip(np.searchsorted(edges, dur, side="right") - 1, 0, len(labels) - 1)
    causes = gaps["cause"].astype("string").fillna("unknown") if "cause" in gaps else pd.Series(["gap"] * len(gaps))
    palette = ["#D55E00", "#0072B2", "#E69F00", "#CC79A7", "#009E73", "#56B4E9", "#999999"]
    for k, cause in enumerate(sorted(set(causes))):
        sel = (causes == cause).to_numpy()
        counts = np.bincount(idx[sel], minlength=len(labels))
        idle_ms = np.bincount(idx[sel], weights=dur[sel], minlength=len(labels)) / 1e3
        fig.add_trace(go.Bar(
            x=labels, y=counts, name=str(cause), marker_color=palette[k % len(palette)], customdata=idle_ms,
            hovertemplate=str(cause) + ": %{y} gaps of %{x}, %{customdata:.3f} ms idle<extra></extra>",
        ))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="gap length", type="category", categoryorder="array", categoryarray=labels)
    fig.update_yaxes(title_text="gaps")
    return legend_below(_layout(fig, title), 420, len(fig.data))


# --------------------------------------------------------------------------------------------------
# timeline


def _lane_labels(ev: pd.DataFrame, metadata: Mapping) -> tuple[pd.Series, list[str]]:
    """A lane label for every event (GPU d · stream s, or CPU p · thread t) and the lanes in display
    order (GPU lanes first, then CPU threads by their first event)."""
    cat = ev["cat"].astype(str)
    meta = metadata if isinstance(metadata, Mapping) else {}
    names = meta.get("thread_names") if isinstance(meta.get("thread_names"), Mapping) else {}
    plabels = meta.get("process_labels") if isinstance(meta.get("process_labels"), Mapping) else {}
    gpu_pids = [p for p, lab in plabels.items() if str(lab).startswith("GPU")]
    is_gpu = cat.isin(_GPU_CATS).to_numpy().copy()
    if "stream" in ev:
        is_gpu |= ev["stream"].notna().to_numpy()
    if gpu_pids:
        is_gpu |= ev["pid"].isin(gpu_pids).to_numpy()

    def thread_name(p, t):
        per_pid = names.get(p) or names.get(str(p)) or {}
        return (per_pid.get(t) or per_pid.get(str(t))) if isinstance(per_pid, Mapping) else None

    pids = ev["pid"].to_numpy(dtype=object)
    tids = ev["tid"].to_numpy(dtype=object)
    streams = ev["stream"].to_numpy(dtype=object, na_value=None) if "stream" in ev else [None] * len(ev)
    devices = ev["device"].to_numpy(dtype=object, na_value=None) if "device" in ev else [None] * len(ev)
    label_of: dict[tuple, str] = {}
    labels = []
    for g, p, t, s, d in zip(is_gpu.tolist(), pids, tids, streams, devices):
        key = (g, p, t, s, d)
        lab = label_of.get(key)
        if lab is None:
            if g:
                dev = d if d is not None else p
                if s is not None:
                    lab = f"GPU {dev} · stream {s}"
                else:
                    n = thread_name(p, t)
                    lab = f"GPU {dev} · {n}" if n and not str(n).startswith("stream") else f"GPU {dev} · stream {t}"
            else:
                n = thread_name(p, t)
                lab = f"CPU {p} · {n}" if n else f"CPU {p} · thread {t}"
            label_of[key] = lab
        labels.append(lab)
    lab = pd.Series(labels, index=ev.index, dtype=object)
    first = pd.DataFrame({"_lane": labels, "gpu": is_gpu, "ts": ev["ts_us"].to_numpy()}).groupby(
        "_lane", sort=False).agg(gpu=("gpu", "max"), first=("ts", "min"))
    first = first.sort_values(["gpu", "first"], ascending=[False, True])
    return lab, [str(x) for x in first.index]


MAX_FLOWS = 5_000  # launch -> GPU arrows drawn at most (the first ones in time)


COMPILE_LANE = "torch.compile"
COMPILE_TRACE_NAME = "compiled region"
COMPILE_COLOR = "#8e44ad"


def _regions_in(regions, events, start_us, end_us):
    """The compiled regions that overlap the drawn window (None when there are none to draw)."""
    if regions is None or not len(regions):
        return None
    lo = float(start_us) if start_us is not None else float(events["ts_us"].min())
    hi = float(end_us) if end_us is not None else float((events["ts_us"] + events["dur_us"].fillna(0.0)).max())
    r = regions[(regions["ts_us"] < hi) & (regions["ts_us"] + regions["dur_us"] > lo)]
    return r if len(r) else None


def timeline_figure(trace, start_us: float | None = None, end_us: float | None = None,
                    max_events: int = 20_000, title: str = "Timeline", flows: bool = False,
                    regions: pd.DataFrame | None = None) -> go.Figure:
    """A zoomable timeline of a trace: one lane per GPU stream and per CPU thread, one colour per event
    category, time in ms from the start of the trace.

    ``start_us``/``end_us`` (in the trace's own clock, like ``Trace.events.ts_us``) pick a window; the
    events drawn are the ones :func:`workbench.analysis.windows.trace_window` picks for it: all of them
    when they fit ``max_events``, else every GPU event first and the host events thinned to one per
    lane, category and pixel column (zooming in narrows the window and brings the rest back). Each event
    is one WebGL line segment (at most ``2 * max_events`` points, capped at the figures' point budget).
    The title says what is shown. With a window, the x axis spans exactly that window (events reaching
    outside it are cut at its edges), so a step's timeline starts at the step, not at the trace start.
    ``flows=True`` adds the launch -> GPU arrows (runtime call to the kernel or copy it launched, by
    correlation id) among the drawn events, the first :data:`MAX_FLOWS` of them. ``regions``: the trace's
    torch.compile regions (``TraceAnalysis.compile_regions``: ``Torch-Compiled Region: F/C`` ranges) drawn
    in a lane of their own on top, ``torch.compile``, a region resumed after a graph break one row lower
    than the one it breaks out of, each with its graph work and break cost in the hover.
    """
    ev = trace.events if hasattr(trace, "events") else trace
    meta = getattr(trace, "metadata", {}) or {}
    fig = go.Figure()
    if ev is None or len(ev) == 0:
        return _layout(_empty(fig, "no events in this trace"), title, 260)
    # which events: the window, picked by what is in view (analysis.timeline); this only draws them
    win = trace_window(trace, start_us, end_us, max_events=int(max(1, min(max_events, MAX_POINTS // 2))))
    sel, origin, n_window = win.events, win.origin_us, win.n_window
    if sel.empty:
        return _layout(_empty(fig, "no events in this window"), title, 260)
    lanes_of, lanes = _lane_labels(sel, meta)
    shown_regions = _regions_in(regions, win.events, start_us, end_us)
    if shown_regions is not None:
        lanes = [COMPILE_LANE] + lanes
    lane_pos = {name: i for i, name in enumerate(lanes)}
    y_lane = lanes_of.map(lane_pos).to_numpy(dtype=float)
    cats = sel["cat"].astype(str).to_numpy()
    x0 = (sel["ts_us"].to_numpy(dtype=float) - origin) / 1e3
    x1 = x0 + np.nan_to_num(sel["dur_us"].to_numpy(dtype=float), nan=0.0) / 1e3
    # short names once per distinct name (names are categorical: few distinct, many events)
    name_codes, name_uniques = pd.factorize(sel["name"].astype(str))
    names = np.array([short_name(n, 80) for n in name_uniques], dtype=object)[name_codes]
    for c in sorted(set(cats), key=lambda c: (c not in _COLORS, list(_COLORS).index(c) if c in _COLORS else 0, c)):
        m = cats == c
        n = int(m.sum())
        y = y_lane[m] + _LANE_OFFSET.get(c, 0.0)
        xs = np.empty(3 * n)
        ys = np.empty(3 * n)
        xs[0::3], xs[1::3], xs[2::3] = x0[m], x1[m], np.nan
        ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
        hover = np.empty(3 * n, dtype=object)
        txt = [f"{nm}<br>{(b - a) * 1e3:,.1f} µs" for nm, a, b in zip(names[m], x0[m], x1[m])]
        hover[0::3] = txt
        hover[1::3] = txt
        hover[2::3] = ""
        fig.add_trace(go.Scattergl(
            x=xs, y=ys, mode="lines", name=c, line={"color": _COLORS.get(c, _OTHER_COLOR), "width": 8},
            hovertext=hover, hoverinfo="text", connectgaps=False,
        ))
    if shown_regions is not None:
        r = shown_regions
        n = len(r)
        a = (r["ts_us"].to_numpy(dtype=float) - origin) / 1e3
        b = a + r["dur_us"].to_numpy(dtype=float) / 1e3
        y = lane_pos[COMPILE_LANE] + 0.22 * np.minimum(r["depth"].to_numpy(dtype=float), 3) - 0.2
        xs, ys = np.empty(3 * n), np.empty(3 * n)
        xs[0::3], xs[1::3], xs[2::3] = a, b, np.nan
        ys[0::3], ys[1::3], ys[2::3] = y, y, np.nan
        txt = [f"{nm}<br>{d:,.1f} µs: work {w:,.1f} µs, guards {lk:,.1f} µs, own {o:,.1f} µs"
               for nm, d, w, lk, o in zip(r["name"], r["dur_us"], r["work_us"], r["lookup_us"], r["self_us"])]
        hover = np.empty(3 * n, dtype=object)
        hover[0::3], hover[1::3], hover[2::3] = txt, txt, ""
        fig.add_trace(go.Scattergl(
            x=xs, y=ys, mode="lines", name=COMPILE_TRACE_NAME, line={"color": COMPILE_COLOR, "width": 8},
            hovertext=hover, hoverinfo="text", connectgaps=False,
        ))
    if flows:
        pairs = flow_pairs(sel)
        n_pairs = len(pairs)
        pairs = pairs.head(MAX_FLOWS)
        if len(pairs):
            ylab = pd.Series(y_lane, index=sel.index)
            xa = (pairs["launch_ts_us"].to_numpy(dtype=float) - origin) / 1e3
            xb = (pairs["gpu_ts_us"].to_numpy(dtype=float) - origin) / 1e3
            ya = ylab.loc[pairs["launch_index"]].to_numpy(dtype=float)
            yb = ylab.loc[pairs["gpu_index"]].to_numpy(dtype=float)
            n = len(pairs)
            xs, ys = np.empty(3 * n), np.empty(3 * n)
            xs[0::3], xs[1::3], xs[2::3] = xa, xb, np.nan
            ys[0::3], ys[1::3], ys[2::3] = ya, yb, np.nan
            label = "launch → GPU" + (f" (first {n:,} of {n_pairs:,})" if n_pairs > n else "")
            fig.add_trace(go.Scattergl(
                x=xs, y=ys, mode="lines+markers", name=label,
                line={"color": "rgba(120,120,120,0.55)", "width": 1},
                marker={"size": np.tile([0, 5, 0], n), "color": "rgba(90,90,90,0.8)"},
                hoverinfo="skip", connectgaps=False,
            ))
    shown = len(sel)
    if not win.thinned:
        subtitle = f"all {shown:,} events"
    elif win.all_gpu:
        subtitle = (f"all {win.n_gpu:,} GPU events, {shown - win.n_gpu:,} of {n_window - win.n_gpu_window:,} "
                    "host events; zoom in for more")
    else:
        subtitle = f"{win.n_gpu:,} of {win.n_gpu_window:,} GPU events, one per stream and pixel; zoom in for more"
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(lanes))), ticktext=lanes,
                     autorange="reversed", showgrid=False, zeroline=False, title_text="")
    fig.update_xaxes(title_text="time since trace start (ms)")
    if start_us is not None or end_us is not None:
        lo = (float(start_us) - origin) / 1e3 if start_us is not None else float(np.nanmin(x0))
        hi = (float(end_us) - origin) / 1e3 if end_us is not None else float(np.nanmax(x1))
        fig.update_xaxes(range=[lo, hi])
    fig.update_layout(hovermode="closest", uirevision="timeline")
    height = int(min(900, max(340, 200 + 48 * len(lanes))))
    _layout(fig, f"{title} ({subtitle})", height)
    return legend_below(fig, height, len(fig.data), per_row=5)

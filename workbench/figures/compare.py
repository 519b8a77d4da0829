"""Comparison figures: experiment bars against a baseline, and the kernel deltas of a trace diff.

``experiment_figure(table)`` takes a ledger (or :func:`workbench.analysis.baseline_ratios` of one) and
draws one bar chart per metric (step time with its quartiles, peak memory, throughput, energy), the
baseline's bar in its own colour with a dashed line at its value, and each bar labelled with its ratio
to the baseline. ``kernel_delta_figure(diff.kernels)`` draws the largest per-kernel time changes as
diverging horizontal bars (slower in red, faster in blue). Nothing is displayed here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.figures.trace import distinct_labels, short_name

__all__ = ["EXPERIMENT_METRICS", "experiment_figure", "kernel_delta_figure", "unique_labels"]

# metric column -> (title, unit label, scale to that unit)
EXPERIMENT_METRICS: dict[str, tuple[str, str, float]] = {
    "step_ms_median": ("step time", "ms", 1.0),
    "peak_allocated_bytes": ("peak memory", "GiB", 1.0 / 2**30),
    "samples_per_s": ("throughput", "samples/s", 1.0),
    "energy_j_per_step": ("energy per step", "J", 1.0),
}
_BASE_COLOR = "#E69F00"
_BAR_COLOR = "#0072B2"
_SLOWER = "#D55E00"
_FASTER = "#0072B2"


def unique_labels(names, width: int = 60) -> list[str]:
    """Short labels (see :func:`short_name`), made unique with ``#2``, ``#3``... so that bars of
    kernels whose names differ only in template arguments do not land on one axis category."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        s = short_name(n, width)
        k = seen.get(s, 0) + 1
        seen[s] = k
        out.append(s if k == 1 else f"{s} #{k}")
    return out


def _baseline_index(table: pd.DataFrame, baseline: str | None):
    if baseline is not None:
        hit = table.index[table["configuration"].astype(str) == baseline]
        return hit[0] if len(hit) else None
    if "is_baseline" in table.columns:
        hit = table.index[table["is_baseline"].fillna(False).astype(bool)]
        if len(hit):
            return hit[0]
    hit = table.index[table["configuration"].astype(str) == "fp32"]
    return hit[0] if len(hit) else None


def experiment_figure(table: pd.DataFrame, metrics=None, baseline: str | None = None,
                      label: str = "configuration") -> go.Figure:
    """One bar subplot per metric (default: those of :data:`EXPERIMENT_METRICS` with any value),
    one bar per row. The baseline (``baseline`` by name, else the row with ``is_baseline``, else
    ``fp32``) is drawn in orange with a dashed line at its value; bars carry ``×ratio`` labels.
    Step time has error bars from the first to the third quartile when the table has them."""
    if table is None or len(table) == 0:
        fig = go.Figure()
        fig.update_layout(title="no experiment rows to compare")
        return fig
    t = table.reset_index(drop=True)
    if metrics is None:
        metrics = [m for m in EXPERIMENT_METRICS if m in t.columns and pd.to_numeric(t[m], errors="coerce").notna().any()]
    metrics = list(metrics)
    if not metrics:
        fig = go.Figure()
        fig.update_layout(title="no measured metric in these rows (did every configuration fail?)")
        return fig
    b = _baseline_index(t, baseline)
    names = t[label].astype(str).tolist() if label in t.columns else [str(i) for i in t.index]
    fig = make_subplots(
        rows=1, cols=len(metrics), horizontal_spacing=0.1,
        subplot_titles=[f"{EXPERIMENT_METRICS.get(m, (m, '', 1))[0]} ({EXPERIMENT_METRICS.get(m, (m, '', 1))[1]})"
                        for m in metrics],
    )
    for i, m in enumerate(metrics, start=1):
        title, unit, scale = EXPERIMENT_METRICS.get(m, (m, "", 1.0))
        y = pd.to_numeric(t[m], errors="coerce").astype("float64").to_numpy() * scale
        colors = [_BASE_COLOR if idx == b else _BAR_COLOR for idx in t.index]
        base_val = y[b] if b is not None else float("nan")
        text = []
        for v in y:
            if math.isnan(v) or b is None or math.isnan(base_val) or base_val == 0:
                text.append("")
            else:
                text.append(f"×{v / base_val:.2f}")
        error_y = None
        if m == "step_ms_median" and {"step_ms_q1", "step_ms_q3"} <= set(t.columns):
            q1 = pd.to_numeric(t["step_ms_q1"], errors="coerce").to_numpy(np.float64)
            q3 = pd.to_numeric(t["step_ms_q3"], errors="coerce").to_numpy(np.float64)
            error_y = dict(type="data", symmetric=False, array=np.nan_to_num(q3 - y), arrayminus=np.nan_to_num(y - q1),
                           thickness=1, width=3)
        top = y.copy()
        if error_y is not None:  # the label goes above the error bar, not across it
            top = np.fmax(y, y + error_y["array"])
        for name, v, lab in zip(names, top, text):
            if lab:
                fig.add_annotation(x=name, y=v, text=lab, showarrow=False, yanchor="bottom", yshift=2,
                                   font={"size": 11}, row=1, col=i)
        fig.add_trace(
            go.Bar(x=names, y=y, marker_color=colors, text=text, textposition="none", name=title,
                   error_y=error_y, showlegend=False, cliponaxis=False,
                   hovertemplate="%{x}<br>" + title + " %{y:,.3g} " + unit + "<br>%{text}<extra></extra>"),
            row=1, col=i,
        )
        if b is not None and not math.isnan(base_val):
            fig.add_hline(y=base_val, line_dash="dash", line_color=_BASE_COLOR, row=1, col=i)
        # the unit is in the subplot's title: a y-axis title here would sit on the neighbour's bars
        fig.update_yaxes(row=1, col=i, rangemode="tozero", automargin=True)
        if np.isfinite(top).any() and np.nanmax(top) > 0:  # headroom for the ×ratio labels
            fig.update_yaxes(row=1, col=i, range=[0, float(np.nanmax(top)) * 1.15])
    base_name = names[b] if b is not None else None
    fig.update_layout(
        title="experiment" + (f" (baseline: {base_name}, ratios ×baseline)" if base_name else ""),
        height=380, margin=dict(t=70, b=90, l=50, r=20), bargap=0.25,
    )
    fig.update_xaxes(tickangle=-30)
    return fig


def kernel_delta_figure(kernels: pd.DataFrame, top: int = 15, value: str = "delta_us",
                        title: str = "kernel time change (test − base)") -> go.Figure:
    """The ``top`` largest changes of ``value`` (a :class:`~workbench.analysis.compare.TraceDiff`
    ``kernels`` or ``ops`` table; for ops pass ``value="delta_device_us"`` or ``"delta_cpu_us"``) as
    horizontal bars in ms, largest on top: red where the test run spends more, blue where it spends
    less. Appeared/disappeared names are marked (new)/(gone)."""
    if kernels is None or kernels.empty or value not in kernels.columns:
        fig = go.Figure()
        fig.update_layout(title="no kernels in either trace" if value == "delta_us" else "nothing to compare")
        return fig
    k = kernels.assign(_abs=kernels[value].abs()).sort_values(["_abs", "name"], ascending=[False, True]).head(top)
    k = k.iloc[::-1]  # plotly draws the first category at the bottom
    ms = k[value].to_numpy(np.float64) / 1e3
    status = k["status"].astype(str).to_numpy() if "status" in k.columns else np.full(len(k), "both")
    mark = {"appeared": " (new)", "disappeared": " (gone)"}
    labels = [lab + mark.get(s, "") for lab, s in zip(distinct_labels(k["name"].tolist(), 50), status)]
    base_col = "base_total_us" if "base_total_us" in k.columns else value.replace("delta", "base")
    test_col = "test_total_us" if "test_total_us" in k.columns else value.replace("delta", "test")
    custom = np.column_stack([
        k["name"].astype(str).to_numpy(),
        (k[base_col].to_numpy(np.float64) / 1e3) if base_col in k.columns else np.full(len(k), np.nan),
        (k[test_col].to_numpy(np.float64) / 1e3) if test_col in k.columns else np.full(len(k), np.nan),
    ])
    fig = go.Figure(
        go.Bar(
            x=ms, y=labels, orientation="h",
            marker_color=[_SLOWER if v > 0 else _FASTER for v in ms],
            customdata=custom,
            hovertemplate="%{customdata[0]}<br>base %{customdata[1]:,.3f} ms → test %{customdata[2]:,.3f} ms"
                          "<br>change %{x:+,.3f} ms<extra></extra>",
        )
    )
    fig.add_vline(x=0, line_color="#444", line_width=1)
    fig.update_layout(
        title=title, xaxis_title="ms (red: slower in test, blue: faster)",
        height=max(260, 26 * len(k) + 120), margin=dict(l=10, r=20, t=50, b=50),
    )
    fig.update_yaxes(automargin=True)
    return fig

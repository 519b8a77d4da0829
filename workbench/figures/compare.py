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

from workbench.figures.trace import distinct_labels
from workbench.units import short_name

__all__ = ["EXPERIMENT_METRICS", "experiment_figure", "kernel_delta_figure", "unique_labels", "changes_html",
           "findings_change_html", "readable_delta_table", "breakdown_change_figure"]

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
    """The ``top`` largest changes of ``value`` (a :class:`~workbench.analysis.trace.diff.TraceDiff`
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


# -- what changed, as HTML (the ComparePanel and the diff report say it first) -----------------------

_FINDING_COLORS = {"critical": "#D55E00", "warning": "#E69F00", "info": "#0072B2"}


def _ms_cell(us) -> str:
    return "" if us is None or (isinstance(us, float) and math.isnan(us)) else f"{us / 1e3:,.3f}"


def changes_html(diff) -> str:
    """The headline sentence and the table of what changed (median step, then the breakdown parts,
    largest change first; GPU busy; launches), every number in the diff's unit, named in the header."""
    import html as _html

    rows = []
    for c in diff.changes:
        label = c["label"] + (" (per step)" if c["key"] == "step" and diff.normalize != "per_step" else "")
        pct = "" if c["delta_pct"] is None else f" ({c['delta_pct']:+.1f}%)"
        color = _SLOWER if c["delta_us"] > 0 else _FASTER if c["delta_us"] < 0 else "inherit"
        rows.append(f"<tr class='wb-diff-change wb-diff-change-{_html.escape(c['key'])}'><td style='padding:2px 8px'>{_html.escape(label)}</td>"
                    f"<td style='padding:2px 8px;text-align:right'>{_ms_cell(c['base_us'])}</td>"
                    f"<td style='padding:2px 8px;text-align:right'>{_ms_cell(c['test_us'])}</td>"
                    f"<td style='padding:2px 8px;text-align:right;color:{color}'>{c['delta_us'] / 1e3:+,.3f}{pct}</td></tr>")
    bg, tg = diff.gpu("base"), diff.gpu("test")
    rows.append(f"<tr><td style='padding:2px 8px'>GPU busy</td><td style='padding:2px 8px;text-align:right'>{_ms_cell(bg['busy_us'])}</td>"
                f"<td style='padding:2px 8px;text-align:right'>{_ms_cell(tg['busy_us'])}</td>"
                f"<td style='padding:2px 8px;text-align:right'>{(tg['busy_us'] - bg['busy_us']) / 1e3:+,.3f}</td></tr>")
    rows.append(f"<tr><td style='padding:2px 8px'>kernel launches (count)</td><td style='padding:2px 8px;text-align:right'>{bg['kernel_count']:,.6g}</td>"
                f"<td style='padding:2px 8px;text-align:right'>{tg['kernel_count']:,.6g}</td>"
                f"<td style='padding:2px 8px;text-align:right'>{tg['kernel_count'] - bg['kernel_count']:+,.6g}</td></tr>")
    unit = _html.escape(diff.unit)
    return (f"<div class='wb-diff-headline' style='font-size:1.05em;margin:4px 0'><b>What changed:</b> "
            f"{_html.escape(diff.headline)}</div>"
            f"<table class='wb-table wb-diff-changes' style='border-collapse:collapse;font-size:12px'>"
            f"<thead><tr><th style='padding:2px 8px;text-align:left'>time, ms ({unit})</th>"
            f"<th style='padding:2px 8px'>base</th><th style='padding:2px 8px'>test</th>"
            f"<th style='padding:2px 8px'>change (test − base)</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def findings_change_html(diff) -> str:
    """Findings resolved (base only), new (test only), changed severity and still there, one line each."""
    import html as _html

    from workbench.analysis.findings import severity_rank

    fc = diff.findings_change
    items = []

    def item(kind, fid, sev, text, message=""):
        color = _FINDING_COLORS.get(sev, "#888")
        msg = f": {_html.escape(message)}" if message else ""
        items.append(f"<div class='wb-diff-finding wb-diff-finding-{kind}' style='border-left:4px solid {color};"
                     f"padding:2px 8px;margin:2px 0'><b>{kind}</b> <code>{_html.escape(fid)}</code> "
                     f"({_html.escape(text)}){msg}</div>")

    for f in fc["resolved"]:
        item("resolved", f["id"], "info", f"{f['severity']} in base", f["message"])
    for f in fc["new"]:
        item("new", f["id"], f["severity"], f["severity"], f["message"])
    for f in fc["changed"]:
        kind = "eased" if severity_rank(f["test_severity"]) < severity_rank(f["base_severity"]) else "worse"
        item(kind, f["id"], f["test_severity"], f"{f['base_severity']} → {f['test_severity']}", f["message"])
    for f in fc["kept"]:
        item("still", f["id"], f["severity"], f["severity"])
    if not items:
        return "<div class='wb-diff-findings' style='color:var(--jp-ui-font-color2,#666)'>No findings in either trace.</div>"
    return "<div class='wb-diff-findings'><b>Findings</b> (base → test)" + "".join(items) + "</div>"


def readable_delta_table(frame: pd.DataFrame) -> pd.DataFrame:
    """A diff's ``kernels`` or ``ops`` table for reading: times in ms, headers in words with units."""
    names = {
        "name": "name", "status": "status",
        "base_count": "base calls", "test_count": "test calls", "delta_count": "calls change",
        "base_total_us": "base ms", "test_total_us": "test ms", "delta_us": "change ms", "delta_pct": "change %",
        "base_cpu_total_us": "base CPU ms", "test_cpu_total_us": "test CPU ms", "delta_cpu_us": "CPU change ms",
        "base_device_total_us": "base GPU ms", "test_device_total_us": "test GPU ms",
        "delta_device_us": "GPU change ms",
    }
    out = frame.copy()
    for c in out.columns:
        if c.endswith("_us"):
            out[c] = out[c].astype("float64") / 1e3
    out["name"] = out["name"].astype(str)
    return out.rename(columns={c: names.get(c, c.replace("_", " ")) for c in out.columns})


def breakdown_change_figure(diff) -> go.Figure:
    """Base and test as two stacked bars of the GPU time breakdown (compute, communication,
    memcpy/memset, idle) in the diff's unit."""
    from workbench.figures.trace import breakdown_figure

    rows = pd.DataFrame([{"label": "base", **diff.breakdown("base")}, {"label": "test", **diff.breakdown("test")}])
    return breakdown_figure(rows, title=f"Where the GPU time went, base vs test ({diff.unit})")

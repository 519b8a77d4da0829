"""The roofline figure: log-log achieved TFLOP/s against arithmetic intensity, one point per op group.

Takes the per-op table of :func:`workbench.analysis.trace.roofline.roofline` (``Roofline.ops``: one row per op
name with ``flops``, ``bytes``, ``intensity``, ``tflops``, ``dtype``, ``costed_us``) and the
:class:`~workbench.analysis.trace.peaks.Peak` in use; draws one roof per dtype present
(``min(peak[dtype], intensity x GB/s)``), measured ceilings dashed when given, and each op group as a
marker whose area follows its GPU time. Ops without FLOPs (copies) cannot sit on a FLOP roofline: the
figure says how much time they hold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.trace.peaks import Peak
from workbench.figures.trace import _empty, _layout
from workbench.units import format_ms, short_name

__all__ = ["roofline_figure"]

_DTYPE_COLORS = {"bf16": "#0072B2", "fp16": "#56B4E9", "tf32": "#009E73", "fp32": "#D55E00", "fp64": "#8C3A00",
                 "fp8": "#CC79A7", "int8": "#E69F00"}
_OTHER = "#777777"


def roofline_figure(ops: pd.DataFrame, peak: Peak | None, measured: Peak | None = None, top: int = 40,
                    title: str = "Roofline: achieved TFLOP/s by op") -> go.Figure:
    """Log-log roofline of the ``top`` op groups by GPU time that have FLOPs (see the module docstring)."""
    fig = go.Figure()
    rows = ops if ops is not None else pd.DataFrame()
    if rows.empty or "flops" not in rows:
        return _layout(_empty(fig, "no op with FLOPs in this trace (recorded without shapes?)"), title, 300)
    with_flops = rows[(rows["flops"] > 0) & (rows["bytes"] > 0) & rows["tflops"].notna()]
    time_col = "costed_us" if "costed_us" in rows else "total_us"
    with_flops = with_flops.sort_values(time_col, ascending=False).head(int(top))
    if with_flops.empty:
        return _layout(_empty(fig, "no op with FLOPs in this trace (recorded without shapes?)"), title, 300)
    inten = with_flops["intensity"].to_numpy(float)
    lo = max(1e-3, 10 ** np.floor(np.log10(max(inten.min(), 1e-3)) - 0.5))
    hi = 10 ** np.ceil(np.log10(max(inten.max(), 1.0)) + 0.5)
    xs = np.logspace(np.log10(lo), np.log10(hi), 200)
    dtypes = [d for d in dict.fromkeys(with_flops["dtype"].astype(str)) if d]
    if peak is not None:
        hi = max(hi, max((peak.compute(d) or 0) * 1e3 / peak.gbps for d in dtypes) * 4 if dtypes else hi)
        xs = np.logspace(np.log10(lo), np.log10(hi), 200)
        for d in dtypes:
            comp = peak.compute(d)
            if comp is None:
                continue
            fig.add_trace(go.Scatter(
                x=xs, y=np.minimum(comp, xs * peak.gbps / 1e3), mode="lines", name=f"{peak.name} {d} roof",
                line={"color": _DTYPE_COLORS.get(d, _OTHER), "width": 2},
                hovertemplate=f"{d} roof: %{{y:.1f}} TFLOP/s at %{{x:.2f}} FLOP/B<extra></extra>"))
        if measured is not None:
            for d in dtypes:
                if d in measured.tflops and np.isfinite(measured.gbps):
                    fig.add_trace(go.Scatter(
                        x=xs, y=np.minimum(measured.tflops[d], xs * measured.gbps / 1e3), mode="lines",
                        name=f"measured {d}", line={"color": _DTYPE_COLORS.get(d, _OTHER), "width": 1, "dash": "dash"},
                        hovertemplate=f"measured {d}: %{{y:.1f}} TFLOP/s<extra></extra>"))
    t = with_flops[time_col].to_numpy(float)
    size = 8 + 40 * np.sqrt(t / t.max())
    for d in dtypes or [""]:
        sel = (with_flops["dtype"].astype(str) == d).to_numpy()
        r = with_flops[sel]
        if r.empty:
            continue
        custom = np.column_stack([
            r["name"].astype(str), [format_ms(x, 2) for x in r[time_col]], r.get("kind", pd.Series([""] * len(r))).astype(str),
            r["gbps"].to_numpy(float), (100 * r["roofline_fraction"]).to_numpy(float),
        ])
        fig.add_trace(go.Scatter(
            x=r["intensity"], y=r["tflops"], mode="markers+text", name=f"ops ({d})" if d else "ops",
            text=[short_name(n, 28) for n in r["name"].astype(str)], textposition="top center",
            textfont={"size": 10}, customdata=custom,
            marker={"size": size[sel], "color": _DTYPE_COLORS.get(d, _OTHER), "opacity": 0.7,
                    "line": {"width": 1, "color": "#333"}},
            hovertemplate="%{customdata[0]} (%{customdata[2]})<br>%{y:.1f} TFLOP/s · %{customdata[3]:.0f} GB/s · "
                          "%{x:.2f} FLOP/byte<br>%{customdata[1]} GPU time · %{customdata[4]:.0f}% of the roof"
                          "<extra></extra>"))
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP / byte)")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s")
    no_flops = rows[~(rows["flops"] > 0)]
    if len(no_flops):
        fig.add_annotation(
            text=f"{len(no_flops)} op groups without FLOPs (copies, fills): {format_ms(float(no_flops[time_col].sum()), 1)} "
                 "not drawn", showarrow=False, xref="paper", yref="paper", x=0.0, y=-0.16, xanchor="left",
            font={"size": 11, "color": "#666"})
    return _layout(fig, title, 520)

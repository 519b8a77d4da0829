"""Figures of a peak-memory estimate: the step's memory over events, the peak's categories, configurations."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.figures._downsample import minmax_downsample
from workbench.figures._style import legend_below
from workbench.figures.memory import CATEGORY_COLORS

__all__ = ["estimate_timeline_figure", "estimate_category_figure", "configurations_figure"]

_GIB = 2**30
# the memory figures' category colours (Okabe-Ito), so a category looks the same everywhere
_CATEGORY_COLOURS = {**CATEGORY_COLORS, "workspace": "#56B4E9", "allocator_rounding": "#F0E442"}
_OTHER = ("#000000", "#777777", "#BBBBBB")
_PHASE_COLOURS = {"inputs": "#eeeeee", "forward": "#e3f2fd", "backward": "#fff3e0", "optimizer": "#e8f5e9"}


def estimate_timeline_figure(estimate, max_points: int = 5_000, title: str | None = None) -> go.Figure:
    """Allocated and reserved GiB after each alloc/free event of the estimated step, phases shaded."""
    tl = estimate.timeline
    fig = go.Figure()
    for col, name, dash in (("allocated_bytes", "allocated", None), ("reserved_bytes", "reserved", "dot"),
                            ("tensor_bytes", "tensor bytes", "dash")):
        x, y = minmax_downsample(tl["event"].to_numpy(), tl[col].to_numpy() / _GIB, max_points)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line={"dash": dash} if dash else None))
    if len(tl):
        # shade phases: contiguous runs of the same (step, phase)
        key = tl["phase"].astype(str) + "/" + tl["step"].astype(str)
        starts = tl.index[key.ne(key.shift())].tolist() + [len(tl)]
        for a, b in zip(starts[:-1], starts[1:]):
            ph = tl["phase"].iat[a]
            fig.add_vrect(x0=tl["event"].iat[a], x1=tl["event"].iat[b - 1], fillcolor=_PHASE_COLOURS.get(ph, "#f5f5f5"),
                          opacity=0.5, line_width=0, layer="below")
        peak = int(tl["allocated_bytes"].to_numpy().argmax())
        fig.add_annotation(x=tl["event"].iat[peak], y=tl["allocated_bytes"].iat[peak] / _GIB,
                           text=f"peak {tl['allocated_bytes'].iat[peak] / _GIB:.2f} GiB ({tl['phase'].iat[peak]})")
    m = estimate.meta
    fig.update_layout(
        title=title or f"Estimated GPU memory: {m.get('model', 'model')}, batch {m.get('batch_size')}, "
                       f"{m.get('precision')}{', checkpointing' if m.get('checkpointing') else ''}",
        xaxis_title="alloc/free event", yaxis_title="GiB", template="plotly_white", hovermode="x")
    return fig


def estimate_category_figure(estimate, title: str | None = None) -> go.Figure:
    """Bytes of each category at the allocated peak, as one stacked horizontal bar."""
    fig = go.Figure()
    total = sum(b for b in estimate.by_category.values() if b) or 1
    for i, (cat, b) in enumerate((c, b) for c, b in estimate.by_category.items() if b):
        share = b / total * 100
        fig.add_trace(go.Bar(y=["peak"], x=[b / _GIB], name=f"{cat} {share:.0f}%", orientation="h",
                             marker_color=_CATEGORY_COLOURS.get(cat, _OTHER[i % len(_OTHER)]),
                             hovertemplate=f"{cat}: %{{x:.3f}} GiB ({share:.1f}%)<extra></extra>"))
    fig.update_layout(barmode="stack", title=title or f"At the peak: {estimate.peak_allocated_bytes / _GIB:.2f} GiB "
                      f"allocated, {estimate.peak_reserved_bytes / _GIB:.2f} GiB reserved",
                      xaxis_title="GiB", template="plotly_white", legend={"traceorder": "normal"})
    fig.update_yaxes(showticklabels=False)
    # every category visible at once: a horizontal legend under the axis, never a scrolling box
    return legend_below(fig, 300, len(fig.data), top=50, per_row=4)


def configurations_figure(table, budget_bytes: int | None = None, title: str = "Which configuration fits") -> go.Figure:
    """Bars of peak allocated and reserved GiB per configuration (from ``estimate_table``/``fits_table``),
    with the budget as a line."""
    labels = [f"{p}{' + ckpt' if c else ''}, bs {b}" for p, c, b in
              zip(table["precision"], table["checkpointing"], table["batch_size"])]
    fig = go.Figure([
        go.Bar(x=labels, y=table["peak_allocated_bytes"] / _GIB, name="allocated"),
        go.Bar(x=labels, y=table["peak_reserved_bytes"] / _GIB, name="reserved"),
    ])
    if budget_bytes is not None:
        fig.add_hline(y=budget_bytes / _GIB, line_dash="dash", annotation_text=f"budget {budget_bytes / _GIB:.1f} GiB")
    fig.update_layout(barmode="group", title=title, yaxis_title="GiB", template="plotly_white")
    return fig

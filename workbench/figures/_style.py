"""Layout helpers shared by the figures: a horizontal legend that sits below the x-axis title instead
of on it, and readable numbers with units for text shown next to figures (findings' evidence).

A legend placed with a fixed paper fraction (``y=-0.15``) lands on the x-axis title whenever the plot
is short; :func:`legend_below` places it a fixed number of *pixels* under the plot area and reserves
the bottom margin for it, so tick labels, axis title and legend never overlap at any height.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

__all__ = ["legend_below", "LEGEND_GAP_PX", "format_us", "format_bytes"]

LEGEND_GAP_PX = 64  # plot bottom -> legend top: tick labels (~20 px) + axis title (~25 px) + air
_ROW_PX = 22


def legend_below(fig: go.Figure, height: int, n_items: int, *, top: int = 50, per_row: int = 4,
                 gap_px: int = LEGEND_GAP_PX) -> go.Figure:
    """Horizontal legend under the x-axis title: ``gap_px`` below the plot area, with a bottom margin
    that holds ``ceil(n_items / per_row)`` legend rows. Sets ``height`` and the top/bottom margins."""
    rows = max(1, math.ceil(max(n_items, 1) / per_row))
    bottom = gap_px + _ROW_PX * rows + 8
    plot_h = max(height - top - bottom, 60)
    fig.update_layout(
        height=height,
        margin={"t": top, "b": bottom},
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -gap_px / plot_h, "yanchor": "top"},
    )
    return fig


def format_us(us: float) -> str:
    """A duration given in microseconds, in the unit that reads best: ``812 µs``, ``12.9 ms``, ``1.25 s``."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "n/a"
    us = float(us)
    a = abs(us)
    if a >= 1e6:
        return f"{us / 1e6:,.3g} s"
    if a >= 1e3:
        return f"{us / 1e3:,.3g} ms"
    if a >= 100 or a == 0:
        return f"{us:,.0f} µs"
    return f"{us:.3g} µs"


def format_bytes(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``3.0 MiB``, ``1.25 GiB``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    n = float(n)
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= k:
            return f"{n / k:,.3g} {unit}"
    return f"{n:,.0f} B"

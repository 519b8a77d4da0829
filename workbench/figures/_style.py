"""Layout helpers shared by the figures: a horizontal legend that sits below the x-axis title instead
of on it. (Readable numbers with units are :mod:`workbench.units`.)

A legend placed with a fixed paper fraction (``y=-0.15``) lands on the x-axis title whenever the plot
is short; :func:`legend_below` places it a fixed number of *pixels* under the plot area and reserves
the bottom margin for it, so tick labels, axis title and legend never overlap at any height.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

__all__ = ["legend_below", "LEGEND_GAP_PX"]

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

"""figures: analysis frames -> plotly figures. Returns ``go.Figure``; never displays anything."""

from workbench.figures.live import live_gpu_figure

__all__: list[str] = [
    # live GPU (workbench/figures/live.py)
    "live_gpu_figure",
]

"""NVML samples -> one figure of stacked subplots: utilization, memory, power, temperature and SM clock,
and (when the session has them) the GPM counters: SM activity, occupancy, tensor-core activity, DRAM bandwidth.

One line per GPU per quantity; marks are vertical lines across all rows with their label on top.
One GPU: every quantity has its own colour. Several GPUs: a GPU keeps one colour in every row (the
legend groups its lines under "GPU n") and quantities sharing a row differ by dash.
The live panel draws this figure once and then only swaps the trace data, so
each trace carries ``meta = {"gpu": g, "column": c, "scale": k}`` (plotted y = column value * k).

>>> from workbench import samples
>>> from workbench.io.nvml import load_nvml_session
>>> fig = live_gpu_figure(load_nvml_session(samples.path("h200_nvml_session")))
>>> [t.name for t in fig.data][:2], len(fig.data)
(['gpu0 util', 'gpu0 mem-bw'], 7)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.figures._downsample import minmax_downsample

__all__ = ["live_gpu_figure", "add_marks", "LIVE_SERIES", "COUNTER_SERIES", "has_counters", "QUANTITY_COLORS", "live_series_xy", "gpu_color",
           "series_color"]

GIB = 2.0**30

# (column, row, secondary y, scale, legend suffix, dash): the order of traces for each GPU
LIVE_SERIES: tuple[tuple[str, int, bool, float, str, str], ...] = (
    ("util_gpu_pct", 1, False, 1.0, "util", "solid"),
    ("util_mem_pct", 1, False, 1.0, "mem-bw", "dot"),
    ("mem_used_bytes", 2, False, 1.0 / GIB, "mem used", "solid"),
    ("mem_total_bytes", 2, False, 1.0 / GIB, "mem total", "dash"),
    ("power_w", 3, False, 1.0, "power", "solid"),
    ("temp_c", 4, False, 1.0, "temp", "solid"),
    ("sm_clock_mhz", 4, True, 1.0, "SM clock", "dot"),
)
# the counters row (GPM, Hopper and newer): what the SMs do, not only whether a kernel ran
COUNTER_SERIES: tuple[tuple[str, int, bool, float, str, str], ...] = (
    ("gpm_sm_util_pct", 5, False, 1.0, "SM active", "solid"),
    ("gpm_sm_occupancy_pct", 5, False, 1.0, "occupancy", "dot"),
    ("gpm_tensor_util_pct", 5, False, 1.0, "tensor", "dashdot"),
    ("gpm_dram_bw_util_pct", 5, False, 1.0, "DRAM bw", "dash"),
)
_LEGEND_PX = 150  # room for "gpu0 mem total" and its line sample
_ROW_TITLES = ("utilization (%)", "memory used (GiB)", "power (W)", "temperature (C) / SM clock (MHz)")
_COUNTER_TITLE = "GPM counters (%): SM active, occupancy, tensor cores, DRAM bandwidth"


def has_counters(frame: pd.DataFrame | None) -> bool:
    """True when the session holds any GPM value (the counters row is worth drawing)."""
    return frame is not None and any(c in frame and frame[c].notna().any() for c, *_ in COUNTER_SERIES)


# one colour per quantity when a single GPU is shown (Okabe-Ito: distinguishable for colour-blind readers)
QUANTITY_COLORS = {
    "util_gpu_pct": "#0072B2",
    "util_mem_pct": "#E69F00",
    "mem_used_bytes": "#009E73",
    "mem_total_bytes": "#777777",
    "power_w": "#D55E00",
    "temp_c": "#CC79A7",
    "sm_clock_mhz": "#56B4E9",
    "gpm_sm_util_pct": "#0072B2",
    "gpm_sm_occupancy_pct": "#009E73",
    "gpm_tensor_util_pct": "#D55E00",
    "gpm_dram_bw_util_pct": "#E69F00",
}
_GPU_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999")


def gpu_color(gpu: int) -> str:
    """The colour of one GPU in every row of the figure (several GPUs shown)."""
    return _GPU_PALETTE[int(gpu) % len(_GPU_PALETTE)]


def series_color(gpu: int, column: str, n_gpus: int) -> str:
    """One GPU: each quantity its own colour. Several GPUs: each GPU its own colour, the same in every
    row, and the quantities sharing a row told apart by dash (see ``LIVE_SERIES``)."""
    if n_gpus <= 1:
        return QUANTITY_COLORS.get(column, "#444444")
    return gpu_color(gpu)


def live_series_xy(frame: pd.DataFrame, gpu: int, column: str, scale: float = 1.0,
                   max_points: int = 2_000) -> tuple[np.ndarray, np.ndarray]:
    """x (``t_s``) and scaled y of one GPU's column, downsampled to ``max_points`` keeping peaks."""
    g = frame[frame["gpu"] == gpu]
    x = g["t_s"].to_numpy(dtype=float)
    y = g[column].to_numpy(dtype=float) * scale if column in g else np.full(len(g), np.nan)
    if len(x) > max_points:
        ok = ~np.isnan(y)
        x, y = minmax_downsample(x[ok], y[ok], max_points)
    return x, y


def live_gpu_figure(frame: pd.DataFrame, *, marks=None, window_s: float | None = None, gpus=None,
                    max_points: int = 2_000, title: str | None = None, height: int | None = None,
                    counters: bool | None = None) -> go.Figure:
    """Stacked subplots of a session frame (``t_s``, ``gpu``, ``util_gpu_pct``, ``mem_used_bytes``...).

    ``counters`` adds a fifth row with the GPM counters (default: when the frame holds any GPM value).

    ``window_s`` keeps only the last seconds; ``gpus`` picks GPUs (default all in the frame);
    ``marks`` (default ``frame.attrs["marks"]``) are ``{"t_s", "label"}`` drawn as vertical lines.
    Every trace is capped at ``max_points`` points (min/max downsampling keeps the peaks).
    """
    if marks is None:
        marks = frame.attrs.get("marks", []) if frame is not None else []
    if gpus is None:
        gpus = sorted(int(g) for g in pd.unique(frame["gpu"])) if len(frame) else []
    t_end = float(frame["t_s"].max()) if len(frame) else 0.0
    if window_s is not None and len(frame):
        frame = frame[frame["t_s"] >= t_end - window_s]
    if counters is None:
        counters = has_counters(frame)
    n_rows = 5 if counters else 4
    if height is None:
        height = 800 if counters else 640
    series = LIVE_SERIES + (COUNTER_SERIES if counters else ())
    fig = make_subplots(
        rows=n_rows, cols=1, shared_xaxes=True, vertical_spacing=0.04,
        subplot_titles=_ROW_TITLES + ((_COUNTER_TITLE,) if counters else ()),
        specs=[[{}], [{}], [{}], [{"secondary_y": True}]] + ([[{}]] if counters else []),
    )
    for gpu in gpus:
        for column, row, secondary, scale, suffix, dash in series:
            x, y = live_series_xy(frame, gpu, column, scale, max_points)
            fig.add_trace(
                go.Scatter(
                    x=x, y=y, mode="lines", name=f"gpu{gpu} {suffix}", legendgroup=f"gpu{gpu}",
                    legendgrouptitle={"text": f"GPU {gpu}"} if len(gpus) > 1 else None,
                    line={"color": series_color(gpu, column, len(gpus)), "dash": dash,
                          "width": 2 if dash == "solid" else 1.5},
                    meta={"gpu": int(gpu), "column": column, "scale": scale},
                    uid=f"gpu{gpu}-{column}",
                    hovertemplate=f"gpu{gpu} {suffix}: %{{y:.4g}}<br>t=%{{x:.2f}} s<extra></extra>",
                ),
                row=row, col=1, secondary_y=secondary,
            )
    add_marks(fig, marks)
    fig.update_yaxes(range=[0, 105], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_yaxes(rangemode="tozero", row=3, col=1)
    fig.update_yaxes(title_text="MHz", secondary_y=True, row=4, col=1, showgrid=False)
    if counters:
        fig.update_yaxes(range=[0, 105], row=5, col=1)
    fig.update_xaxes(title_text="time (s)", row=n_rows, col=1)
    if window_s is not None and len(frame):
        fig.update_xaxes(range=[max(0.0, t_end - window_s), t_end])
    fig.update_layout(
        # the legend sits at the figure's right edge (container coordinates) in a margin reserved for
        # it, beside the SM-clock axis instead of on top of its tick labels
        height=height, margin={"l": 60, "r": 60 + _LEGEND_PX, "t": 60 if title else 30, "b": 50},
        title=title, hovermode="x unified",
        legend={"groupclick": "togglegroup", "xref": "container", "x": 1.0, "xanchor": "right",
                "yref": "paper", "y": 1.0, "yanchor": "top", "font": {"size": 11}},
        uirevision="live",  # keeps zoom/legend state across redraws with new data (Plotly.react)
    )
    return fig


def add_marks(fig: go.Figure, marks) -> None:
    """Draw marks (``{"t_s", "label"}``) as vertical lines across every row, label on top."""
    for m in marks or []:
        t, label = (m["t_s"], m["label"]) if isinstance(m, dict) else (m[0], m[1])
        fig.add_shape(type="line", x0=t, x1=t, xref="x", y0=0, y1=1, yref="paper",
                      line={"color": "rgba(80,80,80,0.6)", "dash": "dot", "width": 1}, name=f"mark:{label}")
        fig.add_annotation(x=t, xref="x", y=1.0, yref="paper", yanchor="bottom", text=str(label),
                           showarrow=False, font={"size": 10}, name=f"mark:{label}")

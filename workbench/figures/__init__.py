"""figures: analysis frames -> plotly figures. Returns ``go.Figure``; never displays anything."""

from workbench.figures.compare import experiment_figure, kernel_delta_figure
from workbench.figures.estimate import configurations_figure, estimate_category_figure, estimate_timeline_figure
from workbench.figures.nvml import live_gpu_figure
from workbench.figures.memory import (
    allocator_state_figure,
    memory_timeline_figure,
    oom_figure,
    segment_map_figure,
    top_allocations_figure,
)
from workbench.figures.roofline import roofline_figure
from workbench.figures.text import evidence_html, evidence_items
from workbench.figures.trace import (
    breakdown_figure,
    idle_gap_figure,
    kernel_summary_figure,
    op_summary_figure,
    step_figure,
    timeline_figure,
)

__all__: list[str] = [
    # before/after (workbench/figures/compare.py)
    "experiment_figure",
    "kernel_delta_figure",
    # peak-memory estimate (workbench/figures/estimate.py)
    "estimate_timeline_figure",
    "estimate_category_figure",
    "configurations_figure",
    # live GPU (workbench/figures/nvml.py)
    "live_gpu_figure",
    # allocator snapshots (workbench/figures/memory.py)
    "memory_timeline_figure",
    "segment_map_figure",
    "top_allocations_figure",
    "allocator_state_figure",
    "oom_figure",
    # Kineto traces (workbench/figures/trace.py)
    "kernel_summary_figure",
    "op_summary_figure",
    "breakdown_figure",
    "step_figure",
    "timeline_figure",
    "idle_gap_figure",
    # roofline (workbench/figures/roofline.py)
    "roofline_figure",
    # findings' evidence as text with units (workbench/figures/text.py)
    "evidence_html",
    "evidence_items",
]

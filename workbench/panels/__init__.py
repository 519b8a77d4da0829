"""panels: ipywidgets compositions (controls + figure widget + an Output for errors), one per tool."""

from workbench.panels._base import figure_widget
from workbench.panels.compare import ComparePanel
from workbench.panels.estimate import EstimatePanel
from workbench.panels.live import LiveGpuPanel
from workbench.panels.memory import MemoryPanel
from workbench.panels.profiler import ProfilerPanel

__all__: list[str] = [
    # before/after: experiments and trace diff (workbench/panels/compare.py)
    "ComparePanel",
    # peak-memory estimate (workbench/panels/estimate.py)
    "EstimatePanel",
    # live GPU (workbench/panels/live.py)
    "LiveGpuPanel",
    # allocator snapshots and OOM post-mortems (workbench/panels/memory.py)
    "MemoryPanel",
    # one Kineto trace (workbench/panels/profiler.py)
    "ProfilerPanel",
    # the widget panels draw plotly figures with (workbench/panels/_plot.py)
    "figure_widget",
]

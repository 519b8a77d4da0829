"""panels: ipywidgets compositions (controls + figure widget + an Output for errors), one per tool."""

from workbench.panels.live import LiveGpuPanel
from workbench.panels.profiler import ProfilerPanel

__all__: list[str] = [
    # live GPU (workbench/panels/live.py)
    "LiveGpuPanel",
    # one Kineto trace (workbench/panels/profiler.py)
    "ProfilerPanel",
]

"""panels: ipywidgets compositions (controls + PlotWidget figures + an Output for errors), one per tool.

Each panel is built one way: ``Panel(source)`` for a file, a loaded object or a capture result
(``_base.classify`` asks the artifact registry, ``io/kinds.py``,
what it was given). ``Panel.from_step(step_fn, steps, ...)`` means one thing
only: run this step function and record it (ProfilerPanel, MemoryPanel, LiveGpuPanel, TimelinePanel);
other ways in are named for what they take (``ComparePanel.from_experiment``,
``EstimatePanel.from_factories``). The names
load on first use, so ``from workbench.panels import ProfilerPanel`` imports only that panel.
"""

from __future__ import annotations

import importlib

_NAMES = {
    # one Kineto trace (workbench/panels/profiler.py)
    "ProfilerPanel": "workbench.panels.profiler",
    # allocator snapshots and OOM post-mortems (workbench/panels/memory.py)
    "MemoryPanel": "workbench.panels.memory",
    # live GPU (workbench/panels/nvml.py)
    "LiveGpuPanel": "workbench.panels.nvml",
    # peak-memory estimate (workbench/panels/estimate.py)
    "EstimatePanel": "workbench.panels.estimate",
    # before/after: experiments and trace diff (workbench/panels/compare.py)
    "ComparePanel": "workbench.panels.compare",
    # the cross-rank view of a distributed run (workbench/panels/ranks.py)
    "RanksPanel": "workbench.panels.ranks",
    # one run on one clock: trace + allocator + NVML/GPM (workbench/panels/timeline.py)
    "TimelinePanel": "workbench.panels.timeline",
    # the widget panels draw plotly figures with (workbench/panels/_plot.py)
    "PlotWidget": "workbench.panels._plot",
}

__all__: list[str] = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench.panels' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES))

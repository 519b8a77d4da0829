"""gpu-workbench: profile and optimize PyTorch on NVIDIA GPUs, inside the notebook.

The front door: the names a researcher types, importable from ``workbench`` itself::

    from workbench import load_trace, ProfilerPanel, samples
    ProfilerPanel(samples.path("h200_train_step"))        # a shipped H200 trace
    ProfilerPanel(profile_steps(step, steps=3))           # your own step, profiled live

The rule for what is on the door: a name is here if the README or the tour (``notebooks/src/00_tour.py``)
types it (``tests/test_front_door.py`` checks both ways); everything else is imported from the module
that defines it. The built-in configurations are behind one name, ``configs`` (``configs.amp_bf16()``).

Importing ``workbench`` is cheap: it loads no torch, pynvml, pandas, plotly or ipywidgets. Each name
loads its module on first use (``_FRONT_DOOR`` maps it to the module that defines it), and the layers
stay reachable as attributes (``workbench.analysis``, ``workbench.io``, ...; see docs/architecture.md)::

    capture  -> io -> analysis -> figures -> panels / report -> cli

    >>> import workbench
    >>> workbench.__version__ >= "0.1"
    True
    >>> "ProfilerPanel" in workbench.__all__
    True
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# name -> the module that defines it. Nothing is imported until a name is asked for.
_FRONT_DOOR: dict[str, str] = {
    # load recorded artifacts (no torch needed)
    "load_trace": "workbench.io.trace",
    "load_traces": "workbench.io.trace",
    "load_snapshot": "workbench.io.snapshot",
    "load_nvml_session": "workbench.io.nvml",
    # the analysis every front reads (CLI, JSON, panels, reports)
    "TraceAnalysis": "workbench.analysis.trace.analysis",
    "MemoryAnalysis": "workbench.analysis.memory.oom",
    # capture live (torch / NVML are imported inside the functions)
    "profile_steps": "workbench.capture.profiler",
    "profile": "workbench.capture.profiler",
    "record_memory_history": "workbench.capture.memory",
    "capture_oom": "workbench.capture.memory",
    # experiments: a workload, configurations to try (the built-ins behind `configs`), one call to run them
    "run_experiment": "workbench.capture.runner",
    "Workload": "workbench.capture.configurations",
    "Configuration": "workbench.capture.configurations",
    "configs": "workbench.capture.configurations",
    # peak memory before running (fake tensors on the CPU)
    "estimate": "workbench.capture.estimate",
    "largest_batch_that_fits": "workbench.capture.estimate",
    # the panels
    "ProfilerPanel": "workbench.panels.profiler",
    "MemoryPanel": "workbench.panels.memory",
    "LiveGpuPanel": "workbench.panels.nvml",
    "EstimatePanel": "workbench.panels.estimate",
    "ComparePanel": "workbench.panels.compare",
    "RanksPanel": "workbench.panels.ranks",
    "TimelinePanel": "workbench.panels.timeline",
    # many ranks without widgets; one run's trace, allocator history and NVML/GPM samples on one clock
    "load_ranks": "workbench.analysis.trace.ranks",
    "record_run": "workbench.capture.session",
    # long runs: a flight recorder that keeps the steps that went wrong
    "watch": "workbench.capture.watch",
    "align": "workbench.analysis.timeline",
    # helpers
    "format_bytes": "workbench.units",
}

def load_ipython_extension(ipython) -> None:
    """``%load_ext workbench``: the ``%%workbench`` cell magic and ``%workbench monitor`` (workbench/magic.py,
    imported only now)."""
    from workbench.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from workbench.magic import unload_ipython_extension as unload

    unload(ipython)


# the layers and other subpackages, loaded on first attribute access
_SUBPACKAGES = ("capture", "io", "analysis", "figures", "panels", "report", "samples", "errors")

__all__ = ["__version__", *_FRONT_DOOR, "samples"]


def _resolve(name: str):
    return getattr(importlib.import_module(_FRONT_DOOR[name]), name)


def __getattr__(name: str):
    # Lazy: `import workbench` must stay fast and must not pull torch, pandas or ipywidgets.
    if name in _FRONT_DOOR:
        value = _resolve(name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_FRONT_DOOR) | set(_SUBPACKAGES))


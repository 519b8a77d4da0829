"""analysis: pandas only. Frames in, frames and typed records out.

Nothing here knows whether the data came from a live GPU or from ``workbench.samples``.
"""

from workbench.analysis.trace.diff import TraceDiff, baseline_ratios, check_verdicts, diff_summary, trace_diff
from workbench.analysis.memory.estimate import Estimate, estimate_from_record, estimate_table, fits_table
from workbench.analysis.memory.segments import AllocatorState, allocator_state, allocator_state_timeline, segment_layout
from workbench.analysis.experiment import (
    ConfigResult,
    Experiment,
    Headroom,
    NumericalCheck,
    numerical_check,
    precision_name,
    search_largest,
)
from workbench.analysis.memory.allocations import (
    allocation_categories,
    allocations,
    category_timeline,
    live_allocations,
    memory_timeline,
    peak_memory,
    surviving_allocations,
)
from workbench.analysis.memory.oom import MemoryAnalysis, OomReport, analyze_snapshot, memory_summary, oom_postmortem
from workbench.analysis.nvml import AlertThresholds, gpu_alerts, gpu_summary
from workbench.analysis.trace.tables import (
    GpuBusy,
    LaunchStats,
    gpu_busy,
    idle_gaps,
    kernel_launches,
    kernel_summary,
    launch_stats,
    memcpy_summary,
    op_summary,
    step_summary,
    step_window,
    temporal_breakdown,
)
from workbench.analysis.trace.diagnosis import Diagnosis, WhatIf, diagnose
from workbench.analysis.trace.step_model import StepGraph, build_graph
from workbench.analysis.findings import Finding
from workbench.analysis.trace.kernel_names import gemm_precision
from workbench.analysis.trace.analysis import findings
from workbench.analysis.trace.analysis import TraceAnalysis, trace_summary

__all__: list[str] = [
    # Kineto traces (workbench/analysis/trace/: tables.py, findings.py, analysis.py, kernel_names.py)
    "TraceAnalysis",
    "kernel_summary",
    "op_summary",
    "memcpy_summary",
    "gpu_busy",
    "GpuBusy",
    "temporal_breakdown",
    "step_summary",
    "step_window",
    "idle_gaps",
    "kernel_launches",
    "launch_stats",
    "LaunchStats",
    "findings",
    "diagnose",
    "Diagnosis",
    "WhatIf",
    "build_graph",
    "StepGraph",
    "Finding",
    "gemm_precision",
    "trace_summary",
    # before/after: experiment ledgers and trace diff (workbench/analysis/trace/diff.py)
    "baseline_ratios",
    "check_verdicts",
    "trace_diff",
    "TraceDiff",
    "diff_summary",
    # experiments: results, verdicts, batch-size search (workbench/analysis/experiment.py)
    "Experiment",
    "ConfigResult",
    "NumericalCheck",
    "numerical_check",
    "Headroom",
    "search_largest",
    "precision_name",
    # peak-memory estimate (workbench/analysis/memory/: estimate.py, allocator_model.py)
    "Estimate",
    "estimate_from_record",
    "estimate_table",
    "fits_table",
    # allocator snapshots and OOM post-mortems (workbench/analysis/memory/: allocations.py, oom.py)
    "analyze_snapshot",
    "MemoryAnalysis",
    "memory_summary",
    "oom_postmortem",
    "OomReport",
    "allocations",
    "allocation_categories",
    "memory_timeline",
    "category_timeline",
    "peak_memory",
    "live_allocations",
    "surviving_allocations",
    "allocator_state",
    "allocator_state_timeline",
    "AllocatorState",
    "segment_layout",
    # NVML samples (workbench/analysis/nvml.py)
    "gpu_alerts",
    "gpu_summary",
    "AlertThresholds",
]

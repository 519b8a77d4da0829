"""analysis: pandas only. Frames in, frames and typed records out.

Nothing here knows whether the data came from a live GPU or from ``workbench.samples``.
"""

from workbench.analysis.nvml import AlertThresholds, gpu_alerts, gpu_summary

__all__: list[str] = [
    # NVML samples (workbench/analysis/nvml.py)
    "gpu_alerts",
    "gpu_summary",
    "AlertThresholds",
]

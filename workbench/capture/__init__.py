"""capture: the ONLY layer that imports torch or pynvml or touches a device.

Profiler sessions, allocator history and the OOM hook, the NVML sampler. Every function here opens
the device lazily, on first use, never at import.
"""

from workbench.capture.profiler import (  # torch is imported inside the functions
    ProfileResult,
    ProfileSession,
    StepCost,
    profile,
    profile_steps,
)
from workbench.capture.nvml import NvmlSampler, ReplaySampler, Sampler, nvml_query  # pynvml opens on start()

__all__: list[str] = [
    # profiler (workbench/capture/profiler.py)
    "profile_steps",
    "profile",
    "ProfileSession",
    "ProfileResult",
    "StepCost",
    # NVML sampler (workbench/capture/nvml.py)
    "Sampler",
    "NvmlSampler",
    "ReplaySampler",
    "nvml_query",
]

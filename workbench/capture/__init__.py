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
from workbench.capture.memory import OomCapture, capture_oom, record_memory_history  # torch inside the functions
from workbench.capture.nvml import NvmlSampler, nvml_query  # pynvml opens on start()
from workbench.capture.sampler import ReplaySampler, Sampler
from workbench.capture.configurations import (  # torch is imported inside the functions
    Configuration,
    Workload,
    amp_bf16,
    amp_fp16,
    batch_size_sweep,
    channels_last,
    checkpointing,
    combine,
    compiled,
    configuration,
    fp32,
    pure_bf16,
    pure_fp16,
    tf32,
)
from workbench.capture.runner import find_max_batch_size, run_experiment

__all__: list[str] = [
    # profiler (workbench/capture/profiler.py)
    "profile_steps",
    "profile",
    "ProfileSession",
    "ProfileResult",
    "StepCost",
    # allocator history and the OOM hook (workbench/capture/memory.py)
    "record_memory_history",
    "capture_oom",
    "OomCapture",
    # NVML sampler (workbench/capture/nvml.py; the replay and the ring: workbench/capture/sampler.py)
    "Sampler",
    "NvmlSampler",
    "ReplaySampler",
    "nvml_query",
    # experiment harness (workbench/capture/configurations.py, runner.py; what it returns, Experiment and
    # Headroom, is workbench/analysis/experiment.py's, exported by workbench.analysis)
    "Workload",
    "Configuration",
    "configuration",
    "combine",
    "fp32",
    "tf32",
    "amp_bf16",
    "amp_fp16",
    "pure_fp16",
    "pure_bf16",
    "checkpointing",
    "compiled",
    "channels_last",
    "batch_size_sweep",
    "run_experiment",
    "find_max_batch_size",
]

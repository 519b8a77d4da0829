"""io: load and save artifacts (Kineto traces, allocator snapshots, NVML sessions) as columns and dicts.

No torch, no pynvml: a snapshot copied off a cluster loads on a laptop.
"""

from workbench.io.ledger import LEDGER_COLUMNS, ledger_frame, load_ledger, save_ledger
from workbench.io.nvml import NVML_COLUMNS, load_nvml_session, save_nvml_session
from workbench.io.nvml_foreign import load_gpu_samples
from workbench.io.profiler_memory import load_memory_timeline, load_profiler_memory
from workbench.io.snapshot import MemorySnapshot, load_snapshot, save_snapshot
from workbench.io.trace import Trace, load_trace, load_traces

__all__: list[str] = [
    # Kineto traces (workbench/io/trace.py)
    "Trace",
    "load_trace",
    "load_traces",
    # results ledger of the experiment harness (workbench/io/ledger.py)
    "load_ledger",
    "save_ledger",
    "ledger_frame",
    "LEDGER_COLUMNS",
    # allocator snapshots, safely (workbench/io/snapshot.py)
    "load_snapshot",
    "save_snapshot",
    "MemorySnapshot",
    # torch.profiler's memory timeline and [memory] events (workbench/io/profiler_memory.py)
    "load_memory_timeline",
    "load_profiler_memory",
    # NVML sessions (workbench/io/nvml.py)
    "load_nvml_session",
    "save_nvml_session",
    "NVML_COLUMNS",
    # GPU samples from other tools: nvidia-smi CSV, DCGM scrapes, metrics tables (workbench/io/nvml_foreign.py)
    "load_gpu_samples",
]

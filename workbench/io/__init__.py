"""io: load and save artifacts (Kineto traces, allocator snapshots, NVML sessions) as columns and dicts.

No torch, no pynvml: a snapshot copied off a cluster loads on a laptop.
"""

from workbench.io.nvml import NVML_COLUMNS, load_nvml_session, save_nvml_session

__all__: list[str] = [
    # NVML sessions (workbench/io/nvml.py)
    "load_nvml_session",
    "save_nvml_session",
    "NVML_COLUMNS",
]

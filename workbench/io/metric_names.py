"""The names other tools give the GPU metrics of an NVML session, mapped to the session's columns
(``io/nvml.py::NVML_COLUMNS``): ``nvidia-smi --query-gpu`` fields, DCGM exporter field names and the
column spellings of hand-made CSV/JSON-lines logs. Standard library only: the registry's sniffers
(``io/kinds.py``) and the loaders (``io/nvml_foreign.py``) share it.

>>> metric_column("utilization.gpu [%]")
('util_gpu_pct', 1.0)
>>> metric_column("memory.used [MiB]")
('mem_used_bytes', 1048576.0)
>>> time_column(["timestamp", "utilization.gpu [%]"])
'timestamp'
"""

from __future__ import annotations

import re

__all__ = ["normalize", "unit_of", "metric_column", "time_column", "gpu_column", "DCGM_FIELDS", "SMI_FIELDS",
           "UNIT_SCALE", "MEMORY_COLUMNS", "THROTTLE_NAMES"]

# a unit in a header, "[MiB]" or "(W)", -> the factor to the session column's unit
UNIT_SCALE: dict[str, float] = {
    "%": 1.0, "w": 1.0, "mw": 1e-3, "kw": 1e3, "mhz": 1.0, "ghz": 1e3, "c": 1.0, "j": 1.0, "mj": 1e-3,
    "b": 1.0, "bytes": 1.0, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "kb": 1e3, "mb": 2.0**20, "gb": 2.0**30,
    "b/s": 1.0, "mib/s": 2.0**20, "mb/s": 2.0**20, "kb/s": 2.0**10,
}
# nvidia-smi writes MiB; "MB" in a home-made log means the same almost always (gpustat, nvtop): read as MiB

# the session's memory columns: a log that gives no unit holds MiB when its values are small (see nvml_foreign)
MEMORY_COLUMNS = ("mem_used_bytes", "mem_total_bytes")

# spelling (normalised: lower case, units dropped, separators as "_") -> (session column, scale)
_ALIASES: dict[str, tuple[str, float]] = {}


def _alias(column: str, scale: float, *names: str) -> None:
    for n in names:
        _ALIASES[n] = (column, scale)


_alias("util_gpu_pct", 1.0, "util_gpu_pct", "util_gpu", "utilization_gpu", "gpu_util", "gpu_util_pct",
       "gpu_utilization", "gpu_utilization_pct", "utilization", "gpu_usage")
_alias("util_mem_pct", 1.0, "util_mem_pct", "util_mem", "utilization_memory", "mem_util", "memory_util",
       "memory_utilization", "mem_util_pct")
_alias("mem_used_bytes", 1.0, "mem_used_bytes", "memory_used_bytes", "fb_used_bytes")
_alias("mem_used_bytes", 2.0**20, "mem_used_mib", "memory_used_mib", "mem_used_mb", "memory_used_mb", "fb_used_mib")
_alias("mem_used_bytes", 2.0**30, "mem_used_gib", "memory_used_gib", "mem_used_gb", "memory_used_gb")
_alias("mem_used_bytes", 0.0, "memory_used", "mem_used", "memory", "gpu_memory_used", "fb_used", "vram_used")
_alias("mem_total_bytes", 1.0, "mem_total_bytes", "memory_total_bytes")
_alias("mem_total_bytes", 2.0**20, "mem_total_mib", "memory_total_mib", "mem_total_mb", "memory_total_mb")
_alias("mem_total_bytes", 2.0**30, "mem_total_gib", "memory_total_gib", "mem_total_gb", "memory_total_gb")
_alias("mem_total_bytes", 0.0, "memory_total", "mem_total", "gpu_memory_total", "fb_total")
_alias("power_w", 1.0, "power_w", "power", "power_draw", "power_draw_instant", "power_draw_average", "power_usage",
       "power_watts", "gpu_power", "power_draw_w")
_alias("power_w", 1e-3, "power_mw")
_alias("temp_c", 1.0, "temp_c", "temp", "temperature", "temperature_gpu", "gpu_temp", "gpu_temperature")
_alias("sm_clock_mhz", 1.0, "sm_clock_mhz", "sm_clock", "clocks_sm", "clocks_current_sm", "sm_mhz", "graphics_clock",
       "clocks_gr", "clocks_current_graphics")
_alias("mem_clock_mhz", 1.0, "mem_clock_mhz", "mem_clock", "clocks_mem", "clocks_current_memory", "mem_mhz",
       "memory_clock")
_alias("energy_j", 1.0, "energy_j")
_alias("energy_j", 1e-3, "energy_mj", "total_energy_consumption")
_alias("throttle_reasons", 1.0, "throttle_reasons", "clocks_throttle_reasons_active", "clocks_event_reasons_active")
for _c in ("gpm_sm_util_pct", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_hmma_util_pct",
           "gpm_dram_bw_util_pct", "gpm_fp32_util_pct", "gpm_fp16_util_pct", "gpm_fp64_util_pct",
           "gpm_pcie_tx_bytes_per_s", "gpm_pcie_rx_bytes_per_s", "gpm_nvlink_rx_bytes_per_s",
           "gpm_nvlink_tx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
    _alias(_c, 1.0, _c)

# the mask columns (hex or decimal NVML clocks-event bits), decoded by io/nvml.decode_throttle_reasons
THROTTLE_NAMES = ("throttle_reasons",)

# nvidia-smi --query-gpu fields the registry recognises a log by (any one, with its dots)
SMI_FIELDS = frozenset({
    "utilization.gpu", "utilization.memory", "memory.used", "memory.total", "memory.free", "power.draw",
    "power.draw.instant", "power.draw.average", "temperature.gpu", "clocks.sm", "clocks.current.sm", "clocks.mem",
    "clocks.current.memory", "clocks.gr", "clocks_throttle_reasons.active", "clocks_event_reasons.active",
    "pstate", "fan.speed",
})

# DCGM exporter field -> (session column, scale). DCGM_FI_PROF_* are ratios (0..1) -> %.
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util_gpu_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("util_mem_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used_bytes", 2.0**20),
    "DCGM_FI_DEV_FB_TOTAL": ("mem_total_bytes", 2.0**20),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_POWER_USAGE_INSTANT": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp_c", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock_mhz", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_j", 1e-3),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_PROF_SM_ACTIVE": ("gpm_sm_util_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("gpm_sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gpm_tensor_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": ("gpm_hmma_util_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gpm_dram_bw_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("gpm_fp32_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("gpm_fp16_util_pct", 100.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("gpm_fp64_util_pct", 100.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpm_pcie_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpm_pcie_rx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("gpm_nvlink_tx_bytes_per_s", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("gpm_nvlink_rx_bytes_per_s", 1.0),
}

# time columns, best first: seconds since the start, then absolute times
_TIME_NAMES = ("t_s", "t", "time_s", "elapsed_s", "seconds", "time", "timestamp", "ts", "datetime", "date_time",
               "time_ns", "timestamp_ns", "time_ms", "timestamp_ms", "time_us", "timestamp_us", "unix_time")
_GPU_NAMES = ("gpu", "index", "gpu_index", "gpu_id", "device", "device_index", "device_id", "local_rank", "rank",
              "uuid", "gpu_uuid", "pci_bus_id", "bus_id")

_UNIT = re.compile(r"\s*[\[(]([^\])]*)[\])]\s*$")


def unit_of(header: str) -> str | None:
    """The unit written in a header, lower case ("utilization.gpu [%]" -> "%"), or None."""
    m = _UNIT.search(str(header))
    return m.group(1).strip().lower() if m else None


def normalize(header: str) -> str:
    """A header as the alias tables spell it: the unit dropped, lower case, separators as "_"."""
    base = _UNIT.sub("", str(header)).strip().lower()
    return re.sub(r"[\s.\-/:]+", "_", base).strip("_")


def metric_column(header: str) -> tuple[str, float] | None:
    """``(session column, scale)`` for a header naming a known metric (its unit, when written, sets the
    scale; 0.0: no unit known, the loader decides), else None."""
    found = _ALIASES.get(normalize(header))
    if found is None:
        return None
    column, scale = found
    unit = unit_of(header)
    if unit is not None and unit in UNIT_SCALE and column != "throttle_reasons":
        if column in MEMORY_COLUMNS and unit == "%":
            return None  # a memory share in %, not a size
        scale = UNIT_SCALE[unit]
    return column, scale


def time_column(headers) -> str | None:
    """The header of the time column (the first of the known names present), else None."""
    by_name = {normalize(h): h for h in headers}
    return next((by_name[n] for n in _TIME_NAMES if n in by_name), None)


def gpu_column(headers) -> str | None:
    """The header naming the GPU of each row (an index, a UUID, a bus id), else None."""
    by_name = {normalize(h): h for h in headers}
    return next((by_name[n] for n in _GPU_NAMES if n in by_name), None)

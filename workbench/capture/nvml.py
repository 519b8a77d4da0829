"""Live GPU samples from NVML in a background thread: the NVML reads and :class:`NvmlSampler`.

The generic part (the :class:`Sampler` interface, the ring, the thread plumbing, and
:class:`ReplaySampler`, a recorded session with the same interface) is
:mod:`workbench.capture.sampler`.

Design notes (why, not what):

- NVML is opened on the first :meth:`NvmlSampler.start` (or :meth:`NvmlSampler.devices`), never at
  import, and kept open for the life of the process: ``nvmlInit`` is reference counted and cheap to
  keep, and a panel that is closed and reopened should not pay for it again.
- Every metric goes through :func:`nvml_query`, so a metric a GPU does not support (fan speed, NVLink
  state on an H200 in a VM) is a missing value, never an exception, and is not asked again.
- PCIe throughput (~21 ms a call on an H200) and total energy (~4 ms) block; they run in a second
  thread on a slower cadence and each row carries the last value seen. The fast metrics (memory,
  utilization, power, temperature, clocks, clocks-event reasons) answer in microseconds.
- What a 100 Hz sampler costs is mostly waking up and the first read after it (measured on the H200:
  ~35 us to wake, 50-80 us for the first read, a few us for each further one; `benchmarks/nvml_tick_cost.py`).
  So a tick reads only what can have changed: memory used, the SM clock and the clocks-event reasons on
  every tick; power and utilization as often as the driver refreshes them (it keeps timestamped samples:
  every 20 ms and every 200 ms on the H200); temperature and the memory clock 10 times a second. A row
  holds the latest value of each; :meth:`NvmlSampler.cadence` lists the intervals and ``cadence_s=``
  changes them. Reads are direct ctypes calls with their arguments built once (``_direct_reads``).
- The ring, the thread lifetimes and the replay are :mod:`workbench.capture.sampler`'s (its notes).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from workbench.capture.sampler import _COL, _NCOLS, _SLOW0, DEFAULT_INTERVAL_S, _ThreadedSampler
from workbench.errors import BadArgument, NoNVML, WorkbenchError

__all__ = [
    # the sampler (the interface, the ring and ReplaySampler: workbench.capture.sampler)
    "NvmlSampler",
    # building blocks
    "nvml_query",
    "open_nvml",
    "gpu_processes",
    "FAST_METRICS",
    "METRIC_REFRESH_S",
    # GPM (Hopper+ SM counters) and who else reads them
    "GPM_METRICS",
    "GPM_REFRESH_S",
    "GPM_MIN_PAIR_S",
    "gpm_support",
    "dcgm_processes",
]

_NO_NVML_FIX = (
    "run on a machine with an NVIDIA GPU and its driver (libnvidia-ml.so.1), or replay a recorded "
    "session: ReplaySampler(path) in Python, `workbench monitor --replay FILE` on the command line"
)


# --------------------------------------------------------------------------------------------------
# NVML

_nvml_lock = threading.Lock()
_nvml_module: Any = None


def open_nvml():
    """Import pynvml and initialise NVML once per process; returns the module.

    Raises :class:`~workbench.errors.NoNVML` with NVML's own reason (e.g. "NVML Shared Library Not
    Found" when libnvidia-ml.so.1 is absent) and the fix.
    """
    global _nvml_module
    with _nvml_lock:
        if _nvml_module is not None:
            return _nvml_module
        try:
            import pynvml
        except ImportError as exc:
            raise NoNVML(f"NVML not available: the nvidia-ml-py package is not installed ({exc}); "
                         "install it with: pip install nvidia-ml-py") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoNVML(f"NVML not available: {exc} ({type(exc).__name__}); {_NO_NVML_FIX}") from exc
        _nvml_module = pynvml
        return pynvml


def _nvml_error_kind(exc: BaseException) -> str | None:
    """'unsupported' for errors that will not go away (NotSupported, FunctionNotFound), 'error' for
    other NVML errors, None for anything that is not an NVML error."""
    pynvml = __import__("sys").modules.get("pynvml")
    if pynvml is None or not isinstance(exc, pynvml.NVMLError):
        return None
    if isinstance(exc, (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)):
        return "unsupported"
    return "error"


def nvml_query(fn: Callable, *args, default=math.nan, on_error: Callable[[str, BaseException], None] | None = None):
    """``fn(*args)``, or ``default`` when NVML answers with an error for this metric.

    A metric the GPU does not support, an old driver without the function, a GPU that stops
    answering: each becomes ``default`` (NaN) rather than an exception. ``on_error(kind, exc)`` is
    told about it (kind ``"unsupported"`` or ``"error"``). Errors that are not NVML's propagate.

    >>> nvml_query(lambda: 42)
    42
    """
    try:
        return fn(*args)
    except Exception as exc:
        kind = _nvml_error_kind(exc)
        if kind is None:
            raise
        if on_error is not None:
            on_error(kind, exc)
        return default


# The metrics of a sampler row, read in the sampling thread (PCIe and energy have their own slow thread).
FAST_METRICS: tuple[str, ...] = ("memory", "utilization", "power", "temperature", "sm_clock", "mem_clock", "throttle")

# Seconds between reads of a metric when the driver does not say how often it refreshes it (power and
# utilization: the driver keeps timestamped samples, see _driver_refresh_periods). 0 = every tick.
# Temperature moves in whole degrees over seconds, the memory clock only with the performance state:
# 10 reads a second see every change that matters. Memory used, the SM clock and the clocks-event
# reasons can change between any two ticks and are read on every one. Override with cadence_s=.
METRIC_REFRESH_S: dict[str, float] = {"temperature": 0.1, "mem_clock": 0.1}

_NVML_SUCCESS = 0
_TIME_NS = _COL["time_ns"]


class _Read:
    """One NVML read of one GPU: ``call(*args)`` returns NVML's return code (0 = success) having filled
    ctypes objects, and ``outs`` says which field of which object goes to which ring column, scaled."""

    __slots__ = ("name", "call", "args", "outs", "every", "gpu", "kind", "error")

    def __init__(self, name, call, args, outs, kind):
        self.name, self.call, self.args, self.outs, self.kind = name, call, args, outs, kind
        self.every, self.gpu, self.error = 1, -1, None


def _direct_reads(nv, h) -> list[_Read] | None:
    """The fast metrics of device handle ``h`` as direct calls into the NVML library pynvml loaded, with
    every argument built once. At 100 Hz the Python around each pynvml call (a new ctypes object, a
    return-code check, the GIL released and taken back) cost more than the read itself.

    The library is opened as ``ctypes.PyDLL``: a call keeps the GIL. These reads answer in microseconds,
    and giving the GIL up around each would make the sampler queue behind a busy notebook cell once per
    read instead of once per tick. (PCIe and energy block for milliseconds and stay on pynvml, which
    releases the GIL, in the slow thread.) None when the library cannot be opened this way."""
    try:
        lib = ctypes.PyDLL(nv.nvmlLib._name)
    except Exception:  # an unusual pynvml or loader: the pynvml reads do the same work, slower
        return None
    c = _COL
    reads = []

    def add(name, symbol, args, outs):
        try:
            fn = getattr(lib, symbol)
        except AttributeError:
            return False
        fn.restype = ctypes.c_int
        reads.append(_Read(name, fn, (h, *args), outs, "direct"))
        return True

    mem, util = nv.c_nvmlMemory_t(), nv.c_nvmlUtilization_t()
    power, sm, mclk, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
    ok = add("memory", "nvmlDeviceGetMemoryInfo", (ctypes.byref(mem),),
             ((c["mem_used_bytes"], mem, "used", 1), (c["mem_total_bytes"], mem, "total", 1)))
    ok &= add("utilization", "nvmlDeviceGetUtilizationRates", (ctypes.byref(util),),
              ((c["util_gpu_pct"], util, "gpu", 1), (c["util_mem_pct"], util, "memory", 1)))
    ok &= add("power", "nvmlDeviceGetPowerUsage", (ctypes.byref(power),), ((c["power_w"], power, "value", 0.001),))
    # temperature: the versioned call where the driver answers it (the old one goes away in CUDA 14)
    temp_v = getattr(nv, "c_nvmlTemperature_v1_t", None)
    done = False
    if temp_v is not None and hasattr(lib, "nvmlDeviceGetTemperatureV"):
        tv = temp_v()
        tv.version = nv.nvmlTemperature_v1
        tv.sensorType = nv.NVML_TEMPERATURE_GPU
        fn = lib.nvmlDeviceGetTemperatureV
        fn.restype = ctypes.c_int
        if fn(h, ctypes.byref(tv)) == _NVML_SUCCESS:
            reads.append(_Read("temperature", fn, (h, ctypes.byref(tv)), ((c["temp_c"], tv, "temperature", 1),),
                               "direct"))
            done = True
    if not done:
        temp = ctypes.c_uint()
        ok &= add("temperature", "nvmlDeviceGetTemperature", (ctypes.c_uint(nv.NVML_TEMPERATURE_GPU), ctypes.byref(temp)),
                  ((c["temp_c"], temp, "value", 1),))
    ok &= add("sm_clock", "nvmlDeviceGetClockInfo", (ctypes.c_uint(nv.NVML_CLOCK_SM), ctypes.byref(sm)),
              ((c["sm_clock_mhz"], sm, "value", 1),))
    ok &= add("mem_clock", "nvmlDeviceGetClockInfo", (ctypes.c_uint(nv.NVML_CLOCK_MEM), ctypes.byref(mclk)),
              ((c["mem_clock_mhz"], mclk, "value", 1),))
    ok &= (add("throttle", "nvmlDeviceGetCurrentClocksEventReasons", (ctypes.byref(reasons),),
               ((c["throttle_mask"], reasons, "value", 1),))
           or add("throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", (ctypes.byref(reasons),),
                  ((c["throttle_mask"], reasons, "value", 1),)))
    return reads if ok else None


class _Value:
    """Where a pynvml read leaves its answer for the row."""

    __slots__ = ("value", "used", "total", "gpu", "memory")


def _pynvml_reads(nv, h) -> list[_Read]:
    """The same reads through pynvml's functions: the fallback when the library cannot be called directly."""
    c = _COL
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    temp_fn = getattr(nv, "nvmlDeviceGetTemperatureV", None)
    if temp_fn is None or nvml_query(temp_fn, h, nv.NVML_TEMPERATURE_GPU, default=None) is None:
        temp_fn = nv.nvmlDeviceGetTemperature
    specs = [
        ("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h), ("used", "total"),
         ((c["mem_used_bytes"], "used", 1), (c["mem_total_bytes"], "total", 1))),
        ("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h), ("gpu", "memory"),
         ((c["util_gpu_pct"], "gpu", 1), (c["util_mem_pct"], "memory", 1))),
        ("power", lambda: nv.nvmlDeviceGetPowerUsage(h), (), ((c["power_w"], "value", 0.001),)),  # mW
        ("temperature", lambda: temp_fn(h, nv.NVML_TEMPERATURE_GPU), (), ((c["temp_c"], "value", 1),)),
        ("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), (), ((c["sm_clock_mhz"], "value", 1),)),
        ("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM), (), ((c["mem_clock_mhz"], "value", 1),)),
        ("throttle", lambda: reasons_fn(h), (), ((c["throttle_mask"], "value", 1),)),
    ]
    reads = []
    for name, fn, fields, outs in specs:
        box = _Value()
        read = _Read(name, None, (), tuple((col, box, attr, scale) for col, attr, scale in outs), "pynvml")

        def call(fn=fn, fields=fields, box=box, read=read):
            try:
                v = fn()
            except nv.NVMLError as exc:
                read.error = exc
                return exc.value or -1
            if fields:
                for f in fields:
                    setattr(box, f, getattr(v, f))
            else:
                box.value = v
            return _NVML_SUCCESS

        read.call = call
        reads.append(read)
    return reads


def _driver_refresh_periods(nv, h) -> dict[str, float]:
    """How often the driver refreshes power and utilization, from the timestamps of the samples it keeps
    (nvmlDeviceGetSamples): on the H200, every 20 ms and every 200 ms. Reading them faster returns the same
    value again. Metrics the driver keeps no samples for are absent."""
    out = {}
    for name, kind in (("power", getattr(nv, "NVML_TOTAL_POWER_SAMPLES", 0)),
                       ("utilization", getattr(nv, "NVML_GPU_UTILIZATION_SAMPLES", 1))):
        got = nvml_query(nv.nvmlDeviceGetSamples, h, kind, 0, default=None)
        if not got:
            continue
        stamps = np.unique(np.array([x.timeStamp for x in got[1]], dtype=np.float64))
        if len(stamps) >= 4:
            gap_s = float(np.median(np.diff(stamps))) / 1e6  # microseconds
            if 0 < gap_s <= 1.0:
                out[name] = gap_s
    return out


# --------------------------------------------------------------------------------------------------
# GPM: Hopper's SM counters (nvmlGpmSampleGet / nvmlGpmMetricsGet)

# session column -> (pynvml metric id name, scale to the column's unit). NVML answers % and MiB/s.
GPM_METRICS: dict[str, tuple[str, float]] = {
    "gpm_sm_util_pct": ("NVML_GPM_METRIC_SM_UTIL", 1.0),
    "gpm_sm_occupancy_pct": ("NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
    "gpm_tensor_util_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 1.0),
    "gpm_hmma_util_pct": ("NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 1.0),
    "gpm_dram_bw_util_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
    "gpm_fp32_util_pct": ("NVML_GPM_METRIC_FP32_UTIL", 1.0),
    "gpm_fp16_util_pct": ("NVML_GPM_METRIC_FP16_UTIL", 1.0),
    "gpm_fp64_util_pct": ("NVML_GPM_METRIC_FP64_UTIL", 1.0),
    "gpm_pcie_tx_bytes_per_s": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(1 << 20)),
    "gpm_pcie_rx_bytes_per_s": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(1 << 20)),
    "gpm_nvlink_rx_bytes_per_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", float(1 << 20)),
    "gpm_nvlink_tx_bytes_per_s": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", float(1 << 20)),
}
# The driver refreshes the counters about every 100 ms; a pair of samples closer than ~50 ms reads 0
# (both measured on the H200). A GPM read takes ~200 us for the sample and ~100 us for the metrics.
GPM_REFRESH_S = 0.1
GPM_MIN_PAIR_S = 0.05

# Processes that read the same profiling counters: while one profiles a GPU, GPM here and there share
# (and perturb) them.
_DCGM_NAMES = ("nv-hostengine", "dcgm-exporter", "dcgmproftester")


def gpm_support(nv, handle) -> str | None:
    """None when GPM can be read on this device; else why not, as one line ("not supported on <GPU> ...")."""
    name = _text(nvml_query(nv.nvmlDeviceGetName, handle, default=None)) or "this GPU"
    query = getattr(nv, "nvmlGpmQueryDeviceSupport", None)
    if query is None or not hasattr(nv, "c_nvmlGpmMetricsGet_t"):
        return (f"GPM counters not supported by this nvidia-ml-py (no nvmlGpmQueryDeviceSupport); "
                "pip install -U nvidia-ml-py")
    try:
        ok = bool(query(handle).isSupportedDevice)
    except nv.NVMLError as exc:
        return f"GPM counters not supported on {name} ({exc}; they need a Hopper or newer GPU and driver >= 520)"
    if not ok:
        return f"GPM counters not supported on {name} (they need a Hopper or newer GPU)"
    return None


def dcgm_processes(nv=None, handles=()) -> list[str]:
    """DCGM's host engine or exporter running on this machine, as "name (pid N)": from /proc (Linux) and
    from NVML's process list of ``handles`` when NVML is open. Empty when none is seen (a container may
    not see the host's processes)."""
    seen: dict[int, str] = {}
    proc = Path("/proc")
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()] if proc.is_dir() else []
    except OSError:
        entries = []
    for p in entries:
        try:
            comm = (p / "comm").read_text().strip()
        except OSError:
            continue
        if any(comm.startswith(n[:15]) for n in _DCGM_NAMES):
            seen[int(p.name)] = comm
    if nv is not None:
        for h in handles:
            for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(nv, fn_name, None)
                procs = nvml_query(fn, h, default=None) if fn is not None else None
                for pr in procs or ():
                    pid = int(getattr(pr, "pid", -1))
                    pname = _text(nvml_query(nv.nvmlSystemGetProcessName, pid, default=None)) or ""
                    base = pname.rsplit("/", 1)[-1]
                    if any(base.startswith(n) for n in _DCGM_NAMES):
                        seen[pid] = base
    return [f"{name} (pid {pid})" for pid, name in sorted(seen.items())]


class _Gpm:
    """One GPU's GPM state: two sample buffers (the previous and the next), the metrics request built
    once, and when the previous sample was taken."""

    __slots__ = ("handle", "prev", "cur", "request", "cols", "scales", "t_prev", "errors")

    def __init__(self, nv, handle, t_now: float):
        ids, self.cols, self.scales = [], [], []
        for col, (id_name, scale) in GPM_METRICS.items():
            if hasattr(nv, id_name):
                ids.append(getattr(nv, id_name))
                self.cols.append(_COL[col])
                self.scales.append(scale)
        self.handle = handle
        self.prev = nv.nvmlGpmSampleAlloc()
        self.cur = nv.nvmlGpmSampleAlloc()
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        for i, mid in enumerate(ids):
            req.metrics[i].metricId = mid
        self.request = req
        self.errors = 0
        nv.nvmlGpmSampleGet(handle, self.prev)
        self.t_prev = t_now

    def read(self, nv, row: list, t_now: float) -> None:
        """Take the next sample, fill ``row``'s GPM columns from the pair (previous, next), keep the next."""
        try:
            nv.nvmlGpmSampleGet(self.handle, self.cur)
            req = self.request
            req.sample1, req.sample2 = self.prev, self.cur
            nv.nvmlGpmMetricsGet(req)
        except nv.NVMLError:
            self.errors += 1
            for col in self.cols:
                row[col] = math.nan
            return
        for i, (col, scale) in enumerate(zip(self.cols, self.scales)):
            m = req.metrics[i]
            row[col] = m.value * scale if m.nvmlReturn == _NVML_SUCCESS else math.nan
        self.prev, self.cur = self.cur, self.prev
        self.t_prev = t_now

    def free(self, nv) -> None:
        for sample in (self.prev, self.cur):
            nvml_query(nv.nvmlGpmSampleFree, sample, default=None)
        self.prev = self.cur = None


class NvmlSampler(_ThreadedSampler):
    """Sample every GPU (or ``gpus``) through NVML every ``interval_s`` seconds (default 10 Hz, down to
    0.01 s = 100 Hz) in a background thread; PCIe throughput and energy every ``slow_interval_s``
    (default 1 s; ``None`` turns them off).

    ``history_s`` (default 15 min) sizes the ring; ``max_rows`` overrides it. NVML opens on
    :meth:`start`; without it :class:`~workbench.errors.NoNVML` says why and what to do.

    ``gpm=True`` (default) also reads the GPM counters (SM activity and occupancy, tensor-core, DRAM
    bandwidth, FP pipes, PCIe and NVLink rates; the ``gpm_*`` columns) on GPUs that have them (Hopper
    and newer), every ``gpm_interval_s`` (default 0.1 s, the counters' refresh; at least 0.05 s, since a
    closer pair reads 0). Elsewhere those columns are NaN and :attr:`notes` says "not supported on <GPU>".
    :attr:`notes` also says when DCGM's host engine or exporter runs (it reads the same counters).
    Every row carries ``time_ns`` (Unix epoch) beside ``t_s``.

    >>> s = NvmlSampler(interval_s=0.05)       # nothing opened yet  # doctest: +SKIP
    >>> with s: train_one_epoch(); s.mark("epoch 1")                 # doctest: +SKIP
    >>> s.frame().groupby("gpu").util_gpu_pct.mean()                 # doctest: +SKIP
    """

    thread_name = "workbench-nvml-sampler"

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, gpus=None, slow_interval_s: float | None = 1.0,
                 history_s: float = 900.0, max_rows: int | None = None, cadence_s: dict[str, float] | None = None,
                 gpm: bool = True, gpm_interval_s: float = GPM_REFRESH_S):
        super().__init__(interval_s, history_s, max_rows)
        if not gpm_interval_s >= GPM_MIN_PAIR_S:
            raise BadArgument(f"gpm_interval_s={gpm_interval_s}: at least {GPM_MIN_PAIR_S} s (the GPM counters "
                              f"refresh every ~{GPM_REFRESH_S} s; a closer pair of samples reads 0)")
        self.gpm = bool(gpm)
        self.gpm_interval_s = float(gpm_interval_s)
        self._gpm: list[_Gpm | None] = []
        self.gpm_unsupported: dict[int, str] = {}   # gpu -> why GPM cannot be read there
        self.notes: list[str] = []                  # lines for a status bar / stderr (GPM support, DCGM)
        self._t0_ns = 0
        self.gpus_requested = None if gpus is None else [int(g) for g in gpus]
        self.slow_interval_s = slow_interval_s
        unknown = set(cadence_s or ()) - set(FAST_METRICS)
        if unknown:
            raise BadArgument(f"cadence_s: no metric {sorted(unknown)}; choose among {list(FAST_METRICS)}")
        self.cadence_s = {k: float(v) for k, v in (cadence_s or {}).items()}
        self._driver_refresh: dict[str, float] = {}
        self._rows: list[list[float]] = []
        self._tick_no = 0
        self.gpus: list[int] = []
        self.unsupported: dict[tuple[int, str], str] = {}   # (gpu, metric) -> NVML's reason
        self.errors: dict[tuple[int, str], int] = {}        # (gpu, metric) -> transient error count
        self._handles: list = []
        self._readers: list[list[_Read]] = []
        self._slow: list | None = None                       # per gpu: [pcie tx, rx, energy]
        self._slow_thread: threading.Thread | None = None
        self._t0 = None
        self._pynvml = None

    # device discovery -----------------------------------------------------------------------------
    def devices(self) -> pd.DataFrame:
        """The GPUs NVML sees: index, name, uuid, memory total (opens NVML)."""
        nv = open_nvml()
        rows = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            name = nvml_query(nv.nvmlDeviceGetName, h, default=None)
            uuid = nvml_query(nv.nvmlDeviceGetUUID, h, default=None)
            mem = nvml_query(nv.nvmlDeviceGetMemoryInfo, h, default=None)
            rows.append({"gpu": i, "name": _text(name), "uuid": _text(uuid),
                         "mem_total_bytes": getattr(mem, "total", math.nan)})
        return pd.DataFrame(rows, columns=["gpu", "name", "uuid", "mem_total_bytes"])

    def _open(self) -> int:
        nv = open_nvml()
        self._pynvml = nv
        if not self._handles:
            count = nv.nvmlDeviceGetCount()
            gpus = list(range(count)) if self.gpus_requested is None else self.gpus_requested
            bad = [g for g in gpus if not 0 <= g < count]
            if bad:
                raise BadArgument(f"no GPU {bad} (NVML sees {count}: 0..{count - 1}); pass gpus= among those")
            self.gpus = gpus
            self._handles = [nv.nvmlDeviceGetHandleByIndex(g) for g in gpus]
            self._driver_refresh = _driver_refresh_periods(nv, self._handles[0]) if self._handles else {}
            self._readers = [self._build_readers(g, h) for g, h in zip(gpus, self._handles)]
            self._rows = [[math.nan] * _NCOLS for _ in gpus]
            for row, g in zip(self._rows, gpus):
                row[1] = g
            self._slow = [[math.nan] * 3 for _ in gpus]
            self.source = f"NVML, {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
        if self._t0 is None:
            self._t0_ns = time.time_ns()
            self._t0 = time.perf_counter()
            self.t0_unix = self._t0_ns / 1e9
        if self.gpm and not self._gpm:
            self._open_gpm(nv)
        else:  # a restart: the first pair starts now, not when the sampler stopped
            t = self._now()
            for g in self._gpm:
                if g is not None:
                    nvml_query(nv.nvmlGpmSampleGet, g.handle, g.prev, default=None)
                    g.t_prev = t
        return len(self._handles)

    def _open_gpm(self, nv) -> None:
        self._gpm = []
        t = self._now()
        for g, h in zip(self.gpus, self._handles):
            why = gpm_support(nv, h)
            state = None
            if why is None:
                try:
                    state = _Gpm(nv, h, t)
                except nv.NVMLError as exc:
                    why = f"GPM counters could not be read on GPU {g} ({exc})"
            if why is not None:
                self.gpm_unsupported[g] = why
            self._gpm.append(state)
        notes = []
        for why in dict.fromkeys(self.gpm_unsupported.values()):  # one line per distinct reason
            gpus = [g for g, w in self.gpm_unsupported.items() if w == why]
            notes.append(why if len(self.gpus) == 1 else f"{why} (GPU {', '.join(map(str, gpus))})")
        dcgm = dcgm_processes(nv, self._handles)
        if dcgm:
            notes.append(f"DCGM is running ({', '.join(dcgm)}): it reads the same profiling counters, so GPM "
                         "values here and DCGM's profiling metrics can perturb each other (or read 0)")
        self.notes = notes

    @property
    def gpm_supported(self) -> bool:
        """True when at least one sampled GPU has GPM counters (known after :meth:`start`)."""
        return any(g is not None for g in self._gpm)

    has_gpm = gpm_supported

    def _build_readers(self, gpu: int, h) -> list[_Read]:
        """The reads of one GPU's row, each with how many ticks apart it runs (see :data:`METRIC_REFRESH_S`)."""
        reads = _direct_reads(self._pynvml, h) or _pynvml_reads(self._pynvml, h)
        for r in reads:
            refresh = self.cadence_s.get(r.name, self._driver_refresh.get(r.name, METRIC_REFRESH_S.get(r.name, 0.0)))
            r.every = max(1, int(round(refresh / self.interval_s))) if self.interval_s > 0 else 1
            r.gpu = gpu
        return reads

    def _error_callback(self, gpu: int, metric: str):
        def note(kind, exc):
            if kind == "unsupported":  # the caller stops asking
                self.unsupported[(gpu, metric)] = str(exc)
            else:
                self.errors[(gpu, metric)] = self.errors.get((gpu, metric), 0) + 1
        return note

    def _read(self, gpu: int, metric: str, fn: Callable):
        """One metric through :func:`nvml_query`; None when the GPU cannot answer it."""
        if (gpu, metric) in self.unsupported:
            return None
        return nvml_query(fn, default=None, on_error=self._error_callback(gpu, metric))

    def _now(self) -> float:
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    def _tick(self) -> bool:
        # The hot loop (every GPU, up to 100 times a second). Each GPU keeps one row list that holds the
        # latest value of every metric, so a metric read every k-th tick carries its value in between;
        # each read is a ctypes call into libnvidia-ml with its arguments built once (see _direct_reads).
        n = self._tick_no
        self._tick_no = n + 1
        t = self._now()
        slow = self._slow
        rows = self._rows
        gpm = self._gpm
        gpm_due = self.gpm_interval_s - 0.5 * self.interval_s  # the tick nearest the refresh interval
        if gpm_due < GPM_MIN_PAIR_S:
            gpm_due = GPM_MIN_PAIR_S
        t_ns = self._t0_ns + t * 1e9
        for k in range(len(rows)):
            row = rows[k]
            row[0] = t
            row[_TIME_NS] = t_ns
            if gpm:
                g = gpm[k]
                if g is not None and t - g.t_prev >= gpm_due:
                    g.read(self._pynvml, row, t)
            for r in self._readers[k]:
                if n % r.every:
                    continue
                rc = r.call(*r.args)
                if rc:
                    self._read_failed(k, r, rc)
                    for col, _obj, _attr, _scale in r.outs:
                        row[col] = math.nan
                    continue
                for col, obj, attr, scale in r.outs:
                    row[col] = getattr(obj, attr) * scale
            if slow is not None:
                row[_SLOW0:] = slow[k]
        self.ring.append_rows(rows)
        return True

    def _read_failed(self, k: int, r: "_Read", rc: int) -> None:
        nv = self._pynvml
        exc = r.error if r.error is not None else nv.NVMLError(rc)
        r.error = None
        kind = _nvml_error_kind(exc) or "error"
        self._error_callback(r.gpu, r.name)(kind, exc)
        if kind == "unsupported":  # asked once; left out from now on
            self._readers[k] = [x for x in self._readers[k] if x is not r]

    def cadence(self) -> pd.DataFrame:
        """How often each metric is actually read: one row per GPU and metric, with the seconds between
        reads and why (the driver refreshes utilization and power on its own clock; reading faster only
        repeats its value). Metrics the GPU does not support are absent."""
        rows = []
        for gpu, reads in zip(self.gpus, self._readers):
            for r in reads:
                rows.append({"gpu": gpu, "metric": r.name, "every_s": r.every * self.interval_s,
                             "driver_refresh_s": self._driver_refresh.get(r.name, math.nan),
                             "reader": r.kind})
        for gpu, g in zip(self.gpus, self._gpm):
            if g is not None:
                every = max(1, int(math.ceil((max(GPM_MIN_PAIR_S, self.gpm_interval_s - 0.5 * self.interval_s))
                                             / self.interval_s - 1e-9))) * self.interval_s if self.interval_s else 0
                rows.append({"gpu": gpu, "metric": "gpm", "every_s": every, "driver_refresh_s": GPM_REFRESH_S,
                             "reader": "pynvml"})
        return pd.DataFrame(rows, columns=["gpu", "metric", "every_s", "driver_refresh_s", "reader"])

    # slow cadence ---------------------------------------------------------------------------------
    def _on_start(self) -> None:
        if self.slow_interval_s:
            self._slow_thread = threading.Thread(target=self._run_slow, name="workbench-nvml-slow", daemon=True)
            self._slow_thread.start()

    def _on_stop(self) -> None:
        t = self._slow_thread
        if t is not None and t is not threading.current_thread():
            t.join(5.0)

    def _run_slow(self) -> None:
        nv = self._pynvml
        while not self._stop_event.is_set():
            for k, (gpu, h) in enumerate(zip(self.gpus, self._handles)):
                if self._stop_event.is_set():
                    return
                tx = self._read(gpu, "pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
                rx = self._read(gpu, "pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
                energy = self._read(gpu, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
                self._slow[k] = [   # replaced whole, so the sampling thread never sees half an update
                    math.nan if tx is None else tx * 1024.0,      # NVML answers KB/s
                    math.nan if rx is None else rx * 1024.0,
                    math.nan if energy is None else energy / 1000.0,  # mJ -> J
                ]
            if self._stop_event.wait(self.slow_interval_s):
                return


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _process_name(pid: int) -> str:
    """The command name of ``pid`` (``/proc/<pid>/comm``; NVML's name when /proc hides it)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        if argv:
            return " ".join([os.path.basename(argv[0]), *argv[1:]])[:200]
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def gpu_processes(gpus=None) -> list[dict]:
    """The processes NVML lists on each GPU (compute and graphics), as nvidia-smi and nvitop show them:
    ``{gpu, pid, kind ('compute'/'graphics'), used_bytes (NaN when the driver hides it), name}``, sorted
    by GPU then memory (largest first). Opens NVML (:class:`~workbench.errors.NoNVML` without it); a
    GPU whose listing fails is left out. A process in another PID namespace (a container) shows its
    host PID and ``?`` as its name."""
    nv = open_nvml()
    out = []
    indices = range(nv.nvmlDeviceGetCount()) if gpus is None else [int(g) for g in gpus]
    for i in indices:
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError:
            continue
        for kind, fn_name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                              ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            fn = getattr(nv, fn_name, None)
            if fn is None:
                continue
            try:
                procs = fn(h)
            except nv.NVMLError:
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                out.append({"gpu": i, "pid": int(p.pid), "kind": kind,
                            "used_bytes": math.nan if used is None else float(used),
                            "name": _process_name(int(p.pid))})
    out.sort(key=lambda r: (r["gpu"], -(0.0 if math.isnan(r["used_bytes"]) else r["used_bytes"]), r["pid"]))
    return out

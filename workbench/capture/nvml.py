"""Live GPU samples from NVML in a background thread, and a replay of a recorded session with the same interface.

>>> from workbench import samples
>>> with ReplaySampler(samples.path("h200_nvml_session"), speed=1000) as s:
...     s.wait(timeout=10)
True
>>> len(s.frame()), s.running
(427, False)

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
- Samples go to a fixed-size numpy ring (:class:`SampleRing`): memory stays bounded whatever the
  duration, and a reader (the live panel) asks only for the rows it has not seen (``rows_since``).
- Threads are daemons named ``workbench-...`` and always end: :meth:`stop`, the context manager
  (including on ``KeyboardInterrupt`` in the cell), and an ``atexit`` hook that stops every live
  sampler. A daemon thread never holds the interpreter open at exit.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from workbench.errors import BadArgument, NoNVML
from workbench.io.nvml import (
    NVML_COLUMNS,
    decode_throttle_reasons,
    encode_throttle_reasons,
    load_nvml_session,
    save_nvml_session,
)

__all__ = [
    # interface
    "Sampler",
    # samplers
    "NvmlSampler",
    "ReplaySampler",
    # building blocks
    "SampleRing",
    "rows_to_frame",
    "nvml_query",
    "open_nvml",
    "RING_COLUMNS",
    "DEFAULT_INTERVAL_S",
    "MIN_INTERVAL_S",
    "FAST_METRICS",
    "METRIC_REFRESH_S",
]

DEFAULT_INTERVAL_S = 0.1   # 10 Hz
MIN_INTERVAL_S = 0.01      # 100 Hz: the fastest cadence a sampler accepts (0 = as fast as possible, benchmarks only)

# The ring stores every column as float64 (throttle reasons as their NVML bit mask); .frame() turns
# the mask back into names. float64 holds byte counts exactly up to 8 PiB.
RING_COLUMNS: tuple[str, ...] = tuple("throttle_mask" if c == "throttle_reasons" else c for c in NVML_COLUMNS)
_COL = {c: i for i, c in enumerate(RING_COLUMNS)}
_NCOLS = len(RING_COLUMNS)
_SLOW0 = _COL["pcie_tx_bytes_per_s"]  # the slow-cadence columns are the last three
assert RING_COLUMNS[_SLOW0:] == ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "energy_j")

_NO_NVML_FIX = (
    "run on a machine with an NVIDIA GPU and its driver (libnvidia-ml.so.1), or replay a recorded "
    "session: ReplaySampler(path) in Python, `workbench monitor --replay FILE` on the command line"
)


# Longest single sleep while waiting for the next tick: bounds how long stop() waits for the thread.
# 0.1 s: at the default 10 Hz a tick is one sleep, one wake-up (every wake-up takes the GIL from the
# notebook's cell, however little the thread then does).
_PAUSE_SLICE_S = 0.1


def _pause(stop_event: threading.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds unless ``stop_event`` is set first; True when stopped.

    time.sleep in slices, not Event.wait(delay): a timed Event.wait goes through a lock with a timeout
    and cost about twice the CPU per wake-up here (90 vs 45 us on a loaded 2-core VM), which is most of
    the sampler's own cost at 100 Hz.
    """
    while delay > 0:
        if stop_event.is_set():
            return True
        step = min(delay, _PAUSE_SLICE_S)
        time.sleep(step)
        delay -= step
    return stop_event.is_set()


# --------------------------------------------------------------------------------------------------
# the interface


@runtime_checkable
class Sampler(Protocol):
    """What the live panel, the CLI and user code rely on; :class:`NvmlSampler` and
    :class:`ReplaySampler` both provide it."""

    interval_s: float
    source: str            # a line for a status bar: "NVML, 8 GPUs" / "replaying <file>"

    def start(self) -> "Sampler": ...
    def stop(self) -> None: ...
    @property
    def running(self) -> bool: ...
    def frame(self) -> pd.DataFrame: ...
    def rows_since(self, cursor: int) -> tuple[np.ndarray, int]: ...
    def mark(self, label: str) -> float: ...
    def marks(self) -> list[dict]: ...
    def save(self, path) -> Path: ...
    def __enter__(self) -> "Sampler": ...
    def __exit__(self, *exc) -> None: ...


# --------------------------------------------------------------------------------------------------
# bounded storage


class SampleRing:
    """A fixed-capacity ring of float64 rows of :data:`RING_COLUMNS`, safe for one writer and many readers.

    ``count`` is the number of rows ever appended; a reader keeps it as a cursor and asks
    :meth:`rows_since` for what is new (rows that fell out of the ring are simply gone).

    >>> r = SampleRing(capacity=3)
    >>> for i in range(5): r.append([float(i)] + [0.0] * (len(RING_COLUMNS) - 1))
    >>> r.all()[:, 0].tolist(), r.count
    ([2.0, 3.0, 4.0], 5)
    >>> rows, cursor = r.rows_since(3); rows[:, 0].tolist(), cursor
    ([3.0, 4.0], 5)
    """

    def __init__(self, capacity: int, ncols: int = _NCOLS):
        if capacity < 1:
            raise BadArgument("capacity must be >= 1")
        self.capacity = int(capacity)
        self._buf = np.full((self.capacity, ncols), np.nan)
        self._lock = threading.Lock()
        self.count = 0

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    def append(self, row) -> None:
        with self._lock:
            self._buf[self.count % self.capacity] = row
            self.count += 1

    def append_rows(self, rows: list[list[float]]) -> None:
        """Append a few rows given as lists (the NVML sampler's tick: one row per GPU), copying them."""
        with self._lock:
            for row in rows:
                self._buf[self.count % self.capacity] = row
                self.count += 1

    def extend(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=float)
        if len(rows) > self.capacity:
            skipped = len(rows) - self.capacity
            rows = rows[-self.capacity:]
        else:
            skipped = 0
        with self._lock:
            self.count += skipped
            start = self.count % self.capacity
            first = min(len(rows), self.capacity - start)
            self._buf[start:start + first] = rows[:first]
            self._buf[: len(rows) - first] = rows[first:]
            self.count += len(rows)

    def _last(self, k: int) -> np.ndarray:
        # the last k rows in order; caller holds the lock
        end = self.count % self.capacity
        if k <= end:
            return self._buf[end - k:end].copy()
        return np.concatenate([self._buf[self.capacity - (k - end):], self._buf[:end]])

    def rows_since(self, cursor: int) -> tuple[np.ndarray, int]:
        """Rows appended after ``cursor`` (at most the ring's capacity), and the new cursor."""
        with self._lock:
            k = min(self.count - max(0, int(cursor)), self.capacity, self.count)
            return self._last(max(k, 0)), self.count

    def all(self) -> np.ndarray:
        with self._lock:
            return self._last(min(self.count, self.capacity))

    def clear(self) -> None:
        with self._lock:
            self.count = 0
            self._buf[:] = np.nan


def rows_to_frame(rows: np.ndarray) -> pd.DataFrame:
    """Ring rows -> a session frame with :data:`~workbench.io.nvml.NVML_COLUMNS`."""
    frame = pd.DataFrame(rows, columns=list(RING_COLUMNS))
    frame["gpu"] = frame["gpu"].astype(np.int64)
    masks = frame.pop("throttle_mask")
    codes, uniques = pd.factorize(masks, use_na_sentinel=True)  # a few distinct masks in many rows
    names = np.array([decode_throttle_reasons(m) for m in uniques] + [None], dtype=object)
    reasons = names[codes]  # code -1 (no mask) picks the trailing None
    frame.insert(NVML_COLUMNS.index("throttle_reasons"), "throttle_reasons", reasons)
    return frame


# --------------------------------------------------------------------------------------------------
# thread plumbing shared by both samplers

_LIVE: "weakref.WeakSet[_ThreadedSampler]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for sampler in list(_LIVE):
        try:
            sampler.stop(timeout=1.0)
        except Exception:  # interpreter is going away; never raise from atexit
            pass


class _ThreadedSampler:
    """Start/stop, context manager, marks, ring and frame; subclasses provide ``_open`` and ``_tick``."""

    thread_name = "workbench-sampler"

    def __init__(self, interval_s: float, history_s: float, max_rows: int | None):
        interval_s = float(interval_s)
        if interval_s != 0 and not (MIN_INTERVAL_S <= interval_s <= 3600):
            raise BadArgument(f"interval_s={interval_s}: choose between {MIN_INTERVAL_S} (100 Hz) and 3600 s")
        self.interval_s = interval_s
        self.history_s = float(history_s)
        self._max_rows = max_rows
        self.ring: SampleRing | None = None
        self._marks: list[dict] = []
        self._marks_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._lifecycle = threading.Lock()
        self.error: BaseException | None = None   # what ended the thread, if it did not end by stop()
        self.samples = 0       # ticks completed
        self.overruns = 0      # ticks that took longer than the interval
        self.cpu_s = 0.0       # CPU time the sampling thread itself used (time.thread_time)
        self.wall_s = 0.0      # time the sampling thread was alive
        self.source = ""
        self._run_wall0 = None

    # -- subclass hooks
    def _open(self) -> int:  # -> number of rows per tick (GPUs), for sizing the ring
        raise NotImplementedError

    def _tick(self) -> bool:  # -> False when there is nothing more to sample
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    def _on_start(self) -> None:
        pass

    def _on_stop(self) -> None:
        pass

    # -- lifecycle
    def start(self):
        """Start sampling in a background thread (no-op when already running). Returns ``self``."""
        with self._lifecycle:
            if self._thread is not None and self._thread.is_alive():
                return self
            rows_per_tick = self._open()
            if self.ring is None:
                cap = self._max_rows or int(math.ceil(self.history_s / max(self.interval_s, MIN_INTERVAL_S)) + 1) * max(
                    1, rows_per_tick
                )
                self.ring = SampleRing(max(cap, rows_per_tick, 1))
            self._stop_event.clear()
            self.error = None
            self._on_start()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            _LIVE.add(self)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread(s) and wait for them to end. Safe to call many times and from any thread."""
        self._stop_event.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._on_stop()
        _LIVE.discard(self)

    close = stop

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the thread ends by itself (a replay that reached its end) or ``timeout``;
        True when it has ended."""
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        cpu_before, wall_before = self.cpu_s, self.wall_s
        self._run_wall0 = wall0
        interval = self.interval_s
        next_due = time.perf_counter()
        try:
            while not self._stop_event.is_set():
                if not self._tick():
                    break
                self.samples += 1
                if not self.samples & 63:  # reading the thread's CPU clock is a system call: not every tick
                    self.cpu_s = cpu_before + time.thread_time() - cpu0
                if interval <= 0:
                    continue
                next_due += interval
                delay = next_due - time.perf_counter()
                if delay < 0:
                    self.overruns += 1
                    next_due = time.perf_counter()  # skip the missed ticks rather than burst
                    delay = 0
                if _pause(self._stop_event, delay):
                    break
        except BaseException as exc:  # the thread must end and say why, never die silently
            self.error = exc
        finally:
            self.cpu_s = cpu_before + time.thread_time() - cpu0
            self.wall_s = wall_before + time.perf_counter() - wall0
            self._run_wall0 = None
            _LIVE.discard(self)

    # -- data
    def frame(self) -> pd.DataFrame:
        """All samples still in the ring as a DataFrame of :data:`~workbench.io.nvml.NVML_COLUMNS`
        (marks in ``.attrs["marks"]``)."""
        rows = self.ring.all() if self.ring is not None else np.empty((0, _NCOLS))
        frame = rows_to_frame(rows)
        frame.attrs["marks"] = self.marks()
        frame.attrs["source"] = self.source
        return frame

    def rows_since(self, cursor: int) -> tuple[np.ndarray, int]:
        """Raw rows (float64, :data:`RING_COLUMNS`) appended after ``cursor``, and the new cursor."""
        if self.ring is None:
            return np.empty((0, _NCOLS)), 0
        return self.ring.rows_since(cursor)

    def mark(self, label: str) -> float:
        """Put ``label`` on the time axis at the current sample time; returns that time (s)."""
        t = float(self._now())
        with self._marks_lock:
            self._marks.append({"t_s": t, "label": str(label)})
        return t

    def marks(self) -> list[dict]:
        with self._marks_lock:
            return list(self._marks)

    def save(self, path) -> Path:
        """Write what was sampled (and the marks) to a JSONL/CSV session file, ``.gz`` allowed."""
        return save_nvml_session(self.frame(), path, marks=self.marks())

    def stats(self) -> dict:
        """The sampler's own cost: ticks, overruns and the sampling thread's CPU time vs wall time."""
        w0 = self._run_wall0
        wall = self.wall_s + (time.perf_counter() - w0 if w0 is not None else 0.0)
        return {
            "samples": self.samples,
            "overruns": self.overruns,
            "cpu_s": self.cpu_s,
            "wall_s": wall,
            "cpu_fraction": (self.cpu_s / wall) if wall > 0 else math.nan,
            "rows": self.ring.count if self.ring is not None else 0,
        }


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


class NvmlSampler(_ThreadedSampler):
    """Sample every GPU (or ``gpus``) through NVML every ``interval_s`` seconds (default 10 Hz, down to
    0.01 s = 100 Hz) in a background thread; PCIe throughput and energy every ``slow_interval_s``
    (default 1 s; ``None`` turns them off).

    ``history_s`` (default 15 min) sizes the ring; ``max_rows`` overrides it. NVML opens on
    :meth:`start`; without it :class:`~workbench.errors.NoNVML` says why and what to do.

    >>> s = NvmlSampler(interval_s=0.05)       # nothing opened yet  # doctest: +SKIP
    >>> with s: train_one_epoch(); s.mark("epoch 1")                 # doctest: +SKIP
    >>> s.frame().groupby("gpu").util_gpu_pct.mean()                 # doctest: +SKIP
    """

    thread_name = "workbench-nvml-sampler"

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, gpus=None, slow_interval_s: float | None = 1.0,
                 history_s: float = 900.0, max_rows: int | None = None, cadence_s: dict[str, float] | None = None):
        super().__init__(interval_s, history_s, max_rows)
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
            self._t0 = time.perf_counter()
            self.t0_unix = time.time()
        return len(self._handles)

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
        for k in range(len(rows)):
            row = rows[k]
            row[0] = t
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


# --------------------------------------------------------------------------------------------------
# replay


class ReplaySampler(_ThreadedSampler):
    """Play a recorded session (JSONL or CSV, ``.gz`` ok, or a session frame) with the
    :class:`Sampler` interface: rows appear when their time comes, ``speed`` times faster than
    recorded; ``loop=True`` starts over at the end (times keep increasing).

    ``interval_s`` is how often the thread wakes to release due rows (default 0.05 s).
    The thread ends by itself at the end of the recording when not looping (:meth:`wait`).
    """

    thread_name = "workbench-nvml-replay"

    def __init__(self, session, *, speed: float = 1.0, loop: bool = False, interval_s: float = 0.05,
                 history_s: float = 900.0, max_rows: int | None = None):
        super().__init__(interval_s, history_s, max_rows)
        if not speed > 0:
            raise BadArgument(f"speed={speed}: must be > 0")
        if isinstance(session, pd.DataFrame):
            frame, self.path = session, None
        else:
            self.path = Path(session)
            frame = load_nvml_session(self.path)
        self.speed = float(speed)
        self.loop = bool(loop)
        data = frame[[c for c in NVML_COLUMNS]].copy()
        data["throttle_reasons"] = [encode_throttle_reasons(v) for v in data["throttle_reasons"]]
        self._data = data.to_numpy(dtype=float)
        t = self._data[:, 0]
        self._t_first = float(t[0])
        self._data[:, 0] = t - self._t_first
        self.duration_s = float(self._data[-1, 0])
        dt = np.diff(np.unique(self._data[:, 0]))
        self.recorded_interval_s = float(np.median(dt)) if len(dt) else 0.0
        # a looped recording restarts one sample period after its last row
        self._period_s = self.duration_s + (self.recorded_interval_s or self.interval_s)
        self._recorded_marks = [
            {"t_s": m["t_s"] - self._t_first, "label": m["label"]} for m in frame.attrs.get("marks", [])
        ]
        self.gpus = sorted(int(g) for g in np.unique(self._data[:, 1]))
        name = self.path.name if self.path is not None else "a session frame"
        self.source = f"replaying {self.path if self.path is not None else name}"
        self._pos = 0            # next row to release
        self._lap = 0
        self._played_s = 0.0     # recording time already played before the current start()
        self._wall0 = None
        self._emitted_marks = 0

    def _open(self) -> int:
        return len(self.gpus)

    def _on_start(self) -> None:
        self._wall0 = time.perf_counter()

    def _on_stop(self) -> None:
        if self._wall0 is not None:  # resume where we were on the next start()
            self._played_s = self._now()
            self._wall0 = None

    def _now(self) -> float:
        if self._wall0 is None:
            return self._played_s
        return self._played_s + (time.perf_counter() - self._wall0) * self.speed

    @property
    def finished(self) -> bool:
        return not self.loop and self._pos >= len(self._data)

    def _tick(self) -> bool:
        now = self._now()
        n = len(self._data)
        while True:
            offset = self._lap * self._period_s
            t_rel = now - offset
            end = int(np.searchsorted(self._data[:, 0], t_rel, side="right"))
            if end > self._pos:
                chunk = self._data[self._pos:end].copy()
                chunk[:, 0] += offset
                self.ring.extend(chunk)
                self._release_marks(t_rel, offset)
                self._pos = end
            if self._pos < n:
                return True
            if not self.loop:
                self._release_marks(math.inf, offset)
                return False
            if now < (self._lap + 1) * self._period_s:
                return True
            self._lap += 1
            self._pos = 0
            self._emitted_marks = 0

    def _release_marks(self, t_rel: float, offset: float) -> None:
        while self._emitted_marks < len(self._recorded_marks) and self._recorded_marks[self._emitted_marks]["t_s"] <= t_rel:
            m = self._recorded_marks[self._emitted_marks]
            with self._marks_lock:
                self._marks.append({"t_s": m["t_s"] + offset, "label": m["label"]})
            self._emitted_marks += 1

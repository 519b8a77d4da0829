"""The sampler machinery that needs no NVML: the :class:`Sampler` interface, the bounded
:class:`SampleRing`, the thread plumbing both samplers share (start/stop, context manager, marks,
frame, save, the ``atexit`` stop), and :class:`ReplaySampler`, which plays a recorded session.

>>> from workbench import samples
>>> with ReplaySampler(samples.path("h200_nvml_session"), speed=1000) as s:
...     s.wait(timeout=10)
True
>>> len(s.frame()), s.running
(427, False)

Design notes (why, not what):

- Samples go to a fixed-size numpy ring (:class:`SampleRing`): memory stays bounded whatever the
  duration, and a reader (the live panel) asks only for the rows it has not seen (``rows_since``).
- Threads are daemons named ``workbench-...`` and always end: :meth:`stop`, the context manager
  (including on ``KeyboardInterrupt`` in the cell), and an ``atexit`` hook that stops every live
  sampler. A daemon thread never holds the interpreter open at exit.

The NVML sampler and the NVML reads are :mod:`workbench.capture.nvml`.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from workbench.errors import BadArgument
from workbench.io.nvml import (
    NVML_COLUMNS,
    decode_throttle_reasons,
    encode_throttle_reasons,
    save_nvml_session,
)
from workbench.io.nvml_foreign import load_gpu_samples

__all__ = [
    "Sampler",
    "ReplaySampler",
    "SampleRing",
    "rows_to_frame",
    "RING_COLUMNS",
    "DEFAULT_INTERVAL_S",
    "MIN_INTERVAL_S",
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
    ns = frame["time_ns"].to_numpy(dtype=float)
    missing = np.isnan(ns)
    frame["time_ns"] = pd.arrays.IntegerArray(np.where(missing, 0, np.round(ns)).astype(np.int64), missing)
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
# replay


# A looped replay far behind its clock plays at most this many laps per tick, so one tick always ends
# and the thread sees stop() (an unbounded catch-up loop spun forever at speed=inf).
_MAX_LAPS_PER_TICK = 64


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
        try:
            speed = float(speed)
        except (TypeError, ValueError):
            raise BadArgument(f"speed={speed!r}: must be a number > 0") from None
        if not (speed > 0 and math.isfinite(speed)):
            raise BadArgument(f"speed={speed}: must be a finite number > 0")
        if isinstance(session, pd.DataFrame):
            frame, self.path = session, None
        else:
            self.path = Path(session)
            frame = load_gpu_samples(self.path)  # a workbench session, an nvidia-smi log, DCGM scrapes...
        self.speed = float(speed)
        self.loop = bool(loop)
        data = frame[[c for c in NVML_COLUMNS]].copy()
        data["throttle_reasons"] = [encode_throttle_reasons(v) for v in data["throttle_reasons"]]
        data["time_ns"] = data["time_ns"].astype("Float64")
        self._data = data.to_numpy(dtype=float, na_value=np.nan)
        t = self._data[:, 0]
        self._t_first = float(t[0])
        self._data[:, 0] = t - self._t_first
        self.duration_s = float(self._data[-1, 0])
        dt = np.diff(np.unique(self._data[:, 0]))
        self.recorded_interval_s = float(np.median(dt)) if len(dt) else 0.0
        # a looped recording restarts one sample period after its last row
        self._period_s = max(self.duration_s + (self.recorded_interval_s or self.interval_s), 1e-6)
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

    @property
    def has_gpm(self) -> bool:
        """True when the recording holds GPM counter values (``gpm_*`` columns)."""
        cols = [_COL[c] for c in RING_COLUMNS if c.startswith("gpm_")]
        return bool(len(self._data)) and bool(np.isfinite(self._data[:, cols]).any())

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
        laps = 0
        while True:
            offset = self._lap * self._period_s
            t_rel = now - offset
            end = int(np.searchsorted(self._data[:, 0], t_rel, side="right"))
            if end > self._pos:
                chunk = self._data[self._pos:end].copy()
                chunk[:, 0] += offset
                chunk[:, _COL["time_ns"]] += offset * 1e9  # a later lap is later in Unix time too
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
            laps += 1
            if laps >= _MAX_LAPS_PER_TICK or self._stop_event.is_set():
                return True  # far behind (a huge speed): give the loop a chance to see stop()

    def _release_marks(self, t_rel: float, offset: float) -> None:
        while self._emitted_marks < len(self._recorded_marks) and self._recorded_marks[self._emitted_marks]["t_s"] <= t_rel:
            m = self._recorded_marks[self._emitted_marks]
            with self._marks_lock:
                self._marks.append({"t_s": m["t_s"] + offset, "label": m["label"]})
            self._emitted_marks += 1

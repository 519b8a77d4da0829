"""A flight recorder for long training runs: cheap bookkeeping on every step, a profiler capture of the
next few steps when something asks for one or goes wrong.

::

    from workbench import watch
    w = watch("runs/exp1", capture_steps=3, slow_factor=3.0)
    for batch in loader:
        with w.step():
            train_step(batch)

Always on (docs/long-runs.md measures the cost): the last ``history`` step times (CUDA events on a GPU,
read without synchronising; ``perf_counter`` on the CPU), the allocator's history in a bounded ring
(``torch.cuda.memory._record_memory_history(max_entries=...)``) and NVML samples in a background thread,
where there is a GPU.

The allocator history budgets its own cost (``memory_history="auto"``, the default): it records Python
stacks from the start, times what one recorded allocation costs with stacks, without them and with the
history off (a calibration of a few thousand small allocations when ``watch(...)`` is called), counts the
allocations of the warm-up steps and keeps the richest history that costs at most ``history_budget`` (1%) of
a step: the stacks, else the ring without them (``"sizes"``), else none (``"off"``); said once
(:func:`workbench.capture.watch_history.history_cost`, ``w.history_mode``, ``w.history_cost``).

A capture profiles the next ``capture_steps`` steps at the light detail, then writes the trace, an
allocator snapshot and the NVML samples of the window, and appends a line to ``index.jsonl``
(:mod:`workbench.io.watch`). It is asked for by: SIGUSR2; a file named ``CAPTURE`` in the output folder
(taken and removed; with many ranks, removed once every rank has taken it); a step slower than
``slow_factor`` x the rolling median of the unprofiled steps, after ``warmup`` steps; ``every=M``; and
``w.capture()``. A ``baseline`` capture right after the warm-up gives the slow ones a normal window to be
compared with (``workbench diff``). An out-of-memory error inside ``w.step()`` writes the allocator snapshot
(with an ``.oom.json`` sidecar) and propagates unchanged.

It never harms the run: a full or read-only disk, a profiler that fails, NVML missing, a second trigger
during a capture... each is logged once (logger ``workbench.watch``, and in ``w.problems``) and training
goes on. Only bad arguments raise, when ``watch(...)`` is called.

For trainer loops, ``w.on_step_end()`` marks the end of each step instead of the context manager (the
time between two calls is a step); it takes and ignores any arguments, so it can be called from a
trainer's callback as it is.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from workbench.capture.watch_history import (
    STEP_FRAMES,
    py_depth,
    calibrate_history,
    cost_words,
    history_cost,
    stacks_us_at,
)
from workbench.errors import BadArgument
from workbench.io.watch import TRIGGER_NAME, append_index_line

__all__ = ["watch", "Watch", "HISTORY_MODES"]

log = logging.getLogger("workbench.watch")

_TRACE = ".pt.trace.json.gz"
_SNAPSHOT = ".snapshot.pickle.gz"
_NVML = ".nvml.jsonl.gz"
_MEDIAN_EVERY = 16       # the rolling median is recomputed every this many steps (and on a candidate)
_NOTE_BYTES = 200        # what is read of the CAPTURE file's text

#: what ``memory_history`` takes: 'auto' (the richest history that costs at most ``history_budget`` of a
#: step: Python stacks, else 'sizes', else none), True / 'python' (Python stacks), 'all' (C++ frames too), 'alloc' (stacks at
#: allocation only), 'sizes' (no stacks), False (no history)
HISTORY_MODES = ("auto", True, False, "python", "all", "alloc", "sizes")
_REFINE_BAND = 4.0       # an estimate within this factor of the budget reads the ring's real stack depth
_DEFER_MAX = 100         # steps the decision waits for the warm-up's CUDA event times (then: host times)


def _rank_and_world(rank, world) -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return (dist.get_rank() if rank is None else int(rank),
                    dist.get_world_size() if world is None else int(world))
    except Exception:
        pass
    r = int(os.environ.get("RANK", "0") or 0) if rank is None else int(rank)
    w = int(os.environ.get("WORLD_SIZE", "1") or 1) if world is None else int(world)
    return r, max(w, 1)


# torch cannot detach an OOM observer: one per process, forwarding what the allocator says to a slot the
# step's exit reads (the request's size, the cap, bytes free), since torch's message holds less
_OOM_SLOT: dict = {}
_OOM_OBSERVER = False


def _install_oom_observer(torch) -> None:
    global _OOM_OBSERVER
    if _OOM_OBSERVER:
        return

    def observe(device, alloc, limit, device_free):
        try:
            _OOM_SLOT.update(device=int(device), requested_bytes=int(alloc), limit_bytes=int(limit),
                             device_free_bytes=int(device_free), time_unix_s=time.time())
        except BaseException:  # noqa: BLE001 - never raise into the allocator
            pass

    try:
        torch._C._cuda_attach_out_of_memory_observer(observe)
        _OOM_OBSERVER = True
    except Exception:
        pass


_LIVE: "weakref.WeakSet[Watch]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for w in list(_LIVE):
        try:
            w.close()
        except Exception:
            pass


class _StepBlock:
    """``with w.step():`` (one reusable object per recorder: no allocation per step)."""

    __slots__ = ("_w",)

    def __init__(self, w: "Watch"):
        self._w = w

    def __enter__(self):
        self._w._begin()
        return self._w

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._w._end(exc)
        return False  # the step's exception (an OOM too) propagates unchanged


class _Capture:
    __slots__ = ("reason", "note", "first_step", "stem", "session", "time_ns", "step_ms", "trigger_step",
                 "trigger_ms", "median_ms")


class Watch:
    """The recorder :func:`watch` returns. ``step()`` (context manager) or ``on_step_end()`` (callback),
    ``capture(note)`` to ask for a capture, ``recent_steps()``, ``captures`` (the index lines written),
    ``problems`` (what went wrong, each once), ``history_mode`` / ``history_cost`` (the allocator history's
    mode now, and the 'auto' mode's estimate once made), ``close()``."""

    def __init__(self, out_dir, *, capture_steps: int = 3, slow_factor: float | None = 3.0, every: int | None = None,
                 warmup: int = 20, history: int = 200, baseline: bool = True, detail: str = "light",
                 memory_history: bool | str = "auto", history_budget: float = 0.01, max_entries: int = 50_000,
                 nvml: bool = True,
                 nvml_interval_s: float = 0.5, nvml_before_s: float = 30.0, poll_s: float = 0.05,
                 max_captures: int = 100, slow_cooldown: int | None = None, rank: int | None = None,
                 world_size: int | None = None, device: str | None = None, handle_signal: bool = True):
        from workbench.capture.profiler import detail_options

        if int(capture_steps) < 1:
            raise BadArgument(f"capture_steps={capture_steps}: capture at least 1 step")
        if slow_factor is not None and not float(slow_factor) > 1.0:
            raise BadArgument(f"slow_factor={slow_factor}: give a factor > 1 (None: no slow-step trigger)")
        if every is not None and int(every) < 1:
            raise BadArgument(f"every={every}: give a number of steps >= 1 (None: not periodic)")
        if int(warmup) < 1 or int(history) < 3:
            raise BadArgument(f"warmup={warmup}, history={history}: need warmup >= 1 and history >= 3")
        if not any(memory_history is m or (isinstance(m, str) and memory_history == m) for m in HISTORY_MODES):
            raise BadArgument(f"memory_history={memory_history!r}: 'auto' (Python stacks within history_budget, "
                              "else 'sizes'), True or 'python' (Python stacks), 'all' (C++ too), 'alloc' (stacks at "
                              "allocation only), 'sizes' (no stacks) or False")
        try:
            budget = float(history_budget)
        except (TypeError, ValueError):
            budget = float("nan")
        if not budget >= 0:
            raise BadArgument(f"history_budget={history_budget!r}: give the share of a step the allocator "
                              "history's stacks may cost, >= 0 (0.01: 1%)")
        detail_options(detail)
        self.folder = Path(out_dir).expanduser()
        self.capture_steps = int(capture_steps)
        self.slow_factor = None if slow_factor is None else float(slow_factor)
        self.every = None if every is None else int(every)
        self.warmup = int(warmup)
        self.baseline = bool(baseline)
        self.detail = detail
        self.poll_s = float(poll_s)
        self.max_captures = int(max_captures)
        self.slow_cooldown = int(history if slow_cooldown is None else slow_cooldown)
        self.nvml_before_s = float(nvml_before_s)
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.captures: list[dict] = []
        self.problems: list[str] = []
        self._logged: set[str] = set()
        self._recent: deque = deque(maxlen=int(history))   # (step, ms) of unprofiled steps
        self._median = None
        self._since_median = 0
        self._unprofiled = 0
        self._quiet_until = -1           # no slow trigger up to this step (after a slow capture)
        self._step = 0                   # the step running (or next to run)
        self._in_step = False
        self._t0 = 0.0
        self._pending: tuple | None = None
        self._cap: _Capture | None = None
        self._signalled = False
        self._next_poll = 0.0
        self._file_token: str | None = None
        self._closed = False
        self._block = _StepBlock(self)
        self._prev_handler = None
        self._sampler = None
        self._history_on = False
        #: the allocator history's mode now ('python', 'all', 'alloc', 'sizes'; None: not recorded)
        self.history_mode: str | None = None
        #: the 'auto' mode's estimate once made (:func:`history_cost`'s dict, plus the frames and the
        #: calibration); None before the warm-up's end, on the CPU, or with a mode named explicitly
        self.history_cost: dict | None = None
        self.history_budget = budget
        self._auto = False               # the budget still to check (memory_history='auto', on a GPU)
        self._calibration: dict | None = None
        self._max_entries = int(max_entries)
        self._win_first = 1 if self.warmup >= 2 else 0     # the warm-up steps counted: [first, decide)
        self._win_decide = max(self.warmup, self._win_first + 1)
        self._win_start: tuple | None = None               # (allocations, perf_counter, Python depth)
        self._win_end: tuple | None = None                 # (allocations, perf_counter)
        self._torch = None
        self._events: deque = deque()    # (step, start, end, profiled) in flight on the GPU
        self._profiled_ms: dict = {}     # a capture's steps' device times, until its entry is written
        self._free_events: list = []
        self._ev_start = None

        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._problem("disk", f"cannot create {self.folder} ({exc}); captures will fail, training goes on")
        self.device = self._open_device(device)
        if self.device.startswith("cuda"):
            self._start_history(memory_history, int(max_entries))
            if nvml:
                self._start_nvml(float(nvml_interval_s))
        if handle_signal:
            self._install_signal()
        _LIVE.add(self)

    # ------------------------------------------------------------------------------------------ setup
    def _open_device(self, device) -> str:
        try:
            import torch
        except ImportError:
            return "cpu"
        try:
            cuda = torch.cuda.is_available()
        except Exception:
            cuda = False
        name = str(device) if device is not None else ("cuda" if cuda else "cpu")
        if not name.startswith("cuda") or not cuda:
            return "cpu"
        self._torch = torch
        index = torch.device(name).index
        return f"cuda:{torch.cuda.current_device() if index is None else index}"

    def _start_history(self, memory_history, max_entries: int) -> None:
        torch = self._torch
        try:
            torch.cuda.init()
            _install_oom_observer(torch)
            if memory_history == "auto":
                try:  # before the ring starts: the calibration leaves the history off, its own ring cleared
                    with torch.cuda.device(self.device):
                        self._calibration = calibrate_history(self.device, off=True)
                    self._auto = True
                except Exception as exc:
                    self._problem("history-cost", f"the allocator history's cost was not measured "
                                                  f"({type(exc).__name__}: {exc}); it keeps Python stacks")
            if memory_history:
                self._set_history("python" if memory_history in ("auto", True) else memory_history, max_entries)
                self._history_on = True
        except Exception as exc:
            self._auto = False
            self._problem("history", f"allocator history not recorded ({type(exc).__name__}: {exc})")

    def _set_history(self, mode: str, max_entries: int) -> None:
        """Record the allocator history in ``mode``; switching modes while it records keeps the ring."""
        # 'alloc': stacks at allocation only (frees keep none); 'sizes': no stacks at all (the events'
        # sizes, addresses and order; nothing names the code)
        stacks = "all" if mode == "all" else "python"
        context = {"alloc": "alloc", "sizes": None}.get(mode, "all")
        self._torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks, max_entries=max_entries)
        self.history_mode = mode

    def _allocations(self) -> int | None:
        stats = self._torch.cuda.memory_stats(self.device)
        n = stats.get("allocation.all.allocated")
        return int(n) if n is not None else None

    def _check_budget(self) -> None:
        """At the warm-up's edges (only then): count the allocations of the steps ``[first, decide)``, and
        once their CUDA event times are read (the device is never waited for: that may be a few steps
        later), decide whether the Python stacks fit in ``history_budget`` of a step (:func:`history_cost`)."""
        step = self._step
        try:
            if self._win_start is None and step >= self._win_first:
                self._win_first = step  # the callback form's first call is step 1
                self._win_decide = max(self._win_decide, step + 1)
                # the loop's depth: the frame that called w.step() / on_step_end() (the step's own
                # allocations sit STEP_FRAMES deeper, the approximation docs/long-runs.md states)
                try:
                    site = py_depth(sys._getframe(3))
                except ValueError:  # called from fewer frames than that
                    site = py_depth(sys._getframe())
                self._win_start = (self._allocations(), time.perf_counter(), site)
                return
            if step < self._win_decide:
                return
            if self._win_end is None:
                self._win_end = (self._allocations(), time.perf_counter())
            self._drain_events()
            events = self._events
            if events and events[0][0] < self._win_decide and step < self._win_decide + _DEFER_MAX:
                return  # the window's last steps still run on the device
            self._auto = False
            (allocs0, t0, site), (allocs1, t1) = self._win_start, self._win_end
            steps = self._win_decide - self._win_first
            if allocs0 is None or allocs1 is None:
                self._problem("history-cost", "the allocator does not count its allocations (memory_stats); "
                                              "the allocator history keeps Python stacks")
                return
            timed = [ms for s, ms in self._recent if self._win_first <= s < self._win_decide]
            step_ms = statistics.median(timed) if timed else (t1 - t0) * 1e3 / steps
            frames = site + STEP_FRAMES
            cal = self._calibration
            est = history_cost((allocs1 - allocs0) / steps, step_ms, stacks_us_at(cal, frames), cal["sizes_us"],
                               self.history_budget, off_us=cal.get("off_us"))
            frames_from = "assumed"
            share = est["cost_pct"]
            budget = self.history_budget
            if share is not None and budget / _REFINE_BAND < share / 100 < budget * _REFINE_BAND:
                # near the budget: the depth the ring's allocations were really recorded at (once; a
                # snapshot of the ring, as a capture takes)
                mean = self._ring_frames()
                if mean is not None:
                    frames, frames_from = mean, "ring"
                    est = history_cost((allocs1 - allocs0) / steps, step_ms, stacks_us_at(cal, frames),
                                       cal["sizes_us"], self.history_budget, off_us=cal.get("off_us"))
            est.update(frames=round(frames, 1), frames_from=frames_from, step_time="cuda events" if timed else "host",
                       decided_at_step=step, calibration=cal)
            self.history_cost = est
            if est["mode"] == "sizes":
                self._set_history("sizes", self._max_entries)
                self._problem("history-auto", f"allocator history without stacks: {cost_words(est)}; "
                                              "pass memory_history='python' to keep them anyway")
            elif est["mode"] == "off":
                self._torch.cuda.memory._record_memory_history(None)
                self.history_mode = "off"
                self._history_on = False
                self._problem("history-auto", f"allocator history off: {cost_words(est)}; an OOM still "
                                              "leaves the allocator's state without its history; pass "
                                              "memory_history='sizes' or 'python' to keep it anyway")
            else:
                log.info("watch rank %s: allocator history keeps Python stacks: %s", self.rank, cost_words(est))
        except Exception as exc:
            self._auto = False
            self._problem("history-cost", f"the allocator history's cost was not estimated "
                                          f"({type(exc).__name__}: {exc}); it keeps {self.history_mode}")

    def _ring_frames(self) -> float | None:
        """The mean number of Python frames recorded with the allocations in the ring (None: none there)."""
        try:
            snap = self._torch.cuda.memory._snapshot()
            index = self._torch.device(self.device).index or 0
            traces = snap.get("device_traces") or []
            entries = traces[index] if index < len(traces) else []
            frames = [len(e.get("frames") or ()) for e in entries if e.get("action") == "alloc"]
            return statistics.mean(frames) if frames else None
        except Exception as exc:
            self._problem("history-frames", f"the ring's stack depth was not read ({type(exc).__name__}: {exc}); "
                                            f"the depth is taken as the loop's + {STEP_FRAMES}")
            return None

    def _history_record(self) -> dict | None:
        """What the index lines say of the allocator history (None on the CPU)."""
        if self._torch is None:
            return None
        rec = {"mode": self.history_mode, "auto": self._calibration is not None}
        est = self.history_cost
        if est is not None:
            rec.update({k: est.get(k) for k in ("cost_pct", "sizes_cost_pct", "allocs_per_step", "step_ms",
                                                "stacks_us", "sizes_us", "off_us", "budget_pct", "frames",
                                                "frames_from")})
        return rec

    def _start_nvml(self, interval_s: float) -> None:
        try:
            from workbench.capture.nvml import NvmlSampler

            history_s = max(self.nvml_before_s * 4, 120.0)
            self._sampler = NvmlSampler(interval_s=interval_s, slow_interval_s=None, history_s=history_s).start()
        except Exception as exc:  # NoNVML, a driver without NVML...
            self._sampler = None
            self._problem("nvml", f"NVML not sampled ({type(exc).__name__}: {exc})")

    def _install_signal(self) -> None:
        sig = getattr(signal, "SIGUSR2", None)
        if sig is None:
            return
        if threading.current_thread() is not threading.main_thread():
            self._problem("signal", "SIGUSR2 is not watched (watch() was called outside the main thread); "
                                    f"create {self.folder / TRIGGER_NAME} instead")
            return
        prev = signal.getsignal(sig)
        ref = weakref.ref(self)

        def on_signal(signum, frame):
            w = ref()
            if w is not None:
                w._signalled = True
            if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
                prev(signum, frame)

        try:
            signal.signal(sig, on_signal)
            self._prev_handler = (sig, prev, on_signal)
        except (ValueError, OSError) as exc:
            self._problem("signal", f"SIGUSR2 is not watched ({exc})")

    def _problem(self, key: str, message: str) -> None:
        """Say it once (the log and ``problems``); never raise."""
        if key in self._logged:
            return
        self._logged.add(key)
        line = f"watch rank {self.rank}: {message}"
        self.problems.append(line)
        log.warning(line)

    # ------------------------------------------------------------------------------------------ the step
    def step(self) -> _StepBlock:
        """``with w.step(): train_step(batch)``: one step, timed; a capture starts or ends at its edges."""
        return self._block

    def on_step_end(self, *_args, **_kwargs) -> None:
        """The callback form: call once at the end of every step (trainer callbacks pass their own
        arguments; they are ignored). The first call ends step 0, untimed (it began before the recorder
        saw it); the time between two calls is the next step, so step numbers are the loop's."""
        if self._in_step:
            self._end(None)
        elif self._step == 0 and not self._closed:
            self._step = 1
        self._begin()

    def capture(self, note: str | None = None) -> None:
        """Ask for a capture of the next ``capture_steps`` steps (reason ``request``)."""
        self._trigger("request", note)

    def _begin(self) -> None:
        if self._closed:
            return
        if self._auto:
            self._check_budget()
        self._poll()
        if self._pending is not None and self._cap is None:
            self._start_capture()
        if self._torch is not None:
            ev = self._free_events.pop() if self._free_events else self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self._ev_start = ev
        self._in_step = True
        self._t0 = time.perf_counter()

    def _end(self, exc) -> None:
        t1 = time.perf_counter()
        if not self._in_step or self._closed:
            return
        self._in_step = False
        ms = (t1 - self._t0) * 1e3
        step = self._step
        self._step += 1
        cap = self._cap
        if self._torch is not None:
            ev = self._free_events.pop() if self._free_events else self._torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((step, self._ev_start, ev, cap is not None))
            self._ev_start = None
        if cap is not None:
            if exc is not None:
                self._finish_capture(exc=exc)
            else:
                cap.step_ms.append(round(ms, 4))
                try:
                    cap.session.step()
                except Exception as err:
                    self._problem("profiler", f"the profiler failed during a capture ({type(err).__name__}: {err})")
                    self._finish_capture(exc=err)
                else:
                    if len(cap.step_ms) >= self.capture_steps:
                        self._finish_capture()
        elif self._torch is None:
            self._record(step, ms)
        if self._torch is not None:
            self._drain_events()
        if exc is not None and _is_oom(exc):
            self._write_oom(step, exc)

    def _drain_events(self) -> None:
        events = self._events
        while events:
            step, start, end, profiled = events[0]
            try:
                if not end.query():
                    break
                ms = start.elapsed_time(end)
            except Exception:  # an event of a failed step: drop it
                ms = None
            events.popleft()
            self._free_events += (start, end)
            if not profiled and ms is not None:
                self._record(step, ms)
            elif profiled and ms is not None:
                self._profiled_ms[step] = ms

    def _record(self, step: int, ms: float) -> None:
        """One unprofiled step's time: the ring, the baseline after the warm-up, the slow-step check."""
        self._unprofiled += 1
        med = self._median
        if (self.slow_factor is not None and med is not None and self._unprofiled > self.warmup
                and step > self._quiet_until and ms > self.slow_factor * med):
            med = self._median = statistics.median(ms_ for _, ms_ in self._recent)  # confirm on fresh numbers
            if ms > self.slow_factor * med:
                self._trigger("slow", None, trigger=(step, round(ms, 4), round(med, 4)))
                self._quiet_until = step + self.capture_steps + self.slow_cooldown
        self._recent.append((step, ms))
        self._since_median += 1
        if med is None or self._since_median >= _MEDIAN_EVERY:
            self._median = statistics.median(ms_ for _, ms_ in self._recent)
            self._since_median = 0
        if self._unprofiled == self.warmup and self.baseline:
            self._trigger("baseline", None)

    # ------------------------------------------------------------------------------------------ triggers
    def _trigger(self, reason: str, note, trigger=None) -> None:
        if self._cap is not None or self._pending is not None:
            busy = self._cap.reason if self._cap is not None else self._pending[0]
            self._problem(f"busy-{reason}", f"a {reason} trigger came during a {busy} capture and was dropped "
                                            "(said once per kind of trigger)")
            return
        self._pending = (reason, note, trigger)

    def _poll(self) -> None:
        if self._signalled:
            self._signalled = False
            self._trigger("signal", None)
        if self.every is not None and self._step and self._step % self.every == 0:
            self._trigger("every", None)
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_s
            taken = self._take_file()
            if taken is not None:
                self._trigger("file", taken or None)

    def _take_file(self) -> str | None:
        """The CAPTURE file's text when it is new to this rank (None: none, or already taken). Removed
        once taken by every rank (each rank leaves a mark ``.CAPTURE-<id>.rank<r>``)."""
        path = self.folder / TRIGGER_NAME
        try:
            st = os.stat(path)
        except OSError:
            return None
        token = f"{st.st_ino}-{st.st_mtime_ns}"
        new = token != self._file_token
        self._file_token = token
        note = ""
        try:
            if new:
                with open(path, "rb") as f:
                    note = f.read(_NOTE_BYTES).decode("utf-8", "replace").strip()
            if self.world_size <= 1:
                path.unlink(missing_ok=True)
            else:
                mark = self.folder / f".{TRIGGER_NAME}-{token}.rank{self.rank}"
                if new:
                    mark.touch()
                marks = list(self.folder.glob(f".{TRIGGER_NAME}-{token}.rank*"))
                if len(marks) >= self.world_size:
                    path.unlink(missing_ok=True)
                    for m in marks:
                        m.unlink(missing_ok=True)
        except OSError as exc:
            self._problem("trigger-file", f"could not take {path} ({exc}); it is taken once per rank anyway")
        return note if new else None

    # ------------------------------------------------------------------------------------------ captures
    def _stem(self, reason: str, step: int) -> str:
        return f"cap-{step:07d}-rank{self.rank}-{reason}"

    def _start_capture(self) -> None:
        reason, note, trigger = self._pending
        self._pending = None
        if len(self.captures) >= self.max_captures:
            self._problem("limit", f"{self.max_captures} captures taken: no more (max_captures)")
            return
        from workbench.capture.profiler import ProfileSession

        cap = _Capture()
        cap.reason, cap.note, cap.first_step = reason, note, self._step
        cap.trigger_step, cap.trigger_ms, cap.median_ms = trigger if trigger else (None, None, None)
        if cap.median_ms is None and self._recent:
            cap.median_ms = round(statistics.median(ms for _, ms in self._recent), 4)
        cap.stem = self._stem(reason, cap.first_step)
        cap.step_ms = []
        cap.time_ns = time.time_ns()
        meta = {"workbench_synchronized_steps": True,
                "workbench_watch": {"reason": reason, "first_step": cap.first_step, "rank": self.rank}}
        # what the step takes without the profiler (the diagnosis' profiler what-if reads it): the slow
        # step itself for a slow capture (the run's median would blame the slowness on the profiler)
        unprofiled = cap.trigger_ms if reason == "slow" else cap.median_ms
        if unprofiled is not None:
            meta["workbench_unprofiled_step_ms"] = unprofiled
        try:
            cap.session = ProfileSession(self.folder / (cap.stem + _TRACE), detail=self.detail, device=self.device,
                                         metadata=meta, first_step=cap.first_step)
            cap.session.__enter__()
        except Exception as exc:
            self._problem("profiler", f"the profiler did not start ({type(exc).__name__}: {exc}); "
                                      "no trace this time, training goes on")
            cap.session = None
            self._cap = None
            self._write_entry(cap, trace=None, complete=False, exc=exc)
            return
        self._cap = cap

    def _finish_capture(self, exc: BaseException | None = None) -> None:
        cap, self._cap = self._cap, None
        trace = None
        if cap.session is not None:
            try:
                cap.session.__exit__(None, None, None)  # the step's own exception is not the profiler's
                if cap.session.result is not None:
                    trace = cap.session.result.path.name
            except Exception as err:
                kind = "disk" if isinstance(err, OSError) else "profiler"
                self._problem(kind, f"trace {cap.stem} not written ({type(err).__name__}: {err}); training goes on")
        self._device_step_ms(cap, exc)
        # at an OOM the step's exit writes the snapshot of the failure itself
        self._write_entry(cap, trace=trace, complete=exc is None, exc=exc, snapshot=exc is None or not _is_oom(exc))

    def _device_step_ms(self, cap: _Capture, exc) -> None:
        """On a GPU a captured step's time is its CUDA events' (the host's perf_counter returns before a
        GPU-bound step is done): wait for the capture's last step once, at its end, and read them."""
        steps = range(cap.first_step, cap.first_step + len(cap.step_ms))
        if self._torch is not None and exc is None and len(steps):
            try:
                self._events[-1][2].synchronize()
            except Exception:  # noqa: S110 - the host times stay
                pass
            self._drain_events()
            dev = [self._profiled_ms.get(s) for s in steps]
            if all(ms is not None for ms in dev):
                cap.step_ms = [round(ms, 4) for ms in dev]
        self._profiled_ms.clear()

    def _write_entry(self, cap: _Capture, *, trace, complete: bool, exc=None, snapshot: bool = True,
                     oom: dict | None = None) -> None:
        snap = self._write_snapshot(cap.stem, oom) if snapshot else None
        nvml = self._write_nvml(cap)
        rec = {
            "time_ns": cap.time_ns, "reason": cap.reason, "first_step": cap.first_step,
            "steps": max(len(cap.step_ms), 1 if cap.reason == "oom" else 0), "trace": trace, "snapshot": snap,
            "nvml": nvml, "rank": self.rank,
            "trigger_step": cap.trigger_step, "trigger_ms": cap.trigger_ms, "median_ms": cap.median_ms,
            "step_ms": list(cap.step_ms), "device": self.device, "complete": bool(complete),
            "note": cap.note if exc is None else f"{type(exc).__name__}: {str(exc)[:300]}",
            "host": socket.gethostname(), "pid": os.getpid(), "history": self._history_record(),
        }
        if trace is None and snap is None and nvml is None:
            self._problem("empty", f"capture {cap.stem} left no file (see the problems above); not listed")
            return
        try:
            append_index_line(self.folder, rec)
        except OSError as err:
            self._problem("disk", f"index line for {cap.stem} not written ({err}); training goes on")
            return
        self.captures.append(rec)
        log.info("watch rank %s: %s capture of steps %s-%s -> %s", self.rank, cap.reason, cap.first_step,
                 cap.first_step + max(len(cap.step_ms), 1) - 1, self.folder)

    def _write_snapshot(self, stem: str, oom: dict | None = None) -> str | None:
        if self._torch is None:
            return None
        try:
            from workbench.io.snapshot import save_snapshot

            # compresslevel 1: the training loop waits for this write (a full history ring is a large pickle),
            # so the fastest gzip level
            path = save_snapshot(self._torch.cuda.memory._snapshot(), self.folder / (stem + _SNAPSHOT), compresslevel=1)
            if oom is not None:
                side = self.folder / (stem + ".snapshot.oom.json")
                tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(oom, default=str))
                os.replace(tmp, side)
            return path.name
        except Exception as err:
            kind = "disk" if isinstance(err, OSError) else "snapshot"
            self._problem(kind, f"snapshot {stem} not written ({type(err).__name__}: {err}); training goes on")
            return None

    def _write_nvml(self, cap: _Capture) -> str | None:
        s = self._sampler
        if s is None:
            return None
        try:
            frame = s.frame()
            t0 = cap.time_ns - int(self.nvml_before_s * 1e9)
            frame = frame[frame["time_ns"].fillna(0).astype("int64") >= t0].reset_index(drop=True)
            if not len(frame):
                return None
            from workbench.io.nvml import save_nvml_session

            return save_nvml_session(frame, self.folder / (cap.stem + _NVML), marks=[]).name
        except Exception as err:
            kind = "disk" if isinstance(err, OSError) else "nvml-write"
            self._problem(kind, f"NVML samples of {cap.stem} not written ({type(err).__name__}: {err})")
            return None

    def _write_oom(self, step: int, exc: BaseException) -> None:
        if self._torch is None:
            self._problem("oom-cpu", f"{type(exc).__name__} on the CPU: no allocator to snapshot")
            return
        info = dict(_OOM_SLOT)
        _OOM_SLOT.clear()
        torch = self._torch
        stats = {}
        try:
            stats = dict(torch.cuda.memory_stats())
        except Exception:
            pass
        oom = {"device": info.get("device", torch.cuda.current_device()),
               "requested_bytes": info.get("requested_bytes", 0), "limit_bytes": info.get("limit_bytes", 0),
               "device_free_bytes": info.get("device_free_bytes", 0),
               "time_unix_s": info.get("time_unix_s", time.time()), "torch_version": torch.__version__,
               "torch_message": str(exc), "memory_stats": stats}
        cap = _Capture()
        cap.reason, cap.note, cap.first_step = "oom", None, step
        cap.trigger_step, cap.trigger_ms, cap.median_ms = step, None, None
        cap.stem, cap.step_ms, cap.time_ns, cap.session = self._stem("oom", step), [], time.time_ns(), None
        self._write_entry(cap, trace=None, complete=False, exc=exc, oom=oom)

    # ------------------------------------------------------------------------------------------ reading
    def recent_steps(self) -> list[tuple[int, float]]:
        """The last unprofiled steps as ``(step, ms)``, oldest first (GPU: device time between CUDA events)."""
        if self._torch is not None:
            self._drain_events()
        return list(self._recent)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(ms for _, ms in self._recent) if self._recent else None

    @property
    def capturing(self) -> bool:
        return self._cap is not None

    # ------------------------------------------------------------------------------------------ the end
    def close(self) -> None:
        """End a capture in progress (written as partial), stop NVML and the allocator history, give the
        signal back. Called at exit too."""
        if self._closed:
            return
        if self._cap is not None:
            self._finish_capture(exc=RuntimeError("the recorder was closed during the capture"))
        self._closed = True
        _LIVE.discard(self)
        if self._sampler is not None:
            try:
                self._sampler.stop()
            except Exception:
                pass
        if self._history_on:
            try:
                self._torch.cuda.memory._record_memory_history(None)
            except Exception:
                pass
        self.history_mode = None
        if self._prev_handler is not None:
            sig, prev, ours = self._prev_handler
            try:
                if signal.getsignal(sig) is ours and threading.current_thread() is threading.main_thread():
                    signal.signal(sig, prev)
            except (ValueError, OSError, TypeError):
                pass

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Watch({str(self.folder)!r}, rank={self.rank}, step={self._step}, captures={len(self.captures)}, "
                f"device={self.device!r})")


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
    except (ImportError, AttributeError):
        return "out of memory" in str(exc).lower()


def watch(out_dir, *, capture_steps: int = 3, slow_factor: float | None = 3.0, every: int | None = None,
          **options) -> Watch:
    """A flight recorder writing into ``out_dir`` (see the module docstring and docs/long-runs.md)::

        w = watch("runs/exp1", capture_steps=3, slow_factor=3.0)
        for batch in loader:
            with w.step():
                train_step(batch)

    ``capture_steps``: steps per capture; ``slow_factor``: a step slower than this x the rolling median of
    the last ``history`` (200) unprofiled steps triggers a capture, after ``warmup`` (20) steps (None: off;
    then ``slow_cooldown`` steps, default ``history``, before the next); ``every``: also a capture every
    this many steps. Other options: ``baseline`` (True: one normal capture after the warm-up),
    ``detail`` ('light'), ``memory_history`` ('auto': Python stacks while they cost at most ``history_budget``,
    0.01 of a step, as estimated at the warm-up's end, else 'sizes'; True or 'python' / 'all' / 'alloc' /
    'sizes' / False: that mode throughout) and ``max_entries`` (50 000, the allocator ring), ``nvml`` and
    ``nvml_interval_s`` (0.5 s), ``nvml_before_s`` (the NVML window kept
    before a capture, 30 s), ``poll_s`` (how often the CAPTURE file is looked for, 0.05 s; 0: every step),
    ``max_captures`` (100), ``rank`` / ``world_size`` (default: torch.distributed, else $RANK /
    $WORLD_SIZE), ``device``, ``handle_signal`` (True: SIGUSR2 asks for a capture).
    """
    return Watch(out_dir, capture_steps=capture_steps, slow_factor=slow_factor, every=every, **options)

"""Profile a step function or a block of code with ``torch.profiler`` and write a Kineto trace file.

Two entry points, one record::

    result = profile_steps(step, steps=3, detail="standard")      # wait/warmup/active schedule
    with profile(detail="light") as session:                       # a block of code
        for batch in loader:
            train(batch)
            session.step()                                         # optional ProfilerStep#N marks
    result = session.result

Both write ``*.pt.trace.json.gz`` atomically (temporary file, then rename) and return a
:class:`ProfileResult` saying where it went, at which detail, over how many steps, on which device, how
long it took, and (for ``detail="full"``) what the detail cost per step.

CPU activity is always recorded; CUDA activity when the device is a CUDA GPU. Detail levels:

``light``     kernels, runtime calls and CPU ops only: no shapes, no memory, no stacks
``standard``  + ``record_shapes`` (op table by input shape)
``full``      + ``profile_memory`` + ``with_stack`` (costly on CPU-bound steps; the cost is measured and printed)

An exception (or Ctrl-C) inside the profiled code stops the profiler, writes whatever was recorded,
and re-raises the original exception; the partial result is on ``session.result`` (block form) or on
the exception's ``workbench_profile`` attribute (step form), and named in an exception note.

Capture is quiet: Kineto prints ``USDT: ... profiler_start`` / ``profiler_stop`` on the process's
stderr (file descriptor 2, so a notebook shows them in red under every capture cell) whenever a trace
starts or stops, and the profiler's memory hook warns "Memory block of unknown size was allocated before
the profiling started" about blocks allocated before the capture; :func:`_quiet_kineto` passes file
descriptor 2 through a line filter for the whole capture (start, profiled code, stop) and writes back,
as it comes, everything else (Kineto's real warnings and errors, the user's own output). Set
``WORKBENCH_KINETO_LOG=1`` to leave stderr alone.

What torch.compile did during the captured calls (graphs, graph breaks, recompiles, compile time: the
structured log dynamo writes, :mod:`workbench.capture.compile`) is stamped into the trace's top-level
metadata as ``workbench_compile``, beside the step time measured without the profiler; ``profile_steps``
also times its un-profiled steps with the compiled functions run eagerly (``eager_step_ms``) when
something was compiled (docs/compile.md).

torch is imported inside the functions, never at module import.
"""

from __future__ import annotations

import gzip
import json
import re
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from workbench.errors import BadArgument, NoDevice, WorkbenchError

__all__ = [
    # what a profiling session returns
    "ProfileResult",
    "StepCost",
    # run one
    "profile_steps",
    "profile",
    "ProfileSession",
    # policies
    "DETAILS",
    "detail_options",
    "default_trace_dir",
]

# detail level -> torch.profiler.profile keyword arguments
DETAILS: dict[str, dict[str, bool]] = {
    "light": {"record_shapes": False, "profile_memory": False, "with_stack": False},
    "standard": {"record_shapes": True, "profile_memory": False, "with_stack": False},
    "full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}

_TRACE_SUFFIX = ".pt.trace.json.gz"


def detail_options(detail: str) -> dict[str, bool]:
    """The ``torch.profiler.profile`` options of a detail level.

    >>> detail_options("standard")
    {'record_shapes': True, 'profile_memory': False, 'with_stack': False}
    """
    try:
        return dict(DETAILS[detail])
    except KeyError:
        raise BadArgument(
            f"unknown profiling detail {detail!r}; choose one of: {', '.join(DETAILS)}"
        ) from None


def default_trace_dir() -> Path:
    """Where traces go when no ``path``/``out_dir`` is given: ``$WORKBENCH_TRACE_DIR`` if set, else
    ``<tempdir>/gpu-workbench/traces`` (so notebooks run in CI leave nothing in the repository)."""
    env = os.environ.get("WORKBENCH_TRACE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "gpu-workbench" / "traces"


@dataclass(frozen=True)
class StepCost:
    """What profiling cost one step: the median un-profiled step against the median profiled step."""

    baseline_ms: float
    profiled_ms: float
    detail: str = "full"

    @property
    def extra_ms(self) -> float:
        return self.profiled_ms - self.baseline_ms

    @property
    def ratio(self) -> float:
        return self.profiled_ms / self.baseline_ms if self.baseline_ms > 0 else float("nan")

    def __str__(self) -> str:
        pct = (self.ratio - 1.0) * 100.0
        verb = "raised" if self.extra_ms >= 0 else "changed"
        return (
            f"{self.detail} detail {verb} the step from {self.baseline_ms:.1f} ms to "
            f"{self.profiled_ms:.1f} ms ({pct:+.0f}%)"
        )


@dataclass(frozen=True)
class ProfileResult:
    """Where a profiling session's trace went and what it covered.

    ``steps`` is the number of recorded (active) steps; ``step_ms`` their wall times (device-synchronised
    on CUDA); ``wall_s`` the whole session including warm-up and writing the file; ``cost`` the
    per-step cost of the detail level when it was measured (always for ``detail="full"``).
    ``complete`` is False when the profiled code raised and the trace holds only what was recorded.
    """

    path: Path
    detail: str
    steps: int
    device: str
    wall_s: float
    step_ms: tuple[float, ...] = ()
    cost: StepCost | None = None
    complete: bool = True

    @property
    def step_ms_median(self) -> float | None:
        return statistics.median(self.step_ms) if self.step_ms else None

    def load(self):
        """The trace, loaded with :func:`workbench.io.load_trace`."""
        from workbench.io import load_trace

        return load_trace(self.path)

    def __str__(self) -> str:
        med = self.step_ms_median
        step = f", median step {med:.1f} ms" if med is not None else ""
        part = "" if self.complete else " (partial: the profiled code raised)"
        return (
            f"{self.steps} step(s) on {self.device} at {self.detail} detail{step}, "
            f"{self.wall_s:.1f} s -> {self.path}{part}"
        )


# --------------------------------------------------------------------------------------------------
# helpers (torch imported lazily)


def _torch():
    from workbench._optional import import_optional

    return import_optional("torch", "to profile a step")


def _resolve_device(device) -> str:
    torch = _torch()
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    name = str(device)
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise NoDevice(
                f"profiling on {name!r} was asked for but torch sees no CUDA device "
                f"(torch {torch.__version__}); pass device='cpu', or run on a machine with an NVIDIA GPU "
                "and a CUDA build of torch"
            )
        return name
    if name == "cpu":
        return "cpu"
    raise BadArgument(f"unsupported profiling device {name!r}; use 'cpu', 'cuda' or 'cuda:N'")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        _torch().cuda.synchronize(device)


def _activities(device: str) -> list:
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(ProfilerActivity.CUDA)
    return acts


def _trace_path(path, out_dir) -> Path:
    if path is not None:
        return Path(path).expanduser().resolve()
    d = Path(out_dir).expanduser() if out_dir is not None else default_trace_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    host = socket.gethostname().split(".")[0] or "host"
    name = f"{host}_{os.getpid()}_{stamp}_{time.monotonic_ns() % 1_000_000:06d}{_TRACE_SUFFIX}"
    return (d / name).resolve()


def _export(prof, path: Path, stamps: dict | None = None) -> bool:
    """Write the profiler's recorded trace to ``path`` atomically; gzip when the name ends in .gz.
    ``stamps``: more top-level metadata known only once the capture ended (:func:`_stamp_tail`).

    Returns False when nothing was recorded (the profiler never started a trace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, raw = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".json", dir=path.parent)
    os.close(fd)
    tmp_gz = raw + ".gz"
    try:
        try:
            # torch writes plain JSON here (the name ends in .json); we compress ourselves.
            prof.export_chrome_trace(raw)
        except (AssertionError, RuntimeError):
            return False  # no kineto results: nothing was recorded
        if os.path.getsize(raw) == 0:
            return False
        _name_trace(raw, path.name.removesuffix(".gz"))
        if stamps:
            _stamp_tail(raw, stamps)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(raw, 0o666 & ~mask)  # readable by the group as any new file, not mkstemp's 0600
        if path.name.endswith(".gz"):
            with open(raw, "rb") as fin, gzip.open(tmp_gz, "wb", compresslevel=5) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
            os.replace(tmp_gz, path)
        else:
            os.replace(raw, path)
        return True
    finally:
        Path(raw).unlink(missing_ok=True)
        Path(tmp_gz).unlink(missing_ok=True)


_TRACE_NAME = re.compile(rb'"traceName"\s*:\s*"(?:[^"\\]|\\.)*"')


def _name_trace(raw: str, name: str) -> None:
    """Kineto ends the file with ``"traceName": "<the temporary file's absolute path>"``. Put the final
    file name there instead, so a trace shared with others (or shipped as a sample) carries no machine
    path. Only the file's tail is rewritten."""
    tail_len = 4096
    with open(raw, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - tail_len)
        f.seek(start)
        tail = f.read()
        new_tail = _TRACE_NAME.sub(lambda m: b'"traceName": ' + json.dumps(name).encode(), tail, count=1)
        if new_tail != tail:
            f.seek(start)
            f.write(new_tail)
            f.truncate()


def _stamp_tail(raw: str, stamps: dict) -> None:
    """Add top-level keys to the written trace: what is known only after the profiler stopped (what
    torch.compile did during the capture, ``workbench_compile``) cannot go through
    ``preset_metadata_json``, which is read when the trace starts. The file's closing brace is replaced by
    ``, "key": value, ... }``; only the tail is rewritten."""
    extra = "".join(f', {json.dumps(k)}: {json.dumps(v, separators=(",", ":"))}' for k, v in stamps.items())
    with open(raw, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - 4096)
        f.seek(start)
        tail = f.read()
        end = tail.rstrip().rfind(b"}")
        if end < 0:
            return
        f.seek(start + end)
        f.write(extra.encode() + b"}\n")
        f.truncate()


def _compile_stamp(recorder) -> dict | None:
    """``{"workbench_compile": ...}`` when dynamo was loaded during the capture (else nothing to say)."""
    from workbench.capture.compile import STAMP_KEY

    if recorder is None or recorder.counters() is None:
        return None
    try:
        return {STAMP_KEY: recorder.stamp()}
    except Exception:  # the stamp is a by-product: never lose the trace for it
        return None


def _annotate(exc: BaseException, result: ProfileResult | None) -> None:
    msg = (
        f"gpu-workbench: the profiler was stopped; partial trace kept at {result.path}"
        if result is not None
        else "gpu-workbench: the profiler was stopped before it recorded anything; no trace was written"
    )
    if hasattr(exc, "add_note"):
        exc.add_note(msg)
    try:
        exc.workbench_profile = result  # type: ignore[attr-defined]
    except Exception:  # exceptions with __slots__
        pass


# What torch and Kineto print on file descriptor 2 during a capture that says nothing to the user (the
# lines are matched whole; anything else, Kineto's real warnings and errors included, is written back):
_KINETO_NOISE = re.compile(
    rb"^(?:"
    # Kineto's USDT probes whenever a trace starts or stops
    rb"USDT:.*\]\s*profiler_(?:start|stop)"
    # the profiler's memory hook meeting a block allocated before the capture (CPU or CUDA allocator)
    rb"|\[W[^\]]*\] Memory block of unknown size was allocated before the profiling started, "
    rb"profiler results will not include the deallocation event"
    # older Kineto's stage log (torch < 2.4 printed it on every capture)
    rb"|STAGE:\d{4}-\d\d-\d\d [^\]]*\] Completed Stage: [A-Za-z ]+"
    rb")\s*$"
)
_quiet_depth = 0
_quiet_lock = threading.Lock()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:  # the original stderr is gone: nothing to show it on
            return


def _pump(read_fd: int, out_fd: int) -> None:
    """Copy ``read_fd`` to ``out_fd`` line by line, leaving out :data:`_KINETO_NOISE` lines."""
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 65536)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        kept = b"".join(line + b"\n" for line in lines if not _KINETO_NOISE.match(line))
        if kept:
            _write_all(out_fd, kept)
    if pending and not _KINETO_NOISE.match(pending):
        _write_all(out_fd, pending)


@contextmanager
def _quiet_kineto():
    """While the block runs (a whole capture: the profiler's start, the profiled code, its stop), what C++
    and Python write on file descriptor 2 goes through a pipe; a thread writes every line back to the
    original stderr as it comes, except :data:`_KINETO_NOISE` (Kineto's USDT ``profiler_start`` /
    ``profiler_stop``, the allocator's "Memory block of unknown size" warning). Real warnings and the
    user's own stderr output pass, in order. Nested blocks share the outer one.
    ``WORKBENCH_KINETO_LOG=1``: no filtering."""
    global _quiet_depth
    if os.environ.get("WORKBENCH_KINETO_LOG", "") not in ("", "0"):
        yield
        return
    with _quiet_lock:
        nested = _quiet_depth > 0
        _quiet_depth += 1
    if nested:
        try:
            yield
        finally:
            with _quiet_lock:
                _quiet_depth -= 1
        return
    saved = read_fd = None
    try:
        for stream in (sys.stderr, sys.__stderr__):
            if stream is not None:
                stream.flush()
        saved = os.dup(2)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
    except (OSError, ValueError, AttributeError):  # no fd 2 (a service), or it cannot be replaced
        for fd in (saved, read_fd):
            if fd is not None:
                os.close(fd)
        with _quiet_lock:
            _quiet_depth -= 1
        yield
        return
    pump = threading.Thread(target=_pump, args=(read_fd, saved), name="workbench-stderr-filter", daemon=True)
    pump.start()
    try:
        yield
    finally:
        for stream in (sys.stderr, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved, 2)  # closes the pipe's last write end (unless a child process kept a copy)
        pump.join(timeout=5)
        if not pump.is_alive():  # else a child still holds the pipe: leave both ends to the thread
            os.close(read_fd)
            os.close(saved)
        with _quiet_lock:
            _quiet_depth -= 1


def _make_profiler(device: str, detail: str, schedule, metadata: dict | None = None, options: dict | None = None):
    import torch.profiler as tp

    opts = detail_options(detail)
    opts.update(options or {})
    prof = tp.profile(activities=_activities(device), schedule=schedule, **opts)
    preset = getattr(prof, "preset_metadata_json", None)
    if preset is not None:  # lands in the trace's top-level metadata (torch >= 2.4)
        try:
            preset("workbench_detail", json.dumps(detail))
            for key, value in (metadata or {}).items():
                preset(key, json.dumps(value))
        except Exception:
            pass
    return prof


# --------------------------------------------------------------------------------------------------
# step function


def profile_steps(
    step_fn: Callable[[], Any],
    steps: int = 3,
    wait: int = 1,
    warmup: int = 1,
    detail: str = "standard",
    out_dir: str | os.PathLike | None = None,
    device: str | None = None,
    *,
    path: str | os.PathLike | None = None,
    measure_cost: bool | None = None,
    progress: bool = True,
    verbose: bool = True,
) -> ProfileResult:
    """Profile ``steps`` calls of ``step_fn`` after ``wait`` skipped and ``warmup`` warm-up calls.

    One more call runs first outside the profiler (a cold first step under ``with_stack`` can crash
    torch's event post-processing; it also keeps lazy initialisation out of the trace). The recorded
    steps appear in the trace as ``ProfilerStep#N`` with N from ``wait + warmup`` to
    ``wait + warmup + steps - 1``.

    ``measure_cost`` (default: True) times ``min(steps, 3)`` more un-profiled
    calls and compares their median with the profiled steps' median; the sentence is printed when
    ``verbose``. ``device`` defaults to CUDA when present, else CPU; the step is timed with a device
    synchronise. Returns a :class:`ProfileResult`; the trace is a gzipped Kineto JSON at ``path``
    (default: a new file in ``out_dir`` or :func:`default_trace_dir`).
    """
    if steps < 1 or wait < 0 or warmup < 0:
        raise BadArgument(f"need steps >= 1 and wait, warmup >= 0 (got steps={steps}, wait={wait}, warmup={warmup})")
    opts = detail_options(detail)  # validates detail
    torch = _torch()
    dev = _resolve_device(device)
    target = _trace_path(path, out_dir)
    if measure_cost is None:
        # the unprofiled step time goes into the trace (the diagnosis' profiler what-if reads it); the
        # sentence about the cost is printed for full detail only
        measure_cost = True
    t_start = time.perf_counter()

    from tqdm.auto import tqdm

    n_base = min(steps, 3) if measure_cost else 0
    total = 1 + n_base + wait + warmup + steps
    bar = tqdm(total=total, desc=f"profiling ({detail})", unit="step", delay=2.0, disable=not progress,
               leave=False)

    from workbench.capture.compile import CompileRecorder, force_eager

    compiled = CompileRecorder()  # what torch.compile does during every call below (docs/compile.md)

    def timed(record: bool = True) -> float:
        t0 = time.perf_counter()
        step_fn()
        _sync(dev)
        ms = (time.perf_counter() - t0) * 1e3
        if record:
            compiled.call(ms)
        return ms

    compiled.start()
    try:
        timed()  # warm-up outside the profiler
        bar.update(1)
        base_ms = []
        for _ in range(n_base):
            base_ms.append(timed())
            bar.update(1)
        if base_ms and compiled.compiled:
            # the same step with its compiled functions run eagerly: what compiling saves a step
            stance = force_eager()
            if stance is not None:
                with stance:
                    eager = [timed(record=False) for _ in range(n_base)]
                compiled.eager_step_ms = round(statistics.median(eager), 4)
    except BaseException:
        compiled.stop()
        bar.close()
        raise

    with warnings.catch_warnings():  # warmup=0: torch warns of skew; the un-profiled warm-up call above is ours
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup", category=UserWarning)
        sched = torch.profiler.schedule(wait=wait, warmup=warmup, active=steps, repeat=1)
    meta = {"workbench_synchronized_steps": True}  # timed() ends every step with a device synchronise
    if base_ms:
        meta["workbench_unprofiled_step_ms"] = round(statistics.median(base_ms), 4)
    prof = _make_profiler(dev, detail, sched, meta)
    step_ms: list[float] = []
    first_active = wait + warmup
    try:
        with _quiet_kineto():  # the whole capture: start, the profiled steps (the schedule starts and
            prof.__enter__()   # stops Kineto's trace inside step()), stop
            try:
                for i in range(wait + warmup + steps):
                    ms = timed()
                    if i >= first_active:
                        step_ms.append(ms)
                    prof.step()
                    bar.update(1)
            finally:
                prof.__exit__(None, None, None)
                compiled.stop()
    except BaseException as exc:
        bar.close()
        # leaving `with prof` stopped the profiler; keep what the active steps recorded
        result = None
        if _export(prof, target, _compile_stamp(compiled)):
            result = ProfileResult(target, detail, len(step_ms), dev, time.perf_counter() - t_start,
                                   tuple(step_ms), None, complete=False)
        _annotate(exc, result)
        raise
    bar.close()
    if not _export(prof, target, _compile_stamp(compiled)):
        raise WorkbenchError(f"{target}: torch.profiler recorded nothing; check that torch was built with Kineto")
    cost = None
    if n_base and step_ms:
        cost = StepCost(statistics.median(base_ms), statistics.median(step_ms), detail)
    result = ProfileResult(target, detail, len(step_ms), dev, time.perf_counter() - t_start,
                           tuple(step_ms), cost, complete=True)
    if verbose:
        if cost is not None and opts["with_stack"]:
            print(cost)
        print(f"trace written: {target}")
    return result


# --------------------------------------------------------------------------------------------------
# block of code


class ProfileSession:
    """Context manager that profiles the code inside it; ``session.step()`` marks step boundaries
    (``ProfilerStep#0``, ``#1``, ... in the trace; without calls the block is one step).

    ``session.result`` holds the :class:`ProfileResult` after the block ends, also when the block
    raised (then ``complete`` is False and the exception propagates unchanged).
    """

    def __init__(self, path=None, *, detail: str = "standard", device: str | None = None,
                 out_dir=None, verbose: bool = False, profile_memory: bool | None = None,
                 metadata: dict | None = None, first_step: int = 0):
        detail_options(detail)
        self.metadata = dict(metadata or {})  # top-level trace metadata (workbench_unprofiled_step_ms, ...)
        self.first_step = int(first_step)     # the first ProfilerStep#N (the flight recorder: the run's step)
        self.detail = detail
        self.profile_memory = profile_memory   # None: as the detail level says
        self.device = _resolve_device(device)
        self.path = _trace_path(path, out_dir)
        self.verbose = verbose
        self.result: ProfileResult | None = None
        self._prof = None
        self._quiet = None
        self._t0 = 0.0
        self._t_step = 0.0
        self._step_ms: list[float] = []
        self._compile = None

    def __enter__(self) -> "ProfileSession":
        from torch.profiler import ProfilerAction

        # a schedule that always records makes torch emit ProfilerStep#N around each step
        options = {} if self.profile_memory is None else {"profile_memory": bool(self.profile_memory)}
        self._prof = _make_profiler(self.device, self.detail, lambda _step: ProfilerAction.RECORD, self.metadata,
                                    options=options)
        self._prof.step_num = self.first_step
        self._t0 = time.perf_counter()
        from workbench.capture.compile import CompileRecorder

        self._compile = CompileRecorder()
        self._compile.start()
        self._quiet = _quiet_kineto()  # until __exit__: the block's own code is part of the capture
        self._quiet.__enter__()
        try:
            self._prof.__enter__()
        except BaseException:
            self._quiet.__exit__(None, None, None)
            self._compile.stop()
            raise
        self._t_step = time.perf_counter()
        return self

    def step(self) -> None:
        """End the current step and start the next one (three calls: three steps; the code after the
        last call is the block's tail, not a step)."""
        if self._prof is None:
            raise WorkbenchError("session.step() called outside the `with profile(...)` block")
        _sync(self.device)
        now = time.perf_counter()
        self._step_ms.append((now - self._t_step) * 1e3)
        self._compile.call(self._step_ms[-1])
        self._prof.step()
        self._t_step = time.perf_counter()

    def __exit__(self, exc_type, exc, tb) -> bool:
        prof, self._prof = self._prof, None
        if exc is None:
            try:
                _sync(self.device)
            except BaseException:
                pass
            if not self._step_ms:  # no step() call: the block is the one step
                self._step_ms.append((time.perf_counter() - self._t_step) * 1e3)
                self._compile.call(self._step_ms[-1])
        if self._step_ms and exc is None and len(self._step_ms) + self.first_step == getattr(prof, "step_num", -1):
            # torch opened ProfilerStep#<step_num> at the last step(): mark it as the tail, not a step
            try:
                prof.add_metadata_json("workbench_trailing_step", json.dumps(int(prof.step_num)))
            except Exception:
                pass
        try:
            prof.__exit__(exc_type, exc, tb)
        finally:
            quiet, self._quiet = self._quiet, None
            if quiet is not None:
                quiet.__exit__(None, None, None)
            self._compile.stop()
        written = _export(prof, self.path, _compile_stamp(self._compile))
        if written:
            self.result = ProfileResult(
                self.path, self.detail, len(self._step_ms), self.device, time.perf_counter() - self._t0,
                tuple(self._step_ms), None, complete=exc is None,
            )
        if exc is not None:
            _annotate(exc, self.result)
            return False  # re-raise the original exception
        if not written:
            raise WorkbenchError(f"{self.path}: torch.profiler recorded nothing; check that torch was built with Kineto")
        if self.verbose:
            print(f"trace written: {self.path}", file=sys.stdout)
        return False


def profile(path=None, *, detail: str = "standard", device: str | None = None, out_dir=None,
            verbose: bool = False) -> ProfileSession:
    """Profile a block of code: ``with profile(detail="light") as s: ...``; then ``s.result``.

    Arguments as :func:`profile_steps`; CPU always, CUDA when ``device`` is (or defaults to) a GPU.
    """
    return ProfileSession(path, detail=detail, device=device, out_dir=out_dir, verbose=verbose)

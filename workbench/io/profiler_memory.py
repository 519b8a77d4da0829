"""torch.profiler's memory artifacts, read into what the allocator-snapshot analyses take.

* :func:`load_memory_timeline`: the category timeline of ``prof.export_memory_timeline`` (``[times,
  sizes]``) or ``export_memory_timeline_raw`` (event rows) as a frame of bytes per category.
* :func:`load_profiler_memory`: the ``[memory]`` events of a Kineto trace (``profile_memory=True``,
  CUDA or CPU) as a :class:`~workbench.io.snapshot.MemorySnapshot`, so the memory analyses and
  MemoryPanel work on a CPU-only profile too.

The trace is decoded like :func:`workbench.io.load_trace` decodes it: read and gunzipped in one
buffer, then msgspec into structs that declare only the fields used (``_kineto_schema.MemoryEvent``);
the bulky per-op ``args`` of a full-detail trace are skipped inside the decoder.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from workbench.errors import BadArtifact
from workbench.io import _kineto_schema as ks
from workbench.io._files import _short_repr, check_input, read_input
from workbench.io.snapshot import MemorySnapshot, snapshot_from_dict

__all__ = ["load_memory_timeline", "PROFILER_CATEGORIES", "load_profiler_memory"]

# torch.profiler's export_memory_timeline category order (index 0 of each size row is unused padding).
PROFILER_CATEGORIES = (
    "parameters",
    "optimizer_state",
    "inputs",
    "temporaries",
    "activations",
    "gradients",
    "autograd_detail",
    "unknown",
)


def load_memory_timeline(path: str | os.PathLike) -> pd.DataFrame:
    """torch.profiler's memory timeline as a frame: ``time_us`` and one ``<category>_bytes`` column per
    profiler category (:data:`PROFILER_CATEGORIES`).

    Reads both forms torch writes: ``export_memory_timeline`` (JSON ``[times, sizes]``) and
    ``export_memory_timeline_raw`` (JSON list of ``[time_ns, action, bytes, category]``; pre-existing
    tensors have time -1 and count from the start).
    """
    path = check_input(path, "a memory timeline file", "Write one with prof.export_memory_timeline(path, device='cuda:0')")
    try:
        data = msgspec.json.decode(read_input(path, "a memory timeline file"))
    except BadArtifact:
        raise
    except (OSError, EOFError, zlib.error, ValueError) as exc:  # msgspec.DecodeError is a ValueError
        raise BadArtifact(path, f"not a readable JSON memory timeline ({exc})",
                          "Write one with prof.export_memory_timeline(path, device='cuda:0')") from None
    except RecursionError:
        raise BadArtifact(path, "nests JSON too deeply to be a memory timeline (a hostile or damaged file)",
                          "Write one with prof.export_memory_timeline(path, device='cuda:0')") from None
    try:
        return _timeline_frame(path, data)
    except BadArtifact:
        raise
    except (TypeError, ValueError, OverflowError, IndexError) as exc:
        raise BadArtifact(path, f"not a torch.profiler memory timeline ({type(exc).__name__}: {_short_repr(str(exc))})",
                          "Write one with prof.export_memory_timeline(path, device='cuda:0')") from None


def _timeline_frame(path: Path, data) -> pd.DataFrame:
    cols = [f"{c}_bytes" for c in PROFILER_CATEGORIES]
    ncat = len(PROFILER_CATEGORIES)
    if data == [[], []] or data == []:
        # torch writes [[], []] (or [] for the raw form) when no tensor lived on the device asked for:
        # it compares devices exactly, so device='cuda' (no index) never matches tensors on 'cuda:0'.
        raise BadArtifact(path, "the memory timeline is empty: no memory samples for the device it was "
                                "exported for",
                          "Export with the device the tensors live on, index included: "
                          "prof.export_memory_timeline(path, device='cuda:0') (or 'cpu'), and record with "
                          "profile(profile_memory=True, record_shapes=True, with_stack=True)")
    if (isinstance(data, list) and len(data) == 2 and isinstance(data[0], list) and isinstance(data[1], list)
            and len(data[0]) == len(data[1]) and (not data[1] or isinstance(data[1][0], list))):
        times = np.asarray(data[0], dtype=np.int64)
        sizes = np.asarray(data[1], dtype=np.int64).reshape(len(times), -1)
        if sizes.shape[1] == ncat + 1:
            sizes = sizes[:, 1:]
        if sizes.shape[1] != ncat:
            raise BadArtifact(path, f"memory timeline rows have {sizes.shape[1]} values, expected {ncat + 1}",
                              "Write it with torch.profiler's export_memory_timeline")
        frame = pd.DataFrame(sizes, columns=cols)
        frame.insert(0, "time_us", times)
        return frame
    if isinstance(data, list) and data and isinstance(data[0], list) and len(data[0]) == 4:
        raw = np.asarray(data, dtype=np.int64)
        t = raw[:, 0]
        t_min = t[t > 0].min() if (t > 0).any() else 0
        t = np.where(t < 0, t_min, t) // 1000  # ns -> us
        cat = np.clip(raw[:, 3], 0, ncat - 1)
        delta = np.zeros((len(raw), ncat), dtype=np.int64)
        delta[np.arange(len(raw)), cat] = raw[:, 2]
        order = np.argsort(t, kind="stable")
        sizes = np.cumsum(delta[order], axis=0)
        frame = pd.DataFrame(sizes, columns=cols)
        frame.insert(0, "time_us", t[order])
        # one row per distinct time: the state after the last event at that time
        last = np.r_[frame["time_us"].to_numpy()[1:] != frame["time_us"].to_numpy()[:-1], True]
        return frame[last].reset_index(drop=True)
    raise BadArtifact(path, "not a torch.profiler memory timeline ([times, sizes] or raw event rows)",
                      "Write one with prof.export_memory_timeline(path, device='cuda:0')")


_PY_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")


def _lenient_event(e: dict) -> ks.MemoryEvent:
    a = e.get("args")
    args = None
    if isinstance(a, dict):
        args = ks.MemoryArgs(device_type=a.get("Device Type"), bytes=a.get("Bytes", 0), addr=a.get("Addr", 0),
                             total_allocated=a.get("Total Allocated", 0), total_reserved=a.get("Total Reserved", 0))
    return ks.MemoryEvent(ph=e.get("ph"), name=e.get("name"), cat=e.get("cat"), ts=e.get("ts"), dur=e.get("dur"),
                          pid=e.get("pid"), tid=e.get("tid"), args=args)


def _trace_events(path: Path) -> list[ks.MemoryEvent] | None:
    """The trace's events as :class:`~workbench.io._kineto_schema.MemoryEvent` (None: no traceEvents list)."""
    try:
        raw = read_input(path, "a trace file")
        try:
            return msgspec.json.decode(raw, type=ks.MemoryTraceFile).traceEvents
        except msgspec.ValidationError:
            # valid JSON of another shape (args that are not objects, a bare list, ...): decode it
            # untyped and keep what fits
            data = msgspec.json.decode(raw)
    except (OSError, EOFError, zlib.error, msgspec.DecodeError) as exc:
        raise BadArtifact(path, f"not a readable Kineto trace ({exc})", "Pass a .json or .json.gz trace") from None
    except RecursionError:
        raise BadArtifact(path, "nests JSON too deeply to be a trace (a hostile or damaged file)",
                          "Pass a .json or .json.gz trace") from None
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        return None
    return [_lenient_event(e) for e in events if isinstance(e, dict)]


def load_profiler_memory(path: str | os.PathLike, device: str | None = None) -> MemorySnapshot:
    """The ``[memory]`` events of a Kineto trace (torch.profiler with ``profile_memory=True``) as a
    :class:`MemorySnapshot`, so the memory analyses and MemoryPanel work on a CPU-only profile too.

    ``device``: 'cuda' or 'cpu' (default: cuda when the trace has CUDA memory events). Each event's
    stack is the chain of CPU ops and Python functions (``with_stack=True``) open on its thread at that
    moment, innermost first. The profiler reports exact sizes and running totals, so no block rounding
    is applied and ``extra['reserved_bytes']`` carries the allocator's reserved total per event.
    """
    path = check_input(path, "a trace file", "Write one with torch.profiler (profile_memory=True) and "
                                             "prof.export_chrome_trace(path)")
    try:
        return _profiler_memory(path, device)
    except BadArtifact:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise BadArtifact(path, f"a memory event has an unexpected shape ({type(exc).__name__}: "
                                f"{_short_repr(str(exc))})", "Pass a torch.profiler trace") from None


def _profiler_memory(path: Path, device: str | None) -> MemorySnapshot:
    events = _trace_events(path)
    if events is None:
        raise BadArtifact(path, "no traceEvents list: not a Kineto trace", "Pass a torch.profiler trace")
    mem = [e for e in events if e.name == "[memory]" and e.args is not None]
    if not mem:
        raise BadArtifact(path, "the trace holds no memory events",
                          "Profile with torch.profiler.profile(profile_memory=True)")
    types = {e.args.device_type for e in mem}
    want = {"cuda": 1, "cpu": 0}.get(device) if device else (1 if 1 in types else 0)
    mem = sorted((e for e in mem if e.args.device_type == want), key=lambda e: 0 if e.ts is None else e.ts)
    if not mem:
        raise BadArtifact(path, f"no {device} memory events in the trace", "Pick device='cpu' or 'cuda'")
    # stacks: the CPU ops open on the event's thread, then the Python functions open in the process at
    # that moment (Kineto puts the Python tracer on its own tid; during backward the allocating thread is
    # autograd's, and the Python stack that matters is the caller's, blocked in backward()).
    def intervals(cat, key):
        out: dict = {}
        for e in events:
            if e.ph == "X" and e.cat in cat and e.ts is not None:
                t0 = float(e.ts)
                out.setdefault(key(e), []).append((t0, t0 + float(e.dur or 0), e))
        for lst in out.values():
            lst.sort(key=lambda x: (x[0], -x[1]))
        return out

    ops_by = intervals(("cpu_op", "user_annotation"), lambda e: (e.pid, e.tid))
    py_by = intervals(("python_function",), lambda e: e.pid)

    def frame_of(op):
        m = None if op.name is None else _PY_FRAME.match(str(op.name))
        if op.cat == "python_function" and m:
            return {"name": m["name"], "filename": m["file"], "line": int(m["line"])}
        return {"name": "?" if op.name is None else str(op.name), "filename": f"<{op.cat}>", "line": 0}

    def open_at(lst, times):
        """For each time (sorted), the intervals covering it, innermost first (one sweep)."""
        res, stack, i = [], [], 0
        for t in times:
            while i < len(lst) and lst[i][0] <= t:
                stack.append(lst[i])
                i += 1
            stack = [s for s in stack if s[1] > t]  # drop what closed (nesting depth is small)
            res.append([frame_of(s[2]) for s in reversed(stack)])
        return res

    def ts_of(e) -> float:
        return 0.0 if e.ts is None else float(e.ts)

    frames_of: dict = {}
    for key in {(e.pid, e.tid) for e in mem}:
        mine = [e for e in mem if (e.pid, e.tid) == key]
        times = [ts_of(e) for e in mine]
        op_frames = open_at(ops_by.get(key, []), times)
        py_frames = open_at(py_by.get(key[0], []), times)
        for e, a, b in zip(mine, op_frames, py_frames):
            frames_of[id(e)] = a + b
    trace, reserved = [], []
    for e in mem:
        a = e.args
        nbytes = int(a.bytes)
        trace.append({"action": "alloc" if nbytes > 0 else "free_completed", "addr": int(a.addr),
                      "size": abs(nbytes), "stream": 0, "time_us": int(ts_of(e)),
                      "frames": frames_of.get(id(e), [])})
        reserved.append(int(a.total_reserved or 0))
    snap = snapshot_from_dict({"segments": [], "device_traces": [trace]}, source=str(path))
    snap.layout = "profiler"
    snap.extra.update(
        block_rounding=False,
        reserved_bytes=np.asarray(reserved, dtype=np.int64),
        total_allocated_bytes=np.asarray([int(e.args.total_allocated or 0) for e in mem], dtype=np.int64),
        device_type="cuda" if want == 1 else "cpu",
    )
    return snap

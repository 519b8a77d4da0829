"""Load CUDA caching-allocator snapshots safely, into columns; write them atomically.

A snapshot (``torch.cuda.memory._snapshot()`` pickled, often gzipped) is someone else's pickle: it is
read with :class:`~workbench.io._unpickle.SnapshotUnpickler` (``io/_unpickle.py``), which builds plain
containers only and raises :class:`~workbench.errors.UnsafePickle` before anything from the file runs.

The loaded snapshot is turned into columns straight away (:class:`MemorySnapshot`): one row per trace
event in numpy arrays, every distinct stack stored once (``stack_id`` per event, a separate frames
table), so 1.6 million events do not stay around as 1.6 million dicts. The garbage collector is
paused while the container-heavy pickle is built; on the 1.6M-event H200 snapshot that alone halves
the load time.

Layouts handled: the current dict (``segments``, ``device_traces``, ``allocator_settings``), the
older bare list of segments (no history), blocks that carry ``history`` (torch 1.13-2.0) instead of
``frames``, and trace entries without ``time_us`` (then the event index is used as time).

torch.profiler's memory artifacts (the category timeline, a Kineto trace's ``[memory]`` events) are
read by ``io/profiler_memory.py``; their loaders are importable from here too.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import pickle
import tempfile
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import BadArtifact, UnsafePickle
from workbench.io._files import open_maybe_gzip
from workbench.io._unpickle import SnapshotUnpickler

__all__ = [
    # loading
    "load_snapshot",
    "snapshot_from_dict",
    "load_snapshot_dict",
    "SnapshotUnpickler",
    "MemorySnapshot",
    "Action",
    "ACTIONS",
    # writing (used by workbench.capture.memory)
    "save_snapshot",
    # torch.profiler's category memory timeline (io/profiler_memory.py)
    "load_memory_timeline",
    "PROFILER_CATEGORIES",
    # torch.profiler's [memory] events, CPU-only profiles included (io/profiler_memory.py)
    "load_profiler_memory",
]


class Action(IntEnum):
    """Trace-entry actions of a snapshot; the value is the code of the categorical ``action`` column
    (``events["action"].cat.codes == Action.OOM``), the lower-case name its category."""

    ALLOC = 0
    FREE_REQUESTED = 1
    FREE_COMPLETED = 2
    SEGMENT_ALLOC = 3
    SEGMENT_FREE = 4
    SEGMENT_MAP = 5
    SEGMENT_UNMAP = 6
    OOM = 7
    SNAPSHOT = 8


# The categories of the `action` column, in code order: "alloc", "free_requested", ...
ACTIONS = tuple(a.name.lower() for a in Action)
_ACTION_CODE = {a: i for i, a in enumerate(ACTIONS)}

_FIX_REMAKE = (
    "Copy the file again (it may be incomplete) or write a new one with "
    "workbench.capture.record_memory_history() or torch.cuda.memory._dump_snapshot()"
)


def _open_bytes(path: Path):
    """A binary file object over the (possibly gzipped) file."""
    if not path.exists():
        raise BadArtifact(path, "no such file", "Check the path; snapshots usually end in .pickle or .pickle.gz")
    if path.is_dir():
        raise BadArtifact(path, "is a directory, not a snapshot file", "Pass the .pickle or .pickle.gz file")
    return open_maybe_gzip(path, "rb")


class _Progress:
    """A file wrapper that advances a tqdm bar by the bytes of the (compressed) file read so far."""

    def __init__(self, f, raw, bar):
        self._f, self._raw, self._bar, self._pos = f, raw, bar, 0

    def _tick(self):
        pos = self._raw.tell()
        if pos > self._pos:
            self._bar.update(pos - self._pos)
            self._pos = pos

    def read(self, n=-1):
        out = self._f.read(n)
        self._tick()
        return out

    def readinto(self, b):
        out = self._f.readinto(b)
        self._tick()
        return out

    def readline(self, limit=-1):
        return self._f.readline(limit)

    def peek(self, n=0):
        return self._f.peek(n) if hasattr(self._f, "peek") else b""

    def close(self):
        self._f.close()


# files larger than this show a progress bar when progress=None (about 2 s of loading)
_PROGRESS_BYTES = 8 * 2**20


def _progress_bar(progress, estimated_bytes: int, total: int, desc: str):
    if progress is None:
        progress = estimated_bytes >= _PROGRESS_BYTES
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False)


def load_snapshot_dict(path: str | os.PathLike, progress: bool | None = False) -> Any:
    """Unpickle a snapshot file with :class:`SnapshotUnpickler` and return the raw object
    (a dict for current torch, a list of segments for old torch). No torch needed.
    ``progress``: a tqdm bar over the bytes read (None: only for large files)."""
    path = Path(path)
    f = _open_bytes(path)
    bar = None
    if progress is not False:
        size = path.stat().st_size
        gz = isinstance(f, gzip.GzipFile)
        # snapshots compress ~20-40x: judge "large" by the estimated unpickled size, count compressed bytes
        bar = _progress_bar(progress, size * 20 if gz else size, size, f"reading {path.name}")
        if bar is not None:
            f = _Progress(f, f.fileobj if gz else f, bar)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them over and over
    try:
        obj = SnapshotUnpickler(f, path).load()
    except UnsafePickle:
        raise
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BadArtifact(path, f"truncated or corrupt file ({type(exc).__name__}: {exc})", _FIX_REMAKE) from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, OverflowError, MemoryError) as exc:
        raise BadArtifact(
            path,
            f"not a readable pickle ({type(exc).__name__}: {exc})",
            "Pass a CUDA allocator snapshot (.pickle or .pickle.gz); " + _FIX_REMAKE,
        ) from None
    except OSError as exc:  # gzip raises OSError subclasses for a bad header on some Pythons
        raise BadArtifact(path, f"cannot read the file ({exc})", _FIX_REMAKE) from None
    finally:
        f.close()
        if bar is not None:
            bar.close()
        if gc_was_enabled:
            gc.enable()
    return obj


@dataclass
class MemorySnapshot:
    """A snapshot as columns.

    ``events``: one row per trace event, columns ``device``, ``action`` (categorical, see
    :data:`ACTIONS`), ``addr``, ``size_bytes``, ``stream``, ``time_us``, ``stack_id`` (-1 when the event
    carries no stack), ``device_free_bytes`` (oom events only, else -1). Rows are in recorded order
    per device, devices one after the other.

    ``segments``: one row per segment at snapshot time (``device``, ``address``, ``total_size_bytes``,
    ``allocated_size_bytes``, ``active_size_bytes``, ``requested_size_bytes``, ``stream``,
    ``segment_type`` ('large'/'small'), ``is_expandable``, ``stack_id``).

    ``blocks``: one row per block (``segment``: row index in ``segments``, ``device``, ``address``,
    ``size_bytes``, ``requested_size_bytes``, ``state``, ``stack_id``).

    ``frames``: one row per distinct frame (``name``, ``filename``, ``line``); ``stacks``: a list, one
    tuple of frame ids per distinct stack, innermost frame first.
    """

    source: str
    events: pd.DataFrame
    segments: pd.DataFrame
    blocks: pd.DataFrame
    frames: pd.DataFrame
    stacks: list[tuple[int, ...]]
    allocator_settings: dict = field(default_factory=dict)
    layout: str = "current"
    has_history: bool = True
    extra: dict = field(default_factory=dict)  # e.g. the OOM sidecar written by capture_oom
    # record_function ranges the allocator saw while recording (``external_annotations``): one row per
    # START/END with ``stage``, ``name``, ``device``, ``time_us`` (e.g. ``ProfilerStep#3``)
    annotations: pd.DataFrame = field(default_factory=lambda: _annotations_frame([]))

    @property
    def devices(self) -> list[int]:
        devs = set(self.segments["device"].unique().tolist()) | set(self.events["device"].unique().tolist())
        return sorted(int(d) for d in devs)

    def stack_frames(self, stack_id: int) -> pd.DataFrame:
        """The frames of one stack, innermost first."""
        if stack_id < 0:
            return self.frames.iloc[0:0]
        return self.frames.iloc[list(self.stacks[stack_id])].reset_index(drop=True)

    def stack_text(self, stack_id: int, limit: int = 12, python_only: bool = True) -> str:
        """A readable stack, innermost first, ``file:line function`` per line."""
        if stack_id < 0:
            return "(no stack recorded)"
        names = self.frames["name"].to_numpy()
        files = self.frames["filename"].to_numpy()
        lines = self.frames["line"].to_numpy()
        out = []
        for fid in self.stacks[stack_id]:
            fn = files[fid]
            if python_only and not str(fn).endswith(".py"):
                continue
            out.append(f"{fn}:{lines[fid]} {names[fid]}")
            if len(out) >= limit:
                break
        return "\n".join(out) if out else "(only C++ frames)"


class _Interner:
    """Frame and stack interning: equal stacks get one id; frames are stored once."""

    _key = itemgetter("filename", "line", "name")

    def __init__(self):
        self.stack_ids: dict[tuple, int] = {}
        self.frame_ids: dict[tuple, int] = {}
        self.stacks: list[tuple[int, ...]] = []

    def stack(self, frames) -> int:
        if not frames:
            return -1
        try:
            key = tuple(map(self._key, frames))
        except (KeyError, TypeError):
            key = tuple(
                (str(f.get("filename", "?")), int(f.get("line", 0) or 0), str(f.get("name", "?")))
                if isinstance(f, dict) else ("?", 0, str(f))
                for f in frames
            )
        sid = self.stack_ids.get(key)
        if sid is None:
            fids = self.frame_ids
            ids = []
            for fr in key:
                fid = fids.get(fr)
                if fid is None:
                    fid = fids[fr] = len(fids)
                ids.append(fid)
            sid = self.stack_ids[key] = len(self.stacks)
            self.stacks.append(tuple(ids))
        return sid

    def frames_frame(self) -> pd.DataFrame:
        rows = sorted(self.frame_ids.items(), key=lambda kv: kv[1])
        return pd.DataFrame(
            {
                "name": pd.Series([k[2] for k, _ in rows], dtype=object),
                "filename": pd.Series([k[0] for k, _ in rows], dtype=object),
                "line": np.array([int(k[1] or 0) for k, _ in rows], dtype=np.int64),
            }
        )


def _block_frames(block: dict):
    frames = block.get("frames")
    if frames is None and block.get("history"):  # torch 1.13-2.0: history of (addr, real_size, frames)
        frames = block["history"][-1].get("frames")
    return frames or ()


def _events_columns(trace: list, device: int, interner: _Interner, cols: dict, bar=None) -> None:
    """Append one device's trace to the column lists, emptying the trace list as it goes (memory)."""
    n = len(trace)
    act = np.empty(n, dtype=np.int8)
    addr = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    stream = np.empty(n, dtype=np.int64)
    time_us = np.empty(n, dtype=np.int64)
    stack = np.empty(n, dtype=np.int32)
    dfree = np.full(n, -1, dtype=np.int64)
    code_get = _ACTION_CODE.get
    key = _Interner._key
    sid_get = interner.stack_ids.get
    istack = interner.stack

    def stack_of(e):
        fr = e.get("frames")
        if not fr:
            return -1
        try:
            sid = sid_get(tuple(map(key, fr)))
        except (KeyError, TypeError):
            sid = None
        return istack(fr) if sid is None else sid

    def ints(values, default=0):
        try:
            return np.asarray(values, dtype=np.int64)
        except (TypeError, ValueError):
            return np.asarray([default if v is None else int(v) for v in values], dtype=np.int64)

    unknown = set()
    oom = int(Action.OOM)
    # Column by column with comprehensions (C-speed loops), one chunk at a time; each chunk's dicts are
    # dropped right after, so the raw trace shrinks while the columns grow.
    chunk = 1 << 16
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        part = trace[start:stop]
        a = [code_get(e.get("action"), -1) for e in part]
        act[start:stop] = a
        addr[start:stop] = ints([e.get("addr", 0) for e in part])
        size[start:stop] = ints([e.get("size", 0) for e in part])
        stream[start:stop] = ints([e.get("stream", 0) for e in part])
        t = [e.get("time_us") for e in part]
        if None in t:
            t = [start + j if v is None else v for j, v in enumerate(t)]
        time_us[start:stop] = ints(t)
        stack[start:stop] = [stack_of(e) for e in part]
        if oom in a or -1 in a:
            for j, c in enumerate(a):
                if c == oom:
                    dfree[start + j] = int(part[j].get("device_free", -1) or -1)
                elif c == -1:
                    unknown.add(str(part[j].get("action")))
        del part, a, t
        trace[start:stop] = [None] * (stop - start)
        if bar is not None:
            bar.update(stop - start)
    keep = act >= 0
    if not keep.all():
        act, addr, size, stream, time_us, stack, dfree = (
            x[keep] for x in (act, addr, size, stream, time_us, stack, dfree)
        )
    cols["action"].append(act)
    cols["addr"].append(addr)
    cols["size_bytes"].append(size)
    cols["stream"].append(stream)
    cols["time_us"].append(time_us)
    cols["stack_id"].append(stack)
    cols["device_free_bytes"].append(dfree)
    cols["device"].append(np.full(len(act), device, dtype=np.int16))
    if unknown:
        cols["_unknown_actions"].extend(sorted(unknown))


def _annotations_frame(raw) -> pd.DataFrame:
    """``external_annotations`` as columns; entries that are not dicts with a name and a time are skipped."""
    rows = {"stage": [], "name": [], "device": [], "time_us": []}
    for a in raw if isinstance(raw, list) else []:
        if not isinstance(a, dict) or not isinstance(a.get("name"), str):
            continue
        try:
            t = int(a.get("time_us"))
            d = int(a.get("device", 0) or 0)
        except (TypeError, ValueError, OverflowError):
            continue
        rows["stage"].append(str(a.get("stage", "")))
        rows["name"].append(a["name"])
        rows["device"].append(d)
        rows["time_us"].append(t)
    return pd.DataFrame({"stage": pd.Series(rows["stage"], dtype=object), "name": pd.Series(rows["name"], dtype=object),
                         "device": np.asarray(rows["device"], dtype=np.int64),
                         "time_us": np.asarray(rows["time_us"], dtype=np.int64)})


def snapshot_from_dict(obj: Any, source: str = "<memory>", progress: bool | None = False) -> MemorySnapshot:
    """Columns from an unpickled snapshot object (``torch.cuda.memory._snapshot()`` output, or an
    older bare list of segments). The lists inside ``obj`` are emptied as they are converted."""
    path = source
    if isinstance(obj, list):
        layout = "segments_list"
        segments_raw, traces, settings, annotations = obj, [], {}, []
    elif isinstance(obj, dict) and ("segments" in obj or "device_traces" in obj):
        layout = "current"
        segments_raw = obj.get("segments") or []
        traces = obj.get("device_traces") or []
        settings = obj.get("allocator_settings") or {}
        annotations = obj.get("external_annotations") or []
    else:
        raise BadArtifact(
            path,
            f"not a CUDA allocator snapshot (found a {type(obj).__name__}"
            + (f" with keys {sorted(map(str, obj))[:6]}" if isinstance(obj, dict) else "")
            + ", expected a dict with 'segments' and 'device_traces' or a list of segments)",
            "Write one with torch.cuda.memory._dump_snapshot(path) or workbench.capture.record_memory_history()",
        )
    if not isinstance(segments_raw, list) or not all(isinstance(s, dict) for s in segments_raw):
        raise BadArtifact(path, "the snapshot's 'segments' is not a list of dicts", _FIX_REMAKE)

    interner = _Interner()
    seg_cols: dict[str, list] = {k: [] for k in (
        "device", "address", "total_size_bytes", "allocated_size_bytes", "active_size_bytes",
        "requested_size_bytes", "stream", "segment_type", "is_expandable", "stack_id")}
    blk_cols: dict[str, list] = {k: [] for k in (
        "segment", "device", "address", "size_bytes", "requested_size_bytes", "state", "stack_id")}
    try:
        for i, s in enumerate(segments_raw):
            blocks = s.get("blocks") or []
            addr = int(s.get("address", 0))
            total = int(s.get("total_size", sum(int(b.get("size", 0)) for b in blocks)))
            dev = int(s.get("device", 0))
            seg_cols["device"].append(dev)
            seg_cols["address"].append(addr)
            seg_cols["total_size_bytes"].append(total)
            alloc_sz = s.get("allocated_size")
            if alloc_sz is None:
                alloc_sz = sum(int(b.get("size", 0)) for b in blocks if b.get("state") == "active_allocated")
            seg_cols["allocated_size_bytes"].append(int(alloc_sz))
            act_sz = s.get("active_size")
            if act_sz is None:
                act_sz = sum(int(b.get("size", 0)) for b in blocks if str(b.get("state", "")).startswith("active"))
            seg_cols["active_size_bytes"].append(int(act_sz))
            seg_cols["requested_size_bytes"].append(int(s.get("requested_size", alloc_sz) or 0))
            seg_cols["stream"].append(int(s.get("stream", 0) or 0))
            stype = s.get("segment_type")
            if stype is None:  # old snapshots: 2 MiB segments are the small pool's
                stype = "small" if total == 2 * 1024 * 1024 else "large"
            seg_cols["segment_type"].append(str(stype))
            seg_cols["is_expandable"].append(bool(s.get("is_expandable", False)))
            seg_cols["stack_id"].append(interner.stack(s.get("frames")))
            baddr = addr
            for b in blocks:
                bsize = int(b.get("size", 0))
                blk_cols["segment"].append(i)
                blk_cols["device"].append(dev)
                blk_cols["address"].append(int(b.get("address", baddr)))
                blk_cols["size_bytes"].append(bsize)
                req = b.get("requested_size")
                if req is None and b.get("history"):
                    req = b["history"][-1].get("real_size")
                blk_cols["requested_size_bytes"].append(int(req if req is not None else bsize))
                blk_cols["state"].append(str(b.get("state", "unknown")))
                blk_cols["stack_id"].append(interner.stack(_block_frames(b)))
                baddr = int(b.get("address", baddr)) + bsize
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadArtifact(path, f"a segment or block has an unexpected shape ({exc})", _FIX_REMAKE) from None

    ev_cols: dict[str, list] = {k: [] for k in (
        "device", "action", "addr", "size_bytes", "stream", "time_us", "stack_id", "device_free_bytes",
        "_unknown_actions")}
    if not isinstance(traces, list):
        raise BadArtifact(path, "the snapshot's 'device_traces' is not a list", _FIX_REMAKE)
    total = sum(len(t) for t in traces if isinstance(t, list))
    bar = None
    if progress is not False and (progress or total >= 400_000):
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="columns", unit="event", unit_scale=True, leave=False)
    try:
        for dev, trace in enumerate(traces):
            if trace:
                _events_columns(trace, dev, interner, ev_cols, bar)
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise BadArtifact(path, f"a trace entry has an unexpected shape ({exc})", _FIX_REMAKE) from None
    finally:
        if bar is not None:
            bar.close()

    def cat(name, dtype):
        parts = ev_cols[name]
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    codes = cat("action", np.int8)
    events = pd.DataFrame(
        {
            "device": cat("device", np.int16),
            "action": pd.Categorical.from_codes(codes, categories=list(ACTIONS)),
            "addr": cat("addr", np.int64),
            "size_bytes": cat("size_bytes", np.int64),
            "stream": cat("stream", np.int64),
            "time_us": cat("time_us", np.int64),
            "stack_id": cat("stack_id", np.int32),
            "device_free_bytes": cat("device_free_bytes", np.int64),
        }
    )
    segments = pd.DataFrame(seg_cols)
    for c in ("address", "total_size_bytes", "allocated_size_bytes", "active_size_bytes",
              "requested_size_bytes", "stream"):
        segments[c] = segments[c].astype(np.int64)
    segments["device"] = segments["device"].astype(np.int64)
    segments["stack_id"] = segments["stack_id"].astype(np.int32)
    blocks = pd.DataFrame(blk_cols)
    for c in ("segment", "device", "address", "size_bytes", "requested_size_bytes"):
        blocks[c] = blocks[c].astype(np.int64)
    blocks["stack_id"] = blocks["stack_id"].astype(np.int32)
    extra = {}
    if ev_cols["_unknown_actions"]:
        extra["skipped_actions"] = sorted(set(ev_cols["_unknown_actions"]))
    return MemorySnapshot(
        source=str(source),
        events=events,
        segments=segments,
        blocks=blocks,
        frames=interner.frames_frame(),
        stacks=interner.stacks,
        allocator_settings=dict(settings) if isinstance(settings, dict) else {},
        layout=layout,
        has_history=len(events) > 0,
        extra=extra,
        annotations=_annotations_frame(annotations),
    )


def _sidecar_path(path: Path) -> Path:
    name = path.name
    for suffix in (".pickle.gz", ".pickle", ".pkl.gz", ".pkl"):
        if name.endswith(suffix):
            return path.with_name(name[: -len(suffix)] + ".oom.json")
    return path.with_name(name + ".oom.json")


def load_snapshot(path: str | os.PathLike, progress: bool | None = None) -> MemorySnapshot:
    """Load a ``.pickle`` or ``.pickle.gz`` allocator snapshot safely (no torch needed) as columns.

    ``progress``: tqdm bars while reading and converting (None: only for large files, which take more
    than a couple of seconds; Ctrl-C stops cleanly).

    If ``capture_oom`` wrote a JSON sidecar beside it (``<name>.oom.json``), its contents
    (requested size, the cap, torch's message, ``memory_stats()`` at the OOM) land in ``.extra['oom']``.

    >>> from workbench import samples
    >>> snap = load_snapshot(samples.path("h200_oom_snapshot"))
    >>> len(snap.segments), len(snap.events), snap.events["action"].iloc[-1]
    (36, 150, 'oom')
    """
    path = Path(path)
    gc_was_enabled = gc.isenabled()
    obj = load_snapshot_dict(path, progress)
    gc.disable()
    try:
        snap = snapshot_from_dict(obj, source=str(path), progress=progress)
    finally:
        del obj
        if gc_was_enabled:
            gc.enable()
    side = _sidecar_path(path)
    if side.is_file():
        try:
            snap.extra["oom"] = json.loads(side.read_text())
        except (OSError, ValueError):
            snap.extra["oom_sidecar_error"] = f"{side}: not readable JSON"
    return snap


def save_snapshot(snapshot: Any, path: str | os.PathLike, *, compresslevel: int = 6) -> Path:
    """Write a snapshot object (the dict from ``torch.cuda.memory._snapshot()``) as a gzip pickle,
    atomically: a temporary file in the same folder, then a rename, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel) as f:
            pickle.dump(snapshot, f, protocol=4)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_PROFILER_NAMES = ("load_memory_timeline", "PROFILER_CATEGORIES", "load_profiler_memory")


def __getattr__(name: str):
    # the profiler-memory loaders moved to io/profiler_memory.py (which imports this module): load it
    # on first use so that old imports from workbench.io.snapshot keep working without a cycle.
    if name in _PROFILER_NAMES:
        from workbench.io import profiler_memory

        return getattr(profiler_memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
read by :mod:`workbench.io.profiler_memory`.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import pickle
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.errors import BadArtifact, UnsafePickle
from workbench.io._files import (
    INT64_MAX,
    INT64_MIN,
    MAX_SKIP_BYTES,
    _fmt,
    _short_repr,
    atomic_write,
    check_input,
    drain,
    open_input,
    rss_bytes,
)
from workbench.io._unpickle import SnapshotUnpickler
from workbench.io.isolation import ReadProgress, can_isolate, make_bar, run_isolated

__all__ = [
    # loading
    "load_snapshot",
    "snapshot_from_dict",
    "load_snapshot_dict",
    "MemorySnapshot",
    "Action",
    "ACTIONS",
    # writing (used by workbench.capture.memory)
    "save_snapshot",
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


_HINT = "Check the path; snapshots usually end in .pickle or .pickle.gz"

# A real trace entry pickles to 30+ bytes (a dict of 5-6 keys); one that costs less is a memo reference
# to an entry already built (10^8 references to one dict fit in a 190 KB .gz). Refused before columns
# are built for them.
_MIN_ENTRY_BYTES = 16


# Real snapshot pickles compress 30-45x; memo references repeating one entry compress 250-1000x and
# cost 8 bytes of memory per 2 pickle bytes. A gzipped snapshot may inflate at most this much per
# compressed byte read (after the first 16 MiB), checked while the unpickler reads.
_SNAPSHOT_RATE = 128
_SNAPSHOT_RATE_FLOOR = 16 * 2**20


def _open_bytes(path: Path):
    """A binary reader over the (possibly gzipped) file: regular files only, decoded size bounded."""
    return open_input(path, "a snapshot file", _HINT, rate=_SNAPSHOT_RATE, rate_floor=_SNAPSHOT_RATE_FLOOR)


# What the unpickler may build: the process may grow by at most this multiple of the file's decoded
# limit while unpickling (a real snapshot grows it ~9x its pickle bytes, which compress ~40x: ~360x the
# file, the limit being 256x the file). Memo references cost 2 pickle bytes and 8 bytes of memory each.
_BUILD_FACTOR = 2
_BUILD_FLOOR = 512 * 2**20


def _watch_memory(bounded, path: Path):
    """A ``watch`` for the bounded reader: refuse once unpickling has grown the process by more than
    ``max(_BUILD_FLOOR, _BUILD_FACTOR * decoded limit)`` (checked every few MiB of pickle read)."""
    start = rss_bytes()
    if not start:
        return None
    budget = max(_BUILD_FLOOR, _BUILD_FACTOR * bounded._limit)

    def watch(count: int) -> None:
        grown = rss_bytes() - start
        if grown > budget:
            raise BadArtifact(
                path, f"unpickling it built more than {_fmt(budget)} of objects from {_fmt(count)} of pickle "
                      f"(the most allowed: {_BUILD_FACTOR} x the {_fmt(bounded._limit)} it may decode to; memo "
                      "references repeating entries, a hostile or damaged file): refused before going on",
                f"If the file is genuine, raise the limit: WORKBENCH_MAX_DECODED_BYTES="
                f"{max(bounded._limit * 4, 2**30) // 2**30}G")
    return watch


# files larger than this show a progress bar when progress=None (about 2 s of loading)
_PROGRESS_BYTES = 8 * 2**20


def _progress_bar(progress, estimated_bytes: int, total: int, desc: str):
    if progress is None:
        progress = estimated_bytes >= _PROGRESS_BYTES
    if not progress:
        return None
    return make_bar(total, desc, "B")


def load_snapshot_dict(path: str | os.PathLike, progress: bool | None = False) -> Any:
    """Unpickle a snapshot file with :class:`SnapshotUnpickler` and return the raw object
    (a dict for current torch, a list of segments for old torch). No torch needed.
    ``progress``: a tqdm bar over the bytes read (None: only for large files)."""
    obj, _ = _load_dict(Path(path), progress)
    return obj


def _load_dict(path: Path, progress) -> tuple[Any, int]:
    """The unpickled object and the number of (decompressed) pickle bytes it came from."""
    bounded = f = _open_bytes(path)
    bounded.watch = _watch_memory(bounded, path)
    bar = None
    if progress is not False:
        size = os.fstat(bounded.raw.fileno()).st_size
        gz = bounded.raw is not bounded._f
        # snapshots compress ~20-40x: judge "large" by the estimated unpickled size, count compressed bytes
        bar = _progress_bar(progress, size * 20 if gz else size, size, f"reading {path.name}")
        if bar is not None:
            f = ReadProgress(bounded, bounded.raw, bar)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them over and over
    try:
        obj = SnapshotUnpickler(f, path).load()
        bounded.watch = None
        # read to the end, so a gzip CRC or length mismatch is an error, not silence; a pickle ends the
        # file, so what follows it is skipped up to MAX_SKIP_BYTES only
        drain(bounded, path, MAX_SKIP_BYTES, "after the end of its pickle")
    except UnsafePickle:
        raise
    except BadArtifact:
        raise
    except RecursionError:
        raise BadArtifact(path, "nests containers too deeply to be a snapshot (a hostile or damaged file)",
                          _FIX_REMAKE) from None
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
    return obj, bounded.count


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
        if not isinstance(frames, list):
            raise TypeError(f"frames is a {type(frames).__name__}, not a list")
        try:
            _check_frames(frames)
            key = tuple(map(self._key, frames))
        except (KeyError, TypeError):
            key = tuple(
                (_text(f.get("filename", "?")), _frame_line(f.get("line", 0)), _text(f.get("name", "?")))
                if isinstance(f, dict) else ("?", 0, _text(f))
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
        for k, _ in rows:  # distinct frames only: cheap
            _frame_line(k[1])
        return pd.DataFrame(
            {
                "name": pd.Series([k[2] for k, _ in rows], dtype=object),
                "filename": pd.Series([k[0] for k, _ in rows], dtype=object),
                "line": np.array([int(k[1] or 0) for k, _ in rows], dtype=np.int64),
            }
        )


_get_file, _get_line, _get_name = itemgetter("filename"), itemgetter("line"), itemgetter("name")
_join = "".join


def _check_frames(frames) -> None:
    """TypeError/KeyError unless every frame's filename and name are str and its line a number: run
    *before* a frame's values are hashed (a 10^6-deep tuple in a file would crash hashing, in C). Three
    passes at C speed (join refuses non-str, sum refuses non-numbers)."""
    _join(map(_get_file, frames))
    _join(map(_get_name, frames))
    sum(map(_get_line, frames))


def _text(v) -> str:
    """A value from the file as text without recursing into it (a deep container is not printed)."""
    return v if isinstance(v, str) else _short_repr(v)


def _frame_line(v) -> int:
    if type(v) is int and INT64_MIN <= v <= INT64_MAX:
        return v
    if v is None:
        return 0
    raise _BadValue(f"a frame's line is {_short_repr(v)}, not a line number")


class _BadValue(Exception):
    """A value of the snapshot that cannot be what it claims (out of range, negative size, wrong type)."""


def _int_of(v, what: str, default: int = 0, nonneg: bool = False) -> int:
    if v is None:
        return default
    if type(v) is bool or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            v = int(v)
        else:
            raise _BadValue(f"{what} is {_short_repr(v)}, not an integer")
    if not INT64_MIN <= v <= INT64_MAX:
        raise _BadValue(f"{what} is {_short_repr(v)}, beyond a 64-bit integer")
    if nonneg and v < 0:
        raise _BadValue(f"{what} is negative ({v})")
    return v


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
            _check_frames(fr)  # types first: nothing from the file is hashed unchecked
            sid = sid_get(tuple(map(key, fr)))
        except (KeyError, TypeError):
            sid = None
        return istack(fr) if sid is None else sid

    def ints(values, what, nonneg=False):
        try:
            out = np.asarray(values, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            out = np.asarray([_int_of(v, what) for v in values], dtype=np.int64)
        if nonneg and out.size and out.min() < 0:
            raise _BadValue(f"{what} is negative ({int(out.min())})")
        return out

    def action_code(a):  # only a str is looked up: a deep tuple would crash hashing
        return code_get(a, -1) if type(a) is str else -1

    unknown = set()
    oom = int(Action.OOM)
    # Column by column with comprehensions (C-speed loops), one chunk at a time; each chunk's dicts are
    # dropped right after, so the raw trace shrinks while the columns grow.
    chunk = 1 << 16
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        part = trace[start:stop]
        a = [action_code(e.get("action")) for e in part]
        act[start:stop] = a
        addr[start:stop] = ints([e.get("addr", 0) for e in part], "a trace entry's addr")
        size[start:stop] = ints([e.get("size", 0) for e in part], "a trace entry's size", nonneg=True)
        stream[start:stop] = ints([e.get("stream", 0) for e in part], "a trace entry's stream")
        t = [e.get("time_us") for e in part]
        if None in t:
            t = [start + j if v is None else v for j, v in enumerate(t)]
        time_us[start:stop] = ints(t, "a trace entry's time_us")
        stack[start:stop] = [stack_of(e) for e in part]
        if oom in a or -1 in a:
            for j, c in enumerate(a):
                if c == oom:
                    dfree[start + j] = _int_of(part[j].get("device_free", -1) or -1, "an oom entry's device_free")
                elif c == -1:
                    unknown.add(_text(part[j].get("action")))
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
        if not (-2**63 <= t < 2**63 and 0 <= d < 2**15):  # out of range: skipped like any bad entry
            continue
        rows["stage"].append(str(a.get("stage", "")))
        rows["name"].append(a["name"])
        rows["device"].append(d)
        rows["time_us"].append(t)
    return pd.DataFrame({"stage": pd.Series(rows["stage"], dtype=object), "name": pd.Series(rows["name"], dtype=object),
                         "device": np.asarray(rows["device"], dtype=np.int64),
                         "time_us": np.asarray(rows["time_us"], dtype=np.int64)})


def snapshot_from_dict(obj: Any, source: str = "<memory>", progress: bool | None = False,
                       decoded_bytes: int | None = None) -> MemorySnapshot:
    """Columns from an unpickled snapshot object (``torch.cuda.memory._snapshot()`` output, or an
    older bare list of segments). The lists inside ``obj`` are emptied as they are converted.

    ``decoded_bytes``: the size of the pickle it came from; more entries than it can hold (memo
    references repeating one entry) are refused before any column is built. A value out of range
    (beyond int64, a negative size, a frame line that is not a number) raises :class:`BadArtifact`."""
    try:
        return _from_dict(obj, source, progress, decoded_bytes)
    except _BadValue as exc:
        raise BadArtifact(source, str(exc), "The file is damaged or was not written by torch") from None
    except RecursionError:
        raise BadArtifact(source, "nests containers too deeply to be a snapshot (a hostile or damaged file)",
                          _FIX_REMAKE) from None


def _from_dict(obj: Any, source: str, progress, decoded_bytes: int | None) -> MemorySnapshot:
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
            + (f" with keys {sorted(map(_text, obj))[:6]}" if isinstance(obj, dict) else "")
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
            if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
                raise _BadValue("a segment's 'blocks' is not a list of dicts")
            addr = _int_of(s.get("address", 0), "a segment's address", nonneg=True)
            bsizes = [_int_of(b.get("size", 0), "a block's size", nonneg=True) for b in blocks]
            total = _int_of(s.get("total_size", sum(bsizes)), "a segment's total_size", nonneg=True)
            dev = _int_of(s.get("device", 0), "a segment's device", nonneg=True)
            if dev > 2**15 - 1:
                raise _BadValue(f"a segment's device is {dev}, not a device index")
            seg_cols["device"].append(dev)
            seg_cols["address"].append(addr)
            seg_cols["total_size_bytes"].append(total)
            alloc_sz = s.get("allocated_size")
            if alloc_sz is None:
                alloc_sz = sum(z for z, b in zip(bsizes, blocks) if b.get("state") == "active_allocated")
            alloc_sz = _int_of(alloc_sz, "a segment's allocated_size", nonneg=True)
            seg_cols["allocated_size_bytes"].append(alloc_sz)
            act_sz = s.get("active_size")
            if act_sz is None:
                act_sz = sum(z for z, b in zip(bsizes, blocks) if _text(b.get("state", "")).startswith("active"))
            seg_cols["active_size_bytes"].append(_int_of(act_sz, "a segment's active_size", nonneg=True))
            seg_cols["requested_size_bytes"].append(
                _int_of(s.get("requested_size", alloc_sz) or 0, "a segment's requested_size", nonneg=True))
            seg_cols["stream"].append(_int_of(s.get("stream", 0) or 0, "a segment's stream"))
            stype = s.get("segment_type")
            if stype is None:  # old snapshots: 2 MiB segments are the small pool's
                stype = "small" if total == 2 * 1024 * 1024 else "large"
            seg_cols["segment_type"].append(_text(stype))
            seg_cols["is_expandable"].append(bool(s.get("is_expandable", False)))
            seg_cols["stack_id"].append(interner.stack(s.get("frames")))
            baddr = addr
            for b, bsize in zip(blocks, bsizes):
                blk_cols["segment"].append(i)
                blk_cols["device"].append(dev)
                baddr = _int_of(b.get("address", baddr), "a block's address", nonneg=True)
                blk_cols["address"].append(baddr)
                blk_cols["size_bytes"].append(bsize)
                req = b.get("requested_size")
                if req is None and b.get("history"):
                    req = b["history"][-1].get("real_size")
                blk_cols["requested_size_bytes"].append(
                    _int_of(req if req is not None else bsize, "a block's requested_size", nonneg=True))
                blk_cols["state"].append(_text(b.get("state", "unknown")))
                blk_cols["stack_id"].append(interner.stack(_block_frames(b)))
                baddr = min(baddr + bsize, INT64_MAX)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        raise BadArtifact(path, f"a segment or block has an unexpected shape ({exc})", _FIX_REMAKE) from None

    ev_cols: dict[str, list] = {k: [] for k in (
        "device", "action", "addr", "size_bytes", "stream", "time_us", "stack_id", "device_free_bytes",
        "_unknown_actions")}
    if not isinstance(traces, list):
        raise BadArtifact(path, "the snapshot's 'device_traces' is not a list", _FIX_REMAKE)
    total = sum(len(t) for t in traces if isinstance(t, list))
    if decoded_bytes is not None and total * _MIN_ENTRY_BYTES > decoded_bytes:
        raise BadArtifact(
            path, f"holds {total:,} trace entries in {decoded_bytes:,} bytes of pickle: entries repeated by "
                  "memo references (a hostile or damaged file), refused before building columns for them",
            _FIX_REMAKE)
    bar = None
    if progress is not False and (progress or total >= 400_000):
        bar = make_bar(total, "columns", "event")
    try:
        for dev, trace in enumerate(traces):
            if trace:
                if not isinstance(trace, list):
                    raise _BadValue(f"device_traces[{dev}] is a {type(trace).__name__}, not a list")
                if dev > 2**15 - 1:
                    raise _BadValue(f"device_traces has {len(traces):,} devices")
                _events_columns(trace, dev, interner, ev_cols, bar)
    except (TypeError, ValueError, AttributeError, OverflowError, KeyError, IndexError) as exc:
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
    path = check_input(path, "a snapshot file", _HINT)
    if _isolated():
        # in a forked child (io/isolation.py): the C unpickler hashes dict keys as it builds them, and a
        # tuple key nested 10^6 deep would crash this process; only the columns come back
        snap = run_isolated(partial(_load_columns, path, progress), path, _FIX_REMAKE,
                            progress=progress is not False, crashed="crashed the unpickler")
    else:
        snap = _load_columns(path, progress)
    side = _sidecar_path(path)
    if os.path.lexists(side):
        oom, problem = load_oom_sidecar(side)
        if oom is not None:
            snap.extra["oom"] = oom
        if problem:  # a bad sidecar never hides the snapshot: it is noted, and what was valid is kept
            snap.extra["oom_sidecar_error"] = problem
    return snap


ISOLATION_ENV = "WORKBENCH_SNAPSHOT_ISOLATION"


def _isolated() -> bool:
    """Whether snapshots are unpickled in a forked child (Linux; ``WORKBENCH_SNAPSHOT_ISOLATION=0``
    turns it off)."""
    return os.environ.get(ISOLATION_ENV, "1") != "0" and can_isolate()


def _load_columns(path: Path, progress) -> MemorySnapshot:
    gc_was_enabled = gc.isenabled()
    obj, decoded = _load_dict(path, progress)
    gc.disable()
    try:
        return snapshot_from_dict(obj, source=str(path), progress=progress, decoded_bytes=decoded)
    finally:
        del obj
        if gc_was_enabled:
            gc.enable()


# field -> (types, check) of the .oom.json sidecar capture_oom writes
_SIDECAR_INTS = ("device", "requested_bytes", "limit_bytes", "device_free_bytes")
_SIDECAR_MAX_BYTES = 16 * 2**20


def load_oom_sidecar(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """The ``.oom.json`` sidecar ``capture_oom`` writes, checked: ``(fields, problem)``. Fields of the
    wrong type or out of range are dropped and named in ``problem``; a file that cannot be read at all
    gives ``(None, problem)``. Never raises for a bad file."""
    try:
        with open_input(path, "an .oom.json sidecar", limit=_SIDECAR_MAX_BYTES) as f:
            data = json.loads(f.read())
    except BadArtifact as exc:
        return None, str(exc)
    except RecursionError:
        return None, f"{path}: nests JSON too deeply to be an .oom.json sidecar"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{path}: not readable JSON ({_text(str(exc))})"
    if not isinstance(data, dict):
        return None, f"{path}: not a JSON object"
    out, bad = {}, []
    for k, v in data.items():
        if k in _SIDECAR_INTS:
            ok = type(v) is int and 0 <= v <= INT64_MAX
        elif k == "time_unix_s":
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
        elif k in ("torch_version", "torch_message"):
            ok = v is None or isinstance(v, str)
        elif k == "memory_stats":
            ok = isinstance(v, dict) and all(isinstance(x, str) and type(y) in (int, float) for x, y in v.items())
        else:
            ok = False  # unknown keys are not carried into the analysis
        if ok:
            out[k] = v
        else:
            bad.append(str(k)[:40])
    problem = f"{path}: ignored field(s) of the wrong type or unknown: {', '.join(sorted(bad)[:8])}" if bad else None
    return out, problem


def save_snapshot(snapshot: Any, path: str | os.PathLike, *, compresslevel: int = 6) -> Path:
    """Write a snapshot object (the dict from ``torch.cuda.memory._snapshot()``) as a gzip pickle,
    atomically: a temporary file in the same folder, then a rename, so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(raw):
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compresslevel) as f:
            pickle.dump(snapshot, f, protocol=4)

    atomic_write(path, write)  # io/_files.py: mode kept, symlink/FIFO targets refused
    return path

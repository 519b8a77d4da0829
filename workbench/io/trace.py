"""Load Kineto traces (torch.profiler, ``export_chrome_trace``, HTA test traces) into one columnar frame.

>>> from workbench import samples
>>> from workbench.io import load_trace
>>> t = load_trace(samples.path("h200_train_step"))
>>> t.device, int((t.events["cat"] == "kernel").sum())
('NVIDIA H200', 1122)

How: the file is read (and gunzipped) into one ``bytes`` buffer and decoded by msgspec into small
typed structs that declare only the fields analysis needs (``_kineto_schema``); every other key,
including the bulky per-op ``args``, is skipped inside the decoder. The structs are turned into numpy
columns straight away and dropped, so what is kept is one DataFrame of the complete ('X') events with
interned (categorical) names, plus a metadata dict. See benchmarks/bench_trace.py for the speed
against Holistic Trace Analysis' parser and a plain gzip + orjson load.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import msgspec
import numpy as np
import pandas as pd

from workbench.errors import BadArtifact
from workbench.io import _kineto_schema as ks
from workbench.io._files import INT64_MAX, INT64_MIN, MAX_SKIP_BYTES, _fmt, check_input, open_input, read_input

__all__ = [
    # the loaded trace
    "Trace",
    "load_trace",
    "load_traces",
    "expand_trace_paths",
    # category names used in Trace.events["cat"]
    "GPU_CATEGORIES",
]

# Categories of events that run on the device (their pid is the device, their tid the stream).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

_FIX_COPY = "The file was probably cut off while being written or copied; copy it again or re-export the trace"
_FIX_TRACE = (
    "Give a Kineto trace written by torch.profiler (prof.export_chrome_trace(...) or "
    "tensorboard_trace_handler), .json or .json.gz"
)


@dataclass
class Trace:
    """One loaded Kineto trace.

    ``events`` holds the complete ('X') events, one row each, with the columns
    name, cat (categorical), ts_us, dur_us (float64, microseconds as in the file), pid, tid (int64;
    non-numeric ids such as Kineto's "Spans" pseudo-process get negative ids, named in
    ``metadata["string_ids"]``), stream, device (Int64, GPU events only), correlation, external_id
    (Int64), bytes, registers (Int64) and input_dims, input_types, concrete_inputs, grid, block (categorical JSON text)
    when the trace has them.
    """

    path: str
    events: pd.DataFrame
    metadata: dict[str, Any] = field(default_factory=dict)
    device: str = "unknown GPU"
    rank: int | None = None
    n_events: int = 0

    def __repr__(self) -> str:
        return (
            f"Trace({self.path!r}, device={self.device!r}, rank={self.rank}, "
            f"n_events={self.n_events}, x_events={len(self.events)})"
        )

    @property
    def kernels(self) -> pd.DataFrame:
        """The rows of ``events`` whose cat is ``kernel`` (a copy-free view is not promised)."""
        return self.events[self.events["cat"] == "kernel"]


# ---------------------------------------------------------------------------------------------- reading


_WHAT = "a trace file"
_HINT = "Check the path (a trace is a .json or .json.gz file)"


def _read_bytes(path: Path) -> bytes:
    # gzip whatever the extension says; regular files only; decoded size bounded (io/_files.py)
    return read_input(path, _WHAT, _HINT)


class _OutOfRange(Exception):
    """An integer field of the trace that does not fit its int64 column."""

    def __init__(self, field: str, value):
        super().__init__(field)
        self.field, self.value = field, value


def _too_deep(path: Path) -> BadArtifact:
    return BadArtifact(path, "nests JSON arrays/objects too deeply to be a trace (a hostile or damaged file)",
                       _FIX_TRACE)


def _decode(path: Path, data: bytes):
    """Decode the JSON document: (events, header) with strict types, falling back to lenient ones."""
    head = data[:4096].lstrip()[:1]  # a slice: lstrip() of the whole buffer would copy it
    if head not in (b"{", b"["):
        raise BadArtifact(path, "is not JSON (it does not start with '{' or '[')", _FIX_TRACE)
    is_list = head == b"["
    strict = (list[ks.Event], ks.TraceFile)[not is_list]
    try:
        doc = msgspec.json.decode(data, type=strict)
        lenient = False
    except msgspec.ValidationError:
        lenient_type = (list[ks.LenientEvent], ks.LenientTraceFile)[not is_list]
        try:
            doc = msgspec.json.decode(data, type=lenient_type)
        except msgspec.ValidationError as exc:
            raise BadArtifact(path, f"is JSON but not a Kineto trace ({exc})", _FIX_TRACE) from None
        except msgspec.DecodeError as exc:
            raise _json_error(path, exc) from None
        except RecursionError:
            raise _too_deep(path) from None
        lenient = True
    except msgspec.DecodeError as exc:
        raise _json_error(path, exc) from None
    except RecursionError:
        raise _too_deep(path) from None
    if is_list:
        return doc, None, lenient
    return doc.traceEvents, doc, lenient


def _json_error(path: Path, exc: Exception) -> BadArtifact:
    text = str(exc)
    if "truncated" in text.lower():
        return BadArtifact(
            path,
            "JSON ends early (the file is truncated)",
            "It was probably cut off while being written or copied; copy it again or re-export the trace",
        )
    return BadArtifact(path, f"is not valid JSON ({text})", _FIX_TRACE)


# ------------------------------------------------------------------------------------ lenient coercion

_ID_RE = re.compile(r"\s*(?:stream|Stream|GPU|thread)\s*(-?\d+)\s*")


def _as_int(v: Any) -> int:
    if type(v) is int:
        return v
    if isinstance(v, float) and v == v and not np.isinf(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return ks.NA_INT
    return ks.NA_INT


def _as_float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return float("nan")
    return float("nan")


def _as_raw(v: Any) -> msgspec.Raw:
    return ks.NA_RAW if v is None else msgspec.Raw(msgspec.json.encode(v))


def _strict_event(e: ks.LenientEvent) -> ks.Event:
    a = e.args if isinstance(e.args, dict) else {}
    args = ks.Args(
        external_id=_as_int(a.get("External id")),
        correlation=_as_int(a.get("correlation")),
        stream=_as_int(a.get("stream")),
        device=_as_int(a.get("device")),
        bytes=_as_int(a.get("bytes")),
        registers=_as_int(a.get("registers per thread")),
        input_dims=_as_raw(a.get("Input Dims")),
        input_types=_as_raw(a.get("Input type")),
        concrete_inputs=_as_raw(a.get("Concrete Inputs")),
        grid=_as_raw(a.get("grid")),
        block=_as_raw(a.get("block")),
        name=a.get("name"),
        labels=a.get("labels"),
        coll_name=a.get("Collective name"),
        pg_name=a.get("Process Group Name"),
        pg_id=a.get("Process Group ID"),
        seq=a.get("Seq"),
        msg_nelems=a.get("In msg nelems"),
        group_size=a.get("Group size"),
    )
    pid = e.pid if isinstance(e.pid, (int, str)) and not isinstance(e.pid, bool) else ks.NA_INT
    tid = e.tid if isinstance(e.tid, (int, str)) and not isinstance(e.tid, bool) else ks.NA_INT
    return ks.Event(
        ph=str(e.ph or ""), name=str(e.name if e.name is not None else ""), cat=str(e.cat or ""),
        ts=_as_float(e.ts), dur=_as_float(e.dur), pid=pid, tid=tid, args=args,
    )


# ------------------------------------------------------------------------------------------- columns


class _Interner:
    """Global codes for values seen chunk by chunk, in order of first appearance (None: -1)."""

    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def codes(self, values: list) -> np.ndarray:
        index = self.index
        for u in dict.fromkeys(values):  # the chunk's distinct values, in order, found in C
            if u is not None and u not in index:
                index[u] = len(index)
        return np.fromiter(map(index.get, values, repeat(-1)), np.int32, len(values))

    def categorical(self, codes: np.ndarray, canonical_json: bool = False) -> pd.Categorical:
        cats = list(self.index)
        if canonical_json:
            # raw JSON texts -> one compact spelling, so '[[1, 2]]' and '[[1,2]]' are the same shape
            cats = [_canonical_json(c) for c in cats]
            remap, uniq = pd.factorize(np.asarray(cats, dtype=object))
            codes = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1).astype(np.int32)
            cats = list(uniq)
        return pd.Categorical.from_codes(codes, categories=pd.Index(cats, dtype=object), validate=False)


def _canonical_json(raw: bytes) -> str:
    try:
        return msgspec.json.encode(msgspec.json.decode(raw)).decode()
    except msgspec.MsgspecError:
        return raw.decode("utf-8", "replace")


def _string_id(v: str, string_ids: dict[str, int]) -> int:
    if v not in string_ids:
        m = _ID_RE.fullmatch(v)
        n = int(m.group(1)) if m else None
        if n is None or not INT64_MIN < n <= INT64_MAX:
            n = -(sum(1 for x in string_ids.values() if x < 0) + 1)
        string_ids[v] = n
    return string_ids[v]


def _in_range(v, field: str) -> int:
    if not INT64_MIN <= v <= INT64_MAX:  # (INT64_MIN itself reads as missing: the NA sentinel)
        raise _OutOfRange(field, v)
    return v


def _ints(values: Iterable, n: int, field: str = "an integer field") -> np.ndarray:
    """int64 from ints; anything else (ROCm's string stream ids, ...) becomes the NA sentinel; an int
    beyond int64 raises _OutOfRange."""
    values = list(values)
    try:
        return np.fromiter(values, np.int64, n)
    except (TypeError, ValueError, OverflowError):
        return np.fromiter((_in_range(v, field) if type(v) is int else ks.NA_INT for v in values), np.int64, n)


def _ids(values: list, string_ids: dict[str, int], field: str = "pid") -> np.ndarray:
    """pid/tid as int64; strings like "stream 7" keep their number, other strings get negative ids."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError, OverflowError):
        pass
    # a few strings among ints (Kineto's "PyTorch Profiler" thread, "Spans"): only those are looked up
    values = list(values)
    for i, v in enumerate(values):
        if type(v) is not int:
            values[i] = _string_id(str(v), string_ids)
    try:
        return np.fromiter(values, np.int64, len(values))
    except OverflowError:
        return np.fromiter((_in_range(v, field) for v in values), np.int64, len(values))


_INT_ARGS = ("stream", "device", "correlation", "external_id", "bytes", "registers")
_RAW_ARGS = ("input_dims", "input_types", "concrete_inputs", "grid", "block")
_NO_RAWS = (ks.NA_RAW,) * len(_RAW_ARGS)  # an event with none of them (the decoder's shared default)


class _Columns:
    """Accumulates the columns of the 'X' events chunk by chunk; ``frame()`` builds the DataFrame."""

    def __init__(self) -> None:
        self.string_ids: dict[str, int] = {}
        self.interners = {k: _Interner() for k in ("name", "cat") + _RAW_ARGS}
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("name", "cat", "ts_us", "dur_us", "pid", "tid") + _INT_ARGS + _RAW_ARGS
        }
        self.meta_events: list[tuple] = []
        # (row, args) of the few 'X' events that carry collective args (record_param_comms, NCCL kernels)
        self.comm_args: list[tuple[int, Any]] = []
        self.n_x = 0
        self.n_events = 0
        self.n_with_ph = 0

    def add(self, events: list) -> None:
        """Take one chunk of decoded events (strict ``Event`` structs); keeps only columns."""
        self.n_events += len(events)
        self.n_with_ph += sum(1 for e in events if e.ph)
        self.meta_events.extend(
            (e.name, e.pid, e.tid, e.args.labels if e.name == "process_labels" else e.args.name)
            for e in events
            if e.ph == "M"
        )
        xs = [e for e in events if e.ph == "X"]
        n = len(xs)
        if not n:
            return
        parts, intern = self.parts, self.interners

        # map(attrgetter) iterates in C: about twice as fast as a generator expression per column.
        def col(attr, seq=xs):
            return map(attrgetter(attr), seq)

        parts["name"].append(intern["name"].codes(list(col("name"))))
        parts["cat"].append(intern["cat"].codes(list(col("cat"))))
        parts["ts_us"].append(np.fromiter(col("ts"), np.float64, n))
        parts["dur_us"].append(np.fromiter(col("dur"), np.float64, n))
        parts["pid"].append(_ids(list(col("pid")), self.string_ids, "pid"))
        parts["tid"].append(_ids(list(col("tid")), self.string_ids, "tid"))
        args = list(col("args"))
        base = self.n_x
        self.n_x += n
        self.comm_args.extend(
            (base + i, a) for i, a in enumerate(args)
            if a.coll_name is not None or a.seq is not None or a.pg_name is not None
        )
        for k in _INT_ARGS:
            try:  # the common case (all ints) without the intermediate list
                parts[k].append(np.fromiter(col(k, args), np.int64, n))
            except (TypeError, ValueError, OverflowError):
                parts[k].append(_ints(col(k, args), n, k))
        # most events lack most of these: the rows with any of them are found in one pass, and only the
        # present values are copied and interned (in row order, so the codes are those of interning every row)
        raws = list(map(attrgetter(*_RAW_ARGS), args))
        with_raw = np.fromiter(map(_NO_RAWS.__ne__, raws), bool, n)
        rows = np.flatnonzero(with_raw)
        raws = list(compress(raws, with_raw))
        for j, k in enumerate(_RAW_ARGS):
            codes = np.full(n, -1, np.int32)
            if rows.size:
                values = list(map(itemgetter(j), raws))
                present = np.fromiter(map(bool, values), bool, len(values))
                if present.any():
                    codes[rows[present]] = intern[k].codes([bytes(r) for r in compress(values, present)])
            parts[k].append(codes)

    def frame(self) -> pd.DataFrame:
        parts = self.parts

        def cat(k):
            return np.concatenate(parts[k]) if parts[k] else np.zeros(0, np.int64)

        cat_col = self.interners["cat"].categorical(cat("cat").astype(np.int32))
        cols: dict[str, Any] = {
            "name": self.interners["name"].categorical(cat("name").astype(np.int32)),
            "cat": cat_col,
            "ts_us": cat("ts_us").astype(np.float64),
            "dur_us": cat("dur_us").astype(np.float64),
            "pid": cat("pid"),
            "tid": cat("tid"),
        }
        is_gpu = np.asarray(pd.Series(cat_col).isin(GPU_CATEGORIES), dtype=bool)
        is_gpu_ann = np.asarray(cat_col == "gpu_user_annotation", dtype=bool)
        # stream/device only for events that run on the device; gpu_user_annotation carries them as tid/pid.
        stream = np.where(is_gpu_ann, cols["tid"], cat("stream"))
        device = np.where(is_gpu_ann, cols["pid"], cat("device"))
        cols["stream"] = pd.arrays.IntegerArray(stream, ~is_gpu | (stream == ks.NA_INT))
        cols["device"] = pd.arrays.IntegerArray(device, ~is_gpu | (device == ks.NA_INT))
        for k in ("correlation", "external_id", "bytes", "registers"):
            v = cat(k)
            na = v == ks.NA_INT
            if k in ("correlation", "external_id") or not na.all():
                cols[k] = pd.arrays.IntegerArray(v, na)
        for k in _RAW_ARGS:
            codes = cat(k).astype(np.int32)
            if (codes >= 0).any():
                cols[k] = self.interners[k].categorical(codes, canonical_json=True)
        if self.comm_args:
            cols.update(_comm_columns(self.comm_args, len(cols["ts_us"])))
        return pd.DataFrame(cols, copy=False)


def _comm_columns(comm_args: list, n: int) -> dict:
    """Sparse collective columns (only rows that carry them are set): coll_name, pg (process group
    name, or its id as text), seq, msg_nelems, group_size."""
    rows = np.fromiter((r for r, _ in comm_args), np.int64, len(comm_args))
    out: dict[str, Any] = {}
    for key, values in (
        ("coll_name", [a.coll_name for _, a in comm_args]),
        ("pg", [a.pg_name if a.pg_name is not None else a.pg_id for _, a in comm_args]),
    ):
        # categories from the few rows that carry the key (the same inference as over all n rows: the
        # other rows are None), codes spread over the whole column: no n-long object array to infer
        small = pd.Categorical(np.asarray([None if v is None else str(v) for v in values] + [None], dtype=object))
        codes = np.full(n, -1, small.codes.dtype)
        codes[rows] = small.codes[:-1]
        out[key] = pd.Categorical.from_codes(codes, dtype=small.dtype, validate=False)
    for key, attr in (("seq", "seq"), ("msg_nelems", "msg_nelems"), ("group_size", "group_size")):
        v = np.full(n, ks.NA_INT, np.int64)
        v[rows] = [_as_int(getattr(a, attr)) for _, a in comm_args]
        out[key] = pd.arrays.IntegerArray(v, v == ks.NA_INT)
    return out


# ------------------------------------------------------------------------------------ chunked reading

_CHUNK_BYTES = 1 << 20  # decode the events ~1 MiB of JSON at a time (4 MiB: ~15 MiB more peak RSS, no faster)
_PIECE_BYTES = 1 << 20  # inflate at most this much per step
_EVENTS_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


class _Fallback(Exception):
    """The chunked reader met something it does not handle; decode the whole document instead."""


def _text_pieces(path: Path) -> Iterator[bytes]:
    """The file's bytes, gunzipped on the fly when it is gzip (whatever the extension says), in pieces
    of at most ``_PIECE_BYTES``; regular files only, decoded size bounded, gzip CRC checked
    (``io/_files.py``)."""
    with open_input(path, _WHAT, _HINT) as f:
        while True:
            piece = f.read(_PIECE_BYTES)
            if not piece:
                return
            yield piece


def _decode_chunked(path: Path, columns: _Columns, chunk_bytes: int):
    """Decode the events chunk by chunk; returns the header struct (or None for a bare event list).

    The traceEvents array is cut at event boundaries (``}`` ``,`` ``{``) and each piece decoded as its
    own JSON array; a cut that falls inside a string makes that piece invalid JSON, which sends the
    caller back to whole-document decoding, so a strange file costs time but never a wrong answer.
    """
    dec_events = msgspec.json.Decoder(list[ks.Event])
    dec_header = msgspec.json.Decoder(ks.TraceFile)
    # A bytearray grows in amortised constant time (``bytes +=`` copies the whole buffer each time),
    # and ``scanned`` remembers how far boundaries were looked for, so a file with no event boundary
    # costs linear time, not quadratic.
    pending = bytearray()
    scanned = 0
    header_prefix = None
    is_list = False
    skipped = 0
    pieces = _text_pieces(path)
    for piece in pieces:
        if header_prefix is None:
            if piece.isspace() and pending:
                # whitespace between tokens before traceEvents: nothing to keep ('{' + GBs of spaces), and
                # a work bound on how much of it is skipped
                skipped += len(piece)
                if skipped > MAX_SKIP_BYTES:
                    raise BadArtifact(path, f"holds more than {_fmt(MAX_SKIP_BYTES)} of whitespace before its "
                                            f"events (refused after skipping {_fmt(MAX_SKIP_BYTES)}; a trace has a "
                                            "few bytes there)", _FIX_TRACE)
                continue
            start = max(0, len(pending) - 256)
            pending += piece
            head = bytes(pending[:4096]).lstrip()[:1]
            if head == b"[":
                is_list = True
                header_prefix = b""
                del pending[: pending.index(b"[") + 1]
            elif head == b"{":
                m = _EVENTS_START.search(pending, start)
                if m is None:
                    if len(pending) > 64 * chunk_bytes:
                        raise _Fallback
                    continue
                header_prefix = bytes(pending[: m.end()])
                del pending[: m.end()]
            elif pending.strip():
                raise BadArtifact(path, "is not JSON (it does not start with '{' or '[')", _FIX_TRACE)
            else:
                pending.clear()
                continue
        else:
            pending += piece
        while len(pending) >= chunk_bytes and len(pending) > scanned:
            n = len(pending)
            lo = max(0, scanned - 4096)
            # the last boundary: looked for in the last 64 KiB first (an event is rarely longer), then in
            # a window four times as wide each time, down to ``lo``
            last = None
            width = 1 << 16
            while True:
                tail_from = max(lo, n - width)
                for last in _EVENT_BOUNDARY.finditer(pending, tail_from):
                    pass
                if last is not None or tail_from == lo:
                    break
                width <<= 2
            scanned = n
            if last is None:
                break  # one huge event (or none at all): wait for more data
            chunk = b"[" + pending[: last.start() + 1] + b"]"
            del pending[: last.end() - 1]
            scanned = len(pending)  # the rest follows the last boundary: it holds none
            try:
                events = dec_events.decode(chunk)
            except msgspec.MsgspecError:
                raise _Fallback from None
            except RecursionError:
                raise _too_deep(path) from None
            del chunk
            columns.add(events)
            del events
    if header_prefix is None:
        if not pending.strip():
            raise BadArtifact(path, "is empty", _FIX_TRACE)
        raise _Fallback
    try:
        if is_list:
            columns.add(dec_events.decode(b"[" + pending))
            return None
        tail = dec_header.decode(b'{"traceEvents":[' + pending)
        head = dec_header.decode(header_prefix + b"]}")
    except msgspec.MsgspecError:
        raise _Fallback from None
    except RecursionError:
        raise _too_deep(path) from None
    columns.add(tail.traceEvents)
    tail.traceEvents = []
    for f in ks.TraceFile.__struct_fields__:  # header fields may sit before or after the events
        if f != "traceEvents" and getattr(tail, f) is None:
            setattr(tail, f, getattr(head, f))
    return tail


# ------------------------------------------------------------------------------------------ metadata


def _device_name(props: list, events: pd.DataFrame) -> str:
    is_gpu = events["cat"].isin(GPU_CATEGORIES)
    # ids and names are someone else's JSON: only ints are ids (a list is unhashable, a deep one would
    # crash hashing), only strings are names
    names = {}
    for i, p in enumerate(props):
        if isinstance(p, dict):
            pid = p.get("id", i)
            name = p.get("name")
            if type(pid) is int and isinstance(name, str) and name:
                names[pid] = name
    if names:
        devs = events.loc[is_gpu, "device"].dropna()
        if len(devs):
            dev = int(devs.mode().iloc[0])
            if dev in names:
                return str(names[dev])
        return str(next(iter(names.values())))
    if bool(is_gpu.any()):
        return "unknown GPU"
    return "cpu"


def _metadata(header, meta_events: list, events: pd.DataFrame, string_ids: dict[str, int]) -> dict:
    md: dict[str, Any] = {}
    if header is not None:
        for f in header.__struct_fields__:
            if f != "traceEvents":
                md[f] = getattr(header, f)
    props = md.get("deviceProperties")
    md["deviceProperties"] = props if isinstance(props, list) else []
    if not isinstance(md.get("distributedInfo"), dict):
        md["distributedInfo"] = None
    process_names: dict[int, str] = {}
    process_labels: dict[int, str] = {}
    thread_names: dict[int, dict[int, str]] = {}
    for kind, pid, tid, value in meta_events:
        if not isinstance(value, str):
            continue
        pid_i = pid if type(pid) is int else string_ids.get(pid, ks.NA_INT)
        if kind == "process_name":
            process_names[pid_i] = value
        elif kind == "process_labels":
            process_labels[pid_i] = value
        elif kind == "thread_name":
            tid_i = tid if type(tid) is int else string_ids.get(tid, ks.NA_INT)
            thread_names.setdefault(pid_i, {})[tid_i] = value.strip()
    md["process_names"] = process_names
    md["process_labels"] = process_labels
    md["thread_names"] = thread_names
    md["string_ids"] = {v: k for k, v in string_ids.items()}
    real = np.asarray(events["cat"] != "Trace", dtype=bool) if len(events) else np.zeros(0, bool)
    if real.any():  # on the columns (taking the rows would copy the whole frame for two numbers)
        ts = events["ts_us"].to_numpy(np.float64)[real]
        dur = events["dur_us"].to_numpy(np.float64)[real]
        md["trace_start_us"] = float(ts.min())
        md["trace_end_us"] = float((ts + np.where(np.isnan(dur), 0.0, dur)).max())
    else:
        md["trace_start_us"] = md["trace_end_us"] = None
    return md


# ---------------------------------------------------------------------------------------------- public


def load_trace(path: str | os.PathLike, *, on_stage: Callable[[str], None] | None = None) -> Trace:
    """Load one Kineto trace (.json or .json.gz) into a :class:`Trace`.

    ``on_stage`` (optional) is called with a short description as each stage starts ("decoding",
    "building columns"); the CLI uses it for progress on big files.

    Raises :class:`~workbench.errors.BadArtifact` naming the file and the fix when it is missing,
    truncated, not JSON, or JSON that is not a trace.
    """
    p = Path(path)
    try:
        return _load(p, on_stage or (lambda _s: None))
    except RecursionError:  # a value nested deeper than the interpreter recurses (lenient coercion)
        raise _too_deep(p) from None
    except _OutOfRange as exc:
        from workbench.io._files import _short_repr

        raise BadArtifact(p, f"an event's {exc.field} is {_short_repr(exc.value)}, beyond a 64-bit integer",
                          "The file is damaged or not written by torch.profiler") from None


def _load(p: Path, stage: Callable[[str], None], chunk_bytes: int = _CHUNK_BYTES, chunked: bool = True) -> Trace:
    """load_trace with the knobs tests need: the chunk size, and whole-document decoding."""
    stage("decoding")
    columns = _Columns()
    header = None
    if chunked:
        try:
            header = _decode_chunked(p, columns, chunk_bytes)
        except _Fallback:
            columns, chunked = _Columns(), False
    if not chunked:
        data = _read_bytes(p)
        events, header, lenient = _decode(p, data)
        del data
        if lenient:
            events = [_strict_event(e) for e in events]
        columns.add(events)
        del events
    if columns.n_events == 0:
        if header is None:
            raise BadArtifact(p, "is a JSON list with no trace events", _FIX_TRACE)
        raise BadArtifact(
            p, "has no 'traceEvents' (it is JSON, but not a Kineto trace, or the trace is empty)", _FIX_TRACE
        )
    if columns.n_with_ph == 0:
        raise BadArtifact(p, "has a traceEvents list but its items are not trace events (no 'ph')", _FIX_TRACE)
    stage("building columns")
    frame = columns.frame()
    # an 'X' event without a usable time (missing, not a number, infinite) cannot be placed anywhere:
    # dropped here and counted, so no analysis or figure meets a NaN start
    ts = frame["ts_us"].to_numpy()
    untimed = ~np.isfinite(ts)
    if untimed.any():
        frame = frame[~untimed].reset_index(drop=True)
        ts = frame["ts_us"].to_numpy()
    _check_times(p, frame, ts)
    md = _metadata(header, columns.meta_events, frame, columns.string_ids)
    md["untimed_events_dropped"] = int(untimed.sum())
    frame = _drop_trailing_step(frame, md)
    md["n_events"] = columns.n_events
    dist = md.get("distributedInfo")
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Trace(
        path=str(p),
        events=frame,
        metadata=md,
        device=_device_name(md["deviceProperties"], frame),
        rank=int(rank) if isinstance(rank, int) and not isinstance(rank, bool) else None,
        n_events=columns.n_events,
    )


_TRACE_SUFFIXES = (".json", ".json.gz", ".gz")

# A time in a trace is microseconds (since the epoch or a steady clock: ~1.7e15 today); every later
# step (the one clock of analysis.timeline, figures) handles it as int64 nanoseconds, which end here.
MAX_TIME_US = INT64_MAX / 1000


def _check_times(p: Path, frame: pd.DataFrame, ts: np.ndarray) -> None:
    """Refuse an event whose start or duration no clock can hold (ts 1e308): one line naming it."""
    dur = frame["dur_us"].to_numpy()
    bad = (np.abs(ts) > MAX_TIME_US) | (np.isfinite(dur) & (np.abs(dur) > MAX_TIME_US))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        field, value = ("ts", ts[i]) if abs(ts[i]) > MAX_TIME_US else ("dur", dur[i])
        raise BadArtifact(p, f"event {str(frame['name'].iloc[i])[:60]!r} has {field} {value:g} us, beyond any clock "
                             f"(at most {MAX_TIME_US:.2g} us; {int(bad.sum()):,} such event(s))",
                          "The file is damaged or was not written by torch.profiler; re-export the trace")


def expand_trace_paths(sources: Sequence[str | os.PathLike] | str | os.PathLike) -> tuple[list[Path], list[tuple[str, str]]]:
    """Files, folders and glob patterns -> (candidate trace files in sorted order, skipped).

    A folder contributes its regular, non-hidden files (not recursively); a pattern (``*``, ``?``, ``[``)
    its matches. Files found that way whose names do not end in .json / .json.gz / .gz are skipped
    with a note ``(path, reason)``; a path named explicitly is always kept (its loader says what is
    wrong with it). A missing path or a pattern that matches nothing raises BadArtifact.
    """
    import glob

    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    out: list[Path] = []
    skipped: list[tuple[str, str]] = []

    def found(files):
        for f in sorted(files):
            if f.name.startswith("."):
                continue
            if not f.is_file():  # FIFOs, sockets, devices found in a folder or by a pattern: never opened
                if f.exists() and not f.is_dir():
                    skipped.append((str(f), "not a regular file"))
                continue
            if f.name.lower().endswith(_TRACE_SUFFIXES):
                out.append(f)
            else:
                skipped.append((str(f), "not a .json or .json.gz file"))

    for s in sources:
        p = Path(s)
        text = str(s)
        if p.is_dir():
            found(p.iterdir())
        elif p.exists():
            out.append(check_input(p, "a trace file"))  # a FIFO or device named here is refused, not read
        elif any(c in text for c in "*?["):
            matches = [Path(m) for m in glob.glob(text)]
            if not matches:
                raise BadArtifact(text, "matches no file", "Check the pattern (quote it so the shell does not expand it)")
            found(m for m in matches if not m.is_dir())
        else:
            raise BadArtifact(p, "no such file or folder", "Check the path (a trace is a .json or .json.gz file)")
    seen: set[Path] = set()
    uniq = [x for x in out if not (x.resolve() in seen or seen.add(x.resolve()))]
    return uniq, skipped


def _drop_trailing_step(frame: pd.DataFrame, md: dict) -> pd.DataFrame:
    """``workbench.capture.profile()`` sessions: torch opens one more ProfilerStep#N at the last
    ``session.step()``, holding only the block's tail; it is not one of the user's steps (three
    ``step()`` calls are three steps), so its annotation rows are dropped (the events inside stay)."""
    n = md.get("workbench_trailing_step")
    if not isinstance(n, int) or isinstance(n, bool) or not len(frame):
        return frame
    names = frame["name"].astype(str)
    drop = (names == f"ProfilerStep#{n}").to_numpy()
    if not drop.any():
        return frame
    return frame.loc[~drop].reset_index(drop=True)


def _load_in_worker(path: Path):
    """Worker side of load_traces: errors travel back as plain values (BadArtifact does not pickle)."""
    try:
        return load_trace(path), None
    except BadArtifact as exc:
        return None, (exc.path, exc.problem, exc.fix)


def load_traces(
    paths: Sequence[str | os.PathLike],
    processes: int | None = None,
    on_skip: Callable[[str, str], None] | None = None,
) -> list[Trace]:
    """Load several traces (e.g. one per rank) in parallel worker processes; order follows ``paths``.

    ``processes`` defaults to min(len(paths), os.cpu_count()); 1 loads in this process. The first
    bad file raises :class:`~workbench.errors.BadArtifact` as :func:`load_trace` would, unless
    ``on_skip(path, message)`` is given: then each bad file is reported to it and left out.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        return []
    n = processes or min(len(paths), os.cpu_count() or 1)
    if n <= 1 or len(paths) == 1:
        results = [_load_in_worker(p) for p in paths]
        return _collect(results, on_skip)
    pool = ProcessPoolExecutor(max_workers=n)
    try:
        results = list(pool.map(_load_in_worker, paths))
    except BaseException:  # Ctrl-C: do not wait for queued files
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return _collect(results, on_skip)


def _collect(results, on_skip) -> list[Trace]:
    out = []
    for trace, err in results:
        if err is not None:
            if on_skip is None:
                raise BadArtifact(*err)
            on_skip(err[0], str(BadArtifact(*err)))
            continue
        out.append(trace)
    return out

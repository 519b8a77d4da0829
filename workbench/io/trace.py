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

import gzip
import os
import re
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import msgspec
import numpy as np
import pandas as pd

from workbench.errors import BadArtifact
from workbench.io import _kineto_schema as ks

__all__ = [
    # the loaded trace
    "Trace",
    "load_trace",
    "load_traces",
    # category names used in Trace.events["cat"]
    "GPU_CATEGORIES",
]

# Categories of events that run on the device (their pid is the device, their tid the stream).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

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
    (Int64), bytes, registers (Int64) and input_dims, input_types, grid, block (categorical JSON text)
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


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BadArtifact(path, "no such file", "Check the path (a trace is a .json or .json.gz file)") from None
    except IsADirectoryError:
        raise BadArtifact(path, "is a directory, not a trace file", "Give the path of one .json/.json.gz trace") from None
    except PermissionError:
        raise BadArtifact(path, "cannot be read (permission denied)", "Fix the file's permissions") from None
    if raw[:2] == b"\x1f\x8b":  # gzip, whatever the extension says
        try:
            return gzip.decompress(raw)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise BadArtifact(
                path,
                f"gzip data is truncated or corrupt ({exc})",
                "The file was probably cut off while being written or copied; copy it again or re-export the trace",
            ) from None
    return raw


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
        lenient = True
    except msgspec.DecodeError as exc:
        raise _json_error(path, exc) from None
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
        grid=_as_raw(a.get("grid")),
        block=_as_raw(a.get("block")),
        name=a.get("name"),
        labels=a.get("labels"),
    )
    pid = e.pid if isinstance(e.pid, (int, str)) and not isinstance(e.pid, bool) else ks.NA_INT
    tid = e.tid if isinstance(e.tid, (int, str)) and not isinstance(e.tid, bool) else ks.NA_INT
    return ks.Event(
        ph=str(e.ph or ""), name=str(e.name if e.name is not None else ""), cat=str(e.cat or ""),
        ts=_as_float(e.ts), dur=_as_float(e.dur), pid=pid, tid=tid, args=args,
    )


# ------------------------------------------------------------------------------------------- columns


def _categorical(values: list) -> pd.Categorical:
    codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=True)
    return pd.Categorical.from_codes(codes, categories=pd.Index(uniques, dtype=object))


def _int_column(values: Iterable, n: int) -> pd.arrays.IntegerArray:
    arr = np.fromiter(values, np.int64, n)
    return pd.arrays.IntegerArray(arr, arr == ks.NA_INT)


def _string_id(v: str, string_ids: dict[str, int]) -> int:
    if v not in string_ids:
        m = _ID_RE.fullmatch(v)
        string_ids[v] = int(m.group(1)) if m else -(sum(1 for x in string_ids.values() if x < 0) + 1)
    return string_ids[v]


def _id_column(values: list, string_ids: dict[str, int]) -> np.ndarray:
    """pid/tid as int64; strings like "stream 7" keep their number, other strings get negative ids."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except (TypeError, ValueError):
        pass
    return np.fromiter(
        (v if type(v) is int else _string_id(str(v), string_ids) for v in values), np.int64, len(values)
    )


def _raw_column(raws: list[msgspec.Raw]) -> pd.Categorical | None:
    """Intern raw JSON texts: factorize the bytes, decode only the distinct ones."""
    if not any(raws):
        return None
    as_bytes = np.empty(len(raws), dtype=object)
    as_bytes[:] = [bytes(r) if r else None for r in raws]
    codes, uniques = pd.factorize(as_bytes, use_na_sentinel=True)
    cats = pd.Index([u.decode("utf-8", "replace") for u in uniques], dtype=object)
    return pd.Categorical.from_codes(codes, categories=cats)


def _events_frame(xs: Sequence[ks.Event], string_ids: dict[str, int]) -> pd.DataFrame:
    # map(attrgetter) iterates in C: about twice as fast as a generator expression per column.
    n = len(xs)

    def col(attr, seq=xs):
        return map(attrgetter(attr), seq)

    cat = _categorical(list(col("cat")))
    cols: dict[str, Any] = {
        "name": _categorical(list(col("name"))),
        "cat": cat,
        "ts_us": np.fromiter(col("ts"), np.float64, n),
        "dur_us": np.fromiter(col("dur"), np.float64, n),
        "pid": _id_column(list(col("pid")), string_ids),
        "tid": _id_column(list(col("tid")), string_ids),
    }
    args = list(col("args"))
    try:
        stream = np.fromiter(col("stream", args), np.int64, n)
    except (TypeError, ValueError):  # ROCm runtime events carry a string stream
        stream = np.fromiter((s if type(s) is int else ks.NA_INT for s in col("stream", args)), np.int64, n)
    device = np.fromiter(col("device", args), np.int64, n)
    # stream/device only for events that run on the device; gpu_user_annotation carries them as pid/tid.
    is_gpu = np.asarray(pd.Series(cat).isin(GPU_CATEGORIES), dtype=bool)
    is_gpu_ann = np.asarray(cat == "gpu_user_annotation", dtype=bool)
    stream = np.where(is_gpu_ann, cols["tid"], stream)
    device = np.where(is_gpu_ann, cols["pid"], device)
    cols["stream"] = pd.arrays.IntegerArray(stream, ~is_gpu | (stream == ks.NA_INT))
    cols["device"] = pd.arrays.IntegerArray(device, ~is_gpu | (device == ks.NA_INT))
    cols["correlation"] = _int_column(col("correlation", args), n)
    cols["external_id"] = _int_column(col("external_id", args), n)
    for name in ("bytes", "registers"):
        values = _int_column(col(name, args), n)
        if not values.isna().all():
            cols[name] = values
    for name in ("input_dims", "input_types", "grid", "block"):
        values = _raw_column(list(col(name, args)))
        if values is not None:
            cols[name] = values
    return pd.DataFrame(cols, copy=False)


# ------------------------------------------------------------------------------------------ metadata


def _device_name(props: list, events: pd.DataFrame) -> str:
    is_gpu = events["cat"].isin(GPU_CATEGORIES)
    names = {p.get("id", i): p.get("name") for i, p in enumerate(props) if isinstance(p, dict)}
    names = {k: v for k, v in names.items() if v}
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
    real = events[events["cat"] != "Trace"] if len(events) else events
    if len(real):
        md["trace_start_us"] = float(real["ts_us"].min())
        md["trace_end_us"] = float((real["ts_us"] + real["dur_us"].fillna(0.0)).max())
    else:
        md["trace_start_us"] = md["trace_end_us"] = None
    return md


# ---------------------------------------------------------------------------------------------- public


def load_trace(path: str | os.PathLike, *, on_stage: Callable[[str], None] | None = None) -> Trace:
    """Load one Kineto trace (.json or .json.gz) into a :class:`Trace`.

    ``on_stage`` (optional) is called with a short description as each stage starts ("reading",
    "decoding", "building columns"); the CLI uses it for progress on big files.

    Raises :class:`~workbench.errors.BadArtifact` naming the file and the fix when it is missing,
    truncated, not JSON, or JSON that is not a trace.
    """
    p = Path(path)
    stage = on_stage or (lambda _s: None)
    stage("reading")
    data = _read_bytes(p)
    stage("decoding")
    events, header, lenient = _decode(p, data)
    if header is None and not events:
        raise BadArtifact(p, "is a JSON list with no trace events", _FIX_TRACE)
    if header is not None and not events:
        raise BadArtifact(
            p, "has no 'traceEvents' (it is JSON, but not a Kineto trace, or the trace is empty)", _FIX_TRACE
        )
    if lenient:
        events = [_strict_event(e) for e in events]
    stage("building columns")
    n_events = len(events)
    xs = [e for e in events if e.ph == "X"]
    meta_events = [
        (e.name, e.pid, e.tid, e.args.labels if e.name == "process_labels" else e.args.name)
        for e in events
        if e.ph == "M"
    ]
    string_ids: dict[str, int] = {}
    if not xs and not any(e.ph for e in events):
        raise BadArtifact(p, "has a traceEvents list but its items are not trace events (no 'ph')", _FIX_TRACE)
    frame = _events_frame(xs, string_ids)
    del xs, events, data
    md = _metadata(header, meta_events, frame, string_ids)
    md["n_events"] = n_events
    dist = md.get("distributedInfo")
    rank = dist.get("rank") if isinstance(dist, dict) else None
    return Trace(
        path=str(p),
        events=frame,
        metadata=md,
        device=_device_name(md["deviceProperties"], frame),
        rank=int(rank) if isinstance(rank, int) else None,
        n_events=n_events,
    )


def load_traces(paths: Sequence[str | os.PathLike], processes: int | None = None) -> list[Trace]:
    """Load several traces (e.g. one per rank) in parallel worker processes; order follows ``paths``.

    ``processes`` defaults to min(len(paths), os.cpu_count()); 1 loads in this process.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        return []
    n = processes or min(len(paths), os.cpu_count() or 1)
    if n <= 1 or len(paths) == 1:
        return [load_trace(p) for p in paths]
    with ProcessPoolExecutor(max_workers=n) as pool:
        return list(pool.map(load_trace, paths))


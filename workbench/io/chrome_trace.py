"""Write trace events as a Chrome trace JSON file, the format Perfetto's UI (https://ui.perfetto.dev)
and chrome://tracing open: the "open in Perfetto" of the ProfilerPanel's timeline.

    from workbench.analysis.windows import flow_pairs, trace_window
    w = trace_window(trace, start_us, end_us, max_events=10**9)
    write_chrome_trace(w.events, "window.json", metadata=trace.metadata, flows=flow_pairs(w.events))

Each row of ``Trace.events`` becomes one complete event (``"ph": "X"``, ``ts``/``dur`` in µs as in the
source) with its ids in ``args`` (correlation, External id, stream, device, grid, block, Input Dims,
bytes); process and thread names come back from the metadata (``process_name``, ``thread_name``
``"M"`` events), ids the loader stored as negative numbers (non-numeric in the file) get their text back
as the name of a positive id. ``flows`` (rows with ``launch_index`` and ``gpu_index``, labels of the
events) become Kineto's own flow pairs (``"ph": "s"`` at the launch, ``"ph": "f", "bp": "e"`` at the
kernel, category ``ac2g``), so Perfetto draws the launch -> kernel arrows. A name ending in ``.gz`` is
gzipped. The file is written atomically (a temporary file in the same folder, then renamed), readable by
the group (mode 0644 under the usual umask).
"""

from __future__ import annotations

import gzip
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

__all__ = ["chrome_trace_document", "write_chrome_trace"]

_ARGS = (("correlation", "correlation"), ("external_id", "External id"), ("stream", "stream"),
         ("device", "device"), ("bytes", "bytes"), ("registers", "registers per thread"))
_JSON_ARGS = (("grid", "grid"), ("block", "block"), ("input_dims", "Input Dims"), ("input_types", "Input type"))
_POSITIVE_BASE = 2**31  # where non-numeric ids (stored negative) go: Perfetto wants ids >= 0


def _id_map(values: np.ndarray) -> dict[int, int]:
    return {int(v): _POSITIVE_BASE + int(-v) for v in np.unique(values) if v < 0}


def chrome_trace_document(events: pd.DataFrame, metadata: dict | None = None,
                          flows: pd.DataFrame | None = None, other: dict | None = None) -> dict:
    """The Chrome trace document (``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": ...}``)
    of ``events`` (rows of ``Trace.events``), with names from ``metadata`` and the ``flows`` arrows."""
    meta = metadata or {}
    ev = events[events["cat"].astype(str) != "Trace"] if len(events) else events
    pid = ev["pid"].to_numpy(dtype=np.int64)
    tid = ev["tid"].to_numpy(dtype=np.int64)
    remap = _id_map(np.concatenate([pid, tid])) if len(ev) else {}
    fix = np.vectorize(lambda v: remap.get(int(v), int(v)), otypes=[np.int64]) if remap else (lambda a: a)
    pid_out, tid_out = fix(pid), fix(tid)
    names = ev["name"].astype(str).to_numpy()
    cats = ev["cat"].astype(str).to_numpy()
    ts = ev["ts_us"].to_numpy(dtype=float)
    dur = np.nan_to_num(ev["dur_us"].to_numpy(dtype=float), nan=0.0)
    arg_cols = [(col, key, ev[col].to_numpy(dtype=object, na_value=None)) for col, key in _ARGS if col in ev]
    json_cols = [(col, key, ev[col].astype(object).where(ev[col].notna(), None).to_numpy())
                 for col, key in _JSON_ARGS if col in ev]
    out: list[dict] = []
    for i in range(len(ev)):
        args = {key: int(vals[i]) for _, key, vals in arg_cols if vals[i] is not None}
        for _, key, vals in json_cols:
            v = vals[i]
            if v is not None:
                try:
                    args[key] = orjson.loads(v)
                except orjson.JSONDecodeError:
                    args[key] = str(v)
        e = {"ph": "X", "name": names[i], "cat": cats[i], "ts": float(ts[i]), "dur": float(dur[i]),
             "pid": int(pid_out[i]), "tid": int(tid_out[i])}
        if args:
            e["args"] = args
        out.append(e)
    # names of processes and threads (those the events use), and the text of non-numeric ids
    strings = meta.get("string_ids") or {}
    used_pids = {int(p) for p in np.unique(pid)} if len(ev) else set()
    used_threads = set(zip(pid.tolist(), tid.tolist()))
    pnames = meta.get("process_names") or {}
    plabels = meta.get("process_labels") or {}
    for p in sorted(used_pids):
        name = pnames.get(p) or strings.get(p)
        if name:
            out.append({"ph": "M", "name": "process_name", "pid": remap.get(p, p), "tid": 0, "args": {"name": str(name)}})
        if plabels.get(p):
            out.append({"ph": "M", "name": "process_labels", "pid": remap.get(p, p), "tid": 0,
                        "args": {"labels": str(plabels[p])}})
    tnames = meta.get("thread_names") or {}
    for p, t in sorted(used_threads):
        name = (tnames.get(p) or {}).get(t) or strings.get(t)
        if name:
            out.append({"ph": "M", "name": "thread_name", "pid": remap.get(p, p), "tid": remap.get(t, t),
                        "args": {"name": str(name)}})
    n_flows = 0
    if flows is not None and len(flows) and len(ev):
        pos = pd.Series(np.arange(len(ev)), index=ev.index)
        for li, gi, corr in zip(flows["launch_index"], flows["gpu_index"], flows["correlation"]):
            if li not in pos.index or gi not in pos.index:
                continue
            a, b = int(pos[li]), int(pos[gi])
            fid = int(corr)
            out.append({"ph": "s", "id": fid, "pid": int(pid_out[a]), "tid": int(tid_out[a]), "ts": float(ts[a]),
                        "cat": "ac2g", "name": "ac2g"})
            out.append({"ph": "f", "bp": "e", "id": fid, "pid": int(pid_out[b]), "tid": int(tid_out[b]),
                        "ts": float(ts[b]), "cat": "ac2g", "name": "ac2g"})
            n_flows += 1
    other_data = {"made_by": "gpu-workbench", "events": int(len(ev)), "flows": n_flows, **(other or {})}
    doc = {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other_data}
    props = meta.get("deviceProperties")
    if isinstance(props, list) and props:
        doc["deviceProperties"] = props
    return doc


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_chrome_trace(events: pd.DataFrame, path: str | os.PathLike, *, metadata: dict | None = None,
                       flows: pd.DataFrame | None = None, other: dict | None = None) -> Path:
    """Write :func:`chrome_trace_document` to ``path`` (``.gz``: gzipped) atomically; returns the path."""
    path = Path(path)
    doc = chrome_trace_document(events, metadata, flows, other)
    data = orjson.dumps(doc, default=_clean, option=orjson.OPT_SERIALIZE_NUMPY)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

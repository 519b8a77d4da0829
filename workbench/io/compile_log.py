"""Read what torch.compile logged: a ``TORCH_TRACE=DIR`` folder (the structured log tlparse reads) or the
``workbench_compile`` stamp of a trace, as one record.

    rec = load_compile_log("/tmp/torch_trace")       # a folder of dedicated_log_torch_trace_*.log, or one file
    TraceAnalysis(trace, compile_log=rec).compile    # the analysis: workbench.analysis.trace.compile

Each log line is ``<glog prefix>] {json metadata}``; a record with a payload is followed by the payload's
lines, each starting with a tab. Of all the records, :func:`keep_record` keeps the few the analysis reads
(``compilation_metrics`` per frame compiled, the ``dynamo_graph_break_reason`` and ``recompile_reasons``
artifacts, ``create_symbol`` per size dynamo made symbolic) in the shape
:class:`workbench.capture.compile.CompileRecorder` stamps into a trace, so a run captured elsewhere and a run captured here give the same ``compile`` block. No torch.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from workbench.errors import BadArtifact

__all__ = ["load_compile_log", "keep_record", "KEPT_METRICS"]

# the fields of dynamo's compilation_metrics record the analysis reads (the rest, e.g. the whole dynamo
# config, is left out)
KEPT_METRICS = (
    "compile_id", "frame_key", "co_name", "co_filename", "co_firstlineno", "cache_size", "guard_count",
    "graph_op_count", "graph_node_count", "entire_frame_compile_time_s", "backend_compile_time_s",
    "inductor_compile_time_s", "code_gen_time_s", "structured_logging_overhead_s", "fail_type", "fail_reason",
    "fail_user_frame_filename", "fail_user_frame_lineno", "has_guarded_code", "restart_reasons",
    "recompile_reason", "start_time", "shape_env_guard_count", "graph_input_count",
    # the compile time by phase (torch >= 2.5): dynamo's whole frame, AOT autograd, inductor, its code generation
    "dynamo_cumulative_compile_time_us", "aot_autograd_cumulative_compile_time_us",
    "inductor_cumulative_compile_time_us", "inductor_code_gen_cumulative_compile_time_us",
)
# of a ``create_symbol`` record (a size dynamo made symbolic while compiling: automatic dynamic shapes,
# ``dynamic=True``, ``mark_dynamic``), what the analysis reads
_SYMBOL_KEYS = ("symbol", "source")
_ARTIFACTS = ("recompile_reasons", "dynamo_graph_break_reason")
_PAYLOAD_CHARS = 4000     # a graph break's payload: the reason and the user's frames come first
_FIX = "Give the folder TORCH_TRACE=DIR wrote (dedicated_log_torch_trace_*.log files), or one of its files"


def keep_record(meta: dict, payload) -> dict | None:
    """One structured-log record cut to what the analysis reads, or None when it reads nothing of it."""
    ids = {k: meta[k] for k in ("frame_id", "frame_compile_id", "attempt") if k in meta}
    for kind in ("compilation_metrics", "bwd_compilation_metrics"):
        if kind in meta:
            m = meta[kind] if isinstance(meta[kind], dict) else {}
            return {"kind": kind, **ids, "metrics": {k: m.get(k) for k in KEPT_METRICS if k in m}}
    if isinstance(meta.get("create_symbol"), dict):
        c = meta["create_symbol"]
        return {"kind": "create_symbol", **ids, **{k: str(c[k]) for k in _SYMBOL_KEYS if c.get(k) is not None}}
    art = meta.get("artifact")
    if isinstance(art, dict) and art.get("name") in _ARTIFACTS:
        text = payload if isinstance(payload, str) else ("" if payload is None else str(payload))
        return {"kind": art["name"], **ids, "payload": _cut_payload(text)}
    return None


def _cut_payload(text: str) -> str:
    """A graph break's payload ends with torch's own traceback (long, nothing the user wrote): keep the
    text before it."""
    i = text.find("\nTraceback (most recent call last)")
    if i >= 0:
        text = text[:i]
    return text[:_PAYLOAD_CHARS]


def _open(p: Path):
    return gzip.open(p, "rt", encoding="utf-8", errors="replace") if p.name.endswith(".gz") else \
        open(p, encoding="utf-8", errors="replace")


def _records_of(p: Path) -> tuple[list[dict], int, str | None]:
    """The kept records of one log file, how many structured lines it had, and the torch version it names."""
    kept: list[dict] = []
    n = 0
    version = None
    meta = None
    payload: list[str] = []

    def flush():
        nonlocal version
        if meta is None:
            return
        text = "\n".join(payload) if payload else None
        art = meta.get("artifact")
        if isinstance(art, dict) and art.get("name") == "torch_version" and text:
            try:
                version = json.loads(text).get("pytorch_version")
            except (ValueError, AttributeError):
                pass
        r = keep_record(meta, text)
        if r is not None:
            kept.append(r)

    with _open(p) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("\t"):
                if meta is not None:
                    payload.append(line[1:])
                continue
            flush()
            meta, payload = None, []
            i = line.find("] {")
            if i < 0:
                continue
            try:
                m = json.loads(line[i + 2:])
            except ValueError:
                continue
            if isinstance(m, dict):
                meta = m
                n += 1
    flush()
    return kept, n, version


def load_compile_log(path: str | os.PathLike) -> dict:
    """The compile record of a TORCH_TRACE folder (every ``*.log`` / ``*.log.gz`` in it) or of one log
    file: ``{version, source: "torch_trace", torch, records, counters: None, calls: [], eager_step_ms: None,
    files}``. Raises :class:`~workbench.errors.BadArtifact` naming the path when there is no such log."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and (f.name.endswith(".log") or f.name.endswith(".log.gz")))
        if not files:
            raise BadArtifact(p, "is a folder with no TORCH_TRACE logs (*.log) in it", _FIX)
    elif p.is_file():
        files = [p]
    else:
        raise BadArtifact(p, "no such file or folder", _FIX)
    records: list[dict] = []
    lines = 0
    version = None
    for f in files:
        try:
            kept, n, v = _records_of(f)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise BadArtifact(f, f"could not be read ({type(exc).__name__}: {exc})", _FIX) from None
        records += kept
        lines += n
        version = version or v
    if not lines:
        raise BadArtifact(p, "holds no structured torch.compile records (not a TORCH_TRACE log)", _FIX)
    return {"version": 1, "source": "torch_trace", "torch": version, "records": records, "counters": None,
            "calls": [], "eager_step_ms": None, "files": [f.name for f in files]}

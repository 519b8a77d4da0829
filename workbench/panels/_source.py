"""What did the user hand a panel? Recognise an artifact by its content, and say which panel fits.

Every panel is built one way, ``Panel(source)``, where ``source`` is a file path, a loaded object or a
capture result. :func:`artifact_kind` names what ``source`` is without loading it (a file is
recognised by its first bytes, gunzipped when gzip, never by its name alone); a panel given a kind it
does not show raises :func:`wrong_kind`'s error, which names the panel or command that does::

    MemoryPanel("run.pt.trace.json.gz")
    BadArtifact: run.pt.trace.json.gz: is a Kineto trace, not an allocator snapshot. Use
    ProfilerPanel(path) or `workbench trace` ...

A missing file raises too, before any widget exists, so no dead controls or progress bar are left in
the output. A file of the right kind that fails to load (truncated, corrupt) is the loader's error.

Kinds: ``trace`` (Kineto JSON, a ``Trace``), ``profile_result`` (``profile_steps``/``profile``),
``snapshot`` (allocator snapshot pickle, ``MemorySnapshot``, ``MemoryAnalysis``), ``memory_recording``
(``record_memory_history``), ``oom_capture`` (``capture_oom``), ``memory_timeline``
(``export_memory_timeline``), ``nvml`` (NVML session JSON lines / CSV, a session frame), ``sampler``,
``ledger`` (experiment ledger JSON / Parquet, ledger frame), ``experiment`` (``run_experiment``),
``model_file`` (a ``.py`` model file for the estimator), ``estimate_file``, ``workload`` (the harness's
``Workload``), ``unknown``.
"""

from __future__ import annotations

import gzip
import io as _io
import json
import os
import zlib
from pathlib import Path

from workbench.errors import BadArtifact

__all__ = ["artifact_kind", "classify", "sniff_file", "wrong_kind", "check_path", "describe_kind", "KIND_NAMES", "FITS"]

# kind -> how a message names it
KIND_NAMES: dict[str, str] = {
    "trace": "a Kineto trace",
    "profile_result": "a profiling result (profile_steps / profile)",
    "snapshot": "a CUDA allocator snapshot",
    "memory_recording": "a memory recording (record_memory_history)",
    "oom_capture": "an OOM capture handle (capture_oom)",
    "memory_timeline": "a torch.profiler memory timeline (export_memory_timeline)",
    "nvml": "an NVML session",
    "sampler": "an NVML sampler",
    "ledger": "an experiment ledger",
    "experiment": "an experiment (run_experiment)",
    "model_file": "a Python model file",
    "estimate_file": "a loaded model file (load_estimate_file)",
    "estimate": "a peak-memory estimate",
    "workload": "a Workload (a step to run, not a recording)",
    "unknown": "not an artifact gpu-workbench knows",
}

# kind -> the panel or command that shows it
FITS: dict[str, str] = {
    "trace": "ProfilerPanel(path) or `workbench trace`",
    "profile_result": "ProfilerPanel(result)",
    "snapshot": "MemoryPanel(path) or `workbench memory`",
    "memory_recording": "MemoryPanel(recording)",
    "oom_capture": "MemoryPanel(handle)",
    "memory_timeline": "`workbench memory SNAPSHOT --profiler-timeline FILE` or workbench.io.load_memory_timeline",
    "nvml": "LiveGpuPanel(path) (a replay) or `workbench monitor --replay FILE`",
    "sampler": "LiveGpuPanel(sampler)",
    "ledger": "ComparePanel(path)",
    "experiment": "ComparePanel(experiment)",
    "model_file": "EstimatePanel(path) or `workbench estimate FILE.py`",
    "estimate_file": "EstimatePanel(model_file)",
    "estimate": "the figures in workbench.figures.estimate (EstimatePanel needs the model to re-run)",
    "workload": "EstimatePanel(workload, configuration) or ComparePanel.from_experiment(workload, configurations)",
}

_HEAD_BYTES = 64 * 1024


def describe_kind(kind: str) -> str:
    return KIND_NAMES.get(kind, kind)


def _head(path: Path, n: int = _HEAD_BYTES) -> bytes:
    """The first ``n`` bytes of the file's content (gunzipped when the file is gzip)."""
    from workbench.io._files import open_input

    with open_input(path, raw=True) as f:  # checked, non-blocking open
        raw = f.read(n)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=_io.BytesIO(raw)) as g:
                out = b""
                while len(out) < n:
                    chunk = g.read(n - len(out))
                    if not chunk:
                        break
                    out += chunk
                return out
        except (EOFError, OSError, zlib.error):
            # a gzip cut short inside the first piece: whatever decompressed is the head
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                return d.decompress(raw, n)
            except zlib.error:
                return b""
    return raw


def sniff_file(path: str | os.PathLike) -> str:
    """The kind of a file from its first 64 KiB (``unknown`` when nothing matches). The file must exist."""
    p = Path(path)
    name = p.name.lower()
    if name.endswith(".py"):
        return "model_file"
    if name.endswith(".parquet"):
        return "ledger"
    head = _head(p)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text:
        return "unknown"
    first = text[:1]
    if first == b"\x80" or first in (b"(", b"}", b"]"):  # pickle: PROTO, or protocol 0/1 MARK / EMPTY_DICT / LIST
        return "snapshot"
    if first == b"{":
        if b'"traceEvents"' in text or b'"schemaVersion"' in text or b'"deviceProperties"' in text:
            return "trace"
        if b'"gpu-workbench-ledger"' in text[:512]:
            return "ledger"
        line = text.split(b"\n", 1)[0]
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict) and "gpu" in rec and ("t" in rec or "t_s" in rec):
            return "nvml"
        return "unknown"
    if first == b"[":
        body = text[1:].lstrip()
        if body[:1] == b"{" and b'"ph"' in text:
            return "trace"  # the JSON-array form of the Chrome trace format
        if body[:1] == b"[" or body[:1] == b"]":
            return "memory_timeline"  # [times, sizes] or the raw [[t, action, bytes, category], ...]
        return "unknown"
    line = text.split(b"\n", 1)[0].decode("utf-8", "replace")
    cols = [c.strip().strip('"') for c in line.split(",")]
    if len(cols) > 2 and "gpu" in cols and ("t_s" in cols or "t" in cols):
        return "nvml"
    return "unknown"


def artifact_kind(source) -> str:
    """The kind of ``source``: a path (by content) or an object gpu-workbench made (by type)."""
    if isinstance(source, (str, os.PathLike)):
        return sniff_file(source)
    cls = type(source).__name__
    module = type(source).__module__ or ""
    by_class = {
        "Trace": "trace", "ProfileResult": "profile_result", "MemorySnapshot": "snapshot",
        "MemoryAnalysis": "snapshot", "MemoryRecording": "memory_recording", "OomCapture": "oom_capture",
        "Experiment": "experiment", "EstimateFile": "estimate_file", "Estimate": "estimate", "Workload": "workload",
        "NvmlSampler": "sampler", "ReplaySampler": "sampler",
    }
    if module.startswith("workbench.") and cls in by_class:
        return by_class[cls]
    if callable(getattr(source, "rows_since", None)) and callable(getattr(source, "frame", None)):
        return "sampler"  # any Sampler (workbench.capture.sampler.Sampler protocol)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(source, pd.DataFrame):
        if "configuration" in source.columns:
            return "ledger"
        if "gpu" in source.columns and "t_s" in source.columns:
            return "nvml"
    return "unknown"


def check_path(source, panel: str, takes: str) -> Path:
    """``source`` as a Path that exists and is a file; else a BadArtifact saying what ``panel`` takes."""
    from workbench.io._files import check_input

    p = Path(source)
    try:
        is_dir = p.is_dir()
    except OSError:  # a name too long, ...: check_input says which
        is_dir = False
    if is_dir:
        raise BadArtifact(p, "is a folder, not a file", f"{panel} takes {takes}")
    # regular files only: a FIFO or a device would block the kernel when its head is read
    return check_input(p, "a file", f"{panel} takes {takes}")


def classify(source, panel: str, takes: str) -> tuple[str, Path | None]:
    """``(kind, path)`` of ``source``; ``path`` is None for objects. A path that does not exist or is a
    folder raises (:func:`check_path`) before its content is looked at."""
    if isinstance(source, (str, os.PathLike)):
        path = check_path(source, panel, takes)
        return sniff_file(path), path
    return artifact_kind(source), None


def _label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"this {type(source).__name__}"


def wrong_kind(source, kind: str, panel: str, takes: str) -> BadArtifact:
    """The error for ``panel`` given ``source`` of ``kind``, which it does not show."""
    if kind == "unknown":
        what = ("is not an artifact gpu-workbench recognises" if isinstance(source, (str, os.PathLike))
                else "is not something a panel shows")
        return BadArtifact(_label(source), what, f"{panel} takes {takes}")
    fits = FITS.get(kind)
    fix = f"Use {fits}" if fits else ""
    return BadArtifact(_label(source), f"is {describe_kind(kind)}, not what {panel} shows ({takes})", fix)

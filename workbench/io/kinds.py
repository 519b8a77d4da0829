"""The one registry of artifact kinds: what a file, folder or object is, what loads it, what shows it.

Every kind gpu-workbench knows is one :class:`ArtifactKind` in :data:`KINDS`: its name, how a message
names it, how it is recognised (by file name, by the first bytes of content, by a Python object's type),
the io function that loads it, the panel that shows it (a ``"module:Name"`` string, resolved by the
panels layer, so io never imports panels), the ``workbench`` subcommand that reads it, and the sentence
an error uses to point there. The CLI (``commands/diff.py``, ``commands/timeline.py``) and the panels
(``panels/_base.py::classify``) ask this module, so they always agree on what a file is.

A file is recognised by its content, never by its name alone (except ``.py`` model files and
``.parquet`` ledgers): :func:`sniff_file` reads the first 64 KiB (gunzipped when gzip) and asks each
kind's ``sniff`` in registry order; the first that says yes wins, else ``unknown``. A folder is a
``rank_folder`` when it holds a ``.json``/``.json.gz`` file (:func:`sniff_path`). Objects gpu-workbench
makes are recognised by class name (:func:`kind_of`), plus a sampler protocol and two frame layouts.

This module imports the standard library only (loaders and panels are imported when asked for).

>>> from workbench import samples
>>> sniff_file(samples.path("h200_train_step"))
'trace'
>>> KINDS["snapshot"].panel, KINDS["snapshot"].command
('workbench.panels.memory:MemoryPanel', 'memory')
"""

from __future__ import annotations

import gzip
import importlib
import io as _io
import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from workbench.errors import BadArtifact
from workbench.io.metric_names import SMI_FIELDS, metric_column, time_column

__all__ = ["ArtifactKind", "Head", "KINDS", "UNKNOWN", "sniff_file", "sniff_path", "kind_of", "describe",
           "check_path", "could_be_pickle", "GPU_SAMPLE_KINDS"]

UNKNOWN = "unknown"
_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Head:
    """What a content sniffer sees of a file: its lower-cased name and its first bytes (gunzipped, a
    leading BOM and whitespace stripped)."""

    name: str
    text: bytes

    @property
    def first(self) -> bytes:
        return self.text[:1]

    @property
    def first_line(self) -> bytes:
        return self.text.split(b"\n", 1)[0]


@dataclass(frozen=True)
class ArtifactKind:
    """One kind of artifact.

    ``suffixes``: file names ending so are this kind whatever their content (checked before reading).
    ``sniff(head)``: whether a file's :class:`Head` is this kind (kinds are asked in registry order; the
sniffers are written so that at most one says yes).
    ``classes``: names of gpu-workbench classes (defined under ``workbench.``) whose objects are this kind;
    ``sniff_object(obj)``: any other object that is (a sampler protocol, a frame's columns).
    ``loader``: the io function that loads a file of this kind (``"module:function"``, under
    ``workbench.io``; None: nothing in io loads it). ``panel``: the panel that shows it
    (``"module:Class"``, resolved by ``panels._base.panel_class``). ``command``: the ``workbench``
    subcommand that reads it. ``fits``: how an error message names where it belongs. ``command_line``: the
    ``workbench`` command line that reads a file of this kind, ``{path}`` standing for the file (what a
    command given the wrong kind of file suggests instead; None: no command reads it, ``fits`` is said)."""

    name: str
    description: str
    fits: str = ""
    loader: str | None = None
    panel: str | None = None
    command: str | None = None
    command_line: str | None = None
    suffixes: tuple[str, ...] = ()
    sniff: Callable[[Head], bool] | None = None
    classes: tuple[str, ...] = ()
    sniff_object: Callable[[Any], bool] | None = None

    def loader_function(self) -> Callable:
        """The loader, imported (io only: a loader outside ``workbench.io`` is refused)."""
        if not self.loader:
            raise LookupError(f"nothing in workbench.io loads {self.description}")
        module, _, name = self.loader.partition(":")
        if not module.startswith("workbench.io."):
            raise LookupError(f"{self.name}: loader {self.loader!r} is not in workbench.io")
        return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------- content sniffers

_PICKLE_FIRST = (b"\x80", b"(", b"}", b"]")  # PROTO, or protocol 0/1 MARK / EMPTY_DICT / EMPTY_LIST
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"')
_LEDGER_MARK = b'"gpu-workbench-ledger"'


def _is_snapshot(h: Head) -> bool:
    return h.first in _PICKLE_FIRST


# opcodes a pickle of any protocol can start with (a value, a MARK, a GLOBAL/INST, PROTO, PERSID)
_PICKLE_START = frozenset(b"(}])cibILFSVNJKMGTUXBC\x80\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x95\x96PQ")


def could_be_pickle(path: str | os.PathLike) -> bool:
    """Whether the file (gunzipped) starts as some pickle could: False says for sure that the pickle
    loader has nothing to read (text, an image, JSON, random bytes), so a caller can say what the file is
    not instead of passing on the unpickler's guess. The file must exist."""
    head = _head(Path(path), 16)
    return bool(head) and head[0] in _PICKLE_START


def _is_trace(h: Head) -> bool:
    if h.first == b"{":
        return any(k in h.text for k in _TRACE_KEYS)
    if h.first == b"[":  # the JSON-array form of the Chrome trace format
        return h.text[1:].lstrip()[:1] == b"{" and b'"ph"' in h.text
    return False


def _is_ledger(h: Head) -> bool:  # the JSON form (.parquet is by name)
    return h.first == b"{" and _LEDGER_MARK in h.text[:512] and not _is_trace(h)


_WATCH_KEYS = ("reason", "first_step", "steps", "rank")


def _is_watch_index(h: Head) -> bool:  # the flight recorder's index.jsonl (workbench.io.watch)
    if h.first != b"{" or b'"first_step"' not in h.first_line:
        return False
    try:
        rec = json.loads(h.first_line)
    except (ValueError, RecursionError):
        return False
    return isinstance(rec, dict) and all(k in rec for k in _WATCH_KEYS)


def _is_nvml(h: Head) -> bool:
    if h.first == b"{":  # JSON lines: the first record has a GPU and a time
        if _is_trace(h) or _is_ledger(h):
            return False
        try:
            rec = json.loads(h.first_line)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to be a session record
            return False
        return isinstance(rec, dict) and "gpu" in rec and ("t" in rec or "t_s" in rec)
    if h.first == b"[" or h.first in _PICKLE_FIRST:
        return False
    cols = [c.strip().strip('"') for c in h.first_line.decode("utf-8", "replace").split(",")]  # CSV header
    return len(cols) > 2 and "gpu" in cols and ("t_s" in cols or "t" in cols)


_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"%PDF-")


def _is_image(h: Head) -> bool:  # PNG, JPEG, GIF, PDF: a screenshot or a saved figure, not a recording
    start = h.text[:1024].lower()
    return h.text.startswith(_IMAGE_MAGIC) or (h.text[:4] == b"RIFF" and h.text[8:12] == b"WEBP") or \
        start.startswith(b"<svg") or (start.startswith(b"<?xml") and b"<svg" in start)


def _is_html(h: Head) -> bool:  # a report written by --html, or any web page
    return h.text[:1024].lower().startswith((b"<!doctype html", b"<html"))


def _csv_header(h: Head) -> list[str]:
    return [c.strip().strip('"') for c in h.first_line.decode("utf-8", "replace").split(",")]


def _is_nvidia_smi(h: Head) -> bool:  # nvidia-smi --query-gpu=... --format=csv: dotted fields, units in []
    if h.first in (b"{", b"[") or h.first in _PICKLE_FIRST or _is_nvml(h):
        return False
    cols = _csv_header(h)
    return len(cols) >= 2 and any(c.split(" [")[0].strip().lower() in SMI_FIELDS for c in cols)


def _is_dcgm(h: Head) -> bool:  # Prometheus text from a DCGM exporter
    for line in h.text.split(b"\n", 64)[:64]:
        line = line.strip()
        if not line:
            continue
        if line.startswith((b"# HELP DCGM_", b"# TYPE DCGM_", b"DCGM_FI_")):
            return True
        if not line.startswith(b"#"):
            return False
    return False


def _is_metrics_table(h: Head) -> bool:  # any CSV / JSON lines with a time column and a known metric
    if h.first in _PICKLE_FIRST or h.first == b"[" or _is_nvml(h) or _is_nvidia_smi(h) or _is_trace(h) \
            or _is_ledger(h) or _is_watch_index(h):
        return False
    if h.first == b"{":
        try:
            rec = json.loads(h.first_line)
        except (ValueError, RecursionError):
            return False
        if not isinstance(rec, dict):
            return False
        cols = [str(k) for k in rec]
    else:
        cols = _csv_header(h)
        if len(cols) < 2:
            return False
    tcol = time_column(cols)
    return tcol is not None and any(metric_column(c) is not None for c in cols if c != tcol)


def _is_memory_timeline(h: Head) -> bool:  # [times, sizes] or the raw [[t, action, bytes, category], ...]
    return h.first == b"[" and h.text[1:].lstrip()[:1] in (b"[", b"]")


# ----------------------------------------------------------------------------------- object sniffers


def _frame_columns(obj) -> set | None:
    pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
    return set(obj.columns) if pd is not None and isinstance(obj, pd.DataFrame) else None


def _is_sampler_object(obj) -> bool:  # any Sampler (workbench.capture.nvml.Sampler protocol)
    return callable(getattr(obj, "rows_since", None)) and callable(getattr(obj, "frame", None))


def _is_ledger_frame(obj) -> bool:
    cols = _frame_columns(obj)
    return cols is not None and "configuration" in cols


def _is_nvml_frame(obj) -> bool:
    cols = _frame_columns(obj)
    return cols is not None and "configuration" not in cols and "gpu" in cols and "t_s" in cols


# ------------------------------------------------------------------------------------------ registry

_REGISTRY = (
    ArtifactKind("trace", "a Kineto trace", "ProfilerPanel(path) or `workbench trace`",
                 loader="workbench.io.trace:load_trace", panel="workbench.panels.profiler:ProfilerPanel",
                 command="trace", command_line="workbench trace {path}", sniff=_is_trace,
                 classes=("Trace", "TraceAnalysis")),
    ArtifactKind("profile_result", "a profiling result (profile_steps / profile)", "ProfilerPanel(result)",
                 panel="workbench.panels.profiler:ProfilerPanel", classes=("ProfileResult",)),
    ArtifactKind("snapshot", "a CUDA allocator snapshot", "MemoryPanel(path) or `workbench memory`",
                 loader="workbench.io.snapshot:load_snapshot", panel="workbench.panels.memory:MemoryPanel",
                 command="memory", command_line="workbench memory {path}", sniff=_is_snapshot,
                 classes=("MemorySnapshot", "MemoryAnalysis")),
    ArtifactKind("memory_recording", "a memory recording (record_memory_history)", "MemoryPanel(recording)",
                 panel="workbench.panels.memory:MemoryPanel", classes=("MemoryRecording",)),
    ArtifactKind("oom_capture", "an OOM capture handle (capture_oom)", "MemoryPanel(handle)",
                 panel="workbench.panels.memory:MemoryPanel", classes=("OomCapture",)),
    ArtifactKind("memory_timeline", "a torch.profiler memory timeline (export_memory_timeline)",
                 "`workbench memory SNAPSHOT --profiler-timeline FILE` or workbench.io.load_memory_timeline",
                 loader="workbench.io.profiler_memory:load_memory_timeline", command="memory",
                 command_line="workbench memory SNAPSHOT --profiler-timeline {path}", sniff=_is_memory_timeline),
    ArtifactKind("watch", "a flight recorder's captures (watch(...): a folder with index.jsonl)",
                 "`workbench watch DIR` (each capture's trace and snapshot open in ProfilerPanel / MemoryPanel)",
                 loader="workbench.io.watch:load_watch_index", command="watch",
                 command_line="workbench watch {path}", sniff=_is_watch_index, classes=("Watch", "WatchIndex")),
    ArtifactKind("nvml", "an NVML session",
                 "LiveGpuPanel(path) (a replay) or `workbench monitor --replay FILE`",
                 loader="workbench.io.nvml:load_nvml_session", panel="workbench.panels.nvml:LiveGpuPanel",
                 command="monitor", command_line="workbench monitor --replay {path}", sniff=_is_nvml,
                 sniff_object=_is_nvml_frame),
    ArtifactKind("nvidia_smi", "an nvidia-smi CSV log (--query-gpu ... --format=csv)",
                 "LiveGpuPanel(path) (a replay) or `workbench monitor --replay FILE`",
                 loader="workbench.io.nvml_foreign:load_nvidia_smi_csv", panel="workbench.panels.nvml:LiveGpuPanel",
                 command="monitor", command_line="workbench monitor --replay {path}", sniff=_is_nvidia_smi),
    ArtifactKind("dcgm", "DCGM exporter scrapes (Prometheus text)",
                 "LiveGpuPanel(path) (a replay) or `workbench monitor --replay FILE`",
                 loader="workbench.io.nvml_foreign:load_dcgm_scrape", panel="workbench.panels.nvml:LiveGpuPanel",
                 command="monitor", command_line="workbench monitor --replay {path}", sniff=_is_dcgm),
    ArtifactKind("metrics_table", "a table of GPU metrics (CSV or JSON lines with a time column)",
                 "LiveGpuPanel(path) (a replay) or `workbench monitor --replay FILE`",
                 loader="workbench.io.nvml_foreign:load_metrics_table", panel="workbench.panels.nvml:LiveGpuPanel",
                 command="monitor", command_line="workbench monitor --replay {path}", sniff=_is_metrics_table),
    ArtifactKind("sampler", "an NVML sampler", "LiveGpuPanel(sampler)",
                 panel="workbench.panels.nvml:LiveGpuPanel", classes=("NvmlSampler", "ReplaySampler"),
                 sniff_object=_is_sampler_object),
    ArtifactKind("ledger", "an experiment ledger", "ComparePanel(path)",
                 loader="workbench.io.ledger:load_ledger", panel="workbench.panels.compare:ComparePanel",
                 suffixes=(".parquet",), sniff=_is_ledger, sniff_object=_is_ledger_frame),
    ArtifactKind("experiment", "an experiment (run_experiment)", "ComparePanel(experiment)",
                 panel="workbench.panels.compare:ComparePanel", classes=("Experiment",)),
    ArtifactKind("model_file", "a Python model file", "EstimatePanel(path) or `workbench estimate FILE.py`",
                 panel="workbench.panels.estimate:EstimatePanel", command="estimate",
                 command_line="workbench estimate {path}", suffixes=(".py",)),
    ArtifactKind("estimate_file", "a loaded model file (load_estimate_file)", "EstimatePanel(model_file)",
                 panel="workbench.panels.estimate:EstimatePanel", classes=("EstimateFile",)),
    ArtifactKind("estimate", "a peak-memory estimate",
                 "the figures in workbench.figures.estimate (EstimatePanel needs the model to re-run)",
                 classes=("Estimate",)),
    ArtifactKind("workload", "a Workload (a step to run, not a recording)",
                 "EstimatePanel(workload, configuration) or ComparePanel.from_experiment(workload, configurations)",
                 panel="workbench.panels.estimate:EstimatePanel", classes=("Workload",)),
    ArtifactKind("rank_folder", "a folder of per-rank traces",
                 "RanksPanel(folder) or `workbench ranks FOLDER`",
                 loader="workbench.io.trace:load_traces", panel="workbench.panels.ranks:RanksPanel",
                 command="ranks", command_line="workbench ranks {path}"),
    ArtifactKind("image", "an image (PNG, JPEG, GIF, WebP, SVG or PDF)",
                 "an image viewer (gpu-workbench reads the recordings, not pictures of them)", sniff=_is_image),
    ArtifactKind("html", "an HTML page",
                 "a web browser (a `--html` report is an output; give the recording it was made from)",
                 sniff=_is_html),
)

#: name -> kind, in the order sniffers are asked
KINDS: dict[str, ArtifactKind] = {k.name: k for k in _REGISTRY}

#: the kinds that load as an NVML session frame (``io.nvml_foreign.load_gpu_samples``): wherever a session
#: is taken (the live panel's replay, ``monitor --replay``, ``timeline --nvml``, ``TimelinePanel``)
GPU_SAMPLE_KINDS: tuple[str, ...] = ("nvml", "nvidia_smi", "dcgm", "metrics_table")


def describe(kind: str) -> str:
    """How a message names ``kind`` ("a Kineto trace"); ``unknown`` and strangers as they are."""
    if kind == UNKNOWN:
        return "not an artifact gpu-workbench knows"
    k = KINDS.get(kind)
    return k.description if k else kind


# ------------------------------------------------------------------------------------------- sniffing


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
    """The kind of a file: by name for the kinds with ``suffixes``, else from its first 64 KiB by each
    kind's ``sniff`` in registry order (``unknown`` when nothing matches). The file must exist."""
    p = Path(path)
    name = p.name.lower()
    for k in _REGISTRY:
        if k.suffixes and name.endswith(k.suffixes):
            return k.name
    head = Head(name, _head(p).lstrip(b"\xef\xbb\xbf \t\r\n"))
    if not head.text:
        return UNKNOWN
    for k in _REGISTRY:
        if k.sniff is not None and k.sniff(head):
            return k.name
    return UNKNOWN


def _holds_traces(folder: Path) -> bool:
    from workbench.io.trace import _TRACE_SUFFIXES

    try:
        return any(f.name.lower().endswith(_TRACE_SUFFIXES) and not f.name.startswith(".") and f.is_file()
                   for f in folder.iterdir())
    except OSError:
        return False


def sniff_path(path: str | os.PathLike) -> str:
    """:func:`sniff_file` for a file; a folder is ``watch`` when it holds a flight recorder's
    ``index.jsonl``, ``rank_folder`` when it holds a ``.json``/``.json.gz`` file (not recursively), else
    ``unknown``."""
    p = Path(path)
    if p.is_dir():
        if _is_watch_folder(p):
            return "watch"
        return "rank_folder" if _holds_traces(p) else UNKNOWN
    return sniff_file(p)


def _is_watch_folder(folder: Path) -> bool:
    index = folder / "index.jsonl"
    try:
        return index.is_file() and sniff_file(index) == "watch"
    except (OSError, BadArtifact):
        return False


def kind_of(source) -> str:
    """The kind of ``source``: a path (by content, :func:`sniff_path`) or an object gpu-workbench made
    (by class name), a sampler or a ledger / NVML frame."""
    if isinstance(source, (str, os.PathLike)):
        return sniff_path(source)
    cls = type(source).__name__
    if (type(source).__module__ or "").startswith("workbench."):
        for k in _REGISTRY:
            if cls in k.classes:
                return k.name
    for k in _REGISTRY:
        if k.sniff_object is not None and k.sniff_object(source):
            return k.name
    return UNKNOWN


def check_path(source, what: str, takes: str) -> Path:
    """``source`` as a Path that exists and is a regular file; else a BadArtifact saying that ``what``
    (a panel, a command's flag) takes ``takes``. A FIFO or a device would block while its head is read."""
    from workbench.io._files import check_input

    p = Path(source)
    try:
        is_dir = p.is_dir()
    except OSError:  # a name too long, ...: check_input says which
        is_dir = False
    if is_dir:
        raise BadArtifact(p, "is a folder, not a file", f"{what} takes {takes}")
    return check_input(p, "a file", f"{what} takes {takes}")

"""The flight recorder's folder on disk: ``index.jsonl`` (one line per capture) and the ``CAPTURE`` trigger.

:func:`workbench.capture.watch.watch` writes into one output folder; every capture's files (a Kineto
trace, an allocator snapshot, NVML samples, each named with the rank) are written atomically first, then
one line is appended to ``index.jsonl``::

    {"time_ns": 1733389562000000000, "reason": "slow", "first_step": 412, "steps": 3,
     "trace": "cap-0000412-rank0-slow.pt.trace.json.gz", "snapshot": null, "nvml": null, "rank": 0, ...}

Paths in the index are file names inside the folder, so the folder can be moved or copied. Extra keys
say what led to the capture (:data:`EXTRA_KEYS`). Many ranks append to the same index: each line is one
``write`` on a file opened for appending, so lines never interleave where appends are atomic (local file
systems; not NFS across hosts, where a torn line is skipped and named by :func:`load_watch_index`).

This module is standard library only (it reads and appends lines; no torch).

>>> e = WatchCapture.from_record({"time_ns": 1, "reason": "file", "first_step": 7, "steps": 3,
...                               "trace": "a.pt.trace.json.gz", "snapshot": None, "nvml": None, "rank": 0})
>>> e.last_step, e.files()
(9, {'trace': 'a.pt.trace.json.gz'})
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import BadArtifact

__all__ = [
    "INDEX_NAME",
    "TRIGGER_NAME",
    "INDEX_KEYS",
    "EXTRA_KEYS",
    "REASONS",
    "WatchCapture",
    "WatchIndex",
    "load_watch_index",
    "index_path",
    "append_index_line",
]

INDEX_NAME = "index.jsonl"
TRIGGER_NAME = "CAPTURE"

#: the keys every index line has (the issue's contract; docs/long-runs.md)
INDEX_KEYS: tuple[str, ...] = ("time_ns", "reason", "first_step", "steps", "trace", "snapshot", "nvml", "rank")
#: keys a line may add: what triggered it and what the steps took
EXTRA_KEYS: tuple[str, ...] = (
    "trigger_step",   # the step that triggered a 'slow' capture (or the OOM's step)
    "trigger_ms",     # that step's time
    "median_ms",      # the rolling median of unprofiled steps when it was taken
    "step_ms",        # the captured steps' times (profiled; CUDA events on a GPU), in order
    "device",         # 'cpu' or 'cuda:N'
    "complete",       # False: the capture was cut short (an exception inside w.step())
    "note",           # the CAPTURE file's text, the exception's message, ...
    "host",
    "pid",
    "history",        # the allocator history's mode and, under 'auto', the stacks' estimated cost (None: CPU)
)
#: why a capture was taken
REASONS: dict[str, str] = {
    "baseline": "a normal window right after the warm-up (what the others are compared with)",
    "signal": "the process got SIGUSR2",
    "file": "a file named CAPTURE appeared in the folder",
    "slow": "a step took more than slow_factor x the rolling median",
    "every": "every M steps, as asked",
    "request": "w.capture() was called",
    "oom": "out of memory inside w.step(): the allocator snapshot at the failure",
}

_STR_OR_NONE = ("trace", "snapshot", "nvml")
_MAX_LINE = 1 << 20
_MAX_LINES = 1_000_000


def index_path(folder: str | os.PathLike) -> Path:
    return Path(folder) / INDEX_NAME


@dataclass(frozen=True)
class WatchCapture:
    """One line of ``index.jsonl``: why, which steps, on which rank, and its files (names in the folder)."""

    time_ns: int
    reason: str
    first_step: int
    steps: int
    trace: str | None
    snapshot: str | None
    nvml: str | None
    rank: int
    extra: dict = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return self.first_step + max(self.steps, 1) - 1

    def files(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in _STR_OR_NONE if getattr(self, k)}

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in INDEX_KEYS}
        d.update(self.extra)
        return d

    @classmethod
    def from_record(cls, rec: dict) -> "WatchCapture":
        """A parsed line; raises ValueError naming what is wrong with it."""
        if not isinstance(rec, dict):
            raise ValueError("is not a JSON object")
        missing = [k for k in INDEX_KEYS if k not in rec]
        if missing:
            raise ValueError(f"lacks {', '.join(missing)}")
        for k in ("time_ns", "first_step", "steps", "rank"):
            if not isinstance(rec[k], int) or isinstance(rec[k], bool):
                raise ValueError(f"{k} is not a whole number")
        if not isinstance(rec["reason"], str):
            raise ValueError("reason is not text")
        for k in _STR_OR_NONE:
            v = rec[k]
            if v is not None and (not isinstance(v, str) or "/" in v or "\\" in v or v in ("", ".", "..")):
                raise ValueError(f"{k} is not a file name in the folder")
        extra = {k: v for k, v in rec.items() if k not in INDEX_KEYS}
        return cls(rec["time_ns"], rec["reason"], rec["first_step"], rec["steps"], rec["trace"], rec["snapshot"],
                   rec["nvml"], rec["rank"], extra)


@dataclass(frozen=True)
class WatchIndex:
    """A flight recorder's folder: its captures in the order they were written, and the lines that could
    not be read (``problems``: ``"line N: why"``; a line cut short by a full disk, say)."""

    folder: Path
    captures: tuple[WatchCapture, ...]
    problems: tuple[str, ...] = ()

    def path(self, name: str | None) -> Path | None:
        return None if name is None else self.folder / name

    def missing(self, capture: WatchCapture) -> list[str]:
        """The file names the line lists that are not in the folder (removed, or never copied)."""
        return [n for n in capture.files().values() if not (self.folder / n).is_file()]


def load_watch_index(path: str | os.PathLike) -> WatchIndex:
    """The flight recorder's index, given its folder or the ``index.jsonl`` itself. A folder without an
    index, or a file that is not one, is one :class:`~workbench.errors.BadArtifact` line."""
    from workbench.io._files import check_input, open_input, read_lines

    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError:  # a name too long, ...: check_input below names the problem
        is_dir = False
    if is_dir:
        folder, idx = p, p / INDEX_NAME
        if not idx.exists():
            raise BadArtifact(p, f"has no {INDEX_NAME} (no capture was taken there yet)",
                              "Give the output folder of `watch(...)`; a capture is listed once taken (send the "
                              f"process SIGUSR2 or create {p / TRIGGER_NAME})")
    else:
        folder, idx = p.parent, p
    check_input(idx, "a flight recorder index", "Give the output folder of `watch(...)` or its index.jsonl")
    captures: list[WatchCapture] = []
    problems: list[str] = []
    with open_input(idx, "a flight recorder index") as f:
        for n, raw in enumerate(read_lines(f, idx, _MAX_LINE), start=1):
            if n > _MAX_LINES:
                problems.append(f"more than {_MAX_LINES} lines: the rest was not read")
                break
            line = raw.strip()
            if not line:
                continue
            try:
                captures.append(WatchCapture.from_record(json.loads(line)))
            except (ValueError, RecursionError) as exc:
                if n == 1 and not captures:
                    raise BadArtifact(idx, f"line 1 is not a flight recorder capture ({_short(exc)})",
                                      "Give the output folder of `watch(...)` or its index.jsonl") from None
                problems.append(f"line {n}: {_short(exc)}")
    return WatchIndex(folder, tuple(captures), tuple(problems))


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 120 else text[:117] + "..."


def append_index_line(folder: str | os.PathLike, record: dict) -> None:
    """Append one capture's line to ``<folder>/index.jsonl``: one ``write`` of the whole line on a file
    opened with ``O_APPEND`` (lines from many ranks never interleave). Raises OSError (a full or
    read-only disk): the caller decides."""
    data = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(index_path(folder), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"wrote {written} of {len(data)} bytes of the index line")
    finally:
        os.close(fd)

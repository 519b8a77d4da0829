"""``workbench watch DIR [--json] [--rank N]``: the captures a flight recorder (``watch(...)``) took, with
why each was taken, its steps, its files and the command that opens each one.

``DIR`` is the recorder's output folder (or its ``index.jsonl``; or the name of a shipped one,
``watch_cpu_slow_data``). A slow capture names the normal capture
it is compared with: ``workbench diff NORMAL SLOW``. ``--json`` keys: docs/json.md.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

__all__ = ["add_arguments", "run"]

_TAKES = "a flight recorder's output folder (watch(...)) or its index.jsonl"


def add_arguments(p) -> None:
    p.add_argument("path", metavar="DIR", help="the output folder given to watch(...) (or its index.jsonl)")
    p.add_argument("--json", action="store_true", help="print the captures as JSON (keys in docs/json.md)")
    p.add_argument("--rank", type=int, default=None, metavar="N", help="only the captures of rank N")


def _when(ns: int) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))
    except (OverflowError, OSError, ValueError):
        return str(ns)


def _trigger(c: dict) -> str:
    if c["reason"] == "slow" and c.get("trigger_ms") is not None and c.get("median_ms"):
        return (f"step {c['trigger_step']} took {c['trigger_ms']:.1f} ms, {c['trigger_ms'] / c['median_ms']:.1f}x "
                f"the median {c['median_ms']:.2f} ms")
    if c["reason"] == "oom" and c.get("note"):
        return c["note"][:160]
    if c.get("note"):
        return f"{c['why']}: {c['note'][:80]}"
    return c["why"]


def _text(doc: dict) -> str:
    caps = doc["captures"]
    if not caps:
        return f"{doc['folder']}: no captures listed"
    reasons = ", ".join(f"{k} {v}" for k, v in doc["by_reason"].items())
    ranks = ", ".join(map(str, doc["ranks"]))
    lines = [f"{doc['folder']}: {len(caps)} capture(s) on rank(s) {ranks} ({reasons})"]
    lines += [f"allocator history, rank {h['rank']}: {h['text']}" for h in doc.get("history", ())]
    lines.append("")
    q = shlex.quote
    for c in caps:
        steps = f"{c['first_step']}-{c['last_step']}" if c["steps"] > 1 else f"{c['first_step']}"
        med = f", captured steps {c['captured_median_ms']:.2f} ms (median, profiled)" if c["captured_median_ms"] else ""
        part = "" if c.get("complete", True) else " (cut short)"
        lines.append(f"{_when(c['time_ns'])}  rank {c['rank']}  {c['reason']:<8} step {steps}{med}{part}")
        lines.append(f"    why: {_trigger(c)}")
        for kind, path in c["paths"].items():
            gone = " (missing)" if c[kind] in c["missing"] else ""
            cmd = {"trace": "workbench trace", "snapshot": "workbench memory",
                   "nvml": "workbench monitor --replay"}[kind]
            lines.append(f"    {kind:<9}{cmd} {q(path)}{gone}")
        if c["compare_with"]:
            base = str(Path(doc["folder"]) / c["compare_with"])
            lines.append(f"    compare  workbench diff {q(base)} {q(c['paths']['trace'])}")
    if doc["problems"]:
        lines += ["", "lines not read:"] + [f"  {p}" for p in doc["problems"]]
    return "\n".join(lines)


def run(args) -> int:
    import json

    from workbench.analysis.watch import watch_summary
    from workbench.commands._checks import expect_kind, sample_or_path
    from workbench.errors import BadArtifact
    from workbench.io.watch import WatchIndex, load_watch_index

    args.path = sample_or_path(args.path)  # a shipped folder by name: watch_cpu_slow_data
    kind = expect_kind(args.path, ("watch",), _TAKES)
    if kind == "folder":
        raise BadArtifact(args.path, "holds no index.jsonl (no capture was taken there yet, or it is not a "
                          "flight recorder's folder)",
                          "Give the folder given to watch(...); send the process SIGUSR2 or create "
                          "DIR/CAPTURE to take a capture")
    if kind not in ("watch", "missing"):
        raise BadArtifact(args.path, "is not a flight recorder's index", f"Give {_TAKES}")
    index = load_watch_index(args.path)
    if args.rank is not None:
        index = WatchIndex(index.folder, tuple(c for c in index.captures if c.rank == args.rank), index.problems)
    doc = watch_summary(index)
    for p in doc["problems"]:
        print(f"workbench watch: warning: {index.folder}: index {p}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else _text(doc))
    return 0

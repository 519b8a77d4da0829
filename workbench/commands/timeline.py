"""``workbench timeline --trace T [--memory S] [--nvml N] [--json] [--html OUT]``: one run on one clock.

A Kineto trace, an allocator snapshot and an NVML session of the same run are put on Unix time
(``workbench.analysis.timeline``): the text says where the allocator peaked and inside which step or
``record_function`` range, and what the SMs were doing (NVML utilization and the GPM counters) during
the longest ranges. ``--memory`` also takes a trace recorded with ``profile_memory=True`` (its
``[memory]`` events: CPU-only runs). ``--json`` keys: docs/json.md; ``--html`` writes the figure.
A file that cannot be put on Unix time is aligned on its first event, with a line saying so.
"""

from __future__ import annotations

import json
import sys
import time

from workbench.io.kinds import GPU_SAMPLE_KINDS

__all__ = ["add_arguments", "run", "load_sources"]


def add_arguments(p) -> None:
    p.add_argument("--trace", metavar="T", help="Kineto trace (.json or .json.gz) of the run")
    p.add_argument("--memory", metavar="S",
                   help="allocator snapshot (.pickle[.gz]) of the same run, or a trace with [memory] events")
    p.add_argument("--nvml", metavar="N", help="NVML session (.jsonl/.csv, .gz ok; or an nvidia-smi CSV log, DCGM "
                        "exporter scrapes, a metrics table with a time column) with time_ns, e.g. from "
                        "`workbench monitor --csv` or NvmlSampler.save")
    p.add_argument("--json", action="store_true", help="print the alignment as JSON (keys in docs/json.md)")
    p.add_argument("--html", metavar="OUT", help="also write the one-clock figure to OUT (self-contained HTML)")


def load_sources(trace=None, memory=None, nvml=None):
    """Load the three files (any may be None) with the io loaders; ``memory`` may be a snapshot pickle
    or a trace with ``[memory]`` events. Returns ``(trace, memory, nvml_frame)``."""
    from workbench.io import load_snapshot, load_trace
    from workbench.io.nvml_foreign import load_gpu_samples
    from workbench.io.profiler_memory import load_profiler_memory

    t = m = n = None
    if trace is not None:
        trace = _check(trace, "--trace", ("trace",), "a Kineto trace")
        t = load_trace(trace)
    if memory is not None:
        memory = _check(memory, "--memory", ("snapshot", "trace"), "an allocator snapshot")
        m = load_snapshot(memory) if _kind(memory) == "snapshot" else load_profiler_memory(memory)
    if nvml is not None:
        nvml = _check(nvml, "--nvml", _NVML_KINDS, "an NVML session")
        n = load_gpu_samples(nvml)
    return t, m, n


_TAKES = "--trace TRACE.json[.gz] --memory SNAPSHOT.pickle[.gz] --nvml SESSION.jsonl[.gz]"
_FLAG_OF = {"trace": "--trace", "snapshot": "--memory", "nvml": "--nvml"}
_NVML_KINDS = GPU_SAMPLE_KINDS  # a session, an nvidia-smi log, DCGM scrapes, a metrics table


def _kind(path) -> str:
    from workbench.io import kinds

    return kinds.sniff_file(path)


def _check(path, flag: str, accepts: tuple[str, ...], takes: str):
    """``path`` (a sample name becomes its file) when it is a kind ``flag`` reads; else one line: what it
    is and the flag or command that reads it."""
    import shlex

    from workbench.commands._checks import input_kind, sample_or_path, wrong_file
    from workbench.errors import BadArtifact
    from workbench.io.kinds import KINDS

    from workbench.commands._checks import path_kind

    path = sample_or_path(path)
    if path_kind(path) == "rank_folder":
        raise wrong_file(path, "rank_folder", takes)
    kind = input_kind(path, f"workbench timeline {flag}", takes)
    if kind in accepts:
        return path
    if kind in _FLAG_OF or kind in _NVML_KINDS:
        other = _FLAG_OF.get(kind, "--nvml")
        raise wrong_file(path, kind, takes, f"Give it as `workbench timeline {other} {shlex.quote(str(path))}`")
    if kind in KINDS:
        raise wrong_file(path, kind, takes)
    raise BadArtifact(path, f"is not {takes} (nor anything else gpu-workbench recognises)", f"Give {_TAKES}")


def _rel(ns, origin) -> str:
    return "?" if ns is None else f"+{(ns - origin) / 1e9:.3f} s"


def _text(doc: dict, tl) -> str:
    from workbench.units import format_bytes as fb

    o = doc["origin_ns"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(o / 1e9)) + f".{(o // 1_000_000) % 1000:03d} UTC"
    clock = (f"one clock: Unix time; t = 0 at the first event ({when})" if doc["clock"] == "unix_ns"
             else "no file carries absolute time: each starts at its first event")
    lines = [clock]
    for s in doc["sources"]:
        how = f"aligned by {s['method']}" if s["aligned"] else "NOT aligned (first event)"
        lines.append(f"  {s['kind']:<6} {s['name']}: {how}")
    ann = doc["annotations"]
    if ann:
        steps = sum(a["kind"] == "step" for a in ann)
        lines.append(f"annotations: {len(ann)} ({steps} ProfilerStep, {len(ann) - steps} record_function ranges), "
                     f"{_rel(ann[0]['start_ns'], o)} .. {_rel(max(a['end_ns'] for a in ann), o)}")
    k = doc["kernels"]
    if k["count"]:
        lines.append(f"GPU: {k['count']:,} kernels/copies on {', '.join(k['lanes'])}")
    mem = doc["memory"]
    if mem:
        where = f", inside {mem['peak_annotation']}" if mem["peak_annotation"] else ""
        lines.append(f"allocator peak: {fb(mem['peak_bytes'])} allocated (reserved {fb(mem['peak_reserved_bytes'])}) "
                     f"at {_rel(mem['peak_time_ns'], o)}{where}")
    nv = doc["nvml"]
    if nv:
        used = (f"; memory used peaks at {fb(nv['peak_mem_used_bytes'])} at {_rel(nv['peak_mem_used_time_ns'], o)}"
                if nv["peak_mem_used_bytes"] is not None else "")
        gpm = "GPM counters" if nv["gpm_columns"] else "no GPM counters"
        lines.append(f"NVML: {nv['rows']} rows, {_rel(nv['first_ns'], o)} .. {_rel(nv['last_ns'], o)}{used}; {gpm}")
    act = [a for a in doc.get("activity", []) if a["rows"]]
    if act:
        lines.append("during the longest ranges (mean over the NVML rows inside each):")

        def pct(v):
            return "   ?" if v is None else f"{v:4.0f}"

        lines.append(f"  {'range':<28} {'rows':>4} {'util%':>5} {'SM%':>4} {'occ%':>4} {'tensor%':>7} {'DRAM%':>5}")
        for a in act:
            lines.append(f"  {a['name'][:28]:<28} {a['rows']:>4} {pct(a['util_gpu_pct']):>5} {pct(a['gpm_sm_util_pct'])} "
                         f"{pct(a['gpm_sm_occupancy_pct'])} {pct(a['gpm_tensor_util_pct']):>7} "
                         f"{pct(a['gpm_dram_bw_util_pct']):>5}")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def run(args) -> int:
    from workbench.analysis.timeline import align, timeline_summary
    from workbench.errors import BadArgument

    if not (args.trace or args.memory or args.nvml):
        raise BadArgument("give at least one file: --trace TRACE [--memory SNAPSHOT] [--nvml SESSION]")
    trace, memory, nvml = load_sources(args.trace, args.memory, args.nvml)
    tl = align(trace, memory, nvml)
    doc = timeline_summary(tl)
    for note in doc["notes"]:
        if args.json:  # the JSON carries them too; people reading stderr see them first
            print(f"workbench timeline: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(_text(doc, tl))
    if args.html:
        from workbench.figures.timeline import aligned_timeline_figure
        from workbench.report.html import Section, write_report

        names = ", ".join(s["name"] for s in doc["sources"])
        path = write_report(args.html, "One run on one clock", [
            Section("Timeline", [aligned_timeline_figure(tl)]),
            Section("Summary", [_text(doc, tl)]),
        ], subtitle=names)
        print(f"workbench timeline: wrote {path}", file=sys.stderr)
    return 0

"""``workbench memory PATH [--json] [--html OUT]``: allocator snapshot summary and OOM post-mortem.

``--json`` keys: docs/json.md; ``--html`` writes :func:`workbench.report.memory_report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.commands._checks import count, device_index, expect_kind, prepare_output, sample_or_path, wrote

__all__ = ["add_arguments", "run"]


# a file no sniffer recognises is not a pickle at all (a snapshot is one): say what to give instead
_NOT_A_SNAPSHOT = ("Give the .pickle or .pickle.gz that torch.cuda.memory._dump_snapshot(path) wrote (or "
                   "workbench.capture.record_memory_history), or a sample name such as h200_oom_snapshot")


def add_arguments(p) -> None:
    p.add_argument("path", help="allocator snapshot (.pickle or .pickle.gz, from torch.cuda.memory._dump_snapshot "
                                "or workbench.capture); loaded safely, nothing in it is executed")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (stable keys, documented in docs/json.md)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report to OUT")
    p.add_argument("--top", type=count, default=10, help="how many allocations/frames to list (default 10)")
    p.add_argument("--profiler-timeline", metavar="FILE", default=None,
                   help="torch.profiler export_memory_timeline JSON(.gz) of the same run: adds the profiler's "
                        "own categories next to the stack-inferred ones")
    p.add_argument("--batch-size", type=count, default=None, metavar="N",
                   help="the batch size the snapshot's step ran with: the OOM advice then names the largest batch "
                        "that fits")
    p.add_argument("--device", type=device_index, default=None, help="CUDA device index in the snapshot (default: the OOM's, "
                                                           "else the busiest)")


def _text(summary: dict) -> str:
    from workbench.analysis.memory.oom import _settings_text
    from workbench.units import format_bytes as fb

    s = summary
    lines = [
        f"{s['source']['path']}: {s['events']:,} events, {s['segments']} segments (device {s['source']['device']})",
        f"now: allocated {fb(s['allocated_bytes'])}, reserved {fb(s['reserved_bytes'])}, free in reserved "
        f"{fb(s['free_in_reserved_bytes'])}, largest free block {fb(s['largest_free_block_bytes'])}",
        f"peak: allocated {fb(s['peak']['allocated_bytes'])} (reserved {fb(s['peak']['reserved_bytes'])}); "
        f"cached-unused share {100 * s['peak']['cached_unused_share']:.0f}% of reserved (alarm at "
        f"{100 * s['cached_unused_alarm']:.0f}%), external fragmentation {s['peak']['external_fragmentation']:.2f} "
        "(1 - largest free block / free)",
        _settings_text(s["allocator_settings"]),
    ]
    if s["peak"]["by_category"]:
        lines.append("  by category: " + ", ".join(
            f"{r['category']} {fb(r['bytes'])}" for r in s["peak"]["by_category"]))
    lines.append("  by frame:")
    for r in s["peak"]["by_frame"]:
        lines.append(f"    {fb(r['bytes']):>12}  {r['count']:>6}x  {r['frame']}")
    if s.get("profiler_categories"):
        pc = s["profiler_categories"]
        lines.append("  profiler's categories at its peak: " + ", ".join(
            f"{k} {fb(v)}" for k, v in sorted(pc["by_category"].items(), key=lambda kv: -kv[1]) if v))
    oom = s["oom"]
    if oom:
        lines += [
            f"OOM ({oom['cause']}): requested {fb(oom['requested_bytes'])}; allocated {fb(oom['allocated_bytes'])}, "
            f"reserved {fb(oom['reserved_bytes'])}, free in reserved {fb(oom['free_in_reserved_bytes'])}, "
            f"largest free block {fb(oom['largest_free_block_bytes'])}"
            + (f", cap {fb(oom['cap_bytes'])}" if oom.get("cap_bytes") else ""),
        ]
        pos = oom.get("position") or {}
        if pos.get("text"):
            lines.append(f"  where: {pos['text']} (confidence {pos.get('confidence', 0):.1f}: {pos.get('reason')}; "
                         f"{pos.get('layers_reason')})")
        from workbench.analysis.memory.whatif import advice_mark, unseen_note

        lines.append("advice: (each fix replayed through the allocator model; the fixes that fit first)")
        lines += [f"  - [{advice_mark(a)}] {a['text']}" for a in oom["advice"]]
        note = unseen_note(oom.get("step_model"))  # an OOM in the first forward: what follows the blocks
        if note:
            lines.append(f"  note: {note}")
    if s["findings"]:
        lines.append("findings:")
        lines += [f"  [{f['severity']}] {f['id']}: {f['message']}" for f in s["findings"]]
    return "\n".join(lines)


def run(args) -> int:
    import json

    from workbench.analysis.memory.oom import analyze_snapshot, memory_summary
    from workbench.io.snapshot import load_snapshot

    from workbench.errors import BadArgument
    from workbench.io.snapshot import _sidecar_path

    args.path = sample_or_path(args.path)
    if expect_kind(args.path, ("snapshot",), "an allocator snapshot") == "unknown":
        from workbench.errors import BadArtifact
        from workbench.io.kinds import could_be_pickle

        if not could_be_pickle(args.path):  # text, JSON, random bytes: the unpickler would only guess
            raise BadArtifact(args.path, "is not an allocator snapshot (not a pickle, nor anything else "
                              "gpu-workbench recognises)", _NOT_A_SNAPSHOT)
    if args.profiler_timeline:
        args.profiler_timeline = sample_or_path(args.profiler_timeline)
        expect_kind(args.profiler_timeline, ("memory_timeline",),
                    "a torch.profiler memory timeline (--profiler-timeline)")
    target = prepare_output(args.html, [args.path, args.profiler_timeline, _sidecar_path(Path(args.path))], "--html")
    # progress bars (large files only) on an interactive terminal; CI logs and pipes stay clean
    snap = load_snapshot(args.path, progress=None if sys.stderr.isatty() else False)
    if args.device is not None and args.device not in snap.devices:
        have = ", ".join(map(str, snap.devices)) or "none"
        raise BadArgument(f"--device {args.device}: {args.path} has no segments or events on device {args.device} "
                          f"(devices in it: {have})")
    analysis = analyze_snapshot(snap, args.device)
    prof = None
    if args.profiler_timeline:
        from workbench.io.profiler_memory import load_memory_timeline

        prof = load_memory_timeline(args.profiler_timeline)
    if args.batch_size is not None and args.batch_size < 1:
        from workbench.errors import BadArgument

        raise BadArgument(f"--batch-size must be a positive integer, not {args.batch_size}")
    summary = memory_summary(snap, top=args.top, analysis=analysis, profiler_timeline=prof,
                             batch_size=args.batch_size)
    if args.html:
        from workbench.report import memory_report

        memory_report(snap, target.path, top=args.top, analysis=analysis, summary=summary)
        print(wrote(target), file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=1, default=_jsonable))
    else:
        print(_text(summary))
    return 0


def _jsonable(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return str(o)

"""``workbench diff BASE TEST [--json] [--html OUT]``: before/after of two Kineto traces, or of two
allocator snapshots (chosen by the files' content, not their names).

Snapshots: both timelines on one axis (aligned at step starts), peak vs peak by category and by the
user's frame with deltas (:func:`workbench.analysis.memory.diff.memory_diff`; ``--json`` keys under
``kind: "memory"`` in docs/json.md; ``--html`` writes :func:`workbench.report.memory_diff_report`).

Text by default, what changed first: one headline sentence (the largest change of the GPU time
breakdown and the step time), the step time and the breakdown (compute, memcpy/memset, communication,
idle; largest change first), GPU busy and launches, the findings resolved / new / changed, then the
largest kernel and op changes and what appeared or disappeared. Every number is in the diff's unit,
printed with it (``total over B -> T steps``, or ``per step`` with ``--per-step``); ``--json`` prints :func:`workbench.analysis.diff_summary` (keys in docs/json.md);
``--html OUT`` also writes :func:`workbench.report.diff_report` (the kernel-delta figure and the tables).
Each trace is analysed once (the :class:`workbench.analysis.TraceAnalysis` that ``trace_diff`` keeps per
side): the text, the JSON and the report read the same summaries and findings.
A missing or corrupt trace is one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from functools import partial

from workbench.commands._checks import count, path_kind, prepare_output, sample_or_path, wrong_file, wrote
from workbench.units import format_change, format_ms

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    p.add_argument("base", help="the 'before' Kineto trace (.json or .json.gz) or allocator snapshot (.pickle[.gz])")
    p.add_argument("test", help="the 'after' file, of the same kind as BASE")
    p.add_argument("--json", action="store_true", help="print the diff as JSON (stable keys, documented in docs/json.md)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report to OUT")
    p.add_argument("--top", type=count, default=None,
                   help="how many kernel/op changes to list (default: 15 in text and HTML, all in JSON)")
    p.add_argument("--per-step", action="store_true",
                   help="divide each trace's totals by its number of ProfilerStep#N (traces of different lengths)")


_ms = partial(format_ms, decimals=3, missing="n/a")


def _pct(b, t) -> str:
    change = format_change(b, t)
    return f" ({change})" if change else ""


def _cut(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _findings_lines(d) -> list[str]:
    from workbench.analysis.findings import severity_rank

    fc = d.findings_change
    lines = []
    for f in fc["resolved"]:
        lines.append(f"  resolved  {f['id']} ({f['severity']} in base)")
    for f in fc["new"]:
        lines.append(f"  new       {f['id']} ({f['severity']}): {_cut(f['message'], 100)}")
    for f in fc["changed"]:
        how = "eased" if severity_rank(f["test_severity"]) < severity_rank(f["base_severity"]) else "worse"
        lines.append(f"  {how:<9} {f['id']} ({f['base_severity']} -> {f['test_severity']}): {_cut(f['message'], 100)}")
    for f in fc["kept"]:
        lines.append(f"  still     {f['id']} ({f['severity']})")
    return ["findings (base -> test):", *lines] if lines else ["findings: none in either trace"]


def _text(d, top: int) -> str:
    base, test = d.base, d.test
    unit = d.unit
    lines = [
        f"what changed: {d.headline}",
        f"base: {base.path} ({base.device}, {base.n_events:,} events, {d.base_steps} steps)",
        f"test: {test.path} ({test.device}, {test.n_events:,} events, {d.test_steps} steps)",
        f"{'time (' + unit + ')':<34} {'base':>11} {'test':>11} {'change':>11}",
    ]
    lines[1:1] = [f"warning: {w}" for w in d.warnings]
    if d.normalize != "per_step" and d.base_steps and d.test_steps and d.base_steps != d.test_steps:
        lines.insert(3 + len(d.warnings), f"note: {d.base_steps} vs {d.test_steps} profiled steps; totals differ by length alone, "
                        "--per-step compares per step")
    for c in d.changes:
        label = "median step (per step)" if c["key"] == "step" and d.normalize != "per_step" else c["label"]
        lines.append(f"  {label:<32} {_ms(c['base_us']):>11} {_ms(c['test_us']):>11} "
                     f"{c['delta_us'] / 1e3:>+8,.3f} ms{_pct(c['base_us'], c['test_us'])}")
    bg, tg = d.gpu("base"), d.gpu("test")
    lines.append(f"  {'GPU busy':<32} {_ms(bg['busy_us']):>11} {_ms(tg['busy_us']):>11} "
                 f"{(tg['busy_us'] - bg['busy_us']) / 1e3:>+8,.3f} ms; idle fraction "
                 f"{bg['idle_fraction']:.1%} -> {tg['idle_fraction']:.1%}")
    lines.append(f"  {'kernel launches':<32} {bg['kernel_count']:>11,.6g} {tg['kernel_count']:>11,.6g}; "
                 f"kernel time change {d.kernel_delta_us / 1e3:+,.3f} ms")
    lines += _findings_lines(d)
    k = d.kernels[d.kernels["delta_us"] != 0].head(top)
    if len(k):
        lines.append(f"largest kernel changes (top {len(k)}, {unit}; launches base -> test):")
        for r in k.itertuples(index=False):
            tag = {"appeared": " [new]", "disappeared": " [gone]"}.get(r.status, "")
            lines.append(f"  {r.delta_us / 1e3:+10.3f} ms  {r.base_count:>7g} -> {r.test_count:<7g} {_cut(r.name)}{tag}")
    else:
        lines.append("no kernel time changed" if len(d.kernels) else "no kernels in either trace")
    o = d.ops[(d.ops["delta_cpu_us"] != 0) | (d.ops["delta_device_us"] != 0) | (d.ops["delta_count"] != 0)].head(top)
    if len(o):
        lines.append(f"largest op changes (top {len(o)}, {unit}; CPU total, device total, calls base -> test):")
        for r in o.itertuples(index=False):
            tag = {"appeared": " [new]", "disappeared": " [gone]"}.get(r.status, "")
            lines.append(f"  cpu {r.delta_cpu_us / 1e3:+9.3f} ms  gpu {r.delta_device_us / 1e3:+9.3f} ms  "
                         f"{r.base_count:>6g} -> {r.test_count:<6g} {_cut(r.name)}{tag}")
    for what, names in (("kernels appeared", d.appeared_kernels), ("kernels disappeared", d.disappeared_kernels),
                        ("ops appeared", d.appeared_ops), ("ops disappeared", d.disappeared_ops)):
        if names:
            shown = ", ".join(_cut(n, 60) for n in names[:8]) + (f", … ({len(names)} in all)" if len(names) > 8 else "")
            lines.append(f"{what}: {shown}")
    return "\n".join(lines)


_TAKES = "a Kineto trace or an allocator snapshot"


def _kinds(args) -> tuple[str, str]:
    """The kinds of BASE and TEST (sample names become their files), when diff can compare them: two
    traces, two snapshots, or files nothing recognises (the trace loader names their problem). Anything
    else is one line naming the file, what it is and what reads it."""
    import shlex

    from workbench.errors import BadArtifact
    from workbench.io.kinds import KINDS

    args.base, args.test = sample_or_path(args.base), sample_or_path(args.test)
    kinds = path_kind(args.base), path_kind(args.test)
    for path, kind in zip((args.base, args.test), kinds):
        if kind == "missing":  # not there, unreadable, a FIFO...: one line naming it, before the other is read
            from workbench.io._files import check_input

            check_input(path, "a file", f"diff takes two files, each {_TAKES}")
        if kind == "rank_folder":
            raise BadArtifact(path, "is a folder of traces, not a file",
                              f"diff compares two files; for the ranks of one run use `workbench ranks "
                              f"{shlex.quote(str(path))}`")
        if kind == "folder":
            raise BadArtifact(path, "is a folder, not a file", f"diff takes two files, each {_TAKES}")
        if kind in KINDS and kind not in ("trace", "snapshot"):
            raise wrong_file(path, kind, _TAKES)
    if "snapshot" in kinds and kinds[0] != kinds[1] and "missing" not in kinds:
        i = 0 if kinds[0] != "snapshot" else 1
        path, other = (args.base, args.test)[i], (args.base, args.test)[1 - i]
        if kinds[i] == "trace":
            raise BadArtifact(path, f"is a Kineto trace and {other} an allocator snapshot",
                              "diff compares two traces or two snapshots: give two of one kind")
        raise BadArtifact(path, f"is not an allocator snapshot like {other} (nor anything else gpu-workbench "
                          "recognises)", "diff compares two traces or two snapshots: give two of one kind")
    return kinds


def _memory_text(s: dict, top: int) -> str:
    from workbench.units import format_bytes as fb

    b, t = s["base"], s["test"]

    def pct(x, y):
        return f" ({100 * (y / x - 1):+.1f}%)" if x else ""

    lines = [
        f"base: {b['path']} ({b['events']:,} events, {b['steps']} steps, by {b['steps_method'] or 'none'})",
        f"test: {t['path']} ({t['events']:,} events, {t['steps']} steps, by {t['steps_method'] or 'none'})",
        f"axis: {'steps (aligned at step starts)' if s['axis'] == 'step' else 'ms from the first event'}",
        f"peak allocated: {fb(b['peak_allocated_bytes'])} -> {fb(t['peak_allocated_bytes'])}"
        f"{pct(b['peak_allocated_bytes'], t['peak_allocated_bytes'])}",
        f"peak reserved:  {fb(b['peak_reserved_bytes'])} -> {fb(t['peak_reserved_bytes'])}"
        f"{pct(b['peak_reserved_bytes'], t['peak_reserved_bytes'])}",
        "by category at each peak:",
    ]
    for r in s["by_category"]:
        lines.append(f"  {r['category']:<16} {fb(r['base_bytes']):>12} -> {fb(r['test_bytes']):>12}  "
                     f"({'+' if r['delta_bytes'] >= 0 else '-'}{fb(abs(r['delta_bytes']))})")
    lines.append(f"largest changes by user frame (top {min(top, len(s['by_frame']))}):")
    for r in s["by_frame"][:top]:
        lines.append(f"  {'+' if r['delta_bytes'] >= 0 else '-'}{fb(abs(r['delta_bytes'])):>11}  "
                     f"{r['base_count']:>5} -> {r['test_count']:<5} {_cut(r['frame'])}")
    return "\n".join(lines)


def _run_memory(args) -> int:
    import json

    from workbench.analysis.memory.diff import memory_diff
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.io.snapshot import load_snapshot

    target = prepare_output(args.html, [args.base, args.test], "--html")  # before the work
    quiet = None if sys.stderr.isatty() else False
    d = memory_diff(analyze_snapshot(load_snapshot(args.base, progress=quiet)),
                    analyze_snapshot(load_snapshot(args.test, progress=quiet)))
    top = args.top or 15
    if args.html:
        from workbench.report import memory_diff_report

        memory_diff_report(d, target.path, top=top)
        print(wrote(target), file=sys.stderr)
    if args.json:
        print(json.dumps(d.summary(top=args.top), indent=1))
    else:
        print(_memory_text(d.summary(top=None), top))
    return 0


def run(args) -> int:
    import json

    from workbench.analysis.trace.diff import diff_summary, trace_diff
    from workbench.io import load_trace

    if args.top is not None and args.top < 1:
        print("workbench diff: error: --top must be at least 1", file=sys.stderr)
        return 2
    kinds = _kinds(args)
    if kinds == ("snapshot", "snapshot"):
        if args.per_step:
            print("workbench diff: error: --per-step is for traces; snapshots are compared peak vs peak on the "
                  "step axis already", file=sys.stderr)
            return 2
        return _run_memory(args)
    target = prepare_output(args.html, [args.base, args.test], "--html")
    if sys.stderr.isatty():
        print(f"loading {args.base} and {args.test} ...", file=sys.stderr)
    base = load_trace(args.base)
    test = load_trace(args.test)
    d = trace_diff(base, test, normalize="per_step" if args.per_step else "total")
    top = args.top or 15
    if args.html:
        from workbench.report import diff_report

        diff_report(d, target.path, top=top)
        print(wrote(target), file=sys.stderr)
    if args.json:
        print(json.dumps(diff_summary(d, top=args.top), indent=1))
    else:
        print(_text(d, top))
    return 0

"""``workbench trace PATH [--json] [--html OUT] [--top N] [--compile-log DIR]``: summary and findings of a Kineto trace.

Several paths (or a folder of traces, e.g. one per rank) are loaded in parallel worker processes;
``--json`` then prints ``{"traces": [summary, ...]}`` instead of one summary (keys: docs/json.md).
``--html`` writes :func:`workbench.report.trace_report`. Each trace is analysed once
(:class:`workbench.analysis.TraceAnalysis`): the text, the JSON and the report read the same numbers.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

from workbench.commands._checks import count, expect_kind, positive_float, prepare_output, sample_or_path, wrote
from workbench.units import format_ms, format_pct, short_name

__all__ = ["add_arguments", "run"]

_PROGRESS_AFTER_S = 2.0  # WORKBENCH_PROGRESS_AFTER_S overrides it (0: always show the stages)
_TRACE_SUFFIXES = (".json", ".json.gz")


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="Kineto trace (.json or .json.gz from torch.profiler / export_chrome_trace); several "
                        "files or a folder load in parallel (one per rank)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (stable keys, documented in docs/json.md)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report (opens offline)")
    p.add_argument("--top", type=count, default=10, help="how many kernels and ops to list (default 10)")
    p.add_argument("--peak", action="append", metavar="KEY=VALUE",
                   help="override the GPU's datasheet peak for the roofline/MFU: DTYPE=TFLOPS (fp64, fp32, tf32, "
                        "bf16, fp16, fp8, int8) or gbps=GB/s; repeatable (e.g. --peak bf16=989.4 --peak gbps=4800)")
    p.add_argument("--step-ms", type=positive_float, metavar="MS",
                   help="the step time measured without the profiler; MFU is computed on it")
    p.add_argument("--ceilings", metavar="JSON",
                   help="measured ceilings (benchmarks/record_ceilings_h200.py output) to report beside the datasheet")
    p.add_argument("--compile-log", metavar="DIR",
                   help="what torch.compile logged for this run: the folder TORCH_TRACE=DIR wrote (or one of its "
                        "files); read instead of the trace's own stamp (docs/compile.md)")


# --------------------------------------------------------------------------------------------- progress


class _Progress:
    """Stage messages on stderr, only once the work has taken longer than ``_PROGRESS_AFTER_S``."""

    def __init__(self, label: str):
        self.label = label
        self.stage = "starting"
        self.t0 = time.perf_counter()
        self.shown = False
        self._lock = threading.Lock()
        after = float(os.environ.get("WORKBENCH_PROGRESS_AFTER_S", _PROGRESS_AFTER_S))
        self._timer = threading.Timer(after, self._show)
        self._timer.name = "workbench-trace-progress"
        self._timer.daemon = True

    def __enter__(self):
        self._timer.start()
        return self

    def _show(self) -> None:
        with self._lock:
            self.shown = True
            self._print()

    def _print(self) -> None:
        print(f"workbench trace: {self.label}: {self.stage} ({time.perf_counter() - self.t0:.1f} s)",
              file=sys.stderr, flush=True)

    def __call__(self, stage: str) -> None:
        with self._lock:
            self.stage = stage
            if self.shown:
                self._print()

    def __exit__(self, exc_type, exc, tb):
        self._timer.cancel()
        self._timer.join()
        if self.shown and exc_type is None:
            print(f"workbench trace: {self.label}: done in {time.perf_counter() - self.t0:.1f} s",
                  file=sys.stderr, flush=True)
        return False


# ------------------------------------------------------------------------------------------------ text


# template arguments kept: cutlass::Kernel2<...sgemm...> says more than cutlass::Kernel2
_short = partial(short_name, templates=True, ellipsis="~")
_ms = partial(format_ms, unit="")  # the unit is in the text or the column header
_pct = format_pct


def _text(s: dict) -> str:
    src, gpu, br = s["source"], s["gpu"], s["breakdown"]
    window = gpu.get("window_us") or 0.0
    lines = [
        f"{src['path']}",
        f"  device {src['device']}, {src['events']:,} events" + (f", rank {src['rank']}" if src.get("rank") is not None
                                                                  else ""),
    ]
    if s.get("diagnosis"):
        from workbench.analysis.trace.diagnosis import summary_text

        lines += textwrap.wrap(summary_text(s["diagnosis"]), width=108, subsequent_indent="    ")
    if gpu["kernel_count"] or window:
        lines.append(
            f"GPU over the whole window: busy {_ms(gpu['busy_us'])} ms of {_ms(window)} ms, idle {_pct(gpu['idle_fraction'])}, "
            f"{gpu['kernel_count']:,} kernels"
        )
        parts = [("compute", br["compute_us"]), ("communication", br["communication_us"]),
                 ("memcpy/memset", br["memory_us"]), ("idle", br["idle_us"])]
        lines.append("breakdown: " + ", ".join(
            f"{k} {_ms(v)} ms ({_pct(v / window) if window else '-'})" for k, v in parts))
    ps = s.get("per_step")
    if ps and (ps.get("delimited") or gpu["kernel_count"]):
        from workbench.analysis.trace.tables import per_step_text

        # the one definition of step, busy, idle and communication (docs/definitions.md)
        lines.append(per_step_text(ps))
    rl = s.get("roofline")
    if rl:
        from workbench.analysis.trace.roofline import summary_text as roofline_text

        lines += textwrap.wrap(roofline_text(rl), width=108, subsequent_indent="    ")
    if s.get("compile"):
        from workbench.analysis.trace.compile import summary_text as compile_text

        lines.append(compile_text(s["compile"]))
    if s["top_kernels"]:
        lines += ["", f"{'top kernels':<62}{'count':>7}{'total ms':>11}{'mean us':>10}{'%':>7}{'TFLOP/s':>9}"]
        for k in s["top_kernels"]:
            tf = f"{k['tflops']:.1f}" if k.get("tflops") else "-"
            lines.append(f"  {_short(k['name'], 60):<60}{k['count']:>7,}{_ms(k['total_us']):>11}"
                         f"{k.get('mean_us') or 0:>10.1f}{k['percent']:>7.1f}{tf:>9}")
    if s["top_ops"]:
        by = "CPU self time" if not gpu["kernel_count"] and not (s.get("per_step") or {}).get("gpu_activity", True) \
            else "device self time"
        lines += ["", f"{'top ops (by ' + by + ')':<46}{'count':>7}{'cpu self ms':>13}{'cpu total ms':>14}"
                      f"{'dev self ms':>13}"]
        for o in s["top_ops"]:
            lines.append(f"  {_short(o['name'], 44):<44}{o['count']:>7,}{_ms(o['cpu_self_us']):>13}"
                         f"{_ms(o['cpu_total_us']):>14}{_ms(o['device_self_us']):>13}")
    if s.get("memcpy"):
        lines += ["", "memcpy/memset: " + ", ".join(
            f"{m['kind']} {m['count']}x {_ms(m['total_us'])} ms"
            + (f" {m['gb_per_s']:.1f} GB/s" if m.get("gb_per_s") and m["kind"] != "memset" else "")
            for m in s["memcpy"])]
    lines += ["", "findings:" if s["findings"] else "findings: none"]
    for f in s["findings"]:
        lines += textwrap.wrap(f"[{f['severity']}] {f['id']}: {f['message']}", width=108,
                               initial_indent="  ", subsequent_indent="      ")
        if f.get("what_if"):
            w = f["what_if"]
            lines.append(f"      what if: {w['step_ms']:,.2f} -> {w['step_ms_if_fixed']:,.2f} ms a step "
                         f"(saves {100 * w['saved_fraction']:.0f}%)")
        code = (f.get("what_if") or {}).get("fix_code") or f.get("fix_code")
        if code:
            lines.append(f"      fix: {code}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- run


def _expand(paths: list[str]) -> tuple[list[Path], set[Path]]:
    """The files to load, and those of them that came from a folder (which may be skipped)."""
    from workbench.errors import BadArtifact

    out: list[Path] = []
    listed: set[Path] = set()
    for p in map(Path, paths):
        try:
            is_dir = p.is_dir()
        except OSError:  # a name too long, ...: the loader says what is wrong with it
            is_dir = False
        if is_dir:
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_TRACE_SUFFIXES))
            if not found:
                raise BadArtifact(p, "is a folder with no .json or .json.gz traces in it",
                                  "Give a trace file, or a folder that holds one trace per rank")
            out += found
            listed.update(found)
        else:
            out.append(p)
    return out, listed


def _peak_args(args):
    from workbench.analysis.trace.peaks import parse_peak_overrides
    from workbench.errors import BadArgument, BadArtifact

    peak = parse_peak_overrides(getattr(args, "peak", None)) or None
    if getattr(args, "step_ms", None) is not None and not args.step_ms > 0:
        raise BadArgument(f"--step-ms {args.step_ms}: give the measured step time in milliseconds (> 0)")
    measured = None
    if getattr(args, "ceilings", None):
        import json

        p = Path(args.ceilings)
        try:
            measured = json.loads(p.read_text())
            if not isinstance(measured, dict) or "matmul" not in measured:
                raise ValueError("no 'matmul' key")
        except FileNotFoundError:
            raise BadArtifact(p, "no such file", "Give the ceilings.json that benchmarks/record_ceilings_h200.py wrote") from None
        except ValueError as exc:
            raise BadArtifact(p, f"is not a ceilings JSON ({exc})",
                              "Give the ceilings.json that benchmarks/record_ceilings_h200.py wrote") from None
    return peak, measured


def run(args) -> int:
    import json

    from workbench.analysis import TraceAnalysis
    from workbench.errors import BadArtifact
    from workbench.io import load_trace, load_traces

    paths, listed = _expand([sample_or_path(p) for p in args.paths])
    for p in paths:
        if p not in listed:  # named on the command line: another kind of artifact says where it belongs
            expect_kind(p, ("trace",), "a Kineto trace")
    skipped: list[str] = []

    def skip(path, message):
        # a file found in a folder that is not a trace (a config.json beside the ranks) is left out
        # with a note; a file named on the command line is an error
        if Path(path) not in listed:
            raise BadArtifact(path, message.removeprefix(f"{path}: "))
        skipped.append(path)
        print(f"workbench trace: skipped {message}", file=sys.stderr)
    target = prepare_output(args.html, paths, "--html")  # before the work: writable, not an input

    label = str(paths[0]) if len(paths) == 1 else f"{len(paths)} traces"
    with _Progress(label) as progress:
        if len(paths) == 1:
            traces = [load_trace(paths[0], on_stage=progress)]
        else:
            progress(f"loading {len(paths)} files in parallel")
            traces = load_traces(paths, on_skip=skip)
            if not traces:
                raise BadArtifact(", ".join(args.paths), f"holds no loadable trace ({len(skipped)} files skipped)",
                                  "Give torch.profiler traces (.json or .json.gz)")
        progress("analysing")
        peak, measured = _peak_args(args)
        step_ms = getattr(args, "step_ms", None)
        compile_log = None
        if getattr(args, "compile_log", None):
            from workbench.io.compile_log import load_compile_log

            progress("reading the torch.compile log")
            compile_log = load_compile_log(args.compile_log)
        # one analysis per trace: the text, the JSON and the HTML report all read it
        analyses = [TraceAnalysis(t, peak=peak, step_ms=step_ms, measured=measured, compile_log=compile_log)
                    for t in traces]
        summaries = [a.summary(args.top) for a in analyses]
        if len(traces) == 1 and traces[0].metadata.get("profile_memory"):
            progress("reading its memory events")
            from workbench.analysis.findings import severity_rank

            found = summaries[0]["findings"] + _memory_leak_findings(paths[0])
            summaries[0]["findings"] = sorted(found, key=lambda f: -severity_rank(f["severity"]))  # stable
        if args.html:
            progress("writing HTML")
            from workbench.report import trace_report

            trace_report(analyses, target.path, top=args.top)
    if args.html:
        print(wrote(target), file=sys.stderr)
    if args.json:
        doc = summaries[0] if len(summaries) == 1 else {"traces": summaries}
        print(json.dumps(doc, indent=1))
    else:
        print("\n\n".join(_text(s) for s in summaries))
    return 0


def _memory_leak_findings(path) -> list[dict]:
    """A trace profiled with ``profile_memory=True`` (CPU or CUDA; a CPU run has no allocator snapshot) carries
    its allocations as ``[memory]`` events: a leak across steps is found there too (the memory rule
    ``leak_across_steps`` over ``io.load_profiler_memory``). Nothing when they cannot be read."""
    from workbench.analysis.memory.findings import leak_across_steps
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.errors import WorkbenchError
    from workbench.io.profiler_memory import load_profiler_memory

    try:
        snap = load_profiler_memory(path)
    except WorkbenchError:
        return []
    if not len(snap.events):
        return []
    f = leak_across_steps(analyze_snapshot(snap))
    return [f.as_dict()] if f is not None else []

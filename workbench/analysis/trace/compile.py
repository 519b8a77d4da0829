"""torch.compile in a trace: how many graphs the step became, where and why dynamo broke it, what
recompiled and why, what compiling cost, and what each fix would save (docs/compile.md).

Two sources, one block:

* the records dynamo logged while the step ran: stamped into the trace by the capture
  (``workbench_compile``, :mod:`workbench.capture.compile`) or read from a ``TORCH_TRACE`` folder
  (:func:`workbench.io.compile_log.load_compile_log`); :func:`summarize` turns them into a
  :class:`CompileSummary` (graphs, graph breaks with the user's file and line, recompiles with the guard
  that failed, compile time per frame, calls until nothing compiled any more);
* the trace's own events: the ``Torch-Compiled Region: F/C`` ranges dynamo's frames leave in a profiled
  step, each holding the compiled graph's call (``CompiledFunction``) and, after a graph break, the eager
  code and the next frame's region (:func:`compiled_regions`).

The what-ifs (:func:`graph_break_whatif`, :func:`recompile_whatif`, :func:`compile_payback`) read both;
:class:`~workbench.analysis.trace.analysis.TraceAnalysis` computes them once (``.compile``,
``.compile_regions``) for the CLI, the JSON, the panel and the findings. No torch.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis.trace.diagnosis import WhatIf

__all__ = [
    "CompileSummary",
    "summarize",
    "compiled_regions",
    "region_steps",
    "graph_break_whatif",
    "recompile_whatif",
    "compile_costs",
    "compile_payback",
    "REGION_PREFIX",
    "summary_text",
]

REGION_PREFIX = "Torch-Compiled Region: "
_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
# eager ops in a break that only wait (a GPU sync for .item(), a host copy): the fix takes them away
_WAITS = re.compile(r"^(aten::item|aten::_local_scalar_dense|cudaStreamSynchronize|cudaDeviceSynchronize|"
                    r"cudaMemcpy|aten::is_nonzero)")
_AT = re.compile(r"Graph break in user code at (.+):(\d+)\s*$", re.M)
_FILE_LINE = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$', re.M)
_CID = re.compile(r"^\s*\d+/\d+:\s*")


# ------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class CompileSummary:
    """What dynamo did: ``graphs`` compiled, ``graph_breaks`` (``[{reason, file, line, count, code, hint,
    function}]``: count = times dynamo met the break while compiling), ``recompiles`` (``[{reason, count,
    function, file, line, compile_ms}]``: a guard that failed and made a frame compile again),
    ``compile_ms`` (all frames, without the structured log's own cost; a training graph's backward,
    compiled at its first backward, included), ``frames`` (per frame compiled: ``{function, file, line,
    compiles, compile_ms, graphs}``, ``backward_compile_ms`` when there was one), ``steps_until_stable`` (the call after which nothing
    compiled: from the calls when the capture marked them, ``steps_until_stable_from="calls"``; from a
    log, the most compiles of one frame, ``"frames"``), ``eager_step_ms`` (the step with compiled functions
    run eagerly, when measured), ``counters`` (dynamo's own over the capture, when captured here),
    ``compile_list`` (each frame compile in the order dynamo logged them: ``{id, frame, compile, function,
    compile_ms, dynamic_sizes, call}``: ``dynamic_sizes`` the sizes dynamo made symbolic in that compile, e.g.
    ``L['x'].size()[0]`` (automatic dynamic shapes after a size changed, ``dynamic=True``, ``mark_dynamic``),
    ``call`` the capture's call it fell in, None from a log)."""

    graphs: int
    graph_breaks: list
    recompiles: list
    compile_ms: float
    steps_until_stable: int | None
    steps_until_stable_from: str | None
    frames: list
    compiles: int
    recompile_ms: float
    logging_overhead_ms: float
    calls: list = field(default_factory=list)
    eager_step_ms: float | None = None
    counters: dict | None = None
    source: str = "capture"
    torch: str | None = None
    compile_list: list = field(default_factory=list)

    @property
    def graph_break_count(self) -> int:
        return int(sum(b["count"] for b in self.graph_breaks))

    @property
    def recompile_count(self) -> int:
        return int(sum(r["count"] for r in self.recompiles))

    def as_dict(self) -> dict:
        """The ``compile`` block of ``workbench trace --json`` (docs/json.md)."""
        return {
            "source": self.source,
            "torch": self.torch,
            "graphs": self.graphs,
            "graph_breaks": list(self.graph_breaks),
            "recompiles": list(self.recompiles),
            "compile_ms": round(self.compile_ms, 3),
            "compiles": self.compiles,
            "recompile_ms": round(self.recompile_ms, 3),
            "steps_until_stable": self.steps_until_stable,
            "steps_until_stable_from": self.steps_until_stable_from,
            "frames": list(self.frames),
            "calls": len(self.calls),
            "eager_step_ms": self.eager_step_ms,
            "logging_overhead_ms": round(self.logging_overhead_ms, 3),
            "counters": self.counters,
            "compile_list": list(self.compile_list),
        }


def _first_line(text: str) -> str:
    for line in str(text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _parse_break(payload: str) -> dict:
    """reason, file, line, code (the source line), function and the first hint of one graph break."""
    text = payload or ""
    file = line = code = function = None
    m = _AT.search(text)
    user = text.split("User code traceback:", 1)[1] if "User code traceback:" in text else text
    frames = list(_FILE_LINE.finditer(user))
    if m:
        file, line = m.group(1), int(m.group(2))
    elif frames:
        file, line = frames[-1].group(1), int(frames[-1].group(2))
    for fm in reversed(frames):   # the source line dynamo shows under the frame of the break
        if file is not None and fm.group(1) == file and int(fm.group(2)) == line:
            function = fm.group(3).strip()
            rest = user[fm.end():].splitlines()
            code = next((s.strip() for s in rest if s.strip() and not set(s.strip()) <= set("^~ ")), None)
            break
    reason_text = text.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in text else text
    reason_text = reason_text.split("User code traceback:", 1)[0]
    lines = [s.strip() for s in reason_text.splitlines() if s.strip()]
    reason = ""
    if lines:
        reason = lines[0]
        if reason.startswith("Encountered graph break when attempting to trace") and len(lines) > 1:
            reason = lines[1]
    hint = next((s.removeprefix("Hint:").strip() for s in lines if s.startswith("Hint:")), None)
    return {"reason": reason, "file": file, "line": line, "code": code, "function": function, "hint": hint}


def _recompile_reason(payload: str) -> str:
    text = payload or ""
    if text.lstrip().startswith("["):   # a list of reasons (written as JSON lines)
        try:
            import json

            items = json.loads(text)
            text = "\n".join(map(str, items))
        except ValueError:
            pass
    return _CID.sub("", _first_line(text))


def summarize(stamp: dict | None) -> CompileSummary | None:
    """The :class:`CompileSummary` of a ``workbench_compile`` stamp or a loaded TORCH_TRACE log; None when
    there is none or it holds nothing compiled."""
    if not isinstance(stamp, dict):
        return None
    records = [r for r in stamp.get("records") or [] if isinstance(r, dict)]
    metrics = {}
    for r in records:
        if r.get("kind") == "compilation_metrics" and isinstance(r.get("metrics"), dict):
            key = (r.get("frame_id"), r.get("frame_compile_id"))
            metrics[key if None not in key else ("?", len(metrics))] = r["metrics"]
    # a training graph's backward is compiled at its first backward, outside the frame's compile time
    bwd = {}
    for r in records:
        if r.get("kind") == "bwd_compilation_metrics" and isinstance(r.get("metrics"), dict):
            m = r["metrics"]
            t = m.get("entire_frame_compile_time_s") or m.get("inductor_compile_time_s") or 0.0
            bwd[r.get("frame_id")] = bwd.get(r.get("frame_id"), 0.0) + float(t) * 1e3
    calls = [c for c in stamp.get("calls") or [] if isinstance(c, dict)]
    counters = stamp.get("counters") if isinstance(stamp.get("counters"), dict) else None
    if not metrics and not any(r.get("kind") == "dynamo_graph_break_reason" for r in records):
        return None

    def ms(m) -> float:
        t = m.get("entire_frame_compile_time_s") or 0.0
        o = m.get("structured_logging_overhead_s") or 0.0
        return max(0.0, float(t) - float(o)) * 1e3

    frames: dict = {}
    for (fid, cid), m in metrics.items():
        f = frames.setdefault(fid, {"frame": fid, "function": m.get("co_name"), "file": m.get("co_filename"),
                                    "line": m.get("co_firstlineno"), "compiles": 0, "compile_ms": 0.0, "graphs": 0})
        f["compiles"] += 1
        f["compile_ms"] += ms(m)
        f["graphs"] += int(bool(m.get("graph_op_count")))
    for fid, t in bwd.items():
        if fid in frames and t > 0:
            frames[fid]["compile_ms"] += t
            frames[fid]["backward_compile_ms"] = round(t, 3)
    frame_rows = sorted(frames.values(), key=lambda f: -f["compile_ms"])
    for f in frame_rows:
        f["compile_ms"] = round(f["compile_ms"], 3)

    breaks: dict = {}
    for r in records:
        if r.get("kind") != "dynamo_graph_break_reason":
            continue
        b = _parse_break(r.get("payload") or "")
        key = (b["reason"], b["file"], b["line"])
        if key not in breaks:
            breaks[key] = {**b, "count": 0}
        breaks[key]["count"] += 1
    break_rows = sorted(breaks.values(), key=lambda b: (-b["count"], str(b["file"]), b["line"] or 0))
    break_rows = [{k: b[k] for k in ("reason", "file", "line", "count", "code", "function", "hint")} for b in break_rows]

    recompiles: dict = {}
    for r in records:
        if r.get("kind") != "recompile_reasons":
            continue
        reason = _recompile_reason(r.get("payload") or "")
        m = metrics.get((r.get("frame_id"), r.get("frame_compile_id")), {})
        fn = m.get("co_name")
        key = (re.sub(r"\d+", "#", reason), fn)
        row = recompiles.setdefault(key, {"reason": reason, "count": 0, "function": fn, "file": m.get("co_filename"),
                                          "line": m.get("co_firstlineno"), "compile_ms": 0.0})
        row["count"] += 1
        row["compile_ms"] += ms(m) if m else 0.0
    recompile_rows = sorted(recompiles.values(), key=lambda r: -r["count"])
    for r in recompile_rows:
        r["compile_ms"] = round(r["compile_ms"], 3)
    recompile_ms = float(sum(ms(m) for (fid, cid), m in metrics.items() if isinstance(cid, int) and cid > 0))

    compile_list = _compile_list(records, calls, ms)

    if calls:
        compiling = [i for i, c in enumerate(calls) if c.get("compiles")]
        until, until_from = (compiling[-1] + 1 if compiling else 0), "calls"
    elif frames:
        until, until_from = max(f["compiles"] for f in frames.values()), "frames"
    else:
        until, until_from = None, None
    eager = stamp.get("eager_step_ms")
    return CompileSummary(
        graphs=int(sum(bool(m.get("graph_op_count")) for m in metrics.values())),
        graph_breaks=break_rows,
        recompiles=recompile_rows,
        compile_ms=float(sum(ms(m) for m in metrics.values())) + float(sum(bwd.values())),
        steps_until_stable=until,
        steps_until_stable_from=until_from,
        frames=frame_rows,
        compiles=len(metrics),
        recompile_ms=recompile_ms,
        logging_overhead_ms=float(sum((m.get("structured_logging_overhead_s") or 0.0) for m in metrics.values())) * 1e3,
        calls=calls,
        eager_step_ms=float(eager) if isinstance(eager, (int, float)) else None,
        counters=counters,
        source=str(stamp.get("source") or "capture"),
        torch=stamp.get("torch"),
        compile_list=compile_list,
    )


def _compile_list(records: list, calls: list, ms) -> list:
    """Each frame compile in log order (see :class:`CompileSummary`): the call it fell in comes from the calls'
    counts of ``compilation_metrics`` records (the capture counts them in the same order)."""
    sizes: dict = {}
    for r in records:
        if r.get("kind") == "create_symbol":
            src = r.get("source") or r.get("symbol")
            got = sizes.setdefault((r.get("frame_id"), r.get("frame_compile_id")), [])
            if src and src not in got:
                got.append(src)
    owner = [i for i, c in enumerate(calls) for _ in range(int(c.get("compiles") or 0))]
    rows = []
    for r in records:
        if r.get("kind") != "compilation_metrics" or not isinstance(r.get("metrics"), dict):
            continue
        m, fid, cid = r["metrics"], r.get("frame_id"), r.get("frame_compile_id")
        k = len(rows)
        rows.append({"id": m.get("compile_id") or f"{fid}/{cid}", "frame": fid, "compile": cid,
                     "function": m.get("co_name"), "compile_ms": round(ms(m), 3),
                     "dynamic_sizes": list(sizes.get((fid, cid), [])), "call": owner[k] if k < len(owner) else None})
    return rows


# ---------------------------------------------------------------------------------------- the trace


_REGION_COLS = ["name", "frame", "compile", "pid", "tid", "ts_us", "dur_us", "work_us", "nested_us", "lookup_us",
                "waits_us", "self_us", "step", "depth"]
_LOOKUP = "TorchDynamo Cache Lookup"


def _empty_regions() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in _REGION_COLS})


def _name_starts(name: pd.Series, prefix: str) -> pd.Series:
    """``name.str.startswith(prefix)``, on the categories when the names are categorical (millions of
    events, a few thousand distinct names)."""
    if isinstance(name.dtype, pd.CategoricalDtype):
        cats = name.cat.categories.astype(str)
        hit = np.asarray(cats.str.startswith(prefix), dtype=bool)
        codes = name.cat.codes.to_numpy()
        return pd.Series(np.where(codes >= 0, hit[np.clip(codes, 0, None)], False) if len(hit) else
                         np.zeros(len(name), bool), index=name.index)
    return name.astype(str).str.startswith(prefix)


def compiled_regions(ev: pd.DataFrame) -> pd.DataFrame:
    """One row per ``Torch-Compiled Region: F/C`` range in the trace: ``frame`` F and ``compile`` C (dynamo's
    compile id), thread, ``ts_us``/``dur_us`` and what its direct children are: ``work_us`` (the compiled
    graph's call, ``CompiledFunction``, or the ops it runs, and the eager ops between graphs: work a single
    graph still does), ``nested_us`` (regions inside it: the frames dynamo resumed in after a graph break),
    ``lookup_us`` (dynamo's guard checks for those resumed frames, ``TorchDynamo Cache Lookup``),
    ``waits_us`` (ops that only wait: ``.item()``'s copy, a device sync), ``self_us`` (the rest: Python and
    the region's own entry); ``step`` (the ProfilerStep it starts in, or -1) and ``depth`` (0: outermost)."""
    if ev is None or not len(ev):
        return _empty_regions()
    is_region = _name_starts(ev["name"], REGION_PREFIX)
    if not bool(is_region.any()):
        return _empty_regions()   # (most traces: decided on the distinct names only)
    names = ev["name"].astype(str)
    host = ev[ev["dur_us"].notna() & ~ev["cat"].isin(("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"))]
    hnames = names.loc[host.index]
    steps = ev[(ev["cat"] == "user_annotation") & names.str.startswith("ProfilerStep#")]
    s_start = steps["ts_us"].to_numpy(float)
    s_end = s_start + steps["dur_us"].to_numpy(float)
    s_num = (names.loc[steps.index].str.slice(len("ProfilerStep#")).astype(int).to_numpy() if len(steps)
             else np.array([], int))
    s_order = np.argsort(s_start, kind="stable")
    s_start, s_end, s_num = s_start[s_order], s_end[s_order], s_num[s_order]
    rows = []
    for (pid, tid), grp in ev[is_region].groupby(["pid", "tid"], sort=False, observed=True):
        same = host[(host["pid"] == pid) & (host["tid"] == tid)]
        ts_all = same["ts_us"].to_numpy(float)
        end_all = ts_all + same["dur_us"].to_numpy(float)
        nm_all = hnames.loc[same.index].to_numpy()
        order = np.lexsort((-end_all, ts_all))   # by start, the longer first (parents before children)
        ts_all, end_all, nm_all = ts_all[order], end_all[order], nm_all[order]
        g = grp.sort_values("ts_us")
        r_ts = g["ts_us"].to_numpy(float)
        r_end = r_ts + g["dur_us"].to_numpy(float)
        r_names = g["name"].astype(str).to_numpy()
        for i in range(len(g)):
            a, b = r_ts[i], r_end[i]
            lo, hi = np.searchsorted(ts_all, a, "left"), np.searchsorted(ts_all, b, "right")
            work = nested = lookup = waits = 0.0
            cover_end = -np.inf
            for t0, t1, nm in zip(ts_all[lo:hi], end_all[lo:hi], nm_all[lo:hi]):
                if t1 > b + 1e-3 or (t0 == a and t1 == b and nm == r_names[i]):
                    continue   # the region itself, or something reaching out of it
                if t0 < cover_end:
                    continue   # inside a direct child already counted
                if nm.startswith(REGION_PREFIX):
                    nested += t1 - t0
                elif nm.startswith(_LOOKUP):
                    lookup += t1 - t0
                elif _WAITS.match(nm):
                    waits += t1 - t0
                else:
                    work += t1 - t0
                cover_end = t1
            depth = int(((r_ts[:i] <= a) & (r_end[:i] >= b)).sum())
            k = np.searchsorted(s_start, a, "right") - 1
            step = int(s_num[k]) if k >= 0 and a < s_end[k] else -1
            m = _REGION.match(r_names[i])
            rows.append({"name": r_names[i], "frame": int(m.group(1)), "compile": int(m.group(2)), "pid": pid,
                         "tid": tid, "ts_us": a, "dur_us": b - a, "work_us": work, "nested_us": nested,
                         "lookup_us": lookup, "waits_us": waits,
                         "self_us": max(0.0, (b - a) - work - nested - lookup - waits), "step": step, "depth": depth})
    return pd.DataFrame(rows, columns=_REGION_COLS).sort_values("ts_us", ignore_index=True)


def region_steps(regions: pd.DataFrame) -> pd.DataFrame:
    """Per ProfilerStep: ``regions`` (compiled regions entered), ``work_us`` (graphs and eager ops in them),
    ``break_us`` (what the breaks cost: the resumed regions' own time, dynamo's guard checks for them and
    the waits a break forces)."""
    cols = ["step", "regions", "work_us", "break_us", "waits_us"]
    if regions is None or not len(regions):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    r = regions[regions["step"] >= 0]
    if not len(r):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})
    r = r.assign(break_us=np.where(r["depth"] > 0, r["self_us"], 0.0) + r["lookup_us"] + r["waits_us"])
    return r.groupby("step").agg(regions=("name", "size"), work_us=("work_us", "sum"), break_us=("break_us", "sum"),
                                 waits_us=("waits_us", "sum")).reset_index()[cols]


# ------------------------------------------------------------------------------------------ what-ifs


def graph_break_whatif(summary: CompileSummary | None, regions: pd.DataFrame, step_ms: float,
                       step_ms_trace: float | None) -> WhatIf | None:
    """The step with the broken regions in one graph. In a profiled step each graph break resumes in a
    region nested in the one before: dynamo checks the resumed frame's guards (``TorchDynamo Cache
    Lookup``), enters its region and runs its graph, after any wait the break forces (``.item()`` copies
    the value to the host: on a GPU a sync). One graph keeps all the work (the graphs' ops and the eager
    ops, now traced) and drops the rest: the resumed regions' own time, the guard checks and the waits
    (:func:`region_steps`' ``break_us``). Measured on the trace's steps (median), applied to ``step_ms`` (the
    step measured without the profiler when the capture did, as a fraction of the traced step)."""
    if summary is None or not summary.graph_breaks or regions is None or not len(regions):
        return None
    per = region_steps(regions)
    per = per[per["regions"] > 1]
    if not len(per) or not step_ms_trace:
        return None
    saved_us = float(np.median(per["break_us"]))
    frac = min(0.95, saved_us / (step_ms_trace * 1e3))
    fixed = step_ms * (1.0 - frac)
    first = summary.graph_breaks[0]
    where = f"{first['file']}:{first['line']}" if first.get("file") else "the break"
    return WhatIf("graph_breaks", step_ms, fixed, frac,
                  f"remove the graph break at {where} so the step is one graph",
                  {"graphs_per_step": int(np.median(per["regions"])), "break_us_per_step": round(saved_us, 1),
                   "work_us_per_step": round(float(np.median(per["work_us"])), 1),
                   "waits_us_per_step": round(float(np.median(per["waits_us"])), 1)})


def recompile_whatif(summary: CompileSummary | None) -> WhatIf | None:
    """The captured calls with the changing dimension compiled dynamically (``dynamic=True`` or
    ``torch._dynamo.mark_dynamic`` on it): each frame that recompiled compiles once, a graph with that size
    symbolic. ``step_ms`` here is the mean call over the captured calls, compile included.

    Every compile costs what it cost the calls (:func:`compile_costs`: its share of its call's wall time
    beyond a stable compiled call, or dynamo's own compile time where that is larger). The compile the fix
    keeps, per frame, is the frame's first compile with a symbolic size where the record holds one (torch's
    default, ``dynamic=None``, compiles the frame again with the changed size symbolic at its first change:
    automatic dynamic shapes; its cost is read, ``kept_compile_from="dynamic"``); else its first compile,
    static (``"static"``): then the fix's dynamic compile is assumed to cost what that static one did, and
    since tracing with symbolic sizes costs more, ``calls_ms_if_fixed`` is a lower bound (``assumes`` says
    so). Every other compile of the frame is saved."""
    if summary is None or not summary.recompiles or not summary.calls:
        return None
    total = float(sum(c.get("ms") or 0.0 for c in summary.calls))
    n = len(summary.calls)
    if total <= 0:
        return None
    stable = compiled_step_ms(summary)
    cost = compile_costs(summary, stable)
    frames: dict = {}
    for i, row in enumerate(summary.compile_list):
        frames.setdefault(row["frame"], []).append(i)
    saved = kept_ms = 0.0
    kinds, sizes = set(), []
    for idx in frames.values():
        if len(idx) < 2:
            continue
        dyn = [i for i in idx if summary.compile_list[i]["dynamic_sizes"]]
        keep = dyn[0] if dyn else idx[0]
        kinds.add("dynamic" if dyn else "static")
        sizes += [s for s in summary.compile_list[keep]["dynamic_sizes"] if s not in sizes]
        kept_ms += cost[keep]
        saved += sum(cost[i] for i in idx if i != keep)
    saved = min(saved, total)
    kept_from = kinds.pop() if len(kinds) == 1 else ("partly dynamic" if kinds else None)
    assumes = None
    if kept_from != "dynamic":
        assumes = ("no compile in this record made the changing size symbolic (dynamic=False, or dynamo's "
                   "automatic dynamic shapes off): the fix's dynamic compile is taken to cost what the frame's "
                   "first, static compile did; tracing with symbolic sizes costs more, so calls_ms_if_fixed is a "
                   "lower bound (a run with torch's default dynamic=None records a dynamic compile at the first "
                   "size change, and this what-if reads its cost)")
    where = f" ({', '.join(sizes)})" if sizes else ""
    wall = sum(_compiling_walls(summary, stable)[1:]) if stable is not None else 0.0
    return WhatIf("recompiles", total / n, (total - saved) / n, saved / total,
                  f"compile the changing dimension dynamically{where}: torch.compile(..., dynamic=True) or "
                  "torch._dynamo.mark_dynamic(x, dim)",
                  {"calls": n, "calls_ms": round(total, 3), "calls_ms_if_fixed": round(total - saved, 3),
                   "recompiles": summary.recompile_count, "recompile_ms": round(summary.recompile_ms, 3),
                   "recompile_wall_ms": round(wall, 3), "kept_compile_ms": round(kept_ms, 3),
                   "kept_compile_from": kept_from, "dynamic_sizes": sizes, "assumes": assumes})


def compile_costs(summary: CompileSummary, stable_ms: float | None) -> list[float]:
    """What each compile of ``summary.compile_list`` cost the calls, ms: its share (by dynamo's compile time,
    among the compiles of its call) of its call's wall time beyond ``stable_ms``, or dynamo's own compile time
    where that is larger or the call was not timed."""
    rows = summary.compile_list
    per_call: dict = {}
    for i, r in enumerate(rows):
        if r.get("call") is not None:
            per_call.setdefault(r["call"], []).append(i)
    out = [float(r["compile_ms"]) for r in rows]
    if stable_ms is None:
        return out
    for c, idx in per_call.items():
        ms = summary.calls[c].get("ms") if c < len(summary.calls) else None
        if ms is None:
            continue
        extra = max(0.0, float(ms) - stable_ms)
        weights = [float(rows[i]["compile_ms"]) for i in idx]
        tot = sum(weights)
        for i, wt in zip(idx, weights):
            share = extra * (wt / tot if tot > 0 else 1.0 / len(idx))
            out[i] = max(out[i], share)
    return out


def compile_payback(summary: CompileSummary | None, step_ms: float | None) -> dict | None:
    """Compiling against what it saves a step: ``{compile_ms, compile_ms_dynamo, eager_step_ms,
    compiled_step_ms, saved_per_step_ms, steps_to_pay_back}`` (None when the eager step was not measured).
    ``compile_ms`` is what compiling cost the calls (:func:`compile_wall_ms`), ``compile_ms_dynamo`` dynamo's
    own frame compile time.
    ``steps_to_pay_back`` is None when the compiled step is not faster (it never pays back)."""
    if summary is None or summary.eager_step_ms is None or not step_ms:
        return None
    saved = summary.eager_step_ms - step_ms
    cost = compile_wall_ms(summary, step_ms)
    steps = int(np.ceil(cost / saved)) if saved > 0 else None
    return {"compile_ms": round(cost, 3), "compile_ms_dynamo": round(summary.compile_ms, 3),
            "eager_step_ms": round(summary.eager_step_ms, 4),
            "compiled_step_ms": round(float(step_ms), 4), "saved_per_step_ms": round(saved, 4),
            "steps_to_pay_back": steps}


def compile_wall_ms(summary: CompileSummary, step_ms: float) -> float:
    """What compiling cost the calls that compiled: their wall time beyond a compiled step (dynamo's frame
    compile time plus what it does not count: the first run's set-up, lazy initialisation). Dynamo's own
    compile time when the calls were not timed (a TORCH_TRACE log)."""
    wall = _compiling_walls(summary, step_ms)
    return float(max(summary.compile_ms, sum(wall))) if wall else float(summary.compile_ms)


def _compiling_walls(summary: CompileSummary, step_ms: float) -> list[float]:
    """Each timed call that compiled, in order: its wall time beyond a compiled step."""
    return [c["ms"] - step_ms for c in summary.calls if c.get("compiles") and c.get("ms") is not None]


def compiled_step_ms(summary: CompileSummary | None) -> float | None:
    """The median call after the last compile (a stable compiled call), from the capture's calls."""
    if summary is None or not summary.calls or summary.steps_until_stable is None:
        return None
    stable = [c["ms"] for c in summary.calls[summary.steps_until_stable:] if c.get("ms")]
    return float(statistics.median(stable)) if stable else None


def summary_text(block: dict | None) -> str | None:
    """One line about torch.compile from the JSON ``compile`` block (the CLI's text and the ProfilerPanel's
    header): graphs, breaks, recompiles, compile time, when calls stopped compiling, regions a step."""
    if not block:
        return None
    regions = f"{block.get('regions_per_step') or 0:g} compiled regions a step"
    if block.get("graphs") is None:
        return f"torch.compile: {regions} (no compile record)"
    nb = sum(b["count"] for b in block.get("graph_breaks") or [])
    nr = sum(r["count"] for r in block.get("recompiles") or [])
    until = block.get("steps_until_stable")
    return (f"torch.compile: {block['graphs']} graph{'s' if block['graphs'] != 1 else ''}, {nb} graph break"
            f"{'s' if nb != 1 else ''}, {nr} recompile{'s' if nr != 1 else ''}, compiling "
            f"{(block.get('compile_ms') or 0) / 1e3:,.2f} s" + (f", stable after call {until}" if until else "")
            + f", {regions}")

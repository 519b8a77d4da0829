"""TraceAnalysis: everything the trace fronts show about one trace, each piece computed once.

    a = TraceAnalysis(load_trace(samples.path("h200_train_step")))
    a.kernels, a.ops, a.gaps, a.steps     # the tables of workbench.analysis.trace.tables
    a.diagnosis                           # the step model's diagnosis (one graph, one diagnose)
    a.roofline                            # on that diagnosis; a.precision: the TF32/bf16 what-ifs
    a.findings                            # the Finding list (workbench.analysis.trace.findings' rules)
    a.compile                             # what torch.compile did (docs/compile.md), a.compile_regions
    a.summary(top=10)                     # the `workbench trace --json` document (docs/json.md)

The CLI (``workbench trace``, ``workbench diff``), the HTML reports, :class:`~workbench.panels.ProfilerPanel`
and :func:`~workbench.analysis.trace.diff.trace_diff` build one per trace (or take one) and read from it, so
the diagnosis, the roofline and the findings are computed once per trace whatever the front shows.
Every attribute is computed on first use and kept. ``peak``: a Peak, or ``{dtype: TFLOP/s, "gbps": GB/s}``
overrides of the datasheet row; ``step_ms``: a step time measured without the profiler (MFU is computed
on it); ``measured``: measured ceilings (a Peak or the ceilings JSON) reported beside; ``compile_log``: what
torch.compile logged for a run captured elsewhere (:func:`workbench.io.compile_log.load_compile_log`), read
instead of the trace's own ``workbench_compile`` stamp.
"""

from __future__ import annotations

import math
import os
from functools import cached_property

import numpy as np
import pandas as pd

from workbench.analysis.trace import tables as ta
from workbench.analysis.findings import Finding
from workbench.analysis.trace.findings import run_rules
from workbench.errors import BadArgument

__all__ = ["TraceAnalysis", "trace_summary", "findings"]


class TraceAnalysis:
    """One trace's tables, diagnosis, roofline and findings, each computed on first use and kept.
    ``trace``: a loaded Trace (or its events frame), or a trace file's path (loaded here)."""

    def __init__(self, trace, peak=None, step_ms: float | None = None, measured=None, compile_log: dict | None = None):
        if isinstance(trace, TraceAnalysis):
            raise BadArgument("TraceAnalysis takes a trace, not another TraceAnalysis")
        if isinstance(trace, (str, os.PathLike)):
            from workbench.io.trace import load_trace

            trace = load_trace(trace)
        self.trace = trace
        self.peak_arg = peak          # a Peak, or {dtype: TFLOP/s, "gbps": ...} overrides
        self.step_ms_arg = step_ms    # a step time measured without the profiler, for MFU
        self.measured_arg = measured  # measured ceilings (Peak or ceilings JSON), reported beside
        self.compile_log_arg = compile_log  # a TORCH_TRACE log's record (io.compile_log), else the trace's stamp
        self.ev = ta._events(trace)
        self.device = getattr(trace, "device", "unknown GPU")
        self.metadata = getattr(trace, "metadata", {}) or {}
        self._summaries: dict[int, dict] = {}

    def __repr__(self) -> str:
        return f"TraceAnalysis({getattr(self.trace, 'path', None) or 'events'!s}, {self.device})"

    # -- tables ----------------------------------------------------------------------------------

    @cached_property
    def busy(self) -> ta.GpuBusy:
        return ta.gpu_busy(self.ev)

    @cached_property
    def gaps(self) -> pd.DataFrame:
        return ta.idle_gaps(self.ev)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        return ta.kernel_summary(self.ev)

    @cached_property
    def ops(self) -> pd.DataFrame:
        """The op table: by device self time, or by CPU self time on a CPU-only trace (no device time)."""
        ops = ta.op_summary(self.ev)
        if self.cpu_only and len(ops):
            ops = ops.sort_values(["cpu_self_us", "cpu_total_us", "name"], ascending=[False, False, True],
                                  ignore_index=True)
        return ops

    @cached_property
    def memcpy(self) -> pd.DataFrame:
        return ta.memcpy_summary(self.ev)

    @cached_property
    def breakdown(self) -> dict:
        return ta.temporal_breakdown(self.ev)

    @cached_property
    def launch(self) -> ta.LaunchStats:
        return ta.launch_stats(self.ev)

    @cached_property
    def steps(self) -> pd.DataFrame:
        return ta.step_summary(self.ev)

    @cached_property
    def numbers(self) -> ta.StepNumbers:
        """The step time, GPU busy, idle and communication a step (:func:`~workbench.analysis.trace.tables.step_numbers`):
        the one definition every front shows (docs/definitions.md)."""
        return ta.step_numbers(self.ev)

    # -- the step model, the roofline, the findings ----------------------------------------------

    @cached_property
    def graph(self):
        from workbench.analysis.trace.step_model import build_graph

        return build_graph(self.trace)

    @cached_property
    def diagnosis(self):
        """The :class:`~workbench.analysis.trace.diagnosis.Diagnosis`: of the GPU step model, or for a CPU-only
        trace with ProfilerSteps :func:`~workbench.analysis.trace.diagnosis.diagnose_cpu` (None otherwise)."""
        from workbench.analysis.trace.diagnosis import diagnose, diagnose_cpu

        if self.cpu_only:
            return diagnose_cpu(self.trace, numbers=self.numbers)
        return diagnose(self.trace, graph=self.graph, numbers=self.numbers)

    @cached_property
    def cpu_only(self) -> bool:
        """True when the trace holds no GPU activity (kernels, copies, memsets)."""
        return bool(len(self.ev)) and not bool(ta._cat_mask(self.ev, ta.GPU_ACTIVITY).any())

    @cached_property
    def roofline(self):
        """The :class:`~workbench.analysis.trace.roofline.Roofline`, on this analysis' diagnosis."""
        from workbench.analysis.trace.peaks import Peak
        from workbench.analysis.trace.roofline import roofline

        p = self.peak_arg
        return roofline(self.trace, peak=p if isinstance(p, Peak) else None,
                        override=None if isinstance(p, Peak) else p, step_ms=self.step_ms_arg,
                        diagnosis=self.diagnosis, measured=self.measured_arg)

    @cached_property
    def precision(self) -> dict:
        """``{"tf32": WhatIf, "bf16": WhatIf}`` (:func:`~workbench.analysis.trace.roofline.precision_what_ifs`)."""
        from workbench.analysis.trace.roofline import precision_what_ifs

        rl = self.roofline
        return precision_what_ifs(self.trace, rl, graph=self.graph) if rl.costs.has_shapes else {}

    @cached_property
    def findings(self) -> list:
        """The findings (:mod:`workbench.analysis.trace.findings`): with a what-if first, largest saving
        first, then the others by severity."""
        return run_rules(self)

    # -- torch.compile ---------------------------------------------------------------------------

    @cached_property
    def compile(self):
        """The :class:`~workbench.analysis.trace.compile.CompileSummary` of what torch.compile did during the
        capture (the trace's ``workbench_compile`` stamp, or the ``compile_log`` given); None without one."""
        from workbench.analysis.trace.compile import summarize

        return summarize(self.compile_log_arg if self.compile_log_arg is not None
                         else self.metadata.get("workbench_compile"))

    @cached_property
    def compile_regions(self) -> pd.DataFrame:
        """The trace's ``Torch-Compiled Region`` ranges (:func:`~workbench.analysis.trace.compile.compiled_regions`)."""
        from workbench.analysis.trace.compile import compiled_regions

        return compiled_regions(self.ev)

    @cached_property
    def compile_whatifs(self) -> dict:
        """``{"graph_breaks": WhatIf, "recompiles": WhatIf, "compile_cost": {...}}`` (the ones that apply)."""
        from workbench.analysis.trace import compile as cc

        s = self.compile
        if s is None:
            return {}
        step_trace = _median_step_ms(self.steps)
        measured = self.metadata.get("workbench_unprofiled_step_ms")
        step = float(measured) if isinstance(measured, (int, float)) and measured > 0 else step_trace
        out = {}
        w = cc.graph_break_whatif(s, self.compile_regions, step, step_trace) if step else None
        if w is not None:
            out["graph_breaks"] = w
        w = cc.recompile_whatif(s)
        if w is not None:
            out["recompiles"] = w
        p = cc.compile_payback(s, step if measured else cc.compiled_step_ms(s))
        if p is not None:
            out["compile_cost"] = p
        return out

    def compile_block(self) -> dict | None:
        """The ``compile`` block of the JSON document: the summary, the regions per step and the what-ifs."""
        from workbench.analysis.trace.compile import region_steps

        s = self.compile
        regions = self.compile_regions
        if s is None and not len(regions):
            return None
        d = s.as_dict() if s is not None else {"source": None, "graphs": None, "graph_breaks": [], "recompiles": [],
                                                "compile_ms": None, "steps_until_stable": None}
        per = region_steps(regions)
        d["regions_per_step"] = float(per["regions"].median()) if len(per) else 0.0
        d["region_work_us_per_step"] = float(per["work_us"].median()) if len(per) else 0.0
        d["region_break_us_per_step"] = float(per["break_us"].median()) if len(per) else 0.0
        wi = self.compile_whatifs
        d["what_if"] = {k: (v.as_dict() | {"evidence": v.evidence} if hasattr(v, "as_dict") else v)
                        for k, v in wi.items()}
        return d

    def gap_us(self, cause: str) -> tuple[float, int]:
        g = self.gaps[self.gaps["cause"] == cause]
        return float(g["dur_us"].sum()), int(len(g))

    @property
    def heavy_profiling(self) -> bool:
        return bool(self.metadata.get("with_stack") or self.metadata.get("profile_memory"))

    # -- the JSON document -----------------------------------------------------------------------

    def summary(self, top: int = 10) -> dict:
        """The ``workbench trace --json`` document (every key in docs/json.md): source, gpu, breakdown,
        top_kernels, top_ops, findings; plus roofline, diagnosis, steps, memcpy, launch and idle_gaps.
        Assembled once per ``top`` and kept: treat it as read-only."""
        top = int(top)
        if top not in self._summaries:
            self._summaries[top] = self._summary(top)
        return self._summaries[top]

    def _summary(self, top: int) -> dict:
        trace = self.trace
        busy = self.busy
        rl = self.roofline if busy.kernel_count else None
        kernels = _with_rates(self.kernels.head(top), None if rl is None else rl.kernels,
                              ["tflops", "roofline_fraction"])
        ops = _with_rates(self.ops.head(top), None if rl is None else rl.ops, ["flops", "tflops"])
        gaps = self.gaps
        by_cause = gaps.groupby("cause")["dur_us"].agg(["count", "sum"]) if len(gaps) else None
        d = self.diagnosis
        return _jsonable(
            {
                "source": {
                    "path": getattr(trace, "path", None),
                    "device": self.device,
                    "events": int(getattr(trace, "n_events", len(self.ev))),
                    "rank": getattr(trace, "rank", None),
                },
                "gpu": {
                    "busy_us": busy.busy_us,
                    "idle_us": busy.idle_us,
                    "idle_fraction": busy.idle_fraction,
                    "kernel_count": busy.kernel_count,
                    "window_us": busy.window_us,
                },
                "per_step": self.numbers.as_dict(),
                "breakdown": dict(self.breakdown),
                "top_kernels": _records(kernels, ["name", "count", "total_us", "percent", "mean_us", "tflops",
                                                  "roofline_fraction"]),
                "top_ops": _records(
                    ops,
                    ["name", "count", "cpu_total_us", "cpu_self_us", "device_total_us", "device_self_us", "flops",
                     "tflops"],
                ),
                "roofline": None if rl is None else _roofline_block(rl),
                "diagnosis": None if d is None else d.as_dict(),
                "findings": [f.as_dict() for f in self.findings],
                "steps": _records(self.steps, list(self.steps.columns)),
                "memcpy": _records(self.memcpy, list(self.memcpy.columns)),
                "launch": self.launch.as_dict(),
                "compile": self.compile_block(),
                "idle_gaps": {
                    "count": int(len(gaps)),
                    "by_cause_us": {} if by_cause is None else {str(k): float(v) for k, v in by_cause["sum"].items()},
                },
            }
        )


def trace_summary(trace, top: int = 10, peak=None, step_ms: float | None = None, measured=None) -> dict:
    """The ``workbench trace --json`` document: ``TraceAnalysis(trace, peak, step_ms, measured).summary(top)``
    (every key in docs/json.md). ``trace``: a Trace, an events frame or a :class:`TraceAnalysis` (then
    ``peak``, ``step_ms`` and ``measured`` are the analysis' own)."""
    if isinstance(trace, TraceAnalysis):
        if peak is not None or step_ms is not None or measured is not None:
            raise BadArgument("trace_summary: a TraceAnalysis carries its own peak, step_ms and measured; "
                              "give them to TraceAnalysis(trace, peak=..., step_ms=..., measured=...)")
        return trace.summary(top)
    return TraceAnalysis(trace, peak=peak, step_ms=step_ms, measured=measured).summary(top)


# ------------------------------------------------------------------------------------------- helpers


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict]:
    return [_jsonable(dict(zip(cols, row))) for row in df[cols].itertuples(index=False, name=None)]


_ROOFLINE_KEYS = ("device", "peak_source", "peak_tflops", "peak_gbps", "measured_peak_tflops", "measured_peak_gbps",
                  "has_shapes", "model_flops", "flops", "dtype", "peak_tflops_dtype", "step_ms", "step_ms_source",
                  "step_ms_trace", "achieved_tflops", "achieved_tflops_trace", "mfu", "mfu_trace", "model_kernel_ms",
                  "model_kernel_tflops", "flops_coverage", "costed_coverage", "matched_kernel_fraction", "notes")


def _roofline_block(rl) -> dict:
    d = rl.as_dict()
    return {k: d[k] for k in _ROOFLINE_KEYS if k in d}


def _with_rates(table: pd.DataFrame, rates: pd.DataFrame | None, cols: list[str]) -> pd.DataFrame:
    """``table`` with the roofline's columns ``cols`` joined on name (NaN where the roofline has no row)."""
    if rates is None or rates.empty:
        return table.assign(**{k: np.nan for k in cols})
    r = rates.drop_duplicates("name").set_index("name")
    return table.assign(**{k: table["name"].map(r[k]).to_numpy() for k in cols})


def _median_step_ms(steps: pd.DataFrame) -> float | None:
    if steps is None or not len(steps):
        return None
    v = float(steps["dur_us"].median()) / 1e3
    return v if v > 0 else None


def findings(trace) -> list[Finding]:
    """Diagnoses of one trace: findings with a what-if first, largest saving first (the profiler's own
    overhead first when it is at least ``analysis.trace.findings.WHATIF_WARN``), then the others by
    severity."""
    return list(TraceAnalysis(trace).findings)

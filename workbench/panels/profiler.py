"""ProfilerPanel: one trace in the notebook. Findings, kernel and op tables with their bars, the
temporal breakdown, a zoomable stream timeline, per-step times, the GPU idle gaps and the roofline
(achieved TFLOP/s per op against the GPU's peaks, MFU; needs a trace with shapes).

    ProfilerPanel(samples.path("h200_train_step"))                   # any Kineto trace file, or a Trace
    ProfilerPanel(profile_steps(train_step, steps=3))                # a ProfileResult
    ProfilerPanel(TraceAnalysis(trace, peak={"bf16": 989.4}))        # a TraceAnalysis (peaks, step_ms)
    ProfilerPanel.from_step(train_step, steps=3, detail="standard")  # profile live, then show it

Given another kind of artifact (a snapshot, an NVML session, ...) or a missing file it raises a
:class:`~workbench.errors.BadArtifact` naming the panel or command that fits (``_base.classify`` asks
the artifact registry, ``io/kinds.py``); a trace file that fails to load (truncated, corrupt) shows its
error in the panel (``raise_errors=True`` raises).

Controls: sort key, top-N, a name filter (case-insensitive substring), a step choice (All or one
ProfilerStep), and "by input shape" for the op table. The table under each figure shows the same
rows as the figure. Everything is computed by :mod:`workbench.analysis` and drawn by
:mod:`workbench.figures.trace`; this module only wires controls to them, lazily per tab. The header,
findings, tables and roofline read the panel's :class:`~workbench.analysis.TraceAnalysis`
(``panel.analysis``, the whole trace; one more per step chosen), so the trace is diagnosed once, as by the
CLI and the report. Errors go to the panel's error area, never a traceback.

CSS classes for browser tests: ``wb-profiler`` (the panel), ``wb-profiler-sort``, ``wb-profiler-topn``,
``wb-profiler-filter``, ``wb-profiler-step``, ``wb-profiler-byshape``, ``wb-profiler-tabs``,
``wb-profiler-findings`` (the diagnosis card ``wb-diagnosis-card``, then one ``wb-finding`` each: see
:func:`~workbench.figures.text.findings_html`), ``wb-profiler-window`` and ``wb-profiler-per-step`` (the
header's numbers over the profiled window and a step), ``wb-profiler-fig-<tab>`` and ``wb-profiler-table-<tab>`` (tab one of
kernels, ops, breakdown, timeline, steps, gaps, roofline); on the timeline tab ``wb-profiler-flows`` (the
launch -> GPU arrows checkbox), ``wb-profiler-perfetto`` (the button that writes the window for
Perfetto), ``wb-profiler-perfetto-note`` (where it was written) and ``wb-perfetto`` (the open/download link).

The timeline shows what :func:`workbench.analysis.windows.trace_window` picks for the visible window:
every kernel and copy of it when they fit, host events thinned to one per lane and pixel otherwise;
zooming re-picks from the events in view. "Open window in Perfetto" (:meth:`ProfilerPanel.open_in_perfetto`)
writes every event of the window on screen, with the launch -> kernel flows, as a Chrome trace JSON file
(next to the trace when that folder is writable and not the package's shipped samples, else in
``<tmp>/gpu-workbench/perfetto``) and offers it to
https://ui.perfetto.dev (:mod:`._perfetto`).
"""

from __future__ import annotations

import dataclasses
import html
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from workbench import analysis as A
from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.figures import trace as F
from workbench.figures.text import findings_html
from workbench.io import load_trace
from workbench.panels._base import PanelBase, classify, path_label, table_html, widgets, wrong_kind
from workbench.panels._plot import PlotWidget
from workbench.units import short_name

__all__ = ["ProfilerPanel"]

PERFETTO_OFFER_MAX_BYTES = 32 * 2**20  # larger windows are written but not sent to the browser
_NO_FINDINGS = ("<div class='wb-finding' style='color:var(--jp-ui-font-color2,#666)'>No findings: nothing stands out "
                "in this trace.</div>")

# tab key, title
TABS: tuple[tuple[str, str], ...] = (
    ("kernels", "Kernels"),
    ("ops", "Operators"),
    ("breakdown", "Breakdown"),
    ("timeline", "Timeline"),
    ("steps", "Steps"),
    ("gaps", "Idle gaps"),
    ("roofline", "Roofline"),
)
# tab -> sort choices (label, column); the first one present in the table is the default
SORTS: dict[str, list[tuple[str, str]]] = {
    "kernels": [("total time", "total_us"), ("count", "count"), ("mean time", "mean_us"),
                ("max time", "max_us"), ("name", "name")],
    "ops": [("GPU time", "device_total_us"), ("CPU total", "cpu_total_us"), ("CPU self", "cpu_self_us"),
            ("count", "count"), ("name", "name")],
    "gaps": [("length", "dur_us"), ("start", "start_us")],
    "roofline": [("GPU time", "total_us"), ("TFLOP/s", "tflops"), ("share of the roof", "roofline_fraction"),
                 ("FLOP/byte", "intensity"), ("name", "name")],
    "steps": [("step", "step"), ("step time", "step_us"), ("host span", "dur_us"), ("GPU busy", "gpu_busy_us"),
              ("GPU idle fraction", "gpu_idle_fraction")],
}
_ASCENDING = {"name", "start_us", "step"}
ALL_STEPS = "All"


def _sorted(df: pd.DataFrame, col: str | None) -> pd.DataFrame:
    if df is None or df.empty or col is None or col not in df.columns:
        return df
    return df.sort_values(col, ascending=col in _ASCENDING, kind="stable", na_position="last")


def _name_filter(df: pd.DataFrame, text: str, column: str = "name") -> pd.DataFrame:
    text = (text or "").strip()
    if not text or df is None or df.empty or column not in df.columns:
        return df
    return df[df[column].astype(str).str.contains(text, case=False, regex=False)]


def _ms_since(us: pd.Series, origin: float) -> pd.Series:
    return (pd.to_numeric(us, errors="coerce").astype(float) - origin) / 1e3


def gaps_display(gaps: pd.DataFrame, origin_us: float, origin_name: str = "trace start") -> pd.DataFrame:
    """The idle-gap rows as the panel's table shows them: start in ms since ``origin_us`` (the trace's
    or the step's start) instead of the clock's absolute microseconds, units in the headers."""
    if gaps is None or gaps.empty:
        return gaps
    out = pd.DataFrame(index=gaps.index)
    out[f"start (ms since {origin_name})"] = _ms_since(gaps["start_us"], origin_us).round(3)
    out["length (µs)"] = gaps["dur_us"].astype(float)
    if "cause" in gaps:
        out["cause"] = gaps["cause"].astype(str)
    if "launch_fraction" in gaps:
        out["launch share (%)"] = gaps["launch_fraction"].astype(float) * 100
    if "sync_us" in gaps:
        out["sync wait (µs)"] = gaps["sync_us"].astype(float)
    if "next_kernel" in gaps:
        out["next kernel"] = gaps["next_kernel"].astype("string").fillna("").map(lambda n: short_name(n, 80))
    for c in gaps.columns:
        if c not in {"start_us", "end_us", "dur_us", "cause", "launch_fraction", "sync_us", "next_kernel"}:
            out[c] = gaps[c]
    return out


def steps_display(steps: pd.DataFrame, origin_us: float) -> pd.DataFrame:
    """The step rows as the panel's table shows them: start in ms since the trace start, times in ms,
    the idle fraction in percent."""
    if steps is None or steps.empty:
        return steps
    out = pd.DataFrame(index=steps.index)
    out["step"] = steps["step"]
    out["start (ms since trace start)"] = _ms_since(steps["start_us"], origin_us).round(3)
    # the step by the one definition (docs/definitions.md); the annotation's host span beside it
    out["step time (ms)"] = steps["step_us" if "step_us" in steps else "dur_us"].astype(float) / 1e3
    if "step_us" in steps:
        out["host span (ms)"] = steps["dur_us"].astype(float) / 1e3
    if "gpu_busy_us" in steps:
        out["GPU busy (ms)"] = pd.to_numeric(steps["gpu_busy_us"], errors="coerce").astype(float) / 1e3
    if "gpu_idle_fraction" in steps:
        out["GPU idle (%)"] = pd.to_numeric(steps["gpu_idle_fraction"], errors="coerce").astype(float) * 100
    for c in steps.columns:
        if c not in {"step", "start_us", "end_us", "dur_us", "step_us", "gpu_busy_us", "gpu_idle_fraction"}:
            out[c] = steps[c]
    return out


_TAKES = "a Kineto trace (.json / .json.gz), a loaded Trace or a ProfileResult from profile_steps"


def _resolve(source, result, raise_errors: bool):
    """``source`` -> (trace or None, result, load error or None); raises for a kind this panel does not show."""
    if source is None or hasattr(source, "events"):  # nothing yet, or a loaded Trace
        return source, result, None
    kind, path = classify(source, "ProfilerPanel", _TAKES)
    if kind == "profile_result":
        result = source
        try:
            return source.load(), result, None
        except Exception as exc:
            if raise_errors:
                raise
            return None, result, exc
    if path is None or kind not in ("trace", "unknown"):  # unknown: an odd producer's JSON, the loader decides
        raise wrong_kind(source, kind, "ProfilerPanel", _TAKES)
    try:
        return load_trace(os.fspath(path)), result, None
    except Exception as exc:
        if raise_errors:
            raise
        return None, result, exc


class ProfilerPanel(PanelBase):
    """Findings, tables and figures of one Kineto trace, driven by a few controls.

    ``source``: a trace file, a loaded ``Trace``, a ``TraceAnalysis`` or a ``ProfileResult`` (module
    docstring). ``analysis``: the :class:`~workbench.analysis.TraceAnalysis` every tab reads."""

    def __init__(self, source=None, *, result=None, top: int = 15, error: BaseException | str | None = None,
                 raise_errors: bool = False):
        analysis = source if isinstance(source, TraceAnalysis) else None
        if analysis is not None:
            source = analysis.trace
        trace, result, load_error = _resolve(source, result, raise_errors)
        if error is None:
            error = load_error
        self.trace = trace
        self.analysis = analysis if analysis is not None or trace is None else TraceAnalysis(trace)
        self.result = result
        self.table_frames: dict[str, pd.DataFrame] = {}
        self.figures: dict[str, Any] = {}
        self.tables: dict[str, Any] = {}
        self._cache: dict[tuple, Any] = {}
        self._stale: set[str] = {k for k, _ in TABS}
        self._updating_timeline = False
        self._quiet = False

        self.sort = widgets.Dropdown(description="Sort by", options=[("total time", "total_us")],
                                     value="total_us", layout=widgets.Layout(width="230px"))
        self.top_n = widgets.IntSlider(description="Top N", value=int(top), min=1, max=50, step=1,
                                       continuous_update=False, layout=widgets.Layout(width="280px"))
        self.name_filter = widgets.Text(description="Filter", placeholder="name contains…",
                                        continuous_update=False, layout=widgets.Layout(width="260px"))
        self.step = widgets.Dropdown(description="Step", options=[ALL_STEPS], value=ALL_STEPS,
                                     layout=widgets.Layout(width="230px"))
        self.by_shape = widgets.Checkbox(description="by input shape", value=False, indent=False,
                                         layout=widgets.Layout(width="140px"))
        for w, cls in ((self.sort, "sort"), (self.top_n, "topn"), (self.name_filter, "filter"),
                       (self.step, "step"), (self.by_shape, "byshape")):
            w.add_class(f"wb-profiler-{cls}")
        self.findings = widgets.HTML(value="")
        self.findings.add_class("wb-profiler-findings")

        self.flows = widgets.Checkbox(description="launch → GPU arrows", value=False, indent=False,
                                      layout=widgets.Layout(width="170px"))
        self.flows.add_class("wb-profiler-flows")
        self.perfetto_button = widgets.Button(description="Open window in Perfetto", icon="external-link",
                                              tooltip="write the events of the window on screen as a Chrome trace "
                                                      "JSON file and open it in ui.perfetto.dev",
                                              layout=widgets.Layout(width="210px"))
        self.perfetto_button.add_class("wb-profiler-perfetto")
        from workbench.panels._perfetto import PerfettoLink

        self.perfetto = PerfettoLink()
        self.perfetto_note = widgets.HTML(value="")
        self.perfetto_note.add_class("wb-profiler-perfetto-note")
        self.timeline_bar = widgets.HBox([self.flows, self.perfetto_button, self.perfetto, self.perfetto_note],
                                         layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
        self._timeline_range: tuple[float | None, float | None] = (None, None)

        pages = []
        for key, _title in TABS:
            fw = PlotWidget(classes=[f"wb-profiler-fig-{key}"])
            self.figures[key] = fw
            tbl = widgets.HTML(value="")
            tbl.add_class(f"wb-profiler-table-{key}")
            self.tables[key] = tbl
            page = [self.timeline_bar, fw] if key == "timeline" else [fw, tbl]
            pages.append(widgets.VBox(page))
        self.tabs = widgets.Tab(children=pages, titles=[t for _, t in TABS])
        self.tabs.add_class("wb-profiler-tabs")

        controls = widgets.HBox([self.step, self.sort, self.top_n, self.name_filter, self.by_shape],
                                layout=widgets.Layout(flex_flow="row wrap"))
        super().__init__()
        self.children = [self.status, controls, self.findings, self.tabs, self.errors]
        self.add_class("wb-profiler")

        self.figures["timeline"].on_relayout(self.guard(self._on_timeline_relayout))
        self.flows.observe(self.guard(self._on_flows), names="value")
        self.perfetto_button.on_click(self.guard(lambda _b: self.open_in_perfetto()))
        for w in (self.sort, self.top_n, self.name_filter):
            w.observe(self.guard(self._on_view_change), names="value")
        self.by_shape.observe(self.guard(self._on_by_shape), names="value")
        self.step.observe(self.guard(self._on_step_change), names="value")
        self.tabs.observe(self.guard(self._on_tab_change), names="selected_index")

        if error is not None:
            self.show_error(error)
        if trace is None:
            for w in (self.sort, self.top_n, self.name_filter, self.step, self.by_shape):
                w.disabled = True
            self.set_status("no trace loaded")
            return
        self.guard(self._start)()

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_step(cls, step_fn: Callable[[], Any], steps: int = 3, detail: str = "standard", *,
                  top: int = 15, raise_errors: bool = False, **profile_kw) -> "ProfilerPanel":
        """Profile ``step_fn`` with :func:`workbench.capture.profile_steps` (same keywords: wait,
        warmup, out_dir, device, ...) and show the trace. If the step raises, the panel shows the
        error and whatever the profiler recorded before it."""
        from workbench.capture.profiler import profile_steps

        try:
            result = profile_steps(step_fn, steps=steps, detail=detail, **profile_kw)
        except Exception as exc:
            if raise_errors:
                raise
            partial = getattr(exc, "workbench_profile", None)
            if partial is None:
                return cls(None, top=top, error=exc)
            return cls(partial, top=top,
                       error=f"{type(exc).__name__}: {exc} (showing the partial trace {partial.path})")
        return cls(result, top=top)

    # -- data (cached per step) ------------------------------------------------------------------

    def _scoped(self):
        """The trace restricted to the chosen step (the whole trace for All)."""
        return self._scoped_analysis().trace

    def _scoped_analysis(self) -> TraceAnalysis:
        """The chosen step's TraceAnalysis: ``self.analysis`` for All, else one of the step's window (same
        peaks), made once per step."""
        if self.step.value == ALL_STEPS:
            return self.analysis
        key = ("analysis", self.step.value)
        if key not in self._cache:
            a = self.analysis
            self._cache[key] = TraceAnalysis(A.step_window(self.trace, self.step.value), peak=a.peak_arg,
                                             step_ms=a.step_ms_arg, measured=a.measured_arg)
        return self._cache[key]

    def _step_window(self, number) -> tuple[float, float]:
        """Start and end (us) of one ProfilerStep for the timeline's x range: its CPU span joined with
        the GPU work it launched (which runs on after the CPU span ends)."""
        steps = self._data("steps_all")
        row = steps[steps["step"] == number].iloc[0]
        lo, hi = float(row["start_us"]), float(row["start_us"] + row["dur_us"])
        ev = self._scoped().events if self.step.value == number else A.step_window(self.trace, number).events
        ev = ev[ev["cat"].astype(str) != "Trace"]
        if len(ev):
            lo = min(lo, float(ev["ts_us"].min()))
            hi = max(hi, float((ev["ts_us"] + ev["dur_us"].fillna(0)).max()))
        return lo, hi

    def _origin(self) -> float:
        """The trace's start (us, trace clock): time 0 of the timeline and of the tables."""
        origin = (self.trace.metadata or {}).get("trace_start_us")
        if origin is None:
            ev = self.trace.events
            origin = float(ev.loc[ev["cat"].astype(str) != "Trace", "ts_us"].min())
        return float(origin)

    def _data(self, what: str):
        if what == "steps_all":
            key = ("steps_all",)
        else:
            key = (what, self.step.value, self.by_shape.value if what == "ops" else None)
        if key in self._cache:
            return self._cache[key]
        if what == "steps_all":
            val = self.analysis.steps
        elif what == "ops" and self.by_shape.value:
            val = A.op_summary(self._scoped(), by_shape=True)
        elif what in ("kernels", "ops", "breakdown", "gaps", "findings", "diagnosis", "busy", "roofline"):
            val = getattr(self._scoped_analysis(), what)  # computed once per scope by the TraceAnalysis
        else:
            raise KeyError(what)
        self._cache[key] = val
        return val

    # -- refresh ---------------------------------------------------------------------------------

    @property
    def tab(self) -> str:
        """Key of the selected tab (kernels, ops, breakdown, timeline, steps, gaps, roofline)."""
        return TABS[self.tabs.selected_index or 0][0]

    def _start(self) -> None:
        steps = self._data("steps_all")
        numbers = [int(s) for s in steps["step"]] if steps is not None and not steps.empty else []
        self.step.options = [(ALL_STEPS, ALL_STEPS), *((f"ProfilerStep#{n}", n) for n in numbers)]
        self._refresh_header()
        if self._data("busy").kernel_count == 0 and self.tab == "kernels":
            self.tabs.selected_index = 1  # a CPU-only trace: the op table is what it has
        self._sync_sort_options()
        if self.tab in self._stale:
            self._refresh(self.tab)

    def _sync_sort_options(self) -> None:
        choices = SORTS.get(self.tab)
        if not choices:
            self.sort.disabled = True
            return
        self.sort.disabled = False
        if [tuple(o) for o in self.sort.options] != [tuple(c) for c in choices]:
            self._quiet = True  # a new tab's sort choices are not a view change
            try:
                self.sort.options = choices
                self.sort.value = choices[0][1]
            finally:
                self._quiet = False

    def _refresh_header(self) -> None:
        tr = self._scoped()
        busy = self._data("busy")
        scope = "all steps" if self.step.value == ALL_STEPS else f"ProfilerStep#{self.step.value}"
        parts = [
            f"<b>{html.escape(str(getattr(self.trace, 'device', '')))}</b>",
            f"{getattr(self.trace, 'n_events', len(tr.events)):,} events",
            f"{busy.kernel_count:,} kernels",
            f"scope: {html.escape(scope)}",
        ]
        if self.result is not None and getattr(self.result, "cost", None) is not None:
            parts.append(html.escape(str(self.result.cost)))
        if self.analysis is not None and (self.analysis.compile is not None or len(self.analysis.compile_regions)):
            from workbench.analysis.trace.compile import summary_text as compile_text

            parts.append(html.escape(compile_text(self.analysis.compile_block()) or ""))
        from workbench.analysis.trace.tables import per_step_text

        # two lines that say what they cover: the whole profiled window, then a step (the one definition of
        # the step, GPU busy, idle and communication every front shows)
        window = (f"<span class='wb-profiler-window'>over the {busy.window_us / 1e3:,.2f} ms window: GPU busy "
                  f"{busy.busy_us / 1e3:,.2f} ms, idle {busy.idle_fraction * 100:.1f}%</span>"
                  if busy.window_us else "<span class='wb-profiler-window'>no GPU activity</span>")
        per_step = (f"<span class='wb-profiler-per-step'>"
                    f"{html.escape(per_step_text(self._scoped_analysis().numbers))}</span>")
        path = path_label(getattr(self.trace, "path", ""))
        self.set_status(" · ".join(parts) + f"<br>{window}<br>{per_step}"
                        f"<br><span style='color:#888;font-size:11px'>{path}</span>", raw_html=True)
        self.findings.value = findings_html(self._data("findings"), self._data("diagnosis"), empty=_NO_FINDINGS)

    def _refresh(self, tab: str) -> None:
        getattr(self, f"_draw_{tab}")()
        self._stale.discard(tab)

    def _view(self, df: pd.DataFrame, tab: str) -> pd.DataFrame:
        df = _name_filter(df, self.name_filter.value, "cause" if tab == "gaps" else "name")
        col = self.sort.value if tab == self.tab else (SORTS.get(tab) or [(None, None)])[0][1]
        return _sorted(df, col)

    def _show(self, tab: str, fig, table: pd.DataFrame | None, shown: pd.DataFrame | None = None,
              formats: dict | None = None) -> None:
        """Draw ``fig``; keep ``table`` (the analysis rows) in ``table_frames`` and show ``shown`` (the
        same rows formatted for reading) or ``table`` itself under the figure."""
        self.figures[tab].show(fig)
        if table is not None:
            self.table_frames[tab] = table
            self.tables[tab].value = table_html(table if shown is None else shown, formats=formats, csv=f"{tab}.csv",
                                                  csv_frame=table)

    def _draw_kernels(self) -> None:
        rows = self._view(self._data("kernels"), "kernels").head(self.top_n.value)
        self._show("kernels", F.kernel_summary_figure(rows, top=self.top_n.value), rows)

    def _draw_ops(self) -> None:
        rows = self._view(self._data("ops"), "ops").head(self.top_n.value)
        self._show("ops", F.op_summary_figure(rows, top=self.top_n.value), rows)

    def _draw_breakdown(self) -> None:
        b = self._data("breakdown")
        table = b if isinstance(b, pd.DataFrame) else pd.DataFrame([dict(b)] if not dataclasses.is_dataclass(b)
                                                                    else [dataclasses.asdict(b)])
        self._show("breakdown", F.breakdown_figure(b), table)

    def _draw_steps(self) -> None:
        steps = self._data("steps_all")
        rows = self._view(steps, "steps")
        self._show("steps", F.step_figure(steps), rows, steps_display(rows, self._origin()),
                   formats={"start (ms since trace start)": "{:,.3f}", "step time (ms)": "{:,.2f}",
                            "GPU busy (ms)": "{:,.2f}", "GPU idle (%)": "{:.1f}"})

    def _draw_gaps(self) -> None:
        gaps = _name_filter(self._data("gaps"), self.name_filter.value, "cause")
        rows = self._view(gaps, "gaps").head(self.top_n.value)
        if self.step.value == ALL_STEPS:
            origin, origin_name = self._origin(), "trace start"
        else:
            origin, origin_name = self._step_window(self.step.value)[0], "step start"
        start_col = f"start (ms since {origin_name})"
        self._show("gaps", F.idle_gap_figure(gaps), rows, gaps_display(rows, origin, origin_name),
                   formats={start_col: "{:,.3f}", "launch share (%)": "{:.0f}", "sync wait (µs)": "{:,.1f}"})

    def _draw_roofline(self) -> None:
        from workbench.analysis.trace.roofline import DISPLAY_FORMATS, display_table, summary_text
        from workbench.figures.roofline import roofline_figure

        rl = self._data("roofline")
        rows = self._view(rl.ops, "roofline").head(self.top_n.value)
        self._show("roofline", roofline_figure(rl.ops, rl.peak, rl.measured), rows, display_table(rows),
                   formats=DISPLAY_FORMATS)
        self.tables["roofline"].value = (f"<div class='wb-roofline-summary' style='margin:4px 0'>"
                                         f"{html.escape(summary_text(rl))}</div>" + self.tables["roofline"].value)

    def _timeline_trace(self):
        """The trace the timeline draws: the whole trace, name-filtered when a filter is set."""
        tr = self.trace
        text = (self.name_filter.value or "").strip()
        if text:
            ev = tr.events
            tr = dataclasses.replace(tr, events=ev[ev["name"].astype(str).str.contains(text, case=False, regex=False)])
        return tr

    def _draw_timeline(self, start_us: float | None = None, end_us: float | None = None, x_range=None) -> None:
        if start_us is None and self.step.value != ALL_STEPS:
            start_us, end_us = self._step_window(self.step.value)
        self._timeline_range = (start_us, end_us)
        fig = F.timeline_figure(self._timeline_trace(), start_us=start_us, end_us=end_us, flows=self.flows.value,
                                regions=self.analysis.compile_regions if self.analysis is not None else None)
        if x_range is not None:
            fig.update_xaxes(range=list(x_range))
        self._updating_timeline = True
        try:
            self.figures["timeline"].show(fig)
        finally:
            self._updating_timeline = False

    # -- callbacks -------------------------------------------------------------------------------

    def _on_view_change(self, _change=None) -> None:
        if self._quiet:
            return
        self.clear_error()
        self._stale = {k for k, _ in TABS}
        self._refresh(self.tab)

    def _on_by_shape(self, _change=None) -> None:
        self.clear_error()
        self._stale.add("ops")
        if self.tab == "ops":
            self._refresh("ops")

    def _on_step_change(self, _change=None) -> None:
        self.clear_error()
        self._stale = {k for k, _ in TABS}
        self._refresh_header()
        self._refresh(self.tab)

    def _on_tab_change(self, _change=None) -> None:
        self._sync_sort_options()
        if self.tab in self._stale:
            self._refresh(self.tab)

    def _on_flows(self, _change=None) -> None:
        self.clear_error()
        self._stale.add("timeline")
        if self.tab == "timeline":
            lo, hi = self._timeline_range
            if lo is None and hi is None:
                self._draw_timeline()
            else:
                origin = self._origin()
                x = None if lo is None or hi is None else ((lo - origin) / 1e3, (hi - origin) / 1e3)
                self._draw_timeline(lo, hi, x_range=x)

    def _perfetto_path(self, lo: float | None, hi: float | None) -> Path:
        src = Path(str(self.trace.path)) if getattr(self.trace, "path", None) else None
        stem = "trace"
        if src is not None:
            stem = src.name
            for suffix in (".gz", ".json", ".pt.trace", ".trace"):
                stem = stem.removesuffix(suffix)
        origin = self._origin()
        part = ("all" if lo is None and hi is None else
                f"{((lo if lo is not None else origin) - origin) / 1e3:.1f}-"
                f"{((hi - origin) / 1e3) if hi is not None else 0:.1f}ms")
        name = f"{stem}.{part}.perfetto.json"
        package = Path(__file__).resolve().parent.parent  # the shipped samples live here: never write into it
        beside = (src is not None and os.access(src.parent, os.W_OK)
                  and not src.resolve().is_relative_to(package))
        folder = src.parent if beside else Path(tempfile.gettempdir()) / "gpu-workbench" / "perfetto"
        return folder / name

    def open_in_perfetto(self, path=None) -> Path:
        """Write every event of the timeline's window (the zoomed range, the chosen step, or the whole
        trace; the name filter applies) with its launch -> kernel flows as a Chrome trace JSON file that
        https://ui.perfetto.dev opens, offer it in the panel (open / download), and return its path."""
        from workbench.analysis.windows import flow_pairs, trace_window
        from workbench.io.chrome_trace import write_chrome_trace

        if self.trace is None:
            raise RuntimeError("no trace loaded")
        lo, hi = self._timeline_range
        if lo is None and hi is None and self.step.value != ALL_STEPS:
            lo, hi = self._step_window(self.step.value)
        tr = self._timeline_trace()
        win = trace_window(tr, lo, hi, max_events=10**12)
        out = Path(path) if path is not None else self._perfetto_path(lo, hi)
        flows = flow_pairs(win.events)
        written = write_chrome_trace(win.events, out, metadata=tr.metadata, flows=flows,
                                     other={"source": os.path.basename(str(tr.path)),
                                            "window_us": [lo, hi]})
        size = written.stat().st_size
        note = f"wrote {len(win.events):,} events and {len(flows):,} flows to {path_label(written)}"
        if size <= PERFETTO_OFFER_MAX_BYTES:
            data = written.read_bytes()
            if written.name.endswith(".gz"):
                import gzip

                data = gzip.decompress(data)
            self.perfetto.offer(data, written.name.removesuffix(".gz"), f"{os.path.basename(str(tr.path))} window")
        else:  # too big to send through the notebook's websocket: open the file from disk
            self.perfetto.offer(b"", "", "")
            note += (f" ({size / 2**20:,.0f} MiB: too big to hand over here; open it at ui.perfetto.dev with "
                     "'Open trace file', or zoom in first)")
        self.perfetto_note.value = f"<span style='color:var(--jp-ui-font-color2,#666)'>{note}</span>"
        return written

    def _on_timeline_relayout(self, data: dict) -> None:
        """A zoom, pan or reset of the timeline's x axis in the browser (plotly relayout data)."""
        if "xaxis.autorange" in data:
            self._on_timeline_zoom(None, autorange=bool(data["xaxis.autorange"]))
        elif "xaxis.range[0]" in data and "xaxis.range[1]" in data:
            self._on_timeline_zoom((data["xaxis.range[0]"], data["xaxis.range[1]"]))
        elif isinstance(data.get("xaxis.range"), (list, tuple)):
            self._on_timeline_zoom(tuple(data["xaxis.range"]))

    def _on_timeline_zoom(self, x_range, autorange=None) -> None:
        """Zooming the timeline re-selects the longest events inside the new window; resetting the
        zoom (autorange) redraws the whole window."""
        if self._updating_timeline or self.trace is None:
            return
        if autorange or x_range is None or len(x_range) != 2:
            if autorange:
                self._draw_timeline()
            return
        origin = self._origin()
        lo, hi = (float(v) for v in x_range)
        self._draw_timeline(origin + lo * 1e3, origin + hi * 1e3, x_range=(lo, hi))

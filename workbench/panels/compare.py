"""ComparePanel: before and after in the notebook.

    ComparePanel(experiment)                       # an Experiment from run_experiment, a ledger DataFrame
    ComparePanel("results/ledger.json")            # ... or a saved ledger file
    ComparePanel("before.json.gz", "after.json.gz")               # two traces, diff view only (or a tuple of two)
    ComparePanel.from_traces("before.json.gz", "after.json.gz")   # the same
    ComparePanel.from_experiment(workload, [fp32(), amp_bf16()])  # run the experiment, then show it

Given one trace, another kind of artifact or a missing file it raises a
:class:`~workbench.errors.BadArtifact` naming the panel or command that fits.

The table marks the baseline (a dropdown picks it) and shows each row's ratios against it; bars show
step time, peak memory, throughput and energy (:func:`workbench.figures.experiment_figure`); the
numerical-check verdicts are listed with their messages. When rows carry traces (``run_experiment(...,
trace=True)``) or the panel was built from two trace files, two dropdowns pick the base and the test
of a trace diff: summary, kernel-delta bars and the kernel and op delta tables
(:func:`workbench.analysis.trace_diff`). Errors go to the panel's error area, never a traceback.

CSS classes for browser tests: ``wb-compare`` (the panel), ``wb-compare-baseline``,
``wb-compare-table``, ``wb-compare-bars``, ``wb-compare-verdicts``, ``wb-compare-diff``,
``wb-compare-base``, ``wb-compare-test``, ``wb-compare-diff-summary``, ``wb-compare-diff-fig``,
``wb-compare-diff-kernels``, ``wb-compare-diff-ops``, ``wb-compare-bars-note``, ``wb-compare-no-kernels``,
``wb-compare-per-step`` (the checkbox: every number per step), and inside the summary ``wb-diff-headline``,
``wb-diff-changes`` (rows ``wb-diff-change-<key>``), ``wb-diff-findings`` (``wb-diff-finding-<kind>``).

The diff leads with what changed: the headline sentence, the step time and the GPU time breakdown
(compute, memcpy/memset, communication, idle; largest change first), the findings resolved / new /
changed, then the kernel-delta bars and the kernel and op tables (ms, headers with units).

A section with nothing to draw is hidden (``layout.display = "none"`` on its box: ``bars_box``,
``diff_fig_box``, ``diff_choice``, ``diff_kernels``, ``diff_ops``), never left as a blank figure: the
bars when no row has a measured metric (their note says why), the diff's pickers, figure and tables when
fewer than two rows carry traces (the summary says to run with ``trace=True``), and the kernel figure and
table for CPU-only traces (the summary points to the operator table).
"""

from __future__ import annotations

import html
import math
import os
from typing import Any

import pandas as pd

from workbench.analysis.trace.diff import baseline_ratios, check_verdicts, trace_diff
from workbench.errors import BadArgument
from workbench.figures.compare import (
    changes_html,
    experiment_figure,
    findings_change_html,
    kernel_delta_figure,
    readable_delta_table,
)
from workbench.io import load_ledger, load_trace
from workbench.io.ledger import ledger_frame
from workbench.errors import BadArtifact
from workbench.panels._base import PanelBase, classify, table_html, widgets, wrong_kind
from workbench.panels._plot import PlotWidget

__all__ = ["ComparePanel"]

_VERDICT_COLORS = {"ok": "#009E73", "n/a": "#999999", "large_error": "#E69F00", "grad_underflow": "#D55E00",
                   "vanishing_updates": "#D55E00", "nonfinite": "#D55E00"}
_NO_DIFF = ("<div style='color:var(--jp-ui-font-color2,#666)'>The diff view needs two traces: run the experiment with "
            "<code>trace=True</code>, or use <code>ComparePanel.from_traces(base, test)</code>.</div>")
_NO_ROW_TRACES = ("<div style='color:var(--jp-ui-font-color2,#666)'>No traces recorded for these rows: run with <code>trace=True</code> "
                  "to compare kernels.</div>")
_ONE_ROW_TRACE = ("<div style='color:var(--jp-ui-font-color2,#666)'>Only one row has a trace ({label}): the diff needs two; run the "
                  "other configurations with <code>trace=True</code> to compare kernels.</div>")
_NO_KERNELS = ("<div class='wb-compare-no-kernels' style='color:var(--jp-ui-font-color2,#666)'>CPU-only traces: no GPU kernels to "
               "compare; see the operator table.</div>")


def _fmt(v, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


_TAKES = "an Experiment, a ledger DataFrame or a ledger file path, or two traces (base, test)"


def _check_source(results):
    """Raise at once (before any widget is built) for a source this panel does not show."""
    if results is None:
        return
    kind, path = classify(results, "ComparePanel", _TAKES)
    if kind in ("ledger", "experiment") or (path is not None and kind == "unknown"):
        return  # unknown content: the ledger loader says what is wrong with it
    if kind in ("trace", "profile_result"):
        raise BadArtifact(path if path is not None else f"this {type(results).__name__}",
                          "is one trace; ComparePanel compares two (or the rows of an experiment)",
                          "Use ProfilerPanel(path) for one trace, ComparePanel((base, test)) or "
                          "`workbench diff BASE TEST` for two")
    raise wrong_kind(results, kind, "ComparePanel", _TAKES)


def _ledger_of(results) -> pd.DataFrame:
    if results is None:
        return ledger_frame([])
    if isinstance(results, pd.DataFrame):
        return ledger_frame(results)
    if isinstance(results, (str, os.PathLike)):
        return load_ledger(results)
    if hasattr(results, "ledger"):  # an Experiment (workbench.analysis.experiment) from run_experiment
        return results.ledger
    raise BadArgument(
        f"ComparePanel takes an Experiment, a ledger DataFrame or a ledger file path, not {type(results).__name__}"
    )


def _trace_pair(base, test) -> dict[str, Any]:
    """``{"base: name": base, "test: name": test}``; each must be a trace (a file checked by content)."""
    out = {}
    for role, src in (("base", base), ("test", test)):
        if not hasattr(src, "events"):
            kind, path = classify(src, "ComparePanel", "two Kineto traces (base, test)")
            if kind == "profile_result":
                src = src.path
            elif kind not in ("trace", "unknown") or path is None and kind == "unknown":
                raise wrong_kind(src, kind, "ComparePanel", "two Kineto traces (base, test)")
        name = os.path.basename(str(src.path if hasattr(src, "events") else src))
        out[f"{role}: {name}"] = src
    return out


class ComparePanel(PanelBase):
    """The experiment table with ratios against a baseline, bars, check verdicts, and a trace diff view."""

    def __init__(self, results=None, test=None, *, baseline: str | None = None, traces: dict[str, Any] | None = None,
                 top: int = 15, error: BaseException | str | None = None):
        if test is not None:  # ComparePanel(base, test): two traces, as ComparePanel((base, test))
            if traces is not None or results is None or isinstance(results, (tuple, list)):
                raise BadArgument("ComparePanel(base, test) takes two traces (paths, Trace or ProfileResult); "
                                  "or give one experiment / ledger, or traces={label: trace}")
            results = (results, test)
        if isinstance(results, (tuple, list)) and len(results) == 2 and traces is None:
            traces, results = _trace_pair(*results), None
        _check_source(results)
        self.top = int(top)
        self.ledger = pd.DataFrame()
        self.table = pd.DataFrame()
        self.diff = None
        self._trace_sources: dict[str, Any] = {}
        self._loaded: dict[str, Any] = {}

        self.baseline = widgets.Dropdown(description="Baseline", options=[], layout=widgets.Layout(width="320px"))
        self.baseline.add_class("wb-compare-baseline")
        self.table_html = widgets.HTML(value="")
        self.table_html.add_class("wb-compare-table")
        self.bars = PlotWidget(classes=["wb-compare-bars"])
        self.bars_box = widgets.VBox([self.bars])
        self.bars_note = widgets.HTML(value="")
        self.bars_note.add_class("wb-compare-bars-note")
        self.bars_note.layout.display = "none"
        self.verdicts = widgets.HTML(value="")
        self.verdicts.add_class("wb-compare-verdicts")
        self.experiment_box = widgets.VBox([self.baseline, self.table_html, self.bars_box, self.bars_note, self.verdicts])

        self.base = widgets.Dropdown(description="Base", options=[], layout=widgets.Layout(width="360px"))
        self.base.add_class("wb-compare-base")
        self.test = widgets.Dropdown(description="Test", options=[], layout=widgets.Layout(width="360px"))
        self.test.add_class("wb-compare-test")
        self.diff_summary_html = widgets.HTML(value=_NO_DIFF)
        self.diff_summary_html.add_class("wb-compare-diff-summary")
        self.diff_fig = PlotWidget(classes=["wb-compare-diff-fig"])
        self.diff_fig_box = widgets.VBox([self.diff_fig])
        self.diff_kernels = widgets.HTML(value="")
        self.diff_kernels.add_class("wb-compare-diff-kernels")
        self.diff_ops = widgets.HTML(value="")
        self.diff_ops.add_class("wb-compare-diff-ops")
        self.per_step = widgets.Checkbox(description="per step", value=False, indent=False,
                                         layout=widgets.Layout(width="110px"),
                                         tooltip="divide every count and time by each trace's ProfilerSteps")
        self.per_step.add_class("wb-compare-per-step")
        self.diff_choice = widgets.HBox([self.base, self.test, self.per_step])
        self.diff_box = widgets.VBox([
            widgets.HTML("<b>Trace diff</b>"), self.diff_choice,
            self.diff_summary_html, self.diff_fig_box, self.diff_kernels, self.diff_ops,
        ])
        self.diff_box.add_class("wb-compare-diff")

        super().__init__()
        self.children = [self.status, self.experiment_box, self.diff_box, self.errors]
        self.add_class("wb-compare")
        if error is not None:
            self.show_error(error)

        self._quiet = True
        try:
            self.guard(self._load_rows)(results, baseline, traces)
        finally:
            self._quiet = False
        self.baseline.observe(self.guard(self._on_baseline), names="value")
        self.base.observe(self.guard(self._on_diff_choice), names="value")
        self.test.observe(self.guard(self._on_diff_choice), names="value")
        self.per_step.observe(self.guard(self._on_diff_choice), names="value")
        self.guard(self._refresh_experiment)()
        self.guard(self._refresh_diff)()

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_traces(cls, base, test, *, top: int = 15) -> "ComparePanel":
        """The diff view of two traces (paths, loaded ``Trace`` objects or ``ProfileResult`` s); no
        experiment table. The same as ``ComparePanel((base, test))``."""
        return cls(None, traces=_trace_pair(base, test), top=top)

    @classmethod
    def from_experiment(cls, workload, configurations, *, baseline: str | None = None, top: int = 15,
                        **run_kw) -> "ComparePanel":
        """Run :func:`workbench.capture.run_experiment` (same keywords: steps, trace=True for the diff
        view, ...) and show the experiment."""
        from workbench.capture.runner import run_experiment

        exp = run_experiment(workload, configurations, **run_kw)
        return cls(exp, baseline=baseline, top=top)

    def _labels(self, ledger: pd.DataFrame) -> list[str]:
        conf = ledger["configuration"].astype(str)
        if "experiment" in ledger.columns and ledger["experiment"].nunique(dropna=True) > 1:
            labels = (ledger["experiment"].astype(str) + " / " + conf).tolist()
        else:
            labels = conf.tolist()
        seen: dict[str, int] = {}
        out = []
        for lab in labels:  # the same run saved twice must still give distinct rows
            seen[lab] = seen.get(lab, 0) + 1
            out.append(lab if seen[lab] == 1 else f"{lab} #{seen[lab]}")
        return out

    def _load_rows(self, results, baseline, traces):
        self.ledger = _ledger_of(results).reset_index(drop=True)
        # trace paths in a saved ledger may be relative to the ledger file's folder
        here = os.path.dirname(os.fspath(results)) if isinstance(results, (str, os.PathLike)) else None
        if len(self.ledger):
            self.ledger["label"] = self._labels(self.ledger)
            ok = self.ledger[self.ledger["status"].fillna("ok") == "ok"]["configuration"].astype(str)
            choices = list(dict.fromkeys(ok))
            if baseline is not None and baseline not in choices:
                raise BadArgument(f"baseline {baseline!r} is not a configuration that ran; choose one of: {', '.join(choices)}")
            self.baseline.options = choices
            if choices:
                self.baseline.value = baseline or ("fp32" if "fp32" in choices else choices[0])
            if "trace_path" in self.ledger.columns:
                for label, path in zip(self.ledger["label"], self.ledger["trace_path"]):
                    if isinstance(path, str) and path:
                        if here is not None and not os.path.isabs(path) and not os.path.exists(path):
                            path = os.path.join(here, path)
                        self._trace_sources[label] = path
        else:
            self.experiment_box.layout.display = "none"
            self.bars_box.layout.display = "none"  # nothing to draw: no blank figure, even if the box is shown
        for label, src in (traces or {}).items():
            self._trace_sources[str(label)] = src
        names = list(self._trace_sources)
        self.base.options = names
        self.test.options = names
        if len(names) >= 2:
            self.base.value, self.test.value = names[0], names[1]
        self.base.disabled = self.test.disabled = len(names) < 2

    # -- experiment view ---------------------------------------------------------------------------

    def _on_baseline(self, change):
        self._refresh_experiment()

    def _refresh_experiment(self):
        if not len(self.ledger):
            return
        self.clear_error()
        self.table = baseline_ratios(self.ledger, baseline=self.baseline.value or None)
        fig = experiment_figure(self.table, label="label")
        self.bars.show(fig)
        # An empty figure (every row failed) is hidden; its title says why in one line instead.
        drawn = len(fig.data) > 0
        self.bars_box.layout.display = None if drawn else "none"
        self.bars_note.layout.display = "none" if drawn else None
        self.bars_note.value = "" if drawn else (
            f"<div style='color:var(--jp-ui-font-color2,#666)'>{html.escape(str(fig.layout.title.text or 'nothing to draw'))}</div>")
        self.table_html.value = self._table_view(self.table)
        self.verdicts.value = self._verdicts_view(self.table)
        n_ok = int((self.table["status"].fillna("ok") == "ok").sum())
        self.set_status(f"{len(self.table)} configuration(s), {n_ok} ran; baseline {self.baseline.value}")

    def _table_view(self, t: pd.DataFrame) -> str:
        rows = []
        for _, r in t.iterrows():
            mark = "★ " if bool(r.get("is_baseline")) else ""
            rows.append({
                "configuration": mark + str(r["label"]),
                "status": "" if pd.isna(r.get("status")) else str(r.get("status")),
                "batch": _fmt(r.get("batch_size"), ","),
                "step ms (median)": _fmt(r.get("step_ms_median"), ",.2f"),
                "q1–q3 ms": ("" if pd.isna(r.get("step_ms_q1")) else
                             f"{r.get('step_ms_q1'):,.2f}–{r.get('step_ms_q3'):,.2f}"),
                "speedup": _fmt(r.get("speedup"), ".2f") + ("×" if pd.notna(r.get("speedup")) else ""),
                "peak GiB": _fmt(float(r["peak_allocated_bytes"]) / 2**30
                                 if pd.notna(r.get("peak_allocated_bytes")) else None, ",.3f"),
                "memory ×base": _fmt(r.get("peak_allocated_ratio"), ".2f"),
                "samples/s": _fmt(r.get("samples_per_s"), ",.1f"),
                "J/step": _fmt(r.get("energy_j_per_step"), ",.2f"),
                "check": "" if pd.isna(r.get("check_verdict")) else str(r.get("check_verdict")),
            })
        view = pd.DataFrame(rows)
        out = table_html(view, max_rows=200, css_class="wb-table wb-compare-rows", csv="experiment.csv",
                         csv_frame=t)
        return out.replace("<td style='padding:2px 8px;text-align:left;white-space:nowrap'>★ ",
                           "<td class='wb-compare-baseline-row' style='padding:2px 8px;text-align:left;"
                           "white-space:nowrap;font-weight:bold;color:#B8860B'>★ ")

    def _verdicts_view(self, t: pd.DataFrame) -> str:
        checks = check_verdicts(t.assign(configuration=t["label"]))
        if checks.empty:
            return "<div style='color:var(--jp-ui-font-color2,#666)'>No numerical check in these rows.</div>"
        parts = ["<div><b>Numerical check</b> (first steps against the reference)</div>"]
        for _, r in checks.iterrows():
            v = str(r["check_verdict"])
            color = _VERDICT_COLORS.get(v, "#888")
            parts.append(
                f"<div class='wb-compare-verdict wb-compare-verdict-{html.escape(v.replace('/', ''))}' "
                f"style='border-left:4px solid {color};padding:2px 8px;margin:2px 0'>"
                f"<b>{html.escape(str(r['configuration']))}</b>: {html.escape(v)}"
                f" — {html.escape(str(r.get('check_message') or ''))}</div>"
            )
        return "".join(parts)

    # -- diff view ---------------------------------------------------------------------------------

    def _trace(self, label: str):
        """The trace's :class:`~workbench.analysis.TraceAnalysis`, loaded and kept: another base/test choice
        or the per-step switch re-reads it, never re-analyses it."""
        if label not in self._loaded:
            from workbench.analysis.trace.analysis import TraceAnalysis

            src = self._trace_sources[label]
            self._loaded[label] = TraceAnalysis(src if hasattr(src, "events") else load_trace(os.fspath(src)))
        return self._loaded[label]

    def _on_diff_choice(self, change):
        if self._quiet:
            return
        self._refresh_diff()

    def _show_diff_parts(self, choice: bool, fig: bool, kernels: bool, ops: bool) -> None:
        """Hide what has nothing to show: an empty figure would be a blank box in the notebook."""
        for w, on in ((self.diff_choice, choice), (self.diff_fig_box, fig), (self.diff_kernels, kernels),
                      (self.diff_ops, ops)):
            w.layout.display = None if on else "none"

    def _no_diff_text(self) -> str:
        if not len(self.ledger):
            return _NO_DIFF
        with_trace = [lab for lab in self.ledger["label"] if lab in self._trace_sources]
        if len(self._trace_sources) == 1 and len(with_trace) == 1:
            return _ONE_ROW_TRACE.format(label=html.escape(with_trace[0]))
        if not self._trace_sources:
            return _NO_ROW_TRACES
        return _NO_DIFF

    def _refresh_diff(self):
        if self.base.value is None or self.test.value is None or len(self._trace_sources) < 2:
            self.diff = None
            self.diff_summary_html.value = self._no_diff_text()
            self._show_diff_parts(choice=False, fig=False, kernels=False, ops=False)
            return
        self.clear_error()
        self.diff_summary_html.value = "<div style='color:var(--jp-ui-font-color2,#666)'>loading traces…</div>"
        d = trace_diff(self._trace(self.base.value), self._trace(self.test.value),
                       normalize="per_step" if self.per_step.value else "total")
        self.diff = d
        has_kernels = not d.kernels.empty
        if has_kernels:
            self.diff_fig.show(kernel_delta_figure(d.kernels, top=self.top))
        self._show_diff_parts(choice=True, fig=has_kernels, kernels=has_kernels, ops=True)
        self.diff_summary_html.value = self._diff_summary_view(d) + ("" if has_kernels else _NO_KERNELS)
        self.diff_kernels.value = ("<b>Kernels</b>" + table_html(readable_delta_table(d.kernels.head(self.top)),
                                                                 float_format="{:,.3f}", csv="diff_kernels.csv",
                                                                 csv_frame=d.kernels)) if has_kernels else ""
        self.diff_ops.value = "<b>Operators</b>" + table_html(readable_delta_table(d.ops.head(self.top)),
                                                              float_format="{:,.3f}", csv="diff_ops.csv",
                                                              csv_frame=d.ops)

    def _diff_summary_view(self, d) -> str:
        """What changed first: the headline, step time and breakdown, then the findings resolved/new."""
        app, gone = d.appeared_kernels, d.disappeared_kernels
        extra = (f"<div>kernels: {len(app)} appeared, {len(gone)} disappeared; ops: {len(d.appeared_ops)} appeared, "
                 f"{len(d.disappeared_ops)} disappeared</div>")
        return changes_html(d) + findings_change_html(d) + extra

"""MemoryPanel: an allocator snapshot in the notebook: its findings under the status line, a time range
that filters before anything is drawn, a moment slider that lists what was live (with stacks), the
segment map at that moment, and an OOM tab when the snapshot holds an OOM.

>>> from workbench import samples
>>> panel = MemoryPanel(samples.path("h200_oom_snapshot"))  # doctest: +SKIP
>>> panel  # doctest: +SKIP

CSS classes for browser tests: ``wb-memory`` (the panel), ``wb-memory-findings`` (the memory
findings, one ``wb-finding`` each), ``wb-memory-range``, ``wb-memory-groupby``,
``wb-memory-moment``, ``wb-memory-tabs``, ``wb-memory-timeline``, ``wb-memory-live``,
``wb-memory-segments``, ``wb-memory-oom`` (the OOM advice card ``wb-advice-card``: the peak against the
cap with each fix, the cheapest fix that fits as a line to copy; :func:`~workbench.figures.text.advice_html`), ``wb-memory-stack-pick`` (which live allocation's stack to
show) and ``wb-memory-stack`` (its whole stack: every Python and C++ frame, innermost first, the user's
frames in bold) (plus ``wb-status``/``wb-errors`` from the base).
"""

from __future__ import annotations

import html
import re
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.memory.segments import CACHED_UNUSED_ALARM, allocator_state, allocator_state_timeline
from workbench.analysis.memory.oom import MemoryAnalysis, _settings_text, analyze_snapshot
from workbench.analysis.memory.whatif import unseen_note
from workbench.figures.memory import (
    allocator_state_figure,
    memory_timeline_figure,
    oom_figure,
    segment_map_figure,
)
from workbench.figures.text import advice_html, findings_html
from workbench.units import format_bytes
from workbench.analysis.windows import event_range
from workbench.errors import BadArtifact, WorkbenchError
from workbench.io.kinds import kind_of
from workbench.io.profiler_memory import load_profiler_memory
from workbench.io.snapshot import MemorySnapshot, load_snapshot
from workbench.panels._base import PanelBase, classify, path_label, table_html, widgets, wrong_kind
from workbench.panels._plot import PlotWidget

__all__ = ["MemoryPanel", "MemoryComparison"]

# room for the longest control label ("moment (ms)"): ipywidgets' default cuts it to "moment (..."
_LABEL_STYLE = {"description_width": "90px"}


_TAKES = ("an allocator snapshot (.pickle / .pickle.gz), a MemorySnapshot or MemoryAnalysis, a recording "
          "from record_memory_history, a capture_oom handle, or a ProfileResult of detail='full'")
_KINDS = ("snapshot", "memory_recording", "oom_capture", "profile_result")


def _check_source(source):
    """Raise at once (before any widget is built) for a source this panel does not show."""
    kind, path = classify(source, "MemoryPanel", _TAKES)
    if path is not None and kind == "unknown":
        return kind  # not recognised by content: the snapshot loader says what is wrong with it
    if kind == "trace" and path is not None:
        raise BadArtifact(path, "is a Kineto trace, not an allocator snapshot",
                          "Use ProfilerPanel(path) or `workbench trace`; for the memory events of a trace "
                          "recorded with profile_memory=True: MemoryPanel(workbench.io.load_profiler_memory(path))")
    if kind not in _KINDS:
        raise wrong_kind(source, kind, "MemoryPanel", _TAKES)
    if kind == "profile_result" and source.detail != "full":
        raise BadArtifact(f"this ProfileResult ({source.path})",
                          f"was recorded with detail={source.detail!r}, which records no memory events",
                          "Profile with detail='full' for MemoryPanel, or show it with ProfilerPanel(result)")
    return kind


def _resolve(source, device):
    """Anything :func:`_check_source` accepts -> MemoryAnalysis (the loaders' errors propagate)."""
    if isinstance(source, MemoryAnalysis):
        return source
    if isinstance(source, MemorySnapshot):
        return analyze_snapshot(source, device)
    if isinstance(source, (str, os.PathLike)):
        return analyze_snapshot(load_snapshot(Path(source)), device)
    kind = kind_of(source)
    if kind == "profile_result":  # torch.profiler's [memory] events, CPU or CUDA
        return analyze_snapshot(load_profiler_memory(source.path), device)
    if kind == "oom_capture":
        if not source.dumps:
            raise WorkbenchError("this capture_oom handle has written no snapshot yet (no OOM happened); "
                                 "open the panel after an OOM, or on a snapshot file")
        return analyze_snapshot(load_snapshot(source.dumps[-1]), device)
    return analyze_snapshot(source.load(), device)  # a MemoryRecording


class MemoryPanel(PanelBase):
    """Allocator snapshot explorer (see the module docstring)."""

    def __init__(self, source, *, device: int | None = None, by: str = "category", max_points: int = 20_000):
        _check_source(source)
        super().__init__()
        self.max_points = max_points
        self.analysis: MemoryAnalysis | None = None
        self.oom = None
        self._t0 = 0
        self.range = widgets.FloatRangeSlider(description="range (ms)", min=0.0, max=1.0, value=(0.0, 1.0),
                                              step=0.001, continuous_update=False, readout_format=".1f",
                                              layout=widgets.Layout(width="60%"), style=_LABEL_STYLE)
        self.range.add_class("wb-memory-range")
        self.groupby = widgets.Dropdown(description="stack by", style=_LABEL_STYLE, options=[
            ("category", "category"), ("user frame", "frame"), ("function", "function"), ("total", "total")],
            value=by, layout=widgets.Layout(width="220px"))
        self.groupby.add_class("wb-memory-groupby")
        self.moment = widgets.FloatSlider(description="moment (ms)", min=0.0, max=1.0, value=0.0, step=0.001,
                                          continuous_update=False, readout_format=".2f",
                                          layout=widgets.Layout(width="60%"), style=_LABEL_STYLE)
        self.moment.add_class("wb-memory-moment")
        self.peak_button = widgets.Button(description="go to peak", layout=widgets.Layout(width="110px"))
        self.peak_button.add_class("wb-memory-peak")
        self.timeline = PlotWidget()
        self.live = widgets.HTML()
        self.live.add_class("wb-memory-live")
        self.stack_pick = widgets.Dropdown(description="full stack of", options=[], style=_LABEL_STYLE,
                                           layout=widgets.Layout(width="80%"))
        self.stack_pick.add_class("wb-memory-stack-pick")
        self.stack_view = widgets.HTML()
        self.stack_view.add_class("wb-memory-stack")
        self.state = widgets.HTML()
        self.segments = PlotWidget()
        self.state_over_time = PlotWidget()
        self.oom_html = widgets.HTML()
        self.oom_html.add_class("wb-memory-oom")
        self.oom_fig = PlotWidget()
        self.findings = widgets.HTML()  # the memory findings (MemoryAnalysis.findings), under the status line
        self.findings.add_class("wb-memory-findings")
        self.tabs = widgets.Tab()
        self.tabs.add_class("wb-memory-tabs")
        tl_box = widgets.VBox([self.timeline, self.live, self.stack_pick, self.stack_view])
        tl_box.add_class("wb-memory-timeline")
        seg_box = widgets.VBox([self.state, self.segments, self.state_over_time])
        seg_box.add_class("wb-memory-segments")
        self._tab_boxes = [tl_box, seg_box]
        controls = widgets.VBox([widgets.HBox([self.range, self.groupby]), widgets.HBox([self.moment, self.peak_button])])
        self.children = [self.status, self.findings, controls, self.tabs, self.errors]
        self.add_class("wb-memory")
        self.range.observe(self.guard(self._on_range), names="value")
        self.groupby.observe(self.guard(self._on_groupby), names="value")
        self.moment.observe(self.guard(self._on_moment), names="value")
        self.stack_pick.observe(self.guard(self._on_stack_pick), names="value")
        self.peak_button.on_click(self.guard(lambda _b: self.go_to_peak()))
        try:
            self.load(source, device)
        except Exception as exc:  # a bad file shows in the panel, it does not raise in the cell
            self.show_error(exc)

    @classmethod
    def from_step(cls, step_fn, steps: int = 1, *, path=None, max_entries: int = 100_000, stacks: str = "python",
                  out_dir=None, model=None, **panel_kw) -> "MemoryPanel":
        """Run ``step_fn()`` ``steps`` times under :func:`workbench.capture.record_memory_history` and show
        the snapshot (written to ``path``, else a new file in ``out_dir`` or the trace folder of
        :func:`~workbench.capture.profile_steps`). Without CUDA the allocator records nothing, so the
        steps are profiled with ``detail='full'`` instead and the panel shows torch.profiler's memory
        events (exact sizes, CPU tensors). ``model``: an ``nn.Module`` whose submodules' forwards are
        marked (:func:`workbench.capture.modules.module_scopes`); the profiler's memory events then carry
        the module path (``blocks.3.mlp``) and "stack by" offers "module" (the CUDA allocator history
        records frames, not these marks)."""
        import contextlib

        from workbench.capture.memory import cuda_available, record_memory_history
        from workbench.capture.profiler import default_trace_dir, profile_steps

        scopes = contextlib.nullcontext()
        if model is not None:
            from workbench.capture.modules import module_scopes

            scopes = module_scopes(model)
        if not cuda_available():
            with scopes:
                result = profile_steps(step_fn, steps=steps, wait=0, warmup=1, detail="full", out_dir=out_dir,
                                       verbose=False, progress=False)
            return cls(result, **panel_kw)
        if path is None:
            folder = Path(out_dir) if out_dir is not None else default_trace_dir()
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"step-{time.strftime('%Y%m%d-%H%M%S')}-pid{os.getpid()}.snapshot.pickle.gz"
        with scopes, record_memory_history(path, max_entries=max_entries, stacks=stacks) as rec:
            for _ in range(int(steps)):
                step_fn()
        return cls(rec, **panel_kw)

    @staticmethod
    def compare(base, test, *, device: int | None = None, labels=("base", "test"), top: int = 15) -> "MemoryComparison":
        """Two snapshots on one axis: both timelines aligned at step starts (ProfilerStep annotations,
        the optimizer's ranges or the allocation pattern), peak vs peak by category and by the user's
        frame with deltas. ``base``/``test``: anything ``MemoryPanel`` takes."""
        return MemoryComparison(base, test, device=device, labels=labels, top=top)

    # ------------------------------------------------------------------------------------------
    def load(self, source, device: int | None = None) -> None:
        """(Re)load from a path, snapshot, analysis or recording (what the constructor takes)."""
        _check_source(source)
        self.clear_error()
        a = _resolve(source, device)
        self.analysis = a
        self.oom = a.oom
        self.findings.value = findings_html(a.findings, empty="")
        base = [("category", "category"), ("user frame", "frame"), ("function", "function"), ("total", "total")]
        if any(m != "(no module)" for m in a.labels.get("module", [])):  # recorded with module_scopes
            base.insert(1, ("module", "module"))
        if [v for _, v in self.groupby.options] != [v for _, v in base]:
            value = self.groupby.value
            with self.groupby.hold_trait_notifications():
                self.groupby.options = base
                self.groupby.value = value if value in [v for _, v in base] else "category"
        tl = a.timeline
        n = len(tl)
        self._t0 = int(tl["time_us"].iloc[0]) if n else 0
        span = max((int(tl["time_us"].iloc[-1]) - self._t0) / 1e3, 0.001) if n else 0.001
        with self.range.hold_trait_notifications(), self.moment.hold_trait_notifications():
            self.range.min, self.range.max = 0.0, span
            self.range.value = (0.0, span)
            self.range.step = max(span / 2000, 1e-3)
            self.moment.min, self.moment.max = 0.0, span
            self.moment.step = max(span / 5000, 1e-3)
        children = list(self._tab_boxes)
        titles = ["Timeline", "Segments"]
        if self.oom is not None:
            box = widgets.VBox([self.oom_html, self.oom_fig])
            children.append(box)
            titles.append("OOM")
        self.tabs.children = children
        for i, t in enumerate(titles):
            self.tabs.set_title(i, t)
        if self.oom is not None:
            self._draw_oom()
            self.tabs.selected_index = 2
        self.set_status(
            f"{path_label(a.snap.source)}: {len(a.snap.events):,} events, {len(a.snap.segments)} segments; "
            f"peak allocated {format_bytes(a.peak['allocated_bytes'])}"
            + (f"; OOM ({self.oom.cause})" if self.oom else ""), raw_html=True)
        self._draw_timeline()
        self._draw_state_over_time()
        self.go_to_peak()

    # ------------------------------------------------------------------------------------------
    def _window_us(self):
        lo, hi = self.range.value
        return self._t0 + lo * 1e3, self._t0 + hi * 1e3

    def moment_index(self) -> int:
        """Event index of the moment slider (the last event at or before it)."""
        t = self.analysis.timeline["time_us"].to_numpy()
        target = self._t0 + self.moment.value * 1e3
        k = int(np.searchsorted(t, target + 1e-6, side="right")) - 1
        return max(0, min(k, len(t) - 1))

    def go_to_peak(self) -> None:
        pk = self.analysis.peak
        if pk["index"] < 0 or pk["time_us"] is None:
            return
        self.moment.value = min(max((pk["time_us"] - self._t0) / 1e3, self.moment.min), self.moment.max)
        self._on_moment(None)

    def _draw_timeline(self) -> None:
        start, end = self._window_us()
        fig = memory_timeline_figure(self.analysis, by=self.groupby.value, start_us=start, end_us=end,
                                     max_points=self.max_points, marker_index=self.moment_index())
        self.timeline.show(fig.update_layout(height=fig.layout.height or 380))

    def _draw_state_over_time(self, points: int = 60) -> None:
        """Allocator state (free in reserved, largest hole, fragmentation) over the selected range."""
        a = self.analysis
        lo, hi = event_range(a.timeline, *self._window_us())
        extra = [a.peak["index"]] if lo <= a.peak["index"] <= hi else []
        states = allocator_state_timeline(a.snap, a.allocs, points=points, start_index=lo, end_index=hi,
                                          extra_indices=extra)
        fig = allocator_state_figure(states, t0_us=self._t0)
        self.state_over_time.show(fig.update_layout(height=fig.layout.height or 360))

    def _on_range(self, _change) -> None:
        lo, hi = self.range.value
        if not (lo <= self.moment.value <= hi):
            self.moment.value = min(max(self.moment.value, lo), hi)
        self._draw_timeline()
        self._draw_state_over_time()

    def _on_groupby(self, _change) -> None:
        self._draw_timeline()

    def live_table(self, index: int | None = None, top: int = 25) -> pd.DataFrame:
        """What was live just after event ``index`` (default: the moment slider), largest first."""
        k = self.moment_index() if index is None else index
        live = self.analysis.live_at(k).head(top)
        snap = self.analysis.snap
        return pd.DataFrame({
            "bytes": live["size_bytes"].to_numpy(),
            "category": live["category"].astype(str).to_numpy(),
            "confidence": live["confidence"].to_numpy(),
            "frame": live["frame"].to_numpy(),
            "stack": [snap.stack_text(int(s), limit=4).replace("\n", " <- ") for s in live["alloc_stack_id"]],
        })

    def _on_stack_pick(self, _change=None) -> None:
        i = self.stack_pick.value
        ids = getattr(self, "_stack_ids", [])
        self.stack_view.value = "" if i is None or i >= len(ids) else stack_html(self.analysis.snap, ids[i])

    def _on_moment(self, _change) -> None:
        a = self.analysis
        k = self.moment_index()
        row = a.timeline.iloc[k]
        live = a.live_at(k)
        head = (f"<b>{(int(row['time_us']) - self._t0) / 1e3:,.3f} ms</b> (event {k:,}, {html.escape(str(row['action']))}): "
                f"{format_bytes(int(row['allocated_bytes']))} allocated in {len(live):,} blocks, "
                f"{format_bytes(int(row['reserved_bytes']))} reserved")
        self.live.value = head + table_html(_with_size(self.live_table(k)), max_rows=25, csv="live_allocations.csv")
        top = live.head(25)
        self._stack_ids = [int(sid) for sid in top["alloc_stack_id"]]
        choices = [(f"#{i + 1}  {format_bytes(int(b))}  {f}", i) for i, (b, f) in
                   enumerate(zip(top["size_bytes"], top["frame"].astype(str)))]
        keep = self.stack_pick.value if self.stack_pick.value is not None and self.stack_pick.value < len(choices) else 0
        self.stack_pick.options = choices
        self.stack_pick.value = keep if choices else None
        self._on_stack_pick()
        st = allocator_state(a.snap, a.allocs, k)
        alarm = st.cached_unused_share >= CACHED_UNUSED_ALARM
        self.state.value = (
            f"free in reserved {format_bytes(st.free_in_reserved_bytes)} in {st.free_blocks} holes; largest "
            f"{format_bytes(st.largest_free_block_bytes)}; "
            f"<span class='wb-memory-cached-unused'>cached-unused share {100 * st.cached_unused_share:.0f}% "
            f"(reserved − allocated) / reserved{' ⚠ above' if alarm else ', below'} the "
            f"{100 * CACHED_UNUSED_ALARM:.0f}% alarm</span>; external fragmentation "
            f"{st.external_fragmentation:.2f} (1 − largest free block / free)")
        self.segments.show(segment_map_figure(a, k))
        self._draw_timeline()

    def _draw_oom(self) -> None:
        r = self.oom
        fb = format_bytes
        details = (
            f"<div>requested <b>{fb(r.requested_bytes)}</b>; allocated {fb(r.allocated_bytes)}; reserved "
            f"{fb(r.reserved_bytes)}; free in reserved {fb(r.free_in_reserved_bytes)}; largest free block "
            f"{fb(r.largest_free_block_bytes)}" + (f"; cap {fb(r.cap_bytes)}" if r.cap_bytes else "") + "</div>"
            + f"<div>{html.escape(_settings_text(r.allocator_settings))}</div>"
            + (f"<div class='wb-memory-unseen'>note: {html.escape(note)}</div>"
               if (note := unseen_note(r.step_model)) else ""))
        where = (f"<div class='wb-memory-where'>where: <b>{html.escape(r.position['text'])}</b> (confidence "
                 f"{r.position['confidence']:.1f}: {html.escape(str(r.position.get('reason')))})</div>"
                 if (r.position or {}).get("text") else "")
        self.oom_html.value = (
            advice_html(r.advice, headline=f"Out of memory: {r.cause}", details=details) + where
            + table_html(_with_size(pd.DataFrame(r.top_live).drop(columns=["stack"], errors="ignore")), max_rows=10,
                         csv="oom_largest_live.csv"))
        self.oom_fig.show(oom_figure(r))


_RECORDER_FRAME = re.compile(r"^torch::unwind::|^torch::CapturedTraceback::|gather_with_cpp\(")


def stack_html(snap, stack_id: int, limit: int = 200) -> str:
    """The whole stack of one allocation, innermost first: every frame (Python and C++) but the stack
    recorder's own (torch's unwinder), the user's Python frames (outside torch and the standard
    library) in bold, C++ frames dimmed."""
    from workbench.analysis.memory.allocations import _INTERNAL, _is_python

    if stack_id is None or stack_id < 0:
        return "<div class='wb-memory-stack-empty' style='color:var(--jp-ui-font-color2,#666)'>(no stack recorded)</div>"
    names = snap.frames["name"].to_numpy()
    files = snap.frames["filename"].to_numpy()
    lines = snap.frames["line"].to_numpy()
    rows = []
    # the recorder's own frames (torch's unwinder) come first in every C++ stack: not the program's
    frames = [f for f in snap.stacks[stack_id] if not _RECORDER_FRAME.search(str(names[f]))]
    for fid in frames[:limit]:
        fn, nm, ln = str(files[fid]), str(names[fid]), lines[fid]
        where = nm if fn in ("??", "") and not ln else f"{fn}:{ln} {nm}"
        if _is_python(fn) and not _INTERNAL.search(fn):
            rows.append(f"<div class='wb-stack-user'><b>{html.escape(where)}</b></div>")
        elif _is_python(fn):
            rows.append(f"<div class='wb-stack-py'>{html.escape(where)}</div>")
        else:
            rows.append(f"<div class='wb-stack-cpp' style='color:var(--jp-ui-font-color2,#777)'>{html.escape(where)}</div>")
    more = f"<div>… {len(frames) - limit} more frames</div>" if len(frames) > limit else ""
    return (f"<div style='font-family:var(--jp-code-font-family,monospace);font-size:11px;line-height:1.35;white-space:nowrap;"
            f"overflow-x:auto;max-height:320px;overflow-y:auto'>{''.join(rows)}{more}</div>")


class MemoryComparison(PanelBase):
    """What :meth:`MemoryPanel.compare` returns: ``diff`` (a
    :class:`~workbench.analysis.memory.diff.MemoryDiff`), ``figure`` (both timelines on one axis) and
    ``table`` (by category and by frame). CSS class ``wb-memory-compare``."""

    def __init__(self, base, test, *, device: int | None = None, labels=("base", "test"), top: int = 15):
        from workbench.analysis.memory.diff import memory_diff
        from workbench.figures.memory import memory_compare_figure

        for src in (base, test):
            _check_source(src)
        super().__init__()
        self.figure = PlotWidget()
        self.table = widgets.HTML()
        self.children = [self.status, self.figure, self.table, self.errors]
        self.add_class("wb-memory-compare")
        self.diff = None
        try:
            self.diff = memory_diff(_resolve(base, device), _resolve(test, device))
        except Exception as exc:  # a bad file shows in the panel, it does not raise in the cell
            self.show_error(exc)
            return
        s = self.diff.summary(top)
        fb = format_bytes
        b, t = s["base"], s["test"]
        self.set_status(
            f"{html.escape(labels[0])}: peak {fb(b['peak_allocated_bytes'])} allocated, {fb(b['peak_reserved_bytes'])} "
            f"reserved ({b['steps']} steps); {html.escape(labels[1])}: peak {fb(t['peak_allocated_bytes'])} allocated, "
            f"{fb(t['peak_reserved_bytes'])} reserved ({t['steps']} steps); axis: {self.diff.axis}", raw_html=True)
        self.figure.show(memory_compare_figure(self.diff, labels=labels))
        cat = pd.DataFrame(s["by_category"]).rename(columns={"base_bytes": labels[0], "test_bytes": labels[1]})
        frames = pd.DataFrame(s["by_frame"])[["frame", "base_bytes", "test_bytes", "delta_bytes"]].rename(
            columns={"base_bytes": labels[0], "test_bytes": labels[1]})
        self.table.value = ("<h4 style='margin:4px 0'>By category at each peak</h4>" + table_html(cat, max_rows=20)
                            + "<h4 style='margin:4px 0'>By user frame at each peak (largest changes)</h4>"
                            + table_html(frames, max_rows=top))


def _with_size(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a readable ``size`` (MiB/GiB) next to the exact ``bytes``."""
    if table is None or table.empty or "bytes" not in table.columns:
        return table
    out = table.copy()
    # a no-break space keeps "32.00 MiB" on one line in a narrow column
    out.insert(int(out.columns.get_loc("bytes")) + 1, "size",
               [format_bytes(int(b)).replace(" ", "\u00a0") for b in out["bytes"]])
    return out

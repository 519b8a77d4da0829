"""TimelinePanel: a trace, an allocator snapshot and NVML/GPM samples of one run on one clock.

``TimelinePanel(trace=..., memory=..., nvml=...)``: each a file or a loaded object (``Trace`` /
``ProfileResult``; ``MemorySnapshot`` / ``MemoryRecording``; a session frame or a sampler), any of them
may be left out. The figure (``figures.timeline.aligned_timeline_figure``) has one row per artifact on a
shared x axis: zooming any row zooms them all, and the kernel lanes are recomputed for the new window
(kernels closer than a pixel are merged when zoomed out). Above it: which file was aligned how, where the
allocator peaked and inside which range, and what the SMs did during the longest ranges.

CSS classes for browser tests: ``wb-timeline``, ``wb-timeline-figure``, ``wb-timeline-summary``,
``wb-timeline-reset``.
"""

from __future__ import annotations

import html
import re

from workbench._optional import import_optional
from workbench.analysis.timeline import activity_by_annotation, align, timeline_summary
from workbench.errors import BadArgument
from workbench.figures.timeline import aligned_timeline_figure
from workbench.io.kinds import GPU_SAMPLE_KINDS
from workbench.panels._base import PanelBase, classify, error_text, table_html, wrong_kind
from workbench.panels._plot import PlotWidget
from workbench.units import format_bytes

__all__ = ["TimelinePanel", "resolve_sources"]

_TAKES = {
    "trace": "a Kineto trace file, a Trace or a ProfileResult",
    "memory": "an allocator snapshot file, a MemorySnapshot or a MemoryRecording (or a trace with [memory] events)",
    "nvml": "an NVML session file (JSONL/CSV), a session frame or a sampler",
}
_RANGE_KEY = re.compile(r"^xaxis(\d*)\.range\[([01])\]$")


def _load(role: str, source):
    """One source as the object align() takes, or a BadArtifact naming what fits."""
    from workbench.io.nvml_foreign import load_gpu_samples
    from workbench.io.snapshot import load_snapshot
    from workbench.io.trace import load_trace
    from workbench.io.profiler_memory import load_profiler_memory

    panel = f"TimelinePanel({role}=...)"
    kind, path = classify(source, panel, _TAKES[role])
    if role == "trace":
        if kind == "trace":
            return load_trace(path) if path is not None else source
        if kind == "profile_result":
            return source.load()
    elif role == "memory":
        if kind == "snapshot":
            return load_snapshot(path) if path is not None else source
        if kind == "memory_recording":
            return source.load()
        if kind == "trace" and path is not None:
            return load_profiler_memory(path)
    elif role == "nvml":
        if kind in GPU_SAMPLE_KINDS:  # a session, an nvidia-smi log, DCGM scrapes, a metrics table
            return load_gpu_samples(path) if path is not None else source
        if kind == "sampler":
            return source.frame()
    raise wrong_kind(source, kind, panel, _TAKES[role])


def resolve_sources(trace=None, memory=None, nvml=None):
    """``(trace, memory, nvml_frame)`` loaded from files or objects (any may be None)."""
    return tuple(None if s is None else _load(role, s)
                 for role, s in (("trace", trace), ("memory", memory), ("nvml", nvml)))


class TimelinePanel(PanelBase):
    """One run on one clock (module docstring). ``raise_errors=True`` raises a loader's error instead of
    showing it in the panel."""

    def __init__(self, trace=None, memory=None, nvml=None, *, height: int | None = None, raise_errors: bool = False):
        ipw = import_optional("ipywidgets", "for the timeline panel")
        if trace is None and memory is None and nvml is None:
            raise BadArgument("TimelinePanel: give at least one of trace=, memory=, nvml=")
        # the kinds are checked before any widget exists: a wrong file raises here, nothing half-drawn
        for role, s in (("trace", trace), ("memory", memory), ("nvml", nvml)):
            if s is not None:
                kind, _path = classify(s, f"TimelinePanel({role}=...)", _TAKES[role])
                ok = {"trace": ("trace", "profile_result"), "memory": ("snapshot", "memory_recording", "trace"),
                      "nvml": (*GPU_SAMPLE_KINDS, "sampler")}[role]
                if kind not in ok:
                    raise wrong_kind(s, kind, f"TimelinePanel({role}=...)", _TAKES[role])
        super().__init__()
        self.height = height
        self.timeline = None
        self.summary: dict | None = None
        self.window: tuple[int, int] | None = None   # the x window the kernel lanes were drawn for (ns)
        self.redraws = 0
        self.run = None
        error = None
        try:
            t, m, n = resolve_sources(trace, memory, nvml)
            self.timeline = align(t, m, n)
        except Exception as exc:
            if raise_errors:
                raise
            error = exc
        fig = aligned_timeline_figure(self.timeline, height=height) if self.timeline is not None else None
        # the figure travels in the first message
        self.figure = PlotWidget(fig, classes=["wb-timeline-figure"])
        self.summary_html = ipw.HTML("")
        self.summary_html.add_class("wb-timeline-summary")
        self.reset_button = ipw.Button(description="Whole run", icon="arrows-h", tooltip="show the whole run")
        self.reset_button.add_class("wb-timeline-reset")
        self.children = [self.status, self.summary_html, self.reset_button, self.figure, self.errors]
        self.add_class("wb-timeline")
        if error is not None:
            self.show_error(error)
            self.set_status(f"could not load: {error_text(error)}")
            self.reset_button.disabled = True
            return
        self.summary = timeline_summary(self.timeline)
        self.redraws = 1
        self._status()
        self._show_summary()
        self.figure.on_relayout(self.guard(self._on_relayout))
        self.reset_button.on_click(self.guard(lambda _b: self._draw(None, reset=True)))

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_step(cls, step_fn, steps: int = 3, *, detail: str = "light", memory: bool = True, nvml: bool = True,
                  out_dir=None, **panel_kw) -> "TimelinePanel":
        """Run ``step_fn()`` ``steps`` times under the profiler (CPU always, CUDA when present), with
        allocator history (CUDA) and NVML/GPM sampling, and show the three on one clock. The artifacts
        stay on disk (``panel.run`` holds their paths)."""
        from workbench.capture.session import record_run

        with record_run(out_dir, detail=detail, memory=memory, nvml=nvml) as run:
            for _ in range(int(steps)):
                step_fn()
                run.step()  # after each step: code after the last step() is not a step
        panel = cls(**run.sources(), **panel_kw)
        panel.run = run.result
        return panel

    # -- drawing -----------------------------------------------------------------------------------
    def _draw(self, window, reset: bool = False) -> None:
        tl = self.timeline
        lo, hi = window if window is not None else (None, None)
        fig = aligned_timeline_figure(tl, lo, hi, height=self.height)
        if reset:
            fig.update_layout(uirevision=f"reset-{self.redraws}")  # forget the browser's zoom
        self.window = window
        self.figure.show(fig)
        self.redraws += 1
        self._status()

    def _on_relayout(self, data: dict) -> None:
        """A zoom or pan of any row (the rows share x): redraw the kernel lanes for the new window."""
        if self.timeline is None:
            return
        if any(k.endswith(".autorange") and v for k, v in data.items() if k.startswith("xaxis")):
            self._draw(None)
            return
        got: dict[int, float] = {}
        for k, v in data.items():
            m = _RANGE_KEY.match(k)
            if m:
                got[int(m.group(2))] = float(v)
            elif re.match(r"^xaxis\d*\.range$", k) and isinstance(v, (list, tuple)) and len(v) == 2:
                got = {0: float(v[0]), 1: float(v[1])}
        if len(got) == 2 and got[1] > got[0]:
            o = self.timeline.origin_ns
            self._draw((int(o + got[0] * 1e9), int(o + got[1] * 1e9)))

    def zoom(self, start_s: float, end_s: float) -> None:
        """Show seconds ``start_s`` .. ``end_s`` after the first event (what a zoom in the browser does)."""
        self._on_relayout({"xaxis.range[0]": start_s, "xaxis.range[1]": end_s})

    def _status(self) -> None:
        tl = self.timeline
        parts = []
        for p in tl.placements:
            how = f"aligned by {p.method}" if p.aligned else "<b>not aligned</b> (first event)"
            parts.append(f"{html.escape(p.kind)}: {html.escape(p.name)} ({how})")
        if self.window is not None:
            lo, hi = ((w - tl.origin_ns) / 1e9 for w in self.window)
            parts.append(f"window {lo:.3f} .. {hi:.3f} s")
        self.set_status(" &middot; ".join(parts), raw_html=True)

    def _show_summary(self) -> None:
        doc, tl = self.summary, self.timeline
        o = doc["origin_ns"]
        items = []
        mem = doc["memory"]
        if mem and mem["peak_time_ns"] is not None:
            where = f" inside <b>{html.escape(mem['peak_annotation'])}</b>" if mem["peak_annotation"] else ""
            items.append(f"allocator peak {html.escape(format_bytes(mem['peak_bytes']))} at "
                         f"{(mem['peak_time_ns'] - o) / 1e9:.3f} s{where}")
        nv = doc["nvml"]
        if nv and not nv["gpm_columns"]:
            items.append("no GPM counters in this session (they need a Hopper or newer GPU)")
        for note in doc["notes"]:
            items.append(f"<span style='color:#a05000'>{html.escape(note)}</span>")
        act = activity_by_annotation(tl)
        act = act[act["rows"] > 0]
        table = ""
        if len(act):
            show = act.assign(start_s=(act["start_ns"] - o) / 1e9, dur_s=(act["end_ns"] - act["start_ns"]) / 1e9)
            show = show[["name", "gpu", "start_s", "dur_s", "rows", "util_gpu_pct", "gpm_sm_util_pct",
                         "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct"]]
            show.columns = ["range", "gpu", "start (s)", "duration (s)", "NVML rows", "NVML util %", "SM active %",
                            "occupancy %", "tensor cores %", "DRAM bw %"]
            table = ("<div style='margin-top:4px'>what the GPU did during the longest ranges (mean of the NVML rows "
                     "inside each):</div>" + table_html(show, max_rows=10, float_format="{:,.1f}",
                                                         formats={"start (s)": "{:,.3f}", "duration (s)": "{:,.3f}"}))
        body = "".join(f"<li>{i}</li>" for i in items)
        self.summary_html.value = (f"<ul style='margin:2px 0;padding-left:1.2em'>{body}</ul>" if body else "") + table

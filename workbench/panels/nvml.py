"""LiveGpuPanel: what every GPU is doing right now, in the notebook output, without blocking the kernel.

>>> from workbench import LiveGpuPanel              # doctest: +SKIP
>>> panel = LiveGpuPanel(); panel                    # live NVML, or a replay where there is none  # doctest: +SKIP
>>> LiveGpuPanel("session.jsonl.gz")                  # a recorded session (or a sampler), replayed  # doctest: +SKIP
>>> LiveGpuPanel.from_step(train_step, steps=50)     # sample while your step runs, marks around it  # doctest: +SKIP
>>> train(); panel.mark("epoch 1")                   # the plot keeps moving while the cell runs  # doctest: +SKIP
>>> panel.alerts(); panel.close()                    # doctest: +SKIP

How it stays out of the way: the sampler records in its own thread; a second thread
(``workbench-live-panel``) wakes every ``refresh_s`` (at least 0.1 s, so at most 10 redraws a
second), takes only the rows it has not seen (``sampler.rows_since``), swaps the windowed data of each
trace in the figure (``fw.fig``, in place) and sends the figure to the browser, one comm message per
redraw. ipykernel
sends comm messages from any thread, so the figure moves while a cell runs, and the cell only
loses the GIL for the few milliseconds a redraw costs (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import html
import math
import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pandas as pd

from workbench._optional import import_optional
from workbench.analysis.nvml import AlertThresholds, gpu_alerts
from workbench.capture.nvml import NvmlSampler
from workbench.capture.sampler import RING_COLUMNS, ReplaySampler
from workbench.errors import NoNVML, WorkbenchError
from workbench.figures.nvml import add_marks, live_gpu_figure
from workbench.io.kinds import GPU_SAMPLE_KINDS
from workbench.panels._base import PanelBase, classify, wrong_kind
from workbench.panels._plot import PlotWidget

__all__ = ["LiveGpuPanel"]

_COL = {c: i for i, c in enumerate(RING_COLUMNS)}
_MIN_REFRESH_S = 0.1
_REDRAW_BUDGET = 20  # wait at least 20x the last redraw's duration before the next
_PANELS: "weakref.WeakSet[LiveGpuPanel]" = weakref.WeakSet()


_TAKES = "an NVML sampler, or a recorded NVML session (.jsonl / .csv, .gz or not; a session frame; a sample name)"


def _sampler_of(source, replay):
    """``(sampler or None, replay)`` for the panel's ``source``: a sampler is used as given; a recorded
    session is replayed (the panel then owns the replay); None keeps the default (live NVML)."""
    if source is None:
        return None, replay
    if isinstance(source, str) and not os.path.lexists(source):  # lexists: no OSError for odd names
        from workbench import samples

        if source in samples.names("nvml"):
            return None, source
    kind, path = classify(source, "LiveGpuPanel", _TAKES)
    if kind == "sampler":
        return source, replay
    if kind in GPU_SAMPLE_KINDS:  # a session, an nvidia-smi log, DCGM scrapes, a metrics table
        return None, source if path is None else path
    if path is not None and kind == "unknown":
        return None, path  # the session loader says what is wrong with it
    raise wrong_kind(source, kind, "LiveGpuPanel", _TAKES)


@atexit.register
def _close_all_at_exit() -> None:
    for p in list(_PANELS):
        try:
            p.close()
        except Exception:
            pass


class LiveGpuPanel(PanelBase):
    """Stacked live plot of utilization, memory, power, temperature/clocks for every GPU, with a
    window length, pause/resume, GPU selection, a mark button, CSV export, a status line and alerts.

    ``source``: any :class:`~workbench.capture.sampler.Sampler`, or a recorded NVML session (a file, a
    session frame, or a shipped sample's name), replayed in a loop at ``speed``. By default an
    :class:`~workbench.capture.nvml.NvmlSampler` at ``interval_s``, or, where NVML is missing, a looping
    :class:`~workbench.capture.sampler.ReplaySampler` of ``replay`` (default: the shipped H200 session),
    and the status line says so. ``replay=`` alone replays that file. The panel stops a sampler it
    created when it closes; one you pass in is yours to stop. Another kind of artifact, or a missing
    file, raises a :class:`~workbench.errors.BadArtifact` naming the panel that fits.

    ``autostart=False`` starts no thread: call :meth:`refresh` yourself (tests, scripted use).
    """

    def __init__(self, source=None, *, replay=None, interval_s: float = 0.1, window_s: float = 60.0,
                 refresh_s: float = 0.2, speed: float = 1.0, thresholds: AlertThresholds | None = None,
                 alerts_every_s: float = 2.0, export_dir=".", autostart: bool = True, max_points: int = 2_000,
                 sampler=None):
        ipw = import_optional("ipywidgets", "for the live GPU panel")
        if sampler is None:
            sampler, replay = _sampler_of(source, replay)
        elif source is not None:
            raise WorkbenchError("LiveGpuPanel: give the source or sampler=, not both")
        super().__init__()
        self.thresholds = thresholds or AlertThresholds()
        self.refresh_s = max(_MIN_REFRESH_S, float(refresh_s))
        self.alerts_every_s = float(alerts_every_s)
        self.export_dir = Path(export_dir)
        self.max_points = int(max_points)
        self.fallback_reason: str | None = None
        self._owns_sampler = sampler is None
        if sampler is None:
            sampler = self._default_sampler(replay, interval_s, speed)
        self.sampler = sampler
        self._live_lock = threading.RLock()
        self._live_stop = threading.Event()
        self._live_thread: threading.Thread | None = None
        self._live_closed = False
        self._paused = False
        self._cursor = 0
        self._rows = np.empty((0, len(RING_COLUMNS)))
        self._marks_drawn = 0
        self._alerts = gpu_alerts(pd.DataFrame(columns=["t_s", "gpu"]))
        self._last_alerts_at = -math.inf
        self.redraws = 0
        self.redraw_s = 0.0       # time spent in redraws (this thread's CPU time), for the benchmark

        if not self.sampler.running:
            self.sampler.start()
        gpus = list(getattr(self.sampler, "gpus", []) or [0])
        self.gpus = gpus
        history = float(getattr(self.sampler, "history_s", 900.0))

        # -- widgets
        self.counters = bool(getattr(self.sampler, "has_gpm", False))  # the GPM counters row
        self.figure = PlotWidget(live_gpu_figure(self.sampler.frame().iloc[0:0], gpus=gpus, marks=[],
                                                 max_points=self.max_points, counters=self.counters),
                                 classes=["wb-live-figure"])
        self._trace_meta = [(tr.meta["gpu"], _COL[tr.meta["column"]], tr.meta["scale"]) for tr in self.figure.data]
        matched = {ax.matches for ax in self.figure.fig.select_xaxes() if ax.matches}
        self._x_anchor = "xaxis" + (matched.pop()[1:] if len(matched) == 1 else "")
        self.window = ipw.BoundedIntText(value=int(window_s), min=5, max=int(max(history, window_s)), step=5,
                                         description="window (s)", layout={"width": "170px"})
        self.window.add_class("wb-live-window")
        self.pause_button = ipw.ToggleButton(value=False, description="Pause", icon="pause",
                                             tooltip="freeze the plot (sampling continues)")
        self.pause_button.add_class("wb-live-pause")
        self.gpu_select = ipw.SelectMultiple(options=[(f"gpu{g}", g) for g in gpus], value=tuple(gpus),
                                             description="GPUs", rows=min(4, max(1, len(gpus))),
                                             layout={"width": "180px"})
        self.gpu_select.add_class("wb-live-gpus")
        self.mark_button = ipw.Button(description="Mark", icon="map-marker", tooltip="put a mark at the current time")
        self.mark_button.add_class("wb-live-mark")
        self.export_button = ipw.Button(description="Export CSV", icon="download",
                                        tooltip="write every sample still in memory to a CSV file")
        self.export_button.add_class("wb-live-export")
        self.export_path = ipw.HTML("")
        self.export_path.add_class("wb-live-export-path")
        self.status.add_class("wb-live-status")
        self.alerts_html = ipw.HTML("")
        self.alerts_html.add_class("wb-live-alerts")
        self.errors.add_class("wb-live-errors")
        controls = ipw.HBox([self.window, self.pause_button, self.gpu_select, self.mark_button,
                             self.export_button, self.export_path])
        controls.add_class("wb-live-controls")
        self.children = [controls, self.status, self.figure, self.alerts_html, self.errors]
        self.add_class("wb-live")
        self._controls = controls

        self.window.observe(self._on_window, names="value")
        self.pause_button.observe(self._on_pause, names="value")
        self.gpu_select.observe(self._on_gpus, names="value")
        self.mark_button.on_click(self.guard(lambda _b: self.mark(f"mark {len(self.sampler.marks()) + 1}")))
        self.export_button.on_click(self.guard(lambda _b: self.export_csv()))

        _PANELS.add(self)
        self.refresh(force_alerts=True)
        if autostart:
            self.start()

    @classmethod
    def from_step(cls, step_fn, steps: int = 10, **panel_kw) -> "LiveGpuPanel":
        """Sample the GPUs while ``step_fn()`` runs ``steps`` times in this cell, with a mark before the
        first step and after the last, and return the panel (it keeps sampling live until closed).
        Where NVML is missing the panel replays the shipped session as usual and says so."""
        panel = cls(**panel_kw)
        panel.mark("steps start")
        try:
            for _ in range(int(steps)):
                step_fn()
        finally:
            panel.mark(f"{int(steps)} steps done")
        return panel

    # -- source ------------------------------------------------------------------------------------
    def _default_sampler(self, replay, interval_s, speed):
        from workbench import samples

        if replay is not None:
            return ReplaySampler(self._replay_path(replay, samples), loop=True, speed=speed)
        nvml = NvmlSampler(interval_s=interval_s)
        try:
            nvml.start()
            return nvml
        except NoNVML as exc:
            cause = exc.__cause__
            self.fallback_reason = str(cause) if cause is not None else str(exc)
            return ReplaySampler(samples.path("h200_nvml_session"), loop=True, speed=speed)

    @staticmethod
    def _replay_path(replay, samples):
        if isinstance(replay, pd.DataFrame):
            return replay
        p = Path(replay)
        if not os.path.lexists(p) and str(replay) in samples.names("nvml"):
            return samples.path(str(replay))
        return p

    @property
    def source_line(self) -> str:
        src = getattr(self.sampler, "source", type(self.sampler).__name__)
        if self.fallback_reason:
            name = getattr(getattr(self.sampler, "path", None), "name", src)
            return f"NVML not available: {self.fallback_reason}; replaying {name}"
        return src

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> "LiveGpuPanel":
        """Start the redraw thread (the constructor does unless ``autostart=False``)."""
        with self._live_lock:
            if self._live_closed:
                raise WorkbenchError("this LiveGpuPanel is closed; create a new one")
            if self._live_thread is None or not self._live_thread.is_alive():
                self._live_stop.clear()
                self._live_thread = threading.Thread(target=self._run, name="workbench-live-panel", daemon=True)
                self._live_thread.start()
        return self

    def close(self) -> None:
        """Stop redrawing, stop the sampler if the panel created it, and close the widgets."""
        if not hasattr(self, "_live_stop"):  # the constructor raised before the panel was built
            return
        self._live_stop.set()
        t = self._live_thread
        if t is not None and t is not threading.current_thread():
            t.join(5.0)
        if self._live_closed:
            return
        self._live_closed = True
        if self._owns_sampler:
            self.sampler.stop()
        for w in (self.window, self.pause_button, self.gpu_select, self.mark_button, self.export_button,
                  self.export_path, self.status, self.alerts_html, self.errors, self.figure, self._controls):
            w.close()
        _PANELS.discard(self)
        super().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def running(self) -> bool:
        t = self._live_thread
        return t is not None and t.is_alive()

    def _run(self) -> None:
        wait = self.refresh_s
        while not self._live_stop.wait(wait):
            if self.comm is None:  # the widget was closed by other means (Widget.close_all, kernel shutdown)
                break
            t0 = time.perf_counter()
            try:
                self.refresh()
            except Exception as exc:  # shown in the panel, and the thread keeps the plot alive
                self.show_error(exc)
            # never spend more than ~5% of the time redrawing: with many GPUs or a long window the
            # plot slows down rather than the cell
            wait = max(self.refresh_s, _REDRAW_BUDGET * (time.perf_counter() - t0))

    # -- controls ----------------------------------------------------------------------------------
    def _on_window(self, change) -> None:
        # a longer window needs rows the panel already dropped: take them back from the sampler's ring
        with self._live_lock:
            ring = getattr(self.sampler, "ring", None)
            if ring is not None:
                self._rows, self._cursor = ring.rows_since(0)
            self._trim()
            self._redraw()

    def _on_pause(self, change) -> None:
        self._paused = bool(change["new"])
        self.pause_button.description = "Resume" if self._paused else "Pause"
        self.pause_button.icon = "play" if self._paused else "pause"
        if not self._paused:
            self.refresh()
        else:
            self._update_status()

    def _on_gpus(self, change) -> None:
        with self._live_lock:
            self._redraw()

    # -- public ------------------------------------------------------------------------------------
    def mark(self, label: str) -> float:
        """Mark the current time (a vertical line on every row); returns the time in seconds."""
        t = self.sampler.mark(label)
        if not self._paused:
            self.refresh()
        return t

    def pause(self) -> None:
        self.pause_button.value = True

    def resume(self) -> None:
        self.pause_button.value = False

    def frame(self) -> pd.DataFrame:
        """Every sample still in the sampler's memory, as a DataFrame."""
        return self.sampler.frame()

    def alerts(self) -> pd.DataFrame:
        """Alerts over everything still sampled, with this panel's thresholds
        (see :func:`workbench.analysis.nvml.gpu_alerts`)."""
        return gpu_alerts(self.sampler.frame(), self.thresholds)

    def export_csv(self, path=None) -> Path:
        """Write the samples (and marks) to a CSV file; the path appears next to the button."""
        if path is None:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = self.export_dir / f"nvml-session-{stamp}.csv"
        path = Path(self.sampler.save(path)).resolve()
        self.export_path.value = f"wrote <code>{html.escape(str(path))}</code>"
        return path

    def refresh(self, force_alerts: bool = False) -> int:
        """Take the new samples and redraw (what the thread does every ``refresh_s``); returns the
        number of new rows. Does nothing to the figure while paused."""
        if self._live_closed:
            return 0
        with self._live_lock:
            if self._paused:
                self._update_status()
                return 0
            c0 = time.thread_time()
            new, self._cursor = self.sampler.rows_since(self._cursor)
            if len(new):
                self._rows = np.concatenate([self._rows, new]) if len(self._rows) else new
                self._trim()
            now = time.perf_counter()
            if force_alerts or now - self._last_alerts_at >= self.alerts_every_s:
                self._last_alerts_at = now
                self._alerts = gpu_alerts(self.sampler.frame(), self.thresholds)
                self._update_alerts()
            self._redraw()
            self.redraws += 1
            self.redraw_s += time.thread_time() - c0
            return len(new)

    # -- drawing -----------------------------------------------------------------------------------
    def _trim(self) -> None:
        if len(self._rows):
            t_end = self._rows[:, _COL["t_s"]].max()
            keep = self._rows[:, _COL["t_s"]] >= t_end - float(self.window.value)
            if not keep.all():
                self._rows = self._rows[keep]

    def _redraw(self) -> None:
        # The traces' data change in place in fw.fig (one plotly_restyle call for x, y and visibility of
        # every trace, one plotly_relayout for the time window: plotly's per-property setters validate
        # each array and cost ~10x more); fw.redraw() then sends the figure in one comm message.
        from workbench.figures._downsample import minmax_downsample

        rows = self._rows
        selected = set(self.gpu_select.value)
        t = rows[:, _COL["t_s"]]
        g = rows[:, _COL["gpu"]]
        t_end = float(t.max()) if len(t) else 0.0
        window = float(self.window.value)
        masks = {gpu: g == gpu for gpu in self.gpus}
        empty = np.empty(0)
        xs, ys, vis = [], [], []
        for gpu, col, scale in self._trace_meta:
            visible = gpu in selected
            vis.append(visible)
            m = masks.get(gpu)
            if not visible or m is None:
                xs.append(empty)
                ys.append(empty)
                continue
            x = t[m]
            y = rows[m, col] * scale
            if len(x) > self.max_points:
                ok = ~np.isnan(y)
                x, y = minmax_downsample(x[ok], y[ok], self.max_points)
            xs.append(x)
            ys.append(y)
        fig = self.figure.fig
        fig.plotly_restyle({"x": xs, "y": ys, "visible": vis}, trace_indexes=list(range(len(xs))))
        marks = self.sampler.marks()
        if len(marks) > self._marks_drawn:
            add_marks(fig, marks[self._marks_drawn:])
            self._marks_drawn = len(marks)
        if len(t):
            # the upper rows' x axes match the bottom one, so one range moves them all
            fig.plotly_relayout({f"{self._x_anchor}.range": [max(0.0, t_end - window), max(t_end, window)]})
        self.figure.redraw()
        self._update_status()

    def _update_status(self) -> None:
        rows = self._rows
        parts = [html.escape(self.source_line)]
        if len(rows):
            last_t = rows[:, _COL["t_s"]].max()
            parts.append(f"t = {last_t:.1f} s")
            latest = rows[rows[:, _COL["t_s"]] == last_t]
            for r in latest[np.argsort(latest[:, _COL["gpu"]])][:8]:
                parts.append(_gpu_brief(r))
        else:
            parts.append("waiting for samples")
        for note in getattr(self.sampler, "notes", ()):  # GPM not supported here; DCGM on the same counters
            parts.append(html.escape(note))
        if self._paused:
            parts.append("<b>paused</b> (sampling continues)")
        err = getattr(self.sampler, "error", None)
        if err is not None:
            parts.append(f"<b>sampler stopped</b>: {html.escape(type(err).__name__ + ': ' + str(err))}")
        elif not self.sampler.running:
            parts.append("sampler stopped")
        self.status.value = " &middot; ".join(parts)

    def _update_alerts(self) -> None:
        a = self._alerts
        if a is None or a.empty:
            self.alerts_html.value = "<span class='wb-live-no-alerts'>no alerts</span>"
            return
        items = "".join(
            f"<li class='wb-alert wb-alert-{html.escape(r.severity)}'>{html.escape(r.message)}"
            f"{' (ongoing)' if r.ongoing else ''}</li>"
            for r in a.tail(10).itertuples()
        )
        more = f"<li>... {len(a) - 10} earlier</li>" if len(a) > 10 else ""
        self.alerts_html.value = f"<b>alerts ({len(a)})</b><ul>{more}{items}</ul>"


def _gpu_brief(r: np.ndarray) -> str:
    def f(col, fmt, scale=1.0):
        v = r[_COL[col]]
        return "?" if math.isnan(v) else format(v * scale, fmt)

    gpm = ""
    if not math.isnan(r[_COL["gpm_sm_util_pct"]]):
        gpm = f" SM {f('gpm_sm_util_pct', '.0f')}% tensor {f('gpm_tensor_util_pct', '.0f')}% DRAM {f('gpm_dram_bw_util_pct', '.0f')}%"
    return (f"gpu{int(r[_COL['gpu']])} {f('util_gpu_pct', '.0f')}% "
            f"{f('mem_used_bytes', '.1f', 2**-30)}/{f('mem_total_bytes', '.1f', 2**-30)} GiB "
            f"{f('power_w', '.0f')} W {f('temp_c', '.0f')} C" + gpm)

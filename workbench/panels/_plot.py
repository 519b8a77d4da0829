"""The figure widget every panel draws with: a plotly figure as one synced JSON trait.

Why not plotly's own ``go.FigureWidget``: in JupyterLab it showed a blank figure now and then (a different
cell each run, more often on a loaded machine). It sends its whole 5 MB JavaScript bundle with every figure,
and anywidget loads each copy as a new module, so every figure evaluates plotly.js again (1.5-2 s of the
page's main thread each on a small machine). anywidget 0.11 gives a widget model 2 s to load its module; a
model that misses it logs "[anywidget] Failed to initialize model" and drops every later update from the
kernel, and FigureWidget sends the figure itself in such updates: blank.

:class:`PlotWidget` keeps it simple: the figure is one trait (``figure``, the figure's plotly JSON, numbers
as base64 typed arrays); a view draws it with ``Plotly.react`` when created and on every change, so a view
created late still shows the current figure, and the figure is already in the first message.
plotly.js comes from plotly's own package (``plotly/package_data/plotly.min.js``), sent once per kernel in a
hidden :class:`PlotlyLibrary` widget and evaluated once per page, when the page is idle (``plot_widget.js``);
nothing is fetched from the network.

The ``figure`` trait is not in the anywidget model but in a plain ipywidgets model beside it
(:class:`FigureState`, ``@jupyter-widgets/base``'s ``WidgetModel``, whose id is in the anywidget model's
first message): anywidget's watchdog does not apply to it. A PlotWidget model that misses the 2 s still gets
views, drawn from its first state, and everything the kernel sends it afterwards is lost. Most figures are
made empty and shown right after (``PlotWidget()`` then ``show``), and the live panel's first figure has no
samples, so with the figure in the anywidget model such a miss left the figure blank for good (the tour's
``LiveGpuPanel``, once in a full CI run on a loaded 2-core VM, tests/browser/test_plot_widget_browser.py
makes it happen every time). The PlotWidget's own state is set once, in its first message, and never
changes: give CSS classes as ``PlotWidget(fig, classes=[...])``, not with ``add_class`` afterwards.

On the Python side ``fw.fig`` is the ``go.Figure`` last shown and ``fw.data`` its traces; ``fw.layout``
stays the ipywidgets layout of the widget's box (show/hide, width), as for any widget. A zoom, pan or
double-click in the browser comes back as plotly's relayout data: it is applied to ``fw.fig`` and passed to
the callbacks given to :meth:`PlotWidget.on_relayout` (the profiler's timeline loads the zoomed window).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import threading
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np
import pandas as pd

from workbench._optional import import_optional

anywidget = import_optional("anywidget", "to draw plotly figures in a panel")
import ipywidgets  # noqa: E402
import plotly  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import plotly.io as pio  # noqa: E402
import traitlets  # noqa: E402

__all__ = ["PlotWidget", "FigureState", "PlotlyLibrary", "plotly_library", "figure_json"]

_HERE = Path(__file__).resolve().parent
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


# dtypes plotly.js reads as typed arrays ({"dtype": ..., "bdata": base64}); others go as JSON lists
_TYPED = {"i1", "u1", "i2", "u2", "i4", "u4", "f4", "f8"}
_I4 = np.iinfo(np.int32)


def _typed_array(a: np.ndarray):
    code = a.dtype.kind + str(a.dtype.itemsize)
    if a.dtype.kind in "iu" and code not in _TYPED:  # int64/uint64: int32 when the values fit, else float64
        a = a.astype("<i4") if a.size == 0 or (a.min() >= _I4.min and a.max() <= _I4.max) else a.astype("<f8")
        code = a.dtype.kind + str(a.dtype.itemsize)
    if code not in _TYPED or a.ndim != 1:
        if a.dtype.kind == "M":
            return [t.isoformat() for t in pd.DatetimeIndex(a.ravel()).to_pydatetime()]  # as plotly writes them
        return a.tolist()
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    return {"dtype": code, "bdata": base64.b64encode(a.tobytes()).decode("ascii")}


def _enc_hook(obj):
    if isinstance(obj, np.ndarray):
        return _typed_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (_dt.datetime, _dt.date, _dt.time)):
        return obj.isoformat()
    if isinstance(obj, decimal.Decimal):
        return float(obj)
    raise NotImplementedError(type(obj))


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def figure_json(fig: go.Figure) -> str:
    """``fig`` as plotly JSON, numbers as base64 typed arrays: what ``plotly.io.to_json`` gives, ~10x faster.

    It encodes the figure's own validated storage directly (no deep copy of the figure); anything it
    does not know how to encode falls back to ``plotly.io.to_json``. The live panel redraws several times
    a second, where the deep copy was most of the cost (7k points: 5.5 ms -> 0.5 ms)."""
    data, layout = getattr(fig, "_data", None), getattr(fig, "_layout", None)
    if isinstance(data, list) and isinstance(layout, dict):
        try:
            traces = [{k: v for k, v in t.items() if k != "uid"} for t in data]  # plotly leaves uids out too
            return _ENCODER.encode({"data": traces, "layout": layout}).decode("utf-8")
        except (NotImplementedError, TypeError, ValueError, OverflowError):
            pass
    return pio.to_json(fig, validate=False)


class PlotlyLibrary(anywidget.AnyWidget):
    """plotly.js's source in a widget that is never displayed: the browser reads it once per page."""

    _esm = "export default {};"
    source = traitlets.Unicode("").tag(sync=True)
    version = traitlets.Unicode("").tag(sync=True)


_library: PlotlyLibrary | None = None
_library_lock = threading.Lock()


def plotly_library() -> PlotlyLibrary:
    """This kernel's PlotlyLibrary (made on first use; made again if it was closed)."""
    global _library
    with _library_lock:
        if _library is None or getattr(_library, "comm", None) is None:
            try:
                source = PLOTLY_JS.read_text(encoding="utf-8")
            except OSError as exc:
                from workbench.errors import WorkbenchError

                raise WorkbenchError(
                    f"plotly's JavaScript bundle is missing ({PLOTLY_JS}: {exc}); reinstall plotly "
                    "(pip install --force-reinstall plotly)") from exc
            _library = PlotlyLibrary(source=source, version=plotly.__version__)
        return _library


class FigureState(ipywidgets.Widget):
    """The figure a :class:`PlotWidget` shows, as a plain ipywidgets model (never displayed itself).

    A ``@jupyter-widgets/base`` ``WidgetModel``, not an anywidget: the browser applies every update the
    kernel sends it, in order, whatever happened to the PlotWidget's anywidget model (see the module's
    docstring)."""

    figure = traitlets.Unicode("{}").tag(sync=True)


class PlotWidget(anywidget.AnyWidget):
    """A plotly figure in a notebook, redrawn in the browser whenever :meth:`show` gives it a new one.

    ``classes``: CSS classes of the widget's box, set in its first message (see the module's docstring for
    why not ``add_class`` later)."""

    _esm = (_HERE / "plot_widget.js").read_text(encoding="utf-8")
    _css = ".wb-plot { width: 100%; min-width: 0; } .wb-plot-area { width: 100%; }"
    library = traitlets.Unicode("").tag(sync=True)
    figure_model = traitlets.Unicode("").tag(sync=True)  # the model id of the FigureState the views draw
    plotly_version = traitlets.Unicode(plotly.__version__).tag(sync=True)

    def __init__(self, fig: go.Figure | dict | None = None, *, classes=(), **kwargs):
        lib = plotly_library()
        if fig is None or not isinstance(fig, go.Figure):
            fig = go.Figure(fig)
        self.fig = fig
        self._relayout_callbacks: list[Callable[[dict], None]] = []
        # the figure goes in its state's first message, and the state's id and the classes in the widget's
        # own: the browser's first view draws it at once, and nothing here has to reach the anywidget model
        # after it opened
        self.figure_state = FigureState(figure=figure_json(fig))
        if classes:
            kwargs["_dom_classes"] = (*kwargs.get("_dom_classes", ()), *classes)
        super().__init__(library=lib.model_id, figure_model=self.figure_state.model_id, **kwargs)
        self.on_msg(self._on_browser_msg)

    @property
    def figure(self) -> str:
        """The figure the browser draws (plotly JSON, numbers as base64 typed arrays), held by
        :attr:`figure_state`."""
        return self.figure_state.figure

    @property
    def data(self):
        """The traces of the figure last shown (``self.fig.data``)."""
        return self.fig.data

    def show(self, fig: go.Figure | dict) -> None:
        """Draw ``fig`` (kept as ``self.fig``) in every view, one message to the browser."""
        if not isinstance(fig, go.Figure):
            fig = go.Figure(fig)
        self.fig = fig
        self.redraw()

    def redraw(self) -> None:
        """Send ``self.fig`` again, after it was changed in place (``fig.plotly_restyle`` and the like)."""
        self.figure_state.figure = figure_json(self.fig)

    def close(self) -> None:
        super().close()
        if getattr(self, "figure_state", None) is not None:  # None: the constructor raised before it
            self.figure_state.close()

    def on_relayout(self, callback: Callable[[dict], None]) -> None:
        """Call ``callback(relayout_data)`` after each zoom, pan or axis reset done in the browser
        (``{"xaxis.range[0]": a, "xaxis.range[1]": b}``, ``{"xaxis.autorange": True}``, ...)."""
        self._relayout_callbacks.append(callback)

    def browser_relayout(self, data: dict) -> None:
        """What happens when the browser reports a relayout: ``fig`` follows it (no redraw: the browser
        already shows it), then the callbacks run. Called by the widget's message handler; tests call it
        directly with what a zoom sends."""
        data = {k: v for k, v in dict(data).items() if isinstance(k, str) and not k.startswith("_")}
        if not data:
            return
        try:
            self.fig.plotly_relayout(data)
        except (ValueError, KeyError):
            pass  # a property the Python figure does not know (plotly.js internals); callbacks still run
        for cb in list(self._relayout_callbacks):
            cb(data)

    def _on_browser_msg(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("type") == "relayout" and isinstance(content.get("data"), dict):
            self.browser_relayout(content["data"])

    def __repr__(self) -> str:  # the text a notebook saves beside the widget: short, not the figure's JSON
        title = self.fig.layout.title.text if self.fig.layout.title else None
        return f"PlotWidget({title!r}, {len(self.fig.data)} traces)" if title else f"PlotWidget({len(self.fig.data)} traces)"

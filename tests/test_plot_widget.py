"""PlotWidget, the widget the panels draw plotly figures with (workbench/panels/_plot.py).

The browser side (plot_widget.js) is exercised by the browser tests; these check what the kernel sends."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

pytest.importorskip("anywidget")

from workbench import samples  # noqa: E402
from workbench.panels._plot import figure_json  # noqa: E402

_DTYPES = {"i1": "<i1", "u1": "<u1", "i2": "<i2", "u2": "<u2", "i4": "<i4", "u4": "<u4", "f4": "<f4", "f8": "<f8",
           "i8": "<i8", "u8": "<u8"}


def _plain(obj):
    """Typed arrays decoded to lists of floats, so two encodings of one figure compare as values."""
    if isinstance(obj, dict):
        if set(obj) >= {"dtype", "bdata"}:
            a = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=_DTYPES[obj["dtype"]]).astype(float)
            if "shape" in obj:
                a = a.reshape([int(n) for n in str(obj["shape"]).split(",")])
            return _plain(a.tolist())
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (int, float)):
        return None if obj != obj else float(obj)  # NaN as null, as JSON has it
    return obj


def _real_figures():
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.analysis.trace.tables import kernel_summary
    from workbench.figures.nvml import live_gpu_figure
    from workbench.figures.memory import memory_timeline_figure
    from workbench.figures.trace import kernel_summary_figure, timeline_figure
    from workbench.io.nvml import load_nvml_session
    from workbench.io.snapshot import load_snapshot
    from workbench.io.trace import load_trace

    tr = load_trace(samples.path("h200_train_step"))
    return {
        "trace timeline": lambda: timeline_figure(tr),
        "kernels": lambda: kernel_summary_figure(kernel_summary(tr)),
        "memory timeline": lambda: memory_timeline_figure(analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))),
        "live": lambda: live_gpu_figure(load_nvml_session(samples.path("h200_nvml_session"))),
    }


def test_figure_widget_state_is_the_whole_current_figure():
    """A view created at any time draws the synced ``figure`` trait, so it has to be the whole current figure
    after every update, in plotly JSON that plotly.js reads (numbers as typed arrays)."""
    import json

    import numpy as np
    import plotly.graph_objects as go

    from workbench.panels import PlotWidget

    fw = PlotWidget()
    assert json.loads(fw.figure)["data"] == [] and len(fw.data) == 0
    y = np.arange(5, dtype=np.float64)
    fw.show(go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout={"title": {"text": "t"}}))
    fw.show(go.Figure(go.Scatter(y=y), layout={"title": {"text": "second"}}))
    state = json.loads(fw.figure)
    assert [d["type"] for d in state["data"]] == ["scatter"] and state["layout"]["title"]["text"] == "second"
    typed = state["data"][0]["y"]
    assert typed["dtype"] == "f8"
    import base64
    assert np.frombuffer(base64.b64decode(typed["bdata"]), dtype="<f8").tolist() == y.tolist()
    assert [t.type for t in fw.data] == ["scatter"] and fw.fig.layout.title.text == "second"
    # in-place edits of fw.fig reach the browser on redraw()
    fw.fig.plotly_restyle({"y": [[9.0, 8.0]]}, trace_indexes=[0])
    fw.redraw()
    assert json.loads(fw.figure)["data"][0]["y"] == [9.0, 8.0]


def test_figure_widgets_share_one_plotly_library_made_again_after_close():
    """plotly.js travels once per kernel (a hidden PlotlyLibrary widget), not once per figure."""
    from workbench.panels import PlotWidget
    from workbench.panels._plot import PLOTLY_JS, PlotWidget, plotly_library

    a, b = PlotWidget(), PlotWidget()
    lib = plotly_library()
    assert a.library == b.library == lib.model_id
    assert lib.source.startswith(PLOTLY_JS.read_text(encoding="utf-8")[:200]) and len(lib.source) > 1_000_000
    assert len(PlotWidget._esm) < 10_000  # the figure's own module stays small
    lib.close()
    c = PlotWidget()
    assert c.library != a.library and c.library == plotly_library().model_id


def test_figure_json_says_what_plotly_to_json_says_for_odd_values():
    t = pd.date_range("2026-12-02", periods=3, freq="s")
    fig = go.Figure([
        go.Scatter(x=np.arange(3, dtype=np.int64), y=np.array([1.0, np.nan, 3.0])),
        go.Scatter(x=np.array([2**40, 1, 2], dtype=np.int64), y=np.array([1, 2, 3], dtype=np.uint8)),
        go.Bar(x=t, y=[np.float32(1.5), np.int64(2), 3], text=["a", None, "c"]),
        go.Scatter(x=np.array(["2026-12-02T00:00:01", "2026-12-02T00:00:02"], dtype="datetime64[ns]"), y=[dt.date(2026, 1, 1), 2]),
        go.Heatmap(z=np.arange(6.0).reshape(2, 3)),
    ], layout={"title": {"text": "odd"}, "xaxis": {"range": [np.float64(0.5), 2]}})
    assert _plain(json.loads(figure_json(fig))) == _plain(json.loads(pio.to_json(fig, validate=False)))


@pytest.mark.parametrize("name", ["trace timeline", "kernels", "memory timeline", "live"])
def test_figure_json_matches_plotly_on_the_panels_figures(name):
    fig = _real_figures()[name]()
    ours, plotly_s = json.loads(figure_json(fig)), json.loads(pio.to_json(fig, validate=False))
    assert _plain(ours) == _plain(plotly_s)
    assert any(isinstance(v, dict) and "bdata" in v for tr in ours["data"] for v in tr.values())  # arrays go binary


def _record_sends(widget) -> list[dict]:
    """The messages ``widget`` sends on its comm from now on."""
    sent = []
    widget.comm.send = lambda data=None, metadata=None, buffers=None, **_: sent.append(data)
    return sent


def test_after_its_first_message_nothing_goes_to_the_anywidget_model():
    """anywidget 0.11 drops every update to a model that missed its 2 s module-load watchdog (a busy page),
    while its views are still made from the model's first state: the tour's live panel stayed blank that way
    in a CI run. So the figure changes only in the FigureState model beside the PlotWidget, a plain ipywidgets
    model, and what the PlotWidget model itself says (the FigureState's id, the classes) is all in its first
    message (tests/browser/test_plot_widget_browser.py makes the watchdog fire in a real JupyterLab)."""
    import anywidget

    from workbench.panels._plot import FigureState, PlotWidget

    fw = PlotWidget(go.Figure(go.Scatter(y=np.array([1.0, 2.0]))), classes=["wb-x"])
    try:
        assert isinstance(fw.figure_state, FigureState)
        assert not isinstance(fw.figure_state, anywidget.AnyWidget)
        state = fw.figure_state.get_state()
        assert (state["_model_module"], state["_model_name"]) == ("@jupyter-widgets/base", "WidgetModel")
        assert fw.figure_model == fw.figure_state.model_id and "wb-x" in fw._dom_classes
        assert json.loads(fw.figure)["data"][0]["y"]["bdata"]  # the first figure: in the state's first message
        to_widget, to_state = _record_sends(fw), _record_sends(fw.figure_state)
        fw.show(go.Figure(go.Bar(x=["a"], y=[3])))
        fw.fig.plotly_restyle({"y": [[4]]}, trace_indexes=[0])
        fw.redraw()
        assert to_widget == []
        figures = [json.loads(m["state"]["figure"]) for m in to_state if m.get("method") == "update"]
        assert [f["data"][0]["type"] for f in figures] == ["bar", "bar"]
        assert figures[-1]["data"][0]["y"] == [4]
    finally:
        fw.close()
    assert fw.comm is None and fw.figure_state.comm is None  # closing the figure closes its state


def test_the_live_panel_and_the_perfetto_link_send_nothing_to_their_anywidget_models():
    from workbench.panels._perfetto import PerfettoLink
    from workbench.panels.nvml import LiveGpuPanel

    p = LiveGpuPanel("h200_nvml_session", speed=1000, autostart=False)
    try:
        assert "wb-live-figure" in p.figure._dom_classes
        to_widget, to_state = _record_sends(p.figure), _record_sends(p.figure.figure_state)
        deadline = time.monotonic() + 30
        while p.refresh() == 0:  # the replay (1000x) gives rows within milliseconds
            assert time.monotonic() < deadline, "the replay gave no rows"
            time.sleep(0.01)
        assert to_widget == [] and any("figure" in m.get("state", {}) for m in to_state)
    finally:
        p.close()

    link = PerfettoLink()
    try:
        to_widget, to_offer = _record_sends(link), _record_sends(link.offered)
        link.offer(b"{}", "w.json", "a window")
        assert to_widget == []
        assert (link.buffer, link.file_name, link.title) == (b"{}", "w.json", "a window")
        updates = [m for m in to_offer if m.get("method") == "update"]  # one message (hold_sync)
        assert [(sorted(m["state"]), m["buffer_paths"]) for m in updates] == [
            (["file_name", "title"], [["buffer"]])]  # the bytes go as a binary buffer
    finally:
        link.close()
    assert link.offered.comm is None

"""The browser's first message about a figure widget holds the figure.

plotly's FigureWidget opens its comm before it sets the state its browser view draws from, and the view
draws once, from the state it has when it renders. ``figure_widget`` opens the comm after; the message a
real ipywidgets comm would send is captured here at ``comm.create_comm``, where ipywidgets hands it over.
"""

from __future__ import annotations

import comm
import plotly.graph_objects as go
import pytest

from workbench.panels import figure_widget


@pytest.fixture
def opened(monkeypatch):
    sent = []
    real = comm.create_comm

    def capture(**kwargs):
        sent.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(comm, "create_comm", capture)
    return sent


def _fig():
    return go.Figure([go.Bar(x=["a", "b", "c"], y=[3, 1, 2], name="bars"), go.Scatter(y=[1, 2], name="line")],
                     layout={"title": {"text": "two traces"}})


def test_plotly_alone_opens_with_an_empty_figure(opened):
    # the cause of the blank figures: the open message of a plain FigureWidget has no traces in it
    go.FigureWidget(_fig())
    state = opened[-1]["data"]["state"]
    assert state["_widget_data"] == [] and state["_widget_layout"] == {}


def test_figure_widget_opens_with_its_traces_and_layout(opened):
    fw = figure_widget(_fig())
    assert len(opened) == 1  # one comm, opened once
    state = opened[0]["data"]["state"]
    assert [t["name"] for t in state["_widget_data"]] == ["bars", "line"]
    assert state["_widget_layout"]["title"]["text"] == "two traces"
    assert isinstance(fw, go.FigureWidget) and fw.comm is not None
    # later edits still reach the widget as usual
    fw.data[0].y = [9, 9, 9]
    assert list(fw.data[0].y) == [9, 9, 9]


def test_empty_figure_widget_still_opens(opened):
    fw = figure_widget()
    assert len(opened) == 1 and fw.comm is not None and len(fw.data) == 0

"""RanksPanel without a browser: what it shows comes from the analysis; controls redraw; bad sources raise
before any widget exists."""

from __future__ import annotations

import pytest


pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

import workbench  # noqa: E402
from workbench.analysis.trace.ranks import load_ranks, rank_frame  # noqa: E402
from workbench.errors import BadArgument, BadArtifact  # noqa: E402
from workbench.io import load_trace  # noqa: E402
from workbench.panels.ranks import RanksPanel  # noqa: E402
from workbench import samples  # noqa: E402

RANKS = samples.path("ranks_healthy").parent


@pytest.fixture(scope="module")
def panel():
    return RanksPanel(RANKS / "straggler", processes=1, cache=False)


def test_verdict_bars_and_tabs(panel):
    assert panel.last_error is None
    assert "straggler: rank 2" in panel.verdict.value and "truth.json" in panel.verdict.value
    fig = panel.time_fig.fig
    assert "rank 2 (straggler)" in fig.data[0].y
    exposed = next(t for t in fig.data if t.name == "exposed communication")
    steps = panel.view.ranks["steps"].to_numpy()
    assert list(exposed.x) == pytest.approx(list(panel.view.ranks["exposed_communication_us"] / steps / 1e3))
    assert [panel.tabs.get_title(i) for i in range(3)] == ["time per rank", "collectives", "timeline"]
    panel.tabs.selected_index = 1
    skew = next(t for t in panel.skew_fig.fig.data if t.name.startswith("start skew"))
    assert sorted(skew.y) == pytest.approx(sorted(panel.view.collectives["skew_us"] / 1e3))
    panel.tabs.selected_index = 2
    lanes = {y for t in panel.timeline_fig.fig.data for y in t.y if y}
    assert lanes == {f"rank {r}" for r in range(4)}
    panel.tabs.selected_index = 0


def test_sort_and_per_step_redraw(panel):
    panel.sort.value = "wait_us"
    order = list(panel.time_fig.fig.data[0].y)
    by_wait = panel.view.ranks.sort_values(["wait_us", "rank"], ascending=[False, True])["rank"].tolist()
    assert [int(y.split()[1]) for y in order] == by_wait and order[-1].startswith("rank 2")
    per_step = list(panel.time_fig.fig.data[0].x)
    panel.per_step.value = False
    total = list(panel.time_fig.fig.data[0].x)
    assert total == pytest.approx([x * 4 for x in per_step])  # 4 steps per rank
    panel.sort.value = "rank"
    panel.per_step.value = True


def test_other_sources_and_the_front_door():
    traces = [load_trace(p) for p in sorted((RANKS / "healthy").glob("rank*.json.gz"))]
    p = workbench.RanksPanel(traces)
    assert "no straggler" in p.verdict.value
    assert RanksPanel([rank_frame(t) for t in traces]).view.straggler is None
    v = load_ranks(RANKS / "straggler", processes=1, cache=False)
    assert RanksPanel(v).view is v
    with pytest.raises(BadArgument, match="RanksPanel takes"):
        RanksPanel(42)
    with pytest.raises(BadArtifact, match="no such file"):
        RanksPanel(RANKS / "missing", cache=False)

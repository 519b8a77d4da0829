"""Layout of the memory figures that share a plot with a second axis or a long legend (the real
shipped H200 snapshot): nothing sits on anything else."""

from __future__ import annotations

import pytest

from workbench import samples
from workbench.analysis.memory.segments import allocator_state_timeline
from workbench.analysis.memory.oom import analyze_snapshot
from workbench.figures._style import LEGEND_GAP_PX
from workbench.figures.memory import allocator_state_figure
from workbench.io.snapshot import load_snapshot


@pytest.fixture(scope="module")
def states():
    a = analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))
    return allocator_state_timeline(a.snap, a.allocs, points=20)


def test_allocator_state_legend_clears_the_fragmentation_axis(states):
    fig = allocator_state_figure(states)
    assert [t.name for t in fig.data] == ["reserved", "allocated", "free in reserved", "largest free block",
                                          "external fragmentation", "cached-unused share"]
    assert fig.data[-1].yaxis == "y2" and fig.data[-2].yaxis == "y2" and fig.layout.yaxis2.side == "right"
    # both fragmentation numbers are drawn, the 25% alarm line goes with the cached-unused share
    assert list(fig.data[-1].y) == pytest.approx(list(states["cached_unused_share"]))
    assert any(sh.y0 == 0.25 for sh in fig.layout.shapes)
    # the legend used to sit at x=1.02, on the right axis' ticks and title; now it is under the time axis
    leg = fig.layout.legend
    assert leg.orientation == "h" and leg.yanchor == "top"
    m = fig.layout.margin
    assert -leg.y * (fig.layout.height - m.t - m.b) == pytest.approx(LEGEND_GAP_PX)
    assert m.b >= LEGEND_GAP_PX + 2 * 22  # six entries, three a row
    assert fig.layout.yaxis2.tickformat == ".0%" and tuple(fig.layout.yaxis2.range) == (0, 1)
    assert fig.layout.yaxis.automargin and fig.layout.yaxis2.automargin


def test_peak_and_oom_labels_do_not_share_a_line():
    from workbench.figures.memory import memory_timeline_figure

    a = analyze_snapshot(load_snapshot(samples.path("h200_oom_snapshot")))
    fig = memory_timeline_figure(a)
    by_text = {an.text: an for an in fig.layout.annotations}
    peak = next(an for t, an in by_text.items() if t.startswith("peak "))
    oom = by_text["OOM"]
    assert oom.yshift in (None, 0) and peak.yshift == -16  # one line apart
    train = memory_timeline_figure(analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot"))))
    assert all(an.yshift in (None, 0) for an in train.layout.annotations)  # no OOM: the peak label stays up

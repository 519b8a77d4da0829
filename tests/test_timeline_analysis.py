"""analysis.timeline: what the timeline figures and the segment map show, checked against independent
computations on the shipped H200 recordings."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.memory import CATEGORIES, allocator_state
from workbench.analysis.memory_oom import analyze_snapshot
from workbench.analysis.timeline import allocation_groups, GroupSeries, event_range, segment_blocks, trace_window
from workbench.io import load_snapshot, load_trace


@pytest.fixture(scope="module")
def train():
    return analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))


def test_trace_window_keeps_the_longest_events_overlapping_the_window():
    tr = load_trace(samples.path("h200_train_step"))
    ev = tr.events[tr.events["cat"].astype(str) != "Trace"]
    lo = float(ev["ts_us"].quantile(0.4))
    hi = float(ev["ts_us"].quantile(0.6))
    end = ev["ts_us"] + ev["dur_us"].fillna(0)
    inside = ev[(end >= lo) & (ev["ts_us"] <= hi)]
    w = trace_window(tr, lo, hi, max_events=100)
    assert w.n_window == len(inside) > 100 and len(w.events) == 100
    assert w.events["dur_us"].min() >= inside["dur_us"].nlargest(100).min()
    assert w.origin_us == pytest.approx(tr.metadata.get("trace_start_us", ev["ts_us"].min()))
    assert len(trace_window(tr, max_events=10**9).events) == len(ev)


def test_group_series_is_the_bytes_live_per_category(train):
    codes, names = allocation_groups(train, "category", top=8)
    assert names == list(CATEGORIES)
    series = GroupSeries(train.allocs, codes, len(names), len(train.timeline))
    k = train.peak["index"]
    live = train.live_at(k)
    for g, name in enumerate(names):
        expected = int(live.loc[live["category"].astype(str) == name, "size_bytes"].sum())
        assert int(series.at(g, np.array([k]))[0]) == expected, name
    lo, hi = event_range(train.timeline)
    assert (lo, hi) == (0, len(train.timeline) - 1)


def test_segment_blocks_holes_are_the_free_memory_in_reserved(train):
    sb = segment_blocks(train, max_segments=10**6)
    state = allocator_state(train.snap, train.allocs)
    holes = sb.blocks[sb.blocks["free"]]
    assert int(holes["size_bytes"].sum()) == state.free_in_reserved_bytes
    assert int(holes["size_bytes"].max()) == state.largest_free_block_bytes
    used = sb.blocks[~sb.blocks["free"]]
    assert set(used["category"]) <= set(CATEGORIES) | {"unknown"} and (holes["category"] == "free").all()
    assert len(segment_blocks(train, max_segments=3).segments) == 3

"""analysis.timeline: what the timeline figures and the segment map show, checked against independent
computations on the shipped H200 recordings."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.memory.segments import allocator_state
from workbench.analysis.memory.allocations import CATEGORIES
from workbench.analysis.memory.oom import analyze_snapshot
from workbench.analysis.windows import allocation_groups, GroupSeries, event_range, segment_blocks, trace_window
from workbench.io import load_snapshot, load_trace


@pytest.fixture(scope="module")
def train():
    return analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))


def _window_events(tr, lo, hi):
    ev = tr.events[tr.events["cat"].astype(str) != "Trace"]
    end = ev["ts_us"] + ev["dur_us"].fillna(0)
    return ev[(end >= lo) & (ev["ts_us"] <= hi)]


def _columns(ev, lo, hi, bins):
    """(pid, tid, stream, cat, pixel column) of each event's start, computed here from the rows."""
    col = np.minimum(((ev["ts_us"].clip(lo, hi) - lo) / (hi - lo) * bins).astype(int), bins - 1)
    return set(zip(ev["pid"], ev["tid"], ev["stream"].fillna(-1).astype(int), ev["cat"].astype(str), col))


def test_trace_window_keeps_every_gpu_event_and_a_mark_per_pixel_of_each_host_lane():
    tr = load_trace(samples.path("h200_train_step"))
    ev = tr.events[tr.events["cat"].astype(str) != "Trace"]
    lo, hi = float(ev["ts_us"].min()), float((ev["ts_us"] + ev["dur_us"].fillna(0)).max())
    gpu = ev[ev["cat"].astype(str).isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    budget, bins = 5_000, 500
    w = trace_window(tr, max_events=budget, resolution=bins)
    assert w.n_window == len(ev) > budget and len(w.events) == budget and w.thinned
    # every kernel and copy is there (the longest-first cut kept a few hundred of 1,122 kernels)
    assert w.all_gpu and w.n_gpu == w.n_gpu_window == len(gpu)
    assert set(gpu.index) <= set(w.events.index)
    # every lane and category keeps an event in every pixel column where one starts
    host = ev.drop(gpu.index)
    shown_host = w.events.drop(gpu.index)
    assert _columns(shown_host, lo, hi, bins) == _columns(host, lo, hi, bins)
    # the budget left after that goes to the longest of the rest
    rest = host.drop(shown_host.index)
    assert rest["dur_us"].max() <= shown_host["dur_us"].nlargest(50).min()
    assert w.origin_us == pytest.approx(tr.metadata.get("trace_start_us", ev["ts_us"].min()))
    assert len(trace_window(tr, max_events=10**9).events) == len(ev)
    # a window that fits shows everything in it (zooming in brings the detail back)
    a, b = float(ev["ts_us"].quantile(0.5)), float(ev["ts_us"].quantile(0.52))
    z = trace_window(tr, a, b, max_events=budget)
    assert not z.thinned and len(z.events) == len(_window_events(tr, a, b))


def test_trace_window_thins_gpu_lanes_per_pixel_when_even_they_do_not_fit():
    tr = load_trace(samples.path("h200_train_step"))
    ev = tr.events[tr.events["cat"].astype(str) != "Trace"]
    lo, hi = float(ev["ts_us"].min()), float((ev["ts_us"] + ev["dur_us"].fillna(0)).max())
    gpu = ev[ev["cat"].astype(str).isin(["kernel", "gpu_memcpy", "gpu_memset"])]
    w = trace_window(tr, max_events=400, resolution=100)
    assert not w.all_gpu and w.n_gpu == len(w.events) == 400 and w.n_gpu_window == len(gpu)
    shown = w.events
    assert set(shown["cat"].astype(str)) <= {"kernel", "gpu_memcpy", "gpu_memset"}
    assert _columns(shown, lo, hi, 100) == _columns(gpu, lo, hi, 100)


def test_flow_pairs_join_launches_to_their_gpu_work():
    from workbench.analysis.windows import flow_pairs

    tr = load_trace(samples.path("h200_train_step"))
    ev = tr.events
    pairs = flow_pairs(ev)
    gpu = ev[ev["cat"].astype(str).isin(["kernel", "gpu_memcpy", "gpu_memset"]) & ev["correlation"].notna()]
    assert len(pairs) == len(gpu) > 1000
    launch = ev.loc[pairs["launch_index"]]
    kern = ev.loc[pairs["gpu_index"]]
    assert (launch["correlation"].to_numpy() == kern["correlation"].to_numpy()).all()
    assert set(launch["cat"].astype(str)) <= {"cuda_runtime", "cuda_driver"}
    assert (kern["ts_us"].to_numpy() >= launch["ts_us"].to_numpy()).all()  # GPU work starts after its launch


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

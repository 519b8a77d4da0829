"""workbench.figures.trace, tested through the figures' data on the shipped real traces."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.analysis import (
    gpu_busy,
    idle_gaps,
    kernel_summary,
    op_summary,
    step_summary,
    temporal_breakdown,
)
from workbench.figures._downsample import MAX_POINTS
from workbench.figures.trace import (
    breakdown_figure,
    idle_gap_figure,
    kernel_summary_figure,
    op_summary_figure,
    step_figure,
    timeline_figure,
)
from workbench.units import short_name
from workbench.io import load_trace
from testdata import DATA


@pytest.fixture(scope="module")
def h200():
    return load_trace(samples.path("h200_train_step"))


@pytest.fixture(scope="module")
def cpu_only():
    return load_trace(samples.path("cpu_only"))


def _annotations(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_kernel_figure_draws_the_tables_first_rows_in_order(h200):
    table = kernel_summary(h200)
    fig = kernel_summary_figure(table, top=5)
    assert len(fig.data) == 1
    bar = fig.data[0]
    assert bar.orientation == "h" and len(bar.y) == 5
    np.testing.assert_allclose(bar.x, table["total_us"].head(5) / 1e3)
    assert list(bar.customdata[:, 0]) == list(table["name"].head(5))  # full names in the hover
    assert bar.text[0] == f"{table['percent'].iloc[0]:.1f}%"
    assert fig.layout.xaxis.title.text == "total time (ms)"
    assert fig.layout.yaxis.autorange == "reversed"  # first row on top
    # order follows the table it is given (the panel sorts)
    by_count = table.sort_values("count", ascending=False).head(5)
    fig2 = kernel_summary_figure(by_count, top=5)
    np.testing.assert_allclose(fig2.data[0].x, by_count["total_us"] / 1e3)
    assert len(kernel_summary_figure(table, top=12).data[0].y) == 12


def test_kernel_labels_stay_distinct_when_short_names_collide():
    table = pd.DataFrame({
        "name": ["void k<float>(int)", "void k<double>(int)"], "count": [1, 2], "total_us": [5.0, 3.0],
        "mean_us": [5.0, 1.5], "min_us": [5.0, 1.0], "max_us": [5.0, 2.0], "percent": [62.5, 37.5],
    })
    fig = kernel_summary_figure(table)
    assert list(fig.data[0].y) == ["k<float>", "k<double>"]  # template arguments tell them apart
    same = table.assign(name=["void k<float>(int)", "void k<float>(long)"])
    assert list(kernel_summary_figure(same).data[0].y) == ["k<float>", "k<float> [2]"]


def test_colliding_real_kernel_names_keep_their_tile_shapes(h200):
    fig = kernel_summary_figure(kernel_summary(h200), top=15)
    labels = list(fig.data[0].y)
    cutlass = [lab for lab in labels if "Kernel2<cutlass_80_simt_sgemm_" in lab]
    assert len(cutlass) == 3 and len(set(cutlass)) == 3  # 128x256 nt, 256x128 nt, 256x128 nn
    assert not any(lab.endswith("]") for lab in labels)  # no "[2]" left: namespaces went, templates stayed
    assert all(len(lab) <= 64 for lab in labels)


def test_empty_kernel_table_says_so(cpu_only):
    fig = kernel_summary_figure(kernel_summary(cpu_only))
    assert len(fig.data) == 0
    assert "no GPU kernels in this trace" in _annotations(fig)


def test_op_figure_has_cpu_and_device_series(h200):
    table = op_summary(h200)
    fig = op_summary_figure(table, top=8)
    names = [t.name for t in fig.data]
    assert names == ["CPU self", "CPU total", "GPU (device) total"]
    for trace, col in zip(fig.data, ["cpu_self_us", "cpu_total_us", "device_total_us"]):
        assert len(trace.y) == 8
        np.testing.assert_allclose(trace.x, table[col].head(8) / 1e3)
    assert fig.layout.barmode == "group"
    assert fig.layout.xaxis.title.text == "time (ms)"


def test_op_figure_by_shape_puts_the_shape_in_the_label(h200):
    table = op_summary(h200, by_shape=True)
    fig = op_summary_figure(table, top=4)
    first = table.iloc[0]
    assert fig.data[0].y[0].endswith(str(first["input_shapes"]))
    assert len(set(fig.data[0].y)) == 4


def test_breakdown_figure_adds_up_to_the_window(h200):
    b = temporal_breakdown(h200)
    fig = breakdown_figure(b)
    assert [t.name for t in fig.data] == ["compute", "communication", "memcpy / memset", "idle"]
    total_ms = sum(float(t.x[0]) for t in fig.data)
    assert total_ms == pytest.approx(gpu_busy(h200).window_us / 1e3, rel=1e-6)
    shares = [float(t.customdata[0]) for t in fig.data]
    assert sum(shares) == pytest.approx(100.0)
    assert fig.data[0].x[0] == pytest.approx(b["compute_us"] / 1e3)
    assert fig.layout.barmode == "stack"


def test_breakdown_figure_one_bar_per_row_and_empty_when_nothing_to_break_down(h200, cpu_only):
    rows = pd.DataFrame([{"rank": 0, **temporal_breakdown(h200)}, {"rank": 1, **temporal_breakdown(h200)}])
    fig = breakdown_figure(rows)
    assert list(fig.data[0].y) == ["0", "1"]
    # the CPU-only sample has no kernels, but its gloo all-reduces are communication (host threads)
    cpu = temporal_breakdown(cpu_only)
    fig = breakdown_figure(cpu)
    comm = next(t for t in fig.data if t.name == "communication")
    assert comm.x[0] == pytest.approx(cpu["communication_us"] / 1e3) and cpu["communication_us"] > 0
    empty = breakdown_figure(temporal_breakdown(load_trace(DATA / "cupti" / "cupti_counters.trace.json.gz")))
    assert len(empty.data) == 0 and "no GPU activity to break down" in _annotations(empty)
    with pytest.raises(TypeError, match="breakdown_figure takes"):
        breakdown_figure([1, 2])


def test_step_figure_shows_step_time_and_gpu_busy(h200):
    steps = step_summary(h200)
    fig = step_figure(steps)
    assert [t.name for t in fig.data] == ["step time", "GPU busy"]
    assert list(fig.data[0].x) == [f"step {s}" for s in steps["step"]]
    np.testing.assert_allclose(fig.data[0].y, steps["dur_us"] / 1e3)
    np.testing.assert_allclose(fig.data[1].y, steps["gpu_busy_us"] / 1e3)
    assert fig.data[1].text[0] == f"{steps['gpu_idle_fraction'].iloc[0] * 100:.0f}% idle"
    assert fig.layout.yaxis.title.text == "time (ms)"
    assert "no ProfilerStep" in _annotations(step_figure(steps.iloc[0:0]))[0]


def test_idle_gap_histogram_counts_every_gap_once(h200):
    gaps = idle_gaps(h200)
    fig = idle_gap_figure(gaps)
    causes = sorted(gaps["cause"].unique())
    assert [t.name for t in fig.data] == causes
    assert sum(int(np.sum(t.y)) for t in fig.data) == len(gaps)
    for t in fig.data:
        sel = gaps[gaps["cause"] == t.name]
        assert int(np.sum(t.y)) == len(sel)
        assert float(np.sum(t.customdata)) == pytest.approx(sel["dur_us"].sum() / 1e3)
    # bins are half decades, labelled, in order; the longest gap falls in the last non-empty bin
    cats = list(fig.layout.xaxis.categoryarray)
    assert cats[0].endswith("µs") and fig.layout.xaxis.title.text == "gap length"
    last = max(i for t in fig.data for i, v in enumerate(t.y) if v)
    assert last == len(cats) - 1
    assert len(idle_gap_figure(gaps.iloc[0:0]).data) == 0


def test_timeline_lanes_and_all_events_when_small():
    raw = json.load(gzip.open(samples.path("a100_alexnet")))
    n_x = sum(1 for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace")
    tr = load_trace(samples.path("a100_alexnet"))
    fig = timeline_figure(tr)
    lanes = list(fig.layout.yaxis.ticktext)
    assert lanes[:1] == ["GPU 0 · stream 7"] and "GPU 0 · stream 20" in lanes
    assert any(lab.startswith("CPU ") and "python3.10" in lab for lab in lanes)
    n_drawn = sum(len(t.x) // 3 for t in fig.data)  # one segment (start, end, gap) per event
    assert n_drawn == n_x
    assert f"(all {n_x:,} events)" in fig.layout.title.text
    assert {t.type for t in fig.data} == {"scattergl"}
    assert {"kernel", "cpu_op", "cuda_runtime"} <= {t.name for t in fig.data}
    assert fig.layout.xaxis.title.text == "time since trace start (ms)"


def test_timeline_keeps_every_kernel_when_capped_and_draws_flows(h200):
    ev = h200.events[h200.events["cat"].astype(str) != "Trace"]
    n_gpu = int(ev["cat"].astype(str).isin(["kernel", "gpu_memcpy", "gpu_memset"]).sum())
    fig = timeline_figure(h200, max_events=5_000)
    seg = np.concatenate([np.asarray(t.x, dtype=float).reshape(-1, 3) for t in fig.data])
    assert len(seg) == 5_000
    kernels = next(t for t in fig.data if t.name == "kernel")
    assert len(kernels.x) // 3 == int((ev["cat"].astype(str) == "kernel").sum())  # not one left out
    assert (f"all {n_gpu:,} GPU events, {5_000 - n_gpu:,} of {len(ev) - n_gpu:,} host events; zoom in for more"
            in fig.layout.title.text)
    # flows: one arrow per launch -> GPU pair among the drawn events, from the launch's lane to the GPU lane
    with_flows = timeline_figure(h200, max_events=10**9, flows=True)
    arrows = next(t for t in with_flows.data if t.name.startswith("launch → GPU"))
    xy = np.column_stack([np.asarray(arrows.x, dtype=float), np.asarray(arrows.y, dtype=float)]).reshape(-1, 3, 2)
    gpu_corr = ev[ev["cat"].astype(str).isin(["kernel", "gpu_memcpy", "gpu_memset"])]["correlation"].dropna()
    assert len(xy) == min(len(gpu_corr), 5_000) and (xy[:, 1, 0] >= xy[:, 0, 0]).all()
    lanes = list(with_flows.layout.yaxis.ticktext)
    assert {lanes[int(round(y))].split(" ·")[0] for y in xy[:, 1, 1]} == {"GPU 0"}
    assert {lanes[int(round(y))].split(" ")[0] for y in xy[:, 0, 1]} == {"CPU"}


def test_timeline_window_and_point_budget(h200):
    steps = step_summary(h200)
    a = float(steps["start_us"].iloc[1])
    b = a + float(steps["dur_us"].iloc[1])
    fig = timeline_figure(h200, start_us=a, end_us=b, max_events=10**9)
    origin = h200.metadata["trace_start_us"]
    seg = np.concatenate([np.asarray(t.x, dtype=float).reshape(-1, 3) for t in fig.data])
    # every drawn event overlaps the window
    assert (seg[:, 0] <= (b - origin) / 1e3 + 1e-9).all() and (seg[:, 1] >= (a - origin) / 1e3 - 1e-9).all()
    ev = h200.events
    end = ev["ts_us"] + ev["dur_us"]
    expected = int(((ev["ts_us"] <= b) & (end >= a) & (ev["cat"].astype(str) != "Trace")).sum())
    assert len(seg) == min(expected, MAX_POINTS // 2)
    # a big request is held to the figures' point budget
    big = load_trace(samples.path("v100_nccl_rank0"))
    figb = timeline_figure(big, max_events=10**9)
    points = sum(int(np.isfinite(np.asarray(t.x, dtype=float)).sum()) for t in figb.data)
    assert points <= MAX_POINTS
    assert "zoom in for more" in figb.layout.title.text
    empty = timeline_figure(h200, start_us=0, end_us=1)
    assert "no events in this window" in _annotations(empty)


def test_short_name():
    assert short_name("void at::native::vectorized_layer_norm_kernel<float, float, false>(int, float)") == (
        "at::native::vectorized_layer_norm_kernel")
    assert short_name("aten::addmm") == "aten::addmm"
    assert short_name("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float>(long)") == (
        "at::native::GammaBetaBackwardCUDAKernelTemplate")
    long = "x" * 200
    assert len(short_name(long, 40)) == 40 and short_name(long, 40).endswith("…")


def _plot_height(fig) -> float:
    m = fig.layout.margin
    return fig.layout.height - m.t - m.b


def test_legends_sit_below_the_x_axis_title_at_every_height(h200):
    from workbench.figures._style import LEGEND_GAP_PX

    steps = step_summary(h200)
    a = float(steps["start_us"].iloc[-1])
    figs = [
        timeline_figure(h200, start_us=a, end_us=a + float(steps["dur_us"].iloc[-1])),
        timeline_figure(load_trace(samples.path("cpu_only"))),
        op_summary_figure(op_summary(h200), top=3),
        breakdown_figure(temporal_breakdown(h200)),
        step_figure(steps),
        idle_gap_figure(idle_gaps(h200)),
    ]
    for fig in figs:
        leg = fig.layout.legend
        assert leg.orientation == "h" and leg.yanchor == "top"
        # the legend's top edge is at least LEGEND_GAP_PX under the plot area (tick labels + title)...
        assert -leg.y * _plot_height(fig) == pytest.approx(LEGEND_GAP_PX)
        # ...and the bottom margin holds it, so nothing is pushed onto the axis title
        assert fig.layout.margin.b >= LEGEND_GAP_PX + 22
    # the stacked breakdown bar reads compute, communication, copies, idle: its legend too
    bd = figs[3]
    assert bd.layout.legend.traceorder == "normal" and [t.name for t in bd.data][0] == "compute"


def test_step_timeline_x_axis_spans_the_step_not_the_trace(h200):
    steps = step_summary(h200)
    a = float(steps["start_us"].iloc[-1])
    b = a + float(steps["dur_us"].iloc[-1])
    origin = h200.metadata["trace_start_us"]
    fig = timeline_figure(h200, start_us=a, end_us=b)
    lo, hi = fig.layout.xaxis.range
    assert lo == pytest.approx((a - origin) / 1e3) and hi == pytest.approx((b - origin) / 1e3)
    assert lo > 50  # the last of three ~30 ms steps: not 0
    # some drawn events start before the step (a long Python frame): the range, not the data, decides
    seg = np.concatenate([np.asarray(t.x, dtype=float).reshape(-1, 3) for t in fig.data])
    assert seg[:, 0].min() < lo
    assert timeline_figure(h200).layout.xaxis.range is None  # whole trace: autorange


def test_evidence_reads_as_numbers_with_units(h200):
    from workbench.analysis import findings
    from workbench.figures.text import evidence_html, evidence_items, format_value

    by_id = {f.id: f for f in findings(h200)}
    items = dict(evidence_items(by_id["profiler_overhead"].evidence))
    ev = by_id["profiler_overhead"].evidence
    assert items["profiled window"].endswith(" ms") and ev["detail"] == "full"
    assert any(k.startswith("estimated unprofiled step") and v.endswith(" ms") for k, v in items.items()), items
    for f in by_id.values():
        text = evidence_html(f.evidence)
        assert "[" not in text and "{" not in text and "e+0" not in text and "_us" not in text
    fp32 = evidence_html(by_id["fp32_matmul"].evidence)
    assert fp32.count("<li>") == len(by_id["fp32_matmul"].evidence["top_kernels"])
    assert "sgemm_128x256" in fp32  # the tile shape survives, the full name is on hover
    # a dict of records (memcpy by kind) becomes a table with units
    table = evidence_html({"by_kind": {"HtoD": {"count": 3, "total_us": 1500.0, "bytes": 3 * 2**20,
                                                "gb_per_s": 2.1}}})
    assert "<table" in table and "1.5 ms" in table and "3 MiB" in table and "2.1 GB/s" in table
    assert format_value("dur_us", 812.0) == "812 µs" and format_value("x_fraction", 0.5) == "50.0%"
    assert format_value("window_us", 2.5e6) == "2.5 s" and format_value("kernels_per_ms", 12.63) == "12.6 per ms"
    assert evidence_html({}) == ""


def test_timeline_categories_each_have_their_own_colour(h200):
    fig = timeline_figure(h200)
    colours = {t.name: t.line.color for t in fig.data}
    assert len(set(colours.values())) == len(colours), colours

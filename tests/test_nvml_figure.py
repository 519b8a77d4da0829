"""The live figure, tested through its data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.figures.nvml import LIVE_SERIES, live_gpu_figure
from workbench.io.nvml import load_nvml_session


@pytest.fixture(scope="module")
def h200():
    return load_nvml_session(samples.path("h200_nvml_session"))


def test_stacked_rows_one_line_per_gpu_and_quantity(h200):
    fig = live_gpu_figure(h200)
    assert len(fig.data) == len(LIVE_SERIES)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["utilization (%)", "memory used (GiB)", "power (W)", "temperature (C) / SM clock (MHz)"]
    by_col = {t.meta["column"]: t for t in fig.data}
    np.testing.assert_array_equal(by_col["util_gpu_pct"].y, h200.util_gpu_pct.to_numpy())
    np.testing.assert_allclose(by_col["mem_used_bytes"].y, h200.mem_used_bytes.to_numpy() / 2**30)
    np.testing.assert_allclose(by_col["power_w"].y, h200.power_w.to_numpy())
    assert by_col["util_gpu_pct"].yaxis == "y" and by_col["power_w"].yaxis == "y3"
    assert by_col["sm_clock_mhz"].yaxis != by_col["temp_c"].yaxis  # clocks on the secondary axis


def test_window_keeps_only_the_last_seconds(h200):
    fig = live_gpu_figure(h200, window_s=5.0)
    x = np.asarray(fig.data[0].x)
    t_end = h200.t_s.max()
    assert x.min() >= t_end - 5.0 and x.max() == t_end
    assert len(x) == int((h200.t_s >= t_end - 5.0).sum())
    assert tuple(fig.layout.xaxis.range) == pytest.approx((t_end - 5.0, t_end))


def test_marks_are_lines_with_labels(h200):
    fig = live_gpu_figure(h200, marks=[{"t_s": 5.0, "label": "epoch 1"}, (12.0, "bf16")])
    assert [s.x0 for s in fig.layout.shapes] == [5.0, 12.0]
    labels = [a.text for a in fig.layout.annotations]
    assert "epoch 1" in labels and "bf16" in labels


def test_two_gpus_and_gpu_choice(h200):
    two = pd.concat([h200, h200.assign(gpu=1, power_w=h200.power_w + 1)])
    fig = live_gpu_figure(two)
    assert len(fig.data) == 2 * len(LIVE_SERIES)
    assert {t.meta["gpu"] for t in fig.data} == {0, 1}
    assert fig.data[0].line.color != fig.data[len(LIVE_SERIES)].line.color
    only1 = live_gpu_figure(two, gpus=[1])
    power = [t for t in only1.data if t.meta["column"] == "power_w"][0]
    np.testing.assert_allclose(power.y, h200.power_w.to_numpy() + 1)


def test_points_are_capped_and_peaks_kept():
    n = 100_000
    t = np.arange(n) * 0.01
    util = np.zeros(n)
    util[54_321] = 100.0
    f = pd.DataFrame({"t_s": t, "gpu": 0, "util_gpu_pct": util})
    fig = live_gpu_figure(f, max_points=1_000)
    y = np.asarray(fig.data[0].y)
    assert len(y) <= 1_000 and y.max() == 100.0


def test_empty_frame_gives_empty_axes():
    f = load_nvml_session(samples.path("h200_nvml_session")).iloc[0:0]
    fig = live_gpu_figure(f, gpus=[0])
    assert len(fig.data) == len(LIVE_SERIES) and all(len(t.x) == 0 for t in fig.data)


def test_one_gpu_quantities_have_distinct_colours(h200):
    fig = live_gpu_figure(h200)
    colours = [t.line.color for t in fig.data]
    assert len(set(colours)) == len(LIVE_SERIES)  # every quantity its own colour
    by_row = {}
    for t, (_col, row, *_rest) in zip(fig.data, LIVE_SERIES):
        by_row.setdefault(row, []).append((t.line.color, t.line.dash))
    for row, lines in by_row.items():  # lines sharing a row differ in colour and in dash
        assert len({c for c, _ in lines}) == len(lines) and len({d for _, d in lines}) == len(lines)


def test_several_gpus_keep_one_colour_in_every_row_and_a_grouped_legend(h200):
    three = pd.concat([h200.assign(gpu=g) for g in range(3)])
    fig = live_gpu_figure(three)
    per_gpu = {}
    for t in fig.data:
        per_gpu.setdefault(t.meta["gpu"], set()).add(t.line.color)
        assert t.legendgroup == f"gpu{t.meta['gpu']}" and t.legendgrouptitle.text == f"GPU {t.meta['gpu']}"
    assert all(len(c) == 1 for c in per_gpu.values())  # same colour in every subplot
    assert len(set.union(*per_gpu.values())) == 3  # and a different one per GPU
    for gpu in per_gpu:  # quantities of one GPU sharing a row differ by dash
        lines = [t for t in fig.data if t.meta["gpu"] == gpu]
        rows = {}
        for t in lines:
            rows.setdefault(t.yaxis, []).append(t.line.dash)
        assert all(len(set(d)) == len(d) for d in rows.values())


def test_legend_has_its_own_margin_beside_the_clock_axis(h200):
    fig = live_gpu_figure(h200)
    leg = fig.layout.legend
    assert leg.xref == "container" and leg.x == 1.0 and leg.xanchor == "right"
    assert fig.layout.margin.r >= 60 + 140  # secondary-axis ticks + "MHz" + the legend's width

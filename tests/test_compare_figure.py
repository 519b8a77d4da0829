"""Layout of the experiment figure: side-by-side subplots whose axis labels stay on their own plot."""

from __future__ import annotations

import pandas as pd

from workbench.figures.compare import experiment_figure


def test_subplots_carry_units_in_their_titles_not_on_the_neighbours_bars():
    table = pd.DataFrame({
        "configuration": ["batch 32", "16 x 2 accumulated", "4 x 8 accumulated"],
        "is_baseline": [True, False, False],
        "step_ms_median": [46.9, 51.1, 70.4],
        "peak_allocated_bytes": [0.020 * 2**30, 0.012 * 2**30, 0.005 * 2**30],
        "samples_per_s": [682.9, 626.8, 454.6],
    })
    fig = experiment_figure(table)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:3] == ["step time (ms)", "peak memory (GiB)", "throughput (samples/s)"]
    # a y-axis title of the 2nd/3rd subplot was drawn inside the gap, over the previous subplot's bars
    for ax in (fig.layout.yaxis, fig.layout.yaxis2, fig.layout.yaxis3):
        assert ax.title.text is None and ax.automargin
    x1, x2 = fig.layout.xaxis.domain, fig.layout.xaxis2.domain
    assert x2[0] - x1[1] >= 0.1 - 1e-9  # room for the tick labels of the next subplot


def test_ratio_labels_sit_above_the_error_bars_inside_the_axis():
    table = pd.DataFrame({
        "configuration": ["fp32", "int8 per-tensor", "int8 per-channel"], "is_baseline": [True, False, False],
        "step_ms_median": [2.19, 1.88, 3.98], "step_ms_q1": [2.15, 1.79, 2.18], "step_ms_q3": [2.30, 4.41, 6.55],
        "samples_per_s": [29257.1, 34078.4, 16100.0],
    })
    fig = experiment_figure(table)
    bars = fig.data[0]
    assert bars.textposition == "none" and list(bars.text) == ["×1.00", "×0.86", "×1.82"]
    labels = [a for a in fig.layout.annotations if a.text.startswith("×") and a.yref == "y"]
    assert [a.text for a in labels] == ["×1.00", "×0.86", "×1.82"]
    # each label starts at the top of its error bar (q3), not at the bar's top where the error bar runs
    assert [a.y for a in labels] == [2.30, 4.41, 6.55] and all(a.yanchor == "bottom" for a in labels)
    assert fig.layout.yaxis.range[1] >= 6.55 * 1.1  # and the axis leaves room for it


def test_kernel_delta_labels_keep_template_arguments_when_short_names_collide():
    from workbench.figures.compare import kernel_delta_figure

    k = pd.DataFrame({
        "name": ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<int> >(int)",
                 "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int)"],
        "delta_us": [-4.0, 0.0], "base_total_us": [12.0, 415.0], "test_total_us": [8.0, 415.0],
        "status": ["both", "both"],
    })
    labels = list(kernel_delta_figure(k).data[0].y)
    assert len(set(labels)) == 2 and not any("#" in lab for lab in labels)
    assert any("CUDAFunctor_add" in lab for lab in labels) and any("FillFunctor" in lab for lab in labels)


def test_kernel_delta_labels_show_what_differs_when_long_names_share_a_prefix():
    from workbench.figures.compare import kernel_delta_figure

    stem = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<{}>, " \
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<{}>, at::detail::Array<char*, 3>)"
    k = pd.DataFrame({"name": [stem.format("int", "int"), stem.format("float", "float")],
                      "delta_us": [-4.0, 0.0], "base_total_us": [12.0, 5.0], "test_total_us": [8.0, 5.0],
                      "status": ["both", "both"]})
    labels = list(kernel_delta_figure(k).data[0].y)
    assert not any(lab.endswith("]") for lab in labels)
    assert any("int>" in lab for lab in labels) and any("float>" in lab for lab in labels)
    assert all("vectorized_elementwise_kernel<…" in lab and len(lab) <= 50 for lab in labels)

"""ProfilerPanel without a browser: build it from the shipped H200 trace (and from a live CPU step),
change the controls' values, and check that the figures and tables changed."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from workbench import samples
from workbench.analysis import gpu_busy, kernel_summary, op_summary, step_summary
from workbench.io import load_trace
from workbench.panels._base import PanelBase, table_html
from workbench.panels.profiler import ALL_STEPS, ProfilerPanel

ipywidgets = pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def trace():
    return load_trace(samples.path("h200_train_step"))


@pytest.fixture
def panel(trace):
    return ProfilerPanel(trace)


def _select(panel, tab):
    keys = ["kernels", "ops", "breakdown", "timeline", "steps", "gaps"]
    panel.tabs.selected_index = keys.index(tab)
    assert panel.tab == tab


def test_builds_from_a_path_and_shows_header_findings_and_kernels(trace):
    p = ProfilerPanel(samples.path("h200_train_step"))
    assert isinstance(p, ipywidgets.VBox) and isinstance(p, PanelBase) and p.widget is p
    assert p.last_error is None
    assert "NVIDIA H200" in p.status.value and "1,122 kernels" in p.status.value
    assert "profiler_overhead" in p.findings.value and "fp32_matmul" in p.findings.value
    assert "input_bound" not in p.findings.value
    # the diagnosis comes first, and each what-if finding says what its fix saves
    assert p.findings.value.index("wb-diagnosis") < p.findings.value.index("profiler_overhead")
    assert "What if fixed:" in p.findings.value
    assert [label for label, _ in p.step.options] == [ALL_STEPS, "ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    # default tab: kernels, top 15 by total time; table and figure show the same rows
    assert p.tab == "kernels" and p.sort.value == "total_us" and p.top_n.value == 15
    expected = kernel_summary(trace).head(15)
    shown = p.table_frames["kernels"]
    assert list(shown["name"]) == list(expected["name"])
    np.testing.assert_allclose(p.figures["kernels"].data[0].x, expected["total_us"] / 1e3)
    assert "<table" in p.tables["kernels"].value and "sm80_xmma_gemm" in p.tables["kernels"].value


def test_top_n_sort_and_filter_update_table_and_figure(panel):
    fig = panel.figures["kernels"]
    before = list(fig.data[0].y)
    panel.top_n.value = 5
    assert len(fig.data[0].y) == 5 and len(panel.table_frames["kernels"]) == 5
    assert list(fig.data[0].y) == before[:5]

    panel.sort.value = "count"
    counts = panel.table_frames["kernels"]["count"].to_numpy()
    assert (np.diff(counts) <= 0).all()
    assert list(fig.data[0].y) != before[:5]
    np.testing.assert_allclose(fig.data[0].x, panel.table_frames["kernels"]["total_us"] / 1e3)

    panel.name_filter.value = "GEMM"  # case-insensitive substring
    names = panel.table_frames["kernels"]["name"]
    assert len(names) > 0 and names.str.lower().str.contains("gemm").all()
    assert len(fig.data[0].y) == len(names)

    panel.name_filter.value = "no-kernel-has-this-name"
    assert panel.table_frames["kernels"].empty and len(fig.data) == 0
    assert panel.last_error is None


def test_step_selection_scopes_tables_and_header(panel, trace):
    steps = step_summary(trace)
    all_total = panel.table_frames["kernels"]["total_us"].sum()
    panel.step.value = 3
    assert "ProfilerStep#3" in panel.status.value
    row = steps[steps["step"] == 3].iloc[0]
    assert f"{int(row['kernel_count']):,} kernels" in panel.status.value
    step_total = panel.table_frames["kernels"]["total_us"].sum()
    assert 0.2 * all_total < step_total < 0.5 * all_total  # one of three similar steps
    panel.step.value = ALL_STEPS
    assert panel.table_frames["kernels"]["total_us"].sum() == pytest.approx(all_total)
    assert "all steps" in panel.status.value


def test_every_tab_draws_and_gets_its_own_sort_choices(panel, trace):
    _select(panel, "ops")
    assert panel.sort.value == "device_total_us"
    assert [t.name for t in panel.figures["ops"].data] == ["CPU self", "CPU total", "GPU (device) total"]
    panel.sort.value = "cpu_self_us"
    self_us = panel.table_frames["ops"]["cpu_self_us"].to_numpy()
    assert (np.diff(self_us) <= 0).all()
    panel.by_shape.value = True
    assert "input_shapes" in panel.table_frames["ops"].columns
    assert len(panel.table_frames["ops"]) == panel.top_n.value
    assert panel.table_frames["ops"]["cpu_self_us"].iloc[0] == pytest.approx(
        op_summary(trace, by_shape=True)["cpu_self_us"].max())

    _select(panel, "breakdown")
    assert [t.name for t in panel.figures["breakdown"].data][0] == "compute"
    assert set(panel.table_frames["breakdown"].columns) >= {"compute_us", "idle_us"}

    _select(panel, "timeline")
    lanes = list(panel.figures["timeline"].fig.layout.yaxis.ticktext)
    assert lanes[0] == "GPU 0 · stream 7" and any(lab.startswith("CPU 418") for lab in lanes)

    _select(panel, "steps")
    assert list(panel.figures["steps"].data[0].x) == ["step 2", "step 3", "step 4"]
    assert list(panel.table_frames["steps"]["step"]) == [2, 3, 4]

    _select(panel, "gaps")
    assert panel.sort.value == "dur_us"
    gaps = panel.table_frames["gaps"]
    assert len(gaps) == panel.top_n.value and (np.diff(gaps["dur_us"].to_numpy()) <= 0).all()
    assert {t.name for t in panel.figures["gaps"].data} == {"host", "launch"}
    panel.name_filter.value = "launch"  # the filter applies to the gap cause here
    assert set(panel.table_frames["gaps"]["cause"]) == {"launch"}
    assert [t.name for t in panel.figures["gaps"].data] == ["launch"]
    assert panel.last_error is None


def test_timeline_zoom_redraws_the_window_and_filter_applies(panel):
    _select(panel, "timeline")
    fw = panel.figures["timeline"]
    full_title = fw.fig.layout.title.text
    assert "GPU events" in full_title and "zoom in for more" in full_title
    fw.browser_relayout({"xaxis.range[0]": 10.0, "xaxis.range[1]": 10.5})  # what a zoom in the browser sends
    zoomed = fw.fig.layout.title.text
    assert zoomed != full_title and "(all " in zoomed and "zoom in" not in zoomed
    assert tuple(fw.fig.layout.xaxis.range) == (10.0, 10.5)
    fw.browser_relayout({"xaxis.autorange": True})  # double-click: back to everything
    assert fw.fig.layout.title.text == full_title
    panel.name_filter.value = "aten::mm"
    names = {t.name for t in fw.data}
    assert names == {"cpu_op"}
    panel.step.value = 2
    assert fw.fig.layout.title.text != full_title and panel.last_error is None


def test_flows_and_open_in_perfetto_write_the_window_on_screen(tmp_path, trace):
    import json
    import shutil

    from workbench.analysis.windows import trace_window

    src = tmp_path / "run.pt.trace.json.gz"
    shutil.copy(samples.path("h200_train_step"), src)
    p = ProfilerPanel(src)
    _select(p, "timeline")
    fw = p.figures["timeline"]
    assert not any(t.name.startswith("launch → GPU") for t in fw.data)
    p.flows.value = True
    assert any(t.name.startswith("launch → GPU") for t in fw.data) and p.last_error is None
    fw.browser_relayout({"xaxis.range[0]": 10.0, "xaxis.range[1]": 12.5})
    p.perfetto_button.click()
    assert p.last_error is None
    out = tmp_path / "run.10.0-12.5ms.perfetto.json"
    assert out.is_file() and "wrote " in p.perfetto_note.value and p.perfetto.file_name == out.name
    assert (os.stat(out).st_mode & 0o777) == (0o666 & ~_umask())
    assert p.perfetto.buffer == out.read_bytes()
    # the file holds every event of the window on screen (not thinned), and Kineto's flow pairs
    origin = trace.metadata["trace_start_us"]
    want = trace_window(trace, origin + 10_000, origin + 12_500, max_events=10**9).events
    doc = json.loads(out.read_bytes())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["name"], e["ts"]) for e in xs) == sorted(zip(want["name"].astype(str), want["ts_us"]))
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert set(starts) == set(ends) and len(starts) > 5 and all(e["bp"] == "e" for e in ends.values())
    assert all(ends[i]["ts"] >= starts[i]["ts"] for i in starts)
    # ... and our own loader reads it back (what Perfetto's JSON importer reads: a Chrome trace)
    back = load_trace(out)
    assert len(back.events) == len(want) and back.metadata["thread_names"]


def test_open_in_perfetto_never_writes_into_the_package(trace):
    from pathlib import Path

    import workbench

    p = ProfilerPanel(samples.path("h200_streams_serial"))
    out = p.open_in_perfetto()
    package = Path(workbench.__file__).resolve().parent
    assert out.is_file() and not out.resolve().is_relative_to(package)
    assert not list(Path(samples.path("h200_streams_serial")).parent.glob("*.perfetto.json"))
    out.unlink()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_controls_carry_descriptions_and_css_classes(panel):
    for w, cls, desc in [(panel.sort, "wb-profiler-sort", "Sort by"), (panel.top_n, "wb-profiler-topn", "Top N"),
                         (panel.name_filter, "wb-profiler-filter", "Filter"), (panel.step, "wb-profiler-step", "Step")]:
        assert cls in w._dom_classes and w.description == desc
    assert "wb-profiler" in panel._dom_classes and "wb-profiler-tabs" in panel.tabs._dom_classes
    assert "wb-errors" in panel.errors._dom_classes and "wb-profiler-findings" in panel.findings._dom_classes
    assert list(panel.tabs.titles) == ["Kernels", "Operators", "Breakdown", "Timeline", "Steps", "Idle gaps", "Roofline"]


def test_bad_file_shows_an_error_instead_of_raising(tmp_path):
    data = gzip.open(samples.path("h200_train_step")).read()
    bad = tmp_path / "truncated.trace.json.gz"
    with gzip.open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    p = ProfilerPanel(bad)
    assert p.trace is None and p.last_error and "truncated.trace.json.gz" in p.last_error
    assert p.errors.outputs and p.errors.outputs[0]["name"] == "stderr"
    assert p.top_n.disabled and p.step.disabled
    with pytest.raises(Exception, match="truncated.trace.json.gz"):
        ProfilerPanel(bad, raise_errors=True)
    # a missing file raises at once (no panel with dead controls), naming the file and what the panel takes
    from workbench.errors import BadArtifact

    with pytest.raises(BadArtifact, match=r"nope\.json: no such file\. ProfilerPanel takes a Kineto trace"):
        ProfilerPanel(tmp_path / "nope.json")


def test_a_missing_path_string_raises_one_clear_error():
    # it used to say "'str' object has no attribute 'events'"
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError) as err:
        ProfilerPanel("missing.json.gz")
    assert str(err.value) == ("missing.json.gz: no such file. ProfilerPanel takes a Kineto trace (.json / .json.gz), "
                              "a loaded Trace or a ProfileResult from profile_steps")


@pytest.mark.parametrize("sample, kind, fits", [
    ("h200_train_snapshot", "a CUDA allocator snapshot", "MemoryPanel(path) or `workbench memory`"),
    ("h200_nvml_session", "an NVML session", "LiveGpuPanel(path)"),
    ("h200_memory_timeline", "a torch.profiler memory timeline", "--profiler-timeline"),
])
def test_another_kind_of_artifact_names_the_panel_that_fits(sample, kind, fits):
    from workbench.errors import WorkbenchError

    from ipywidgets.widgets.widget import _instances

    before = set(_instances)
    with pytest.raises(WorkbenchError) as err:
        ProfilerPanel(str(samples.path(sample)))
    msg = str(err.value)
    assert msg.startswith(f"{samples.path(sample)}: is {kind}") and "not what ProfilerPanel shows" in msg
    assert fits in msg and "\n" not in msg
    assert set(_instances) == before  # recognised before any widget was built: nothing dead left behind


def test_a_failing_callback_goes_to_the_error_area(panel):
    panel.trace = panel.analysis = None  # break the panel's state on purpose: the next refresh fails
    panel._cache.clear()
    panel.top_n.value = 3
    assert panel.last_error and "Error" in panel.last_error
    assert panel.errors.outputs[0]["output_type"] == "stream"


def test_table_html_escapes_and_cuts():
    import pandas as pd

    import base64
    import io
    import re

    df = pd.DataFrame({"name": ["<b>x</b>", "y" * 200], "total_us": [1234.5, 2.0], "count": [3, 4],
                       "gpu_idle_fraction": [0.25, 0.5]})
    html = table_html(df)
    assert "&lt;b&gt;" in html and "…" in html and f"title='{'y' * 200}'" in html
    # readable headers with units, values converted: µs shown as ms, fractions as %
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", html)
    assert heads == ["name", "total (ms)", "count", "GPU idle (%)"]
    assert ">1.234</td>" in html and ">0.002</td>" in html and ">25.0</td>" in html
    assert "white-space:nowrap" in html  # long demangled names stay on one line (cut, full name on hover)
    # a CSV of the stored rows (µs, fractions) to download
    href = re.search(r"class='wb-csv' download='table.csv' href='data:text/csv;charset=utf-8;base64,([^']+)'", html)
    back = pd.read_csv(io.StringIO(base64.b64decode(href.group(1)).decode()))
    assert list(back.columns) == list(df.columns) and back["total_us"].tolist() == [1234.5, 2.0]
    assert "wb-csv" not in table_html(df, csv=None)
    raw = table_html(df, readable=False)
    assert re.findall(r"<th[^>]*>([^<]*)</th>", raw)[1] == "total_us" and "1,234.5" in raw
    assert "(no rows)" in table_html(pd.DataFrame())


torch = pytest.importorskip("torch")


def _tiny_step(fail_on=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    calls = [0]

    def step():
        calls[0] += 1
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if calls[0] == fail_on:
            raise RuntimeError("step exploded")

    return step


def test_from_step_profiles_a_live_cpu_step(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    p = ProfilerPanel.from_step(_tiny_step(), steps=2, detail="standard", out_dir=tmp_path, verbose=False)
    assert p.last_error is None and p.result is not None and p.result.path.is_file()
    assert [label for label, _ in p.step.options] == [ALL_STEPS, "ProfilerStep#2", "ProfilerStep#3"]
    assert "cpu_only" in p.findings.value
    assert p.tab == "ops"  # a CPU trace opens on the op table
    assert "aten::addmm" in set(p.table_frames["ops"]["name"])
    _select(p, "kernels")
    assert len(p.figures["kernels"].data) == 0  # and the kernel tab says there are none
    assert "no GPU kernels" in p.figures["kernels"].fig.layout.annotations[0].text
    _select(p, "ops")
    assert "aten::addmm" in set(p.table_frames["ops"]["name"])


def test_from_step_shows_the_error_and_the_partial_trace(tmp_path):
    # calls: 1 outside the profiler, 2..4 timed without it, 5 wait, 6 warmup, 7 and 8 active -> fails in
    # the second active step
    p = ProfilerPanel.from_step(_tiny_step(fail_on=8), steps=3, out_dir=tmp_path, verbose=False)
    assert p.last_error and "step exploded" in p.last_error and "partial trace" in p.last_error
    assert p.trace is not None and p.result is not None and not p.result.complete
    assert "ProfilerStep#2" in [label for label, _ in p.step.options]


def test_tables_show_times_relative_to_the_trace_or_step_in_ms(panel, trace):
    import re

    _select(panel, "gaps")
    html_all = panel.tables["gaps"].value
    assert "start (ms since trace start)" in html_all and "length (µs)" in html_all
    assert not re.search(r"\d{1,3}(,\d{3}){3,}", html_all)  # no absolute clock values (5,341,304,...)
    window_ms = gpu_busy(trace).window_us / 1e3
    starts = [float(v.replace(",", "")) for v in re.findall(r"<td[^>]*>([\d,]+\.\d{3})</td>", html_all)]
    assert len(starts) == panel.top_n.value and all(0 <= v <= window_ms + 1 for v in starts)
    panel.step.value = 4
    assert "start (ms since step start)" in panel.tables["gaps"].value
    steps = [float(v.replace(",", "")) for v in
             re.findall(r"<td[^>]*>([\d,]+\.\d{3})</td>", panel.tables["gaps"].value)]
    assert steps and all(0 <= v <= 40 for v in steps)  # one ~30 ms step
    _select(panel, "steps")
    assert "start (ms since trace start)" in panel.tables["steps"].value
    assert "GPU idle (%)" in panel.tables["steps"].value
    assert list(panel.table_frames["steps"]["step"]) == [2, 3, 4]  # the analysis rows stay as they were


def test_step_timeline_starts_at_the_step_and_findings_read_as_text(panel, trace):
    panel.step.value = 4
    _select(panel, "timeline")
    lo, hi = panel.figures["timeline"].fig.layout.xaxis.range
    steps = step_summary(trace)
    row = steps[steps["step"] == 4].iloc[0]
    origin = trace.metadata["trace_start_us"]
    assert lo == pytest.approx((row["start_us"] - origin) / 1e3, abs=0.5)
    assert hi >= (row["start_us"] + row["dur_us"] - origin) / 1e3  # and the GPU work it launched
    text = panel.findings.value
    evidence = "".join(text.split("wb-evidence")[1:])  # the evidence blocks (messages hold code)
    assert evidence and "_us" not in evidence and "['" not in evidence and "e+0" not in evidence
    assert "profiled window <b>" in evidence and " ms" in evidence and "%" in evidence


def test_a_profile_result_from_profile_steps_is_shown_directly(tmp_path):
    # `res = profile_steps(step); ProfilerPanel(res)` used to raise AttributeError on an empty chart
    from workbench import profile_steps

    res = profile_steps(_tiny_step(), steps=2, detail="light", out_dir=tmp_path, verbose=False)
    p = ProfilerPanel(res)
    assert p.last_error is None and p.result is res and p.trace is not None
    assert str(p.trace.path) == str(res.path)
    assert [label for label, _ in p.step.options] == [ALL_STEPS, "ProfilerStep#2", "ProfilerStep#3"]
    assert p.tab == "ops" and "aten::addmm" in set(p.table_frames["ops"]["name"])
    # the same file by path and the result give the same op table
    q = ProfilerPanel(str(res.path))
    assert list(q.table_frames["ops"]["name"]) == list(p.table_frames["ops"]["name"])

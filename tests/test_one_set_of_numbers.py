"""Issue 32: one definition of step, GPU busy, idle and communication, the same numbers in every front.

For several real traces (multi-stream ones among them) the median step, GPU busy, idle and communication a
step are identical in ``workbench trace --json`` (and its text), ``workbench diff --json`` (each side),
the ranks view, the timeline analysis, the diagnosis, ProfilerPanel's header and the HTML report, all read
from :func:`workbench.analysis.trace.tables.step_numbers` (docs/definitions.md). And no what-if predicts a
step below GPU busy.
"""

from __future__ import annotations

import html
import json

import pytest
from testdata import DATA

from workbench import samples
from workbench.analysis.timeline import align, timeline_summary
from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.analysis.trace.ranks import load_ranks, ranks_summary
from workbench.analysis.trace.tables import per_step_text, step_numbers
from workbench.cli import main
from workbench.io.trace import load_trace

KEYS = ("steps", "step_ms", "gpu_busy_ms", "idle_ms", "communication_ms")
TRACES = {
    # two CUDA streams: copies on a side stream overlapping compute (streams summed gave 15.88 ms a step
    # of busy against an 11.85 ms step)
    "streams_overlap": samples.path("h200_streams_overlap"),
    # five streams, NCCL kernels on their own streams (communication)
    "multi_rank0": DATA / "multi_rank" / "sampled_rank-0.json.gz",
    # the MI250 sample whose host what-if said '-> 0.00 ms (saves 99%)'
    "mi250": samples.path("mi250_rocm"),
    # GPU-bound, host running ahead (the ProfilerStep host spans are a sixth of the step)
    "gpu_bound": DATA / "h200_pairs" / "gpu_bound_bf16" / "mlp.light.trace.json.gz",
    # a sampled trace whose steps last ~57 ms past their host span (trace and diff used to disagree)
    "trace_compare": DATA / "trace_compare" / "base.json.gz",
    "v100": samples.path("v100_nccl_rank0"),
}


def _json(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _sel(d: dict) -> dict:
    return {k: d[k] for k in KEYS}


@pytest.fixture(scope="module")
def truth():
    return {name: step_numbers(load_trace(p)).as_dict() for name, p in TRACES.items()}


@pytest.mark.parametrize("name", list(TRACES))
def test_trace_json_text_and_diagnosis_read_one_set_of_numbers(name, truth, capsys):
    want = truth[name]
    doc = _json(capsys, "trace", str(TRACES[name]), "--json")
    assert _sel(doc["per_step"]) == _sel(want)
    d = doc["diagnosis"]
    assert d["step_ms"] == want["step_ms"] and d["gpu_busy_ms"] == want["gpu_busy_ms"]
    # the step table's step times are the ones whose median it is
    if want["delimited"]:
        import numpy as np

        assert float(np.median([s["step_us"] for s in doc["steps"]])) / 1e3 == want["step_ms"]
    assert main(["trace", str(TRACES[name])]) == 0
    text = capsys.readouterr().out
    assert per_step_text(want) in text
    assert f"GPU busy {want['gpu_busy_ms']:,.2f} ms a step" in text  # the diagnosis' headline


@pytest.mark.parametrize("name", list(TRACES))
def test_no_what_if_predicts_a_step_below_gpu_busy(name, truth):
    a = TraceAnalysis(TRACES[name])
    busy = truth[name]["gpu_busy_ms"]
    for w in a.diagnosis.what_ifs:
        if w.cause.startswith("memcpy"):
            continue  # removing copies leaves the kernels: its floor is the kernels' union
        assert w.step_ms_if_fixed >= busy - 1e-9 or w.step_ms_if_fixed >= w.step_ms - 1e-9, (w.cause, w)


def test_the_mi250_host_what_if_is_not_a_zero_step(truth):
    d = TraceAnalysis(TRACES["mi250"]).diagnosis
    host = d.what_if("host")
    assert host.step_ms_if_fixed >= truth["mi250"]["gpu_busy_ms"] > 0.0
    assert host.evidence["clamped_at_gpu_busy_ms"] == pytest.approx(truth["mi250"]["gpu_busy_ms"], abs=1e-4)


@pytest.mark.parametrize("pair", [("trace_compare", "streams_overlap"), ("multi_rank0", "v100"),
                                  ("gpu_bound", "mi250")])
def test_diff_each_side_is_the_trace_numbers(pair, truth, capsys):
    b, t = pair
    doc = _json(capsys, "diff", str(TRACES[b]), str(TRACES[t]), "--json")
    assert _sel(doc["base"]["per_step"]) == _sel(truth[b])
    assert _sel(doc["test"]["per_step"]) == _sel(truth[t])
    for side, name in (("base", b), ("test", t)):
        median = doc["steps"][f"{side}_median_us"]
        if truth[name]["delimited"]:
            assert median / 1e3 == truth[name]["step_ms"]
            assert doc[side]["diagnosis"]["step_ms"] == truth[name]["step_ms"]
        else:
            assert median is None
    steps = [c for c in doc["changes"] if c["key"] == "step"]
    if truth[b]["delimited"] and truth[t]["delimited"]:
        assert steps[0]["base_us"] / 1e3 == truth[b]["step_ms"]
        assert steps[0]["test_us"] / 1e3 == truth[t]["step_ms"]


@pytest.mark.parametrize("name", ["multi_rank0", "streams_overlap", "v100"])
def test_ranks_view_reads_the_same_numbers(name, truth):
    v = load_ranks([str(TRACES[name])], processes=1, cache=False)
    row = ranks_summary(v)["ranks"][0]
    assert row["step_ms"] == truth[name]["step_ms"]
    assert row["gpu_busy_ms"] == truth[name]["gpu_busy_ms"]
    assert row["idle_ms"] == truth[name]["idle_ms"]
    assert row["communication_ms"] == truth[name]["communication_ms"]


def test_ranks_of_one_job_read_the_same_numbers_as_trace():
    paths = [DATA / "multi_rank" / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    v = load_ranks([str(p) for p in paths], processes=1, cache=False)
    rows = {r["file"]: r for r in ranks_summary(v)["ranks"]}
    for p in paths:
        want = step_numbers(load_trace(p)).as_dict()
        got = rows[p.name]
        assert (got["step_ms"], got["gpu_busy_ms"], got["idle_ms"], got["communication_ms"]) == (
            want["step_ms"], want["gpu_busy_ms"], want["idle_ms"], want["communication_ms"])


@pytest.mark.parametrize("name", list(TRACES))
def test_timeline_reads_the_same_numbers(name, truth):
    doc = timeline_summary(align(trace=load_trace(TRACES[name])))
    assert doc["per_step"] == truth[name]


@pytest.mark.parametrize("name", ["streams_overlap", "multi_rank0", "mi250"])
def test_html_report_and_profiler_panel_header_say_the_same(name, truth, tmp_path):
    from workbench.report import trace_report

    out = trace_report(load_trace(TRACES[name]), tmp_path / "r.html")
    page = out.read_text() if hasattr(out, "read_text") else (tmp_path / "r.html").read_text()
    assert html.escape(per_step_text(truth[name])) in page
    pytest.importorskip("ipywidgets")
    from workbench.panels.profiler import ProfilerPanel

    p = ProfilerPanel(TRACES[name])
    assert p.last_error is None
    assert html.escape(per_step_text(truth[name])) in p.status.value

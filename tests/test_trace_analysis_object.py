"""TraceAnalysis: every trace front (the CLI's text and --json, the HTML report, ProfilerPanel, trace_diff and
`workbench diff`) reads one analysis per trace, so the step model's graph is built and the trace diagnosed
exactly once per trace; and what the fronts show is the same (the JSON equals trace_summary, the panel's
findings equal the CLI's).

The counting wraps the real functions (``workbench.analysis.trace.diagnosis.diagnose`` and
``workbench.analysis.trace.step_model.build_graph``, looked up through their modules by every caller): nothing is
mocked, the wrapper calls through and counts."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from testdata import data_path

from workbench import samples
from workbench.analysis import TraceAnalysis, trace_diff, trace_summary
from workbench.analysis.trace import diagnosis as diagnosis_module
from workbench.analysis.trace import step_model
from workbench.cli import main
from workbench.errors import BadArgument
from workbench.io import load_trace

H200 = samples.path("h200_train_step")  # kernels, steps, shapes: diagnosis, roofline and precision what-ifs
BASE = data_path("trace_compare", "base.json.gz")
TEST = data_path("trace_compare", "test.json.gz")


def _key(trace) -> str:
    return os.path.basename(str(getattr(trace, "path", "") or "events"))


@pytest.fixture
def calls(monkeypatch):
    """Counter of ``("diagnose" | "build_graph", trace file name)`` over the real functions."""
    counts: Counter = Counter()
    real_diagnose, real_graph = diagnosis_module.diagnose, step_model.build_graph

    def diagnose(trace, *args, **kwargs):
        counts["diagnose", _key(trace)] += 1
        return real_diagnose(trace, *args, **kwargs)

    def build_graph(trace, *args, **kwargs):
        counts["build_graph", _key(trace)] += 1
        return real_graph(trace, *args, **kwargs)

    monkeypatch.setattr(diagnosis_module, "diagnose", diagnose)
    monkeypatch.setattr(step_model, "build_graph", build_graph)
    return counts


def _once(calls: Counter, *names: str) -> None:
    want = Counter({(what, n): 1 for n in names for what in ("diagnose", "build_graph")})
    assert calls == want


def test_the_cli_text_diagnoses_once(calls, capsys):
    assert main(["trace", str(H200)]) == 0
    assert "profiler_overhead" in capsys.readouterr().out
    _once(calls, H200.name)


def test_the_cli_json_diagnoses_once_and_is_the_analysis_summary(calls, capsys):
    assert main(["trace", str(H200), "--json", "--top", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _once(calls, H200.name)
    assert doc == json.loads(json.dumps(TraceAnalysis(load_trace(H200)).summary(4)))


def test_the_cli_html_report_diagnoses_once(calls, capsys, tmp_path):
    out = tmp_path / "r.html"
    assert main(["trace", str(H200), "--json", "--html", str(out)]) == 0
    assert out.stat().st_size > 0 and json.loads(capsys.readouterr().out)["findings"]
    _once(calls, H200.name)  # text/JSON and the report's findings and roofline section: one analysis


def test_the_html_report_of_a_trace_diagnoses_once(calls, tmp_path):
    from workbench.report import trace_report

    trace_report(load_trace(H200), tmp_path / "r.html", top=5)
    _once(calls, H200.name)


def test_the_panel_diagnoses_once_and_shows_the_clis_findings(calls, capsys):
    from workbench.panels.profiler import TABS, ProfilerPanel

    panel = ProfilerPanel(str(H200))
    assert "NVIDIA H200" in panel.status.value  # the header
    shown = panel.findings.value  # the findings cards
    panel.tabs.selected_index = [k for k, _ in TABS].index("roofline")
    assert panel.last_error is None and "Roofline" in panel.tables["roofline"].value
    _once(calls, H200.name)

    assert main(["trace", str(H200), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["findings"]
    mine = json.loads(json.dumps([f.as_dict() for f in panel.analysis.findings]))
    assert [f["id"] for f in mine] == [f["id"] for f in cli] == ["profiler_overhead", "fp32_matmul"]
    assert [f.get("what_if") for f in mine] == [f.get("what_if") for f in cli]
    assert mine == cli
    assert all(f["id"] in shown for f in cli)  # the cards the panel shows are these findings


def test_the_panel_takes_a_trace_analysis_and_reads_it(calls):
    from workbench.panels.profiler import ProfilerPanel

    a = TraceAnalysis(load_trace(H200))
    a.findings  # noqa: B018 -- analysed before the panel: the panel must not analyse again
    _once(calls, H200.name)
    panel = ProfilerPanel(a)
    panel.tabs.selected_index = 6
    assert panel.analysis is a and panel.trace is a.trace and panel.last_error is None
    _once(calls, H200.name)


def test_trace_diff_diagnoses_each_side_once(calls):
    d = trace_diff(load_trace(BASE), load_trace(TEST))
    d.findings_change  # noqa: B018
    _once(calls, BASE.name, TEST.name)
    assert d.base_summary == d.base_analysis.summary() and d.test_summary == trace_summary(load_trace(TEST))


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_the_diff_cli_diagnoses_each_side_once(calls, capsys, tmp_path, extra):
    assert main(["diff", str(BASE), str(TEST), "--html", str(tmp_path / "d.html"), *extra]) == 0
    assert capsys.readouterr().out
    _once(calls, BASE.name, TEST.name)


def test_trace_diff_takes_analyses():
    b, t = TraceAnalysis(load_trace(BASE)), TraceAnalysis(load_trace(TEST))
    d = trace_diff(b, t)
    assert d.base_analysis is b and d.test_analysis is t and d.base is b.trace
    assert d.base_summary is b.summary()
    assert d.findings_change == trace_diff(load_trace(BASE), load_trace(TEST)).findings_change


def test_summary_is_trace_summary_and_computed_once():
    t = load_trace(H200)
    a = TraceAnalysis(t)
    assert a.summary() == trace_summary(t)
    assert trace_summary(a, top=3) is a.summary(3)  # trace_summary of an analysis reads it
    assert a.findings is a.findings and a.diagnosis is a.diagnosis and a.roofline is a.roofline
    with pytest.raises(BadArgument, match="TraceAnalysis"):
        trace_summary(a, step_ms=3.0)
    assert TraceAnalysis(H200).summary(3)["top_kernels"] == a.summary(3)["top_kernels"]  # a path is loaded


def test_the_roofline_is_on_the_analysis_diagnosis(calls):
    from workbench.analysis.trace.roofline import roofline

    a = TraceAnalysis(load_trace(H200))
    assert a.roofline.step["step_ms_trace"] == a.diagnosis.step_ms
    _once(calls, H200.name)
    roofline(a.trace, diagnosis=None)  # None is an answer (a trace without a diagnosis), not "diagnose again"
    _once(calls, H200.name)

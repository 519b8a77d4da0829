"""Issue 32, part 2: CPU-only steps get a diagnosis, checked against CPU fix pairs recorded on this kind of
machine (tests/data/cpu_pairs, benchmarks/record_cpu_pairs.py): DataLoader workers 0 -> 2 and the step
without the profiler, each predicted within 25%."""

from __future__ import annotations

import json

import pytest
from testdata import DATA

from workbench import samples
from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.cli import main

PAIRS = DATA / "cpu_pairs"
TOLERANCE = 0.25


def _truth() -> dict:
    return json.loads((PAIRS / "truth.json").read_text())["variants"]


@pytest.fixture(scope="module")
def workers0():
    return TraceAnalysis(PAIRS / "workers0.light.trace.json.gz")


def test_the_input_what_if_predicts_more_workers(workers0):
    d = workers0.diagnosis
    assert d is not None and d.bound == "input"
    w = d.what_if("input")
    truth = _truth()
    n = truth["workers2"]["num_workers"]
    predicted = w.evidence["step_ms_with_workers"][str(n)]
    measured = truth["workers2"]["unprofiled_step_ms_median"]
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)
    # and the step it starts from is the unprofiled one
    assert w.step_ms == d.step_ms_unprofiled


def test_the_profiler_what_if_predicts_the_unprofiled_step(workers0):
    d = workers0.diagnosis
    w = d.what_if("profiler")
    measured = _truth()["workers0"]["unprofiled_step_ms_median"]
    assert not w.measured and "estimated" in w.change
    assert abs(w.step_ms_if_fixed - measured) <= TOLERANCE * measured, (w.step_ms_if_fixed, measured)
    assert w.step_ms == workers0.numbers.step_ms  # the trace's median step, as every front shows it


def test_cpu_findings_name_the_dataloader_and_sort_ops_by_cpu_time(workers0, capsys):
    ids = [f.id for f in workers0.findings]
    assert ids[0] == "input_bound" and "cpu_only" in ids
    f = workers0.findings[0]
    assert "num_workers=0" in f.message and "DataLoader(num_workers=" in f.message
    ops = workers0.ops
    assert list(ops["cpu_self_us"]) == sorted(ops["cpu_self_us"], reverse=True)
    assert ops["name"].iloc[0].startswith("enumerate(DataLoader)#_SingleProcessDataLoaderIter")
    assert main(["trace", str(PAIRS / "workers0.light.trace.json.gz"), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "top ops (by CPU self time)" in text
    assert "enumerate(DataLoader)#_SingleProcessDataLoa" in text  # was cut to 'enumerate'
    assert "input-bound" in text and "no GPU activity" in text


def test_waiting_for_workers_is_said_as_such():
    a = TraceAnalysis(PAIRS / "workers2.light.trace.json.gz")
    w = a.diagnosis.what_if("input")
    assert w.evidence["loader"] == "workers" and w.evidence["workers"] is None
    assert "DataLoader workers" in a.findings[0].message


def test_the_gloo_sample_is_communication_bound():
    a = TraceAnalysis(samples.path("cpu_only"))
    d = a.diagnosis
    assert d.bound == "communication" and d.gpu_busy_ms == 0.0
    assert d.critical_path_ms["communication"] == pytest.approx(a.numbers.communication_ms, rel=1e-6)

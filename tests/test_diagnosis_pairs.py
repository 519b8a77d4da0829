"""The diagnosis' what-if predictions against fixes timed on the H200 without the profiler.

Each pair in tests/data/h200_pairs/pairs.json is one step recorded before a fix (a Kineto trace) and the
same step before and after the fix timed with CUDA events, unprofiled (benchmarks/record_diagnosis_h200.py,
truth.json of each case). The measured saving is ``1 - after / before`` of those medians; the predicted
one is the ``saved_fraction`` of the cause's what-if on the trace. For the profiler's own cost the
"before" is the trace's own step and the "after" the unprofiled median.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.analysis import diagnose
from workbench.analysis.trace_findings import findings as trace_findings
from workbench.io.trace import load_trace

DATA = Path(__file__).resolve().parent / "data" / "h200_pairs"
PAIRS = json.loads((DATA / "pairs.json").read_text())["pairs"]
TOLERANCE = 0.25  # relative error of the predicted saving allowed by the issue


def _truth(case: str) -> dict:
    return json.loads((DATA / case / "truth.json").read_text())


def _measured_ms(case: str, variant: str) -> float:
    return float(_truth(case)["measured"][variant]["median_ms"])


_DIAG: dict = {}


def _diagnosis(case: str, trace: str):
    key = (case, trace)
    if key not in _DIAG:
        t = load_trace(DATA / case / trace)
        _DIAG[key] = (t, diagnose(t))
    return _DIAG[key]


def _pair_id(p: dict) -> str:
    return f"{p['case']}:{p['trace'].split('.')[0]}:{p['cause']}"


def prediction(p: dict) -> tuple[float, float, bool]:
    """(predicted saving, measured saving, whether the prediction came from a measurement in the trace)."""
    _, d = _diagnosis(p["case"], p["trace"])
    w = d.what_if(p["cause"])
    assert w is not None, f"no what-if for {p['cause']}"
    if p["cause"] == "profiler":
        before, after = d.step_ms, _measured_ms(p["case"], p["after"])
    else:
        before, after = _measured_ms(p["case"], p["before"]), _measured_ms(p["case"], p["after"])
    return w.saved_fraction, 1.0 - after / before, w.measured


FIX_PAIRS = [p for p in PAIRS if p["cause"] != "profiler"]
PROFILER_PAIRS = [p for p in PAIRS if p["cause"] == "profiler"]


def test_the_recorded_pairs_cover_every_fix_the_issue_names():
    causes = {p["cause"] for p in PAIRS}
    assert {"input", "sync", "launch", "memcpy_pinned", "memcpy", "profiler"} <= causes
    # a case where removing the sync matters (36-48%) and one where it hardly does (<= 10%)
    sync = [prediction(p)[1] for p in FIX_PAIRS if p["cause"] == "sync"]
    assert max(sync) > 0.3 and min(sync) < 0.12


@pytest.mark.parametrize("pair", FIX_PAIRS, ids=_pair_id)
def test_predicted_saving_of_each_fix_is_within_25_percent_of_the_measured_one(pair):
    pred, meas, _ = prediction(pair)
    assert meas > 0.05, "a pair whose fix saves nothing cannot check a prediction"
    assert abs(pred - meas) <= TOLERANCE * meas, f"predicted {pred:.3f}, measured {meas:.3f}"


@pytest.mark.parametrize("pair", PROFILER_PAIRS, ids=_pair_id)
def test_the_profiler_cost_is_named_first_when_it_dominates(pair):
    """Without a measurement in the trace the profiler's cost is an estimate per recorded event (its
    per-pair error is in benchmarks/RESULTS.md); the diagnosis must still put it first and call it an
    estimate, and the estimated unprofiled step must be the right size (within 50%: the per-event
    cost varies between workloads 1.9-7.4 us on this host)."""
    t, d = _diagnosis(pair["case"], pair["trace"])
    pred, meas, measured = prediction(pair)
    assert not measured and "estimated" in d.what_if("profiler").change
    if meas >= 0.10:
        assert pred >= 0.10
        findings = trace_findings(t)
        assert findings[0].id == "profiler_overhead"
    truth_ms = _measured_ms(pair["case"], pair["after"])
    assert abs(d.step_ms_unprofiled - truth_ms) <= 0.5 * truth_ms


def test_the_profiler_estimate_is_within_25_percent_on_most_pairs():
    errors = []
    for p in PROFILER_PAIRS:
        pred, meas, _ = prediction(p)
        errors.append(abs(pred - meas) / meas)
    within = sum(e <= TOLERANCE for e in errors)
    # honest bound of the per-event estimate (6 of the 9 recorded pairs): recorded with
    # workbench.capture.profiler.profile_steps the trace carries the measured cost instead
    assert within >= 6, sorted(round(e, 2) for e in errors)


def test_only_the_data_loading_pair_reads_input_bound():
    for p in PAIRS:
        _, d = _diagnosis(p["case"], p["trace"])
        if p["case"] == "loader" and p["trace"].startswith("workers0"):
            assert d.bound == "input"
        else:
            assert d.bound != "input", _pair_id(p)


def test_the_sync_that_does_not_matter_is_not_the_bound():
    """3 ms host + 1.2 ms GPU with .item(): the host limits either way; removing the sync saves ~27%, not
    the ~half of the window the idle gaps suggest, and with 0.3 ms GPU it saves <10%."""
    _, d = _diagnosis("sync", "h3_g0.3_item.light.trace.json.gz")
    assert d.what_if("sync").saved_fraction < 0.12
    _, d = _diagnosis("sync", "h5.9_g6.5_item.light.trace.json.gz")
    assert d.bound == "sync"

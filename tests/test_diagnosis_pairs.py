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
from workbench.analysis.trace.analysis import findings as trace_findings
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
    # traces written by profile_steps carry the measured unprofiled step; the others get the estimate
    assert measured == (pair["case"] == "stamped")
    assert ("estimated" in d.what_if("profiler").change) == (not measured)
    if meas >= 0.10:
        assert pred >= 0.10
        findings = trace_findings(t)
        assert findings[0].id == "profiler_overhead"
    truth_ms = _measured_ms(pair["case"], pair["after"])
    # the model's own unprofiled step (its replay): the diagnosis reports it as a ratio on the trace's
    # median step (the one step definition, tests/test_one_set_of_numbers.py), which on these noisy
    # profiled steps differs from the replayed step by a few percent either way
    model_unprofiled = d.step_ms_unprofiled * d.step_ms_model / d.step_ms
    assert abs(model_unprofiled - truth_ms) <= 0.5 * truth_ms


def test_the_profiler_estimate_is_within_25_percent_on_most_pairs():
    errors = {}
    for p in PROFILER_PAIRS:
        pred, meas, measured = prediction(p)
        if not measured:
            errors[_pair_id(p) + p["trace"]] = abs(pred - meas) / meas
    within = sum(e <= TOLERANCE for e in errors.values())
    # honest bound of the per-event estimate (8 of the 11 recorded traces): misses are a torch.compile'd
    # MLP (7.4 us per event), 600 tiny kernels (1.9 us) and an fp32 transformer at standard detail
    assert len(errors) == 11 and within >= 8, {k: round(v, 2) for k, v in errors.items()}
    # the CNN was recorded after the per-event costs were set: a held-out check
    held_out = [v for k, v in errors.items() if k.startswith("heldout_cnn")]
    assert len(held_out) == 2 and max(held_out) <= TOLERANCE


def test_a_capture_that_measured_the_unprofiled_step_predicts_it():
    """profile_steps times min(steps, 3) calls without the profiler and writes the median into the trace;
    the diagnosis then uses it (and fits the per-event cost to it), within 25% of the CUDA-event truth at
    every detail level (wall time with a device synchronise vs CUDA events: 15.7-15.8 vs 15.40 ms)."""
    stamped = [p for p in PROFILER_PAIRS if p["case"] == "stamped"]
    assert {p["trace"].split(".")[1] for p in stamped} == {"light", "standard", "full"}
    for p in stamped:
        pred, meas, measured = prediction(p)
        assert measured and abs(pred - meas) <= TOLERANCE * meas, (p["trace"], pred, meas)
        t, d = _diagnosis(p["case"], p["trace"])
        assert t.metadata["workbench_synchronized_steps"] is True
        assert d.bound == "profiler"
        # the capture's own end-of-step synchronise is not offered as a sync to remove
        w = d.what_if("sync")
        assert w is None or w.saved_fraction < 0.03


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


def test_no_finding_fires_on_a_gpu_bound_bf16_step():
    """Four 8192-wide bf16 GEMM layers + fused AdamW: 22.55 ms a step unprofiled on the H200, the host
    ~4 ms ahead. The diagnosis says gpu, and its step time is the measured one within 3%."""
    t = load_trace(DATA / "gpu_bound_bf16" / "mlp.light.trace.json.gz")
    d = diagnose(t)
    truth = _measured_ms("gpu_bound_bf16", "unprofiled")
    assert d.bound == "gpu"
    assert abs(d.step_ms - truth) <= 0.03 * truth
    assert abs(d.gpu_busy_ms - truth) <= 0.03 * truth
    assert trace_findings(t) == []


def test_kernels_of_a_cuda_graph_replay_hang_off_their_graph_launch():
    """Holistic Trace Analysis' critical path sometimes drops cudaGraphLaunch kernels (its issue #290):
    here the 600 kernels of each replay link to the one cudaGraphLaunch by correlation, and the replayed
    step is the measured 0.71 ms within 15%."""
    import numpy as np

    from workbench.analysis.trace import step_model as sm
    t = load_trace(DATA / "launch" / "cuda_graph.light.trace.json.gz")
    g = sm.build_graph(t)
    launched = g.g_host[g.g_host >= 0]
    names = set(g.h_name[np.unique(launched)])
    assert names == {"cudaGraphLaunch"}
    per_launch = np.bincount(launched)[np.unique(launched)]
    assert np.median(per_launch) >= 600
    d = diagnose(t)
    truth = _measured_ms("launch", "cuda_graph")
    assert d.bound == "gpu" and abs(d.step_ms - truth) <= 0.15 * truth

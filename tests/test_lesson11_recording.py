"""Lesson 11's shipped H200 recording agrees with itself and with what notebooks/11_time_before_profile claims.

The JSON (``workbench/samples/results/h200_lesson11.json``) and the traces (``lesson11_*``) were written by
``benchmarks/record_lesson11_h200.py`` on the H200; the recorder also ran ``diagnose`` on each trace there.
"""

from __future__ import annotations

import gzip
import json

import pytest

from workbench import samples
from workbench.analysis import diagnose
from workbench.io import load_trace
from workbench.lessons import RESULTS

if not (RESULTS / "h200_lesson11.json").is_file():
    pytest.skip("lesson 11's H200 recording is not in the repository yet "
                "(python benchmarks/record_lesson11_h200.py --out DIR on the H200)", allow_module_level=True)
REC = json.loads((RESULTS / "h200_lesson11.json").read_text())
L = REC["ladder"]
RUNGS = ["fp32", "tf32", "bf16", "compile", "graph"]
TRACES = [(r, "light") for r in RUNGS] + [("fp32", "full"), ("bf16", "full")]


def test_recorded_on_an_h200_without_errors():
    assert not REC["smoke"] and REC["device"] == "cuda"
    assert "H200" in REC["env"]["gpu"]
    assert REC["errors"] == {} and REC["skipped"] == {}
    assert all(r in L for r in RUNGS)


@pytest.mark.parametrize("rung", RUNGS)
def test_timings_are_medians_of_enough_steps(rung):
    u = L[rung]["unprofiled"]
    assert u["steps"] >= 20
    assert u["p10_ms"] <= u["median_ms"] <= u["p90_ms"]


@pytest.mark.parametrize("rung,detail", TRACES)
def test_shipped_trace_is_the_recorded_one_small_and_pathless(rung, detail):
    p = samples.path(f"lesson11_{rung}_{detail}")
    t = L[rung]["traces"][detail]
    assert p.name == t["file"] and p.stat().st_size == t["bytes"] < 1_500_000
    text = gzip.open(p, "rt").read()
    for local in ("/home/", "/root/", "/tmp/", "/work/"):
        assert local not in text
    raw = json.loads(text)
    assert raw["workbench_unprofiled_step_ms"] == t["stamped_unprofiled_step_ms"]


@pytest.mark.parametrize("rung,detail", TRACES)
def test_offline_diagnosis_equals_the_one_made_on_the_h200(rung, detail):
    here = diagnose(load_trace(samples.path(f"lesson11_{rung}_{detail}"))).as_dict()
    there = L[rung]["traces"][detail]["diagnosis"]
    assert here["bound"] == there["bound"]
    assert here["step_ms"] == pytest.approx(there["step_ms"], rel=1e-6)
    assert here["step_ms_unprofiled"] == pytest.approx(there["step_ms_unprofiled"], rel=1e-6)

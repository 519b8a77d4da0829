"""The H200 recording of lesson 12 (workbench/samples/results/h200_lesson12.json): its structure and the
relationships notebooks/12_cpu_gpu_agree.ipynb states."""

import json

import pytest

from workbench.analysis.experiment import DEFAULT_TOLERANCE
from workbench.analysis.numerics import UNIT_ROUNDOFF
from workbench.lessons import RESULTS

PATH = RESULTS / "h200_lesson12.json"
pytestmark = pytest.mark.skipif(not PATH.exists(), reason="the H200 recording of lesson 12 is not in the repo yet "
                                "(python benchmarks/record_lesson12_h200.py --out DIR on the H200)")
MODES = {"cpu_fp32": "fp32", "gpu_fp64": "fp64", "gpu_fp32": "fp32", "gpu_tf32": "tf32", "gpu_bf16_autocast": "bf16"}


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_recorded_on_an_h200_in_full(rec):
    assert not rec["smoke"] and "H200" in rec["env"]["gpu"]
    assert rec["skipped_parts"] == []
    for part in ("precision", "planted_bug", "determinism"):
        assert "error" not in rec["parts"][part], rec["parts"][part].get("error")
    assert rec["env"]["torch"] and rec["env"]["cuda"] and rec["env"]["date"]
    assert "/home/" not in PATH.read_text() and "/tmp/" not in PATH.read_text()    # no local paths


def test_precision_table_covers_every_mode_and_tensor(rec):
    prec = rec["parts"]["precision"]
    assert set(prec["errors"]) == set(MODES)
    assert prec["modes"]["gpu_tf32"]["tf32"] and not prec["modes"]["gpu_fp32"]["tf32"]
    assert prec["tf32_flags"]["gpu_fp32"] == {"matmul.allow_tf32": False, "cudnn.allow_tf32": False}
    assert prec["tf32_flags"]["gpu_tf32"]["matmul.allow_tf32"] is True
    for m, e in prec["errors"].items():
        assert set(e["per_tensor"]) == set(prec["tensors"]), m
        worst = max(v["max_rel"] for v in e["per_tensor"].values())
        assert e["worst_max_rel"] == pytest.approx(worst)
        assert e["grad_max_rel_worst"] <= e["worst_max_rel"]


def test_precision_ladder(rec):
    e = {m: v["worst_max_rel"] for m, v in rec["parts"]["precision"]["errors"].items()}
    assert e["gpu_fp64"] < 1e3 * UNIT_ROUNDOFF["fp64"]
    assert 0 < e["gpu_fp32"] < 10 * e["cpu_fp32"] and e["cpu_fp32"] < 10 * e["gpu_fp32"]
    assert e["gpu_bf16_autocast"] > e["gpu_tf32"] > 10 * e["gpu_fp32"]
    for m, fmt in MODES.items():
        if fmt != "fp64":
            err = rec["parts"]["precision"]["errors"][m]
            assert err["logits_max_rel"] <= DEFAULT_TOLERANCE[fmt], m
            assert err["grad_max_rel_worst"] <= 10 * DEFAULT_TOLERANCE[fmt], m


def test_planted_bug_is_far_above_precision_and_invisible_on_cpu(rec):
    bug, prec = rec["parts"]["planted_bug"], rec["parts"]["precision"]["errors"]
    assert bug["cpu"]["bitwise_equal_to_blocking"]
    t0 = bug["gpu_trials"][0]
    assert t0["copies_done_when_read"]["fixed"] is True
    assert t0["bug_vs_fp64"]["worst_max_rel"] > 10 * prec["gpu_bf16_autocast"]["worst_max_rel"]
    assert t0["fixed_vs_fp64"]["worst_max_rel"] < 10 * prec["gpu_fp32"]["worst_max_rel"]
    assert t0["tensors_wrong"] >= 1
    # the exercise's rule K x unit roundoff has a solution
    k_min = max(v["worst_max_rel"] / UNIT_ROUNDOFF[MODES[m]] for m, v in prec.items() if MODES[m] != "fp64")
    assert k_min < t0["bug_vs_fp64"]["worst_max_rel"] / UNIT_ROUNDOFF["fp32"]


def test_deterministic_algorithms(rec):
    det = rec["parts"]["determinism"]
    assert det["cublas_workspace_config"] == ":4096:8"
    assert set(det["ops"]) == {"index_add_", "scatter_add_"}
    for op, r in det["ops"].items():
        n, d = r["default"], r["deterministic"]
        assert d["bitwise_equal"] and d["max_abs_diff"] == 0.0, op
        bound = r["mean_adds_per_output"] * UNIT_ROUNDOFF["fp32"]
        assert n["max_rel_diff"] < bound and n["vs_fp64_max_rel"] < bound and d["vs_fp64_max_rel"] < bound, op
        assert len(n["ms"]) == len(d["ms"]) == rec["params"]["timing_iters"]
        assert r["deterministic_slowdown"] == pytest.approx(d["ms_median"] / n["ms_median"])

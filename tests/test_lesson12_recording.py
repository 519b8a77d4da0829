"""The H200 recording of lesson 12 (workbench/samples/results/h200_lesson12.json): its structure and the
relationships notebooks/12_cpu_gpu_agree.ipynb states."""

import json

import pytest

from workbench.analysis.experiment import DEFAULT_TOLERANCE
from workbench.analysis.numerics import UNIT_ROUNDOFF
from workbench.lessons import RESULTS

PATH = RESULTS / "h200_lesson12.json"
MODES = {"cpu_fp32": "fp32", "gpu_fp64": "fp64", "gpu_fp32": "fp32", "gpu_tf32": "tf32", "gpu_bf16_autocast": "bf16"}


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_shipped_and_listed_in_the_samples_readme(rec):
    assert PATH.is_file()
    row = next(line for line in (RESULTS.parent / "README.md").read_text().splitlines()
               if line.startswith("| `results/h200_lesson12.json`"))
    e = rec["parts"]["precision"]["errors"]
    for mode, label in (("cpu_fp32", "CPU fp32"), ("gpu_fp32", "GPU fp32"), ("gpu_tf32", "TF32"),
                        ("gpu_bf16_autocast", "bf16")):      # the numbers the row states are the recording's
        assert f"{label} {e[mode]['worst_max_rel']:.1e}".replace("e-0", "e-") in row, label
    wrong = [t for t in rec["parts"]["planted_bug"]["gpu_trials"] if t["tensors_wrong"]]
    assert f"in 3 trials, wrong in {len(wrong)}" in row
    assert f"logits `max_rel` {wrong[0]['bug_vs_fixed']['logits_max_rel']:.2f}" in row
    assert rec["env"]["date"][:10] in row and rec["env"]["driver"] in row


def test_recorded_on_an_h200_in_full(rec):
    assert not rec["smoke"] and "H200" in rec["env"]["gpu"]
    assert rec["env"]["date"].startswith("2026-12-03") and rec["env"]["torch"].startswith("2.11.0")
    p = rec["params"]
    assert (p["layers"], p["d"], p["batch"], p["seq"], p["vocab"]) == (2, 512, 16, 256, 2048)
    assert rec["skipped_parts"] == []
    for part in ("precision", "planted_bug", "determinism"):
        assert "error" not in rec["parts"][part], rec["parts"][part].get("error")
    assert rec["env"]["torch"] and rec["env"]["cuda"] and rec["env"]["date"]
    text = PATH.read_text()
    assert not any(d in text for d in ("/home/", "/tmp/", "/root", "/work/"))      # no local paths


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
    in_u = {m: v / UNIT_ROUNDOFF[MODES[m]] for m, v in e.items()}
    assert all(1 < r < 100 for r in in_u.values()), in_u                 # "between 1 and 100 u"
    assert max(in_u["gpu_tf32"], in_u["gpu_bf16_autocast"]) < min(in_u["cpu_fp32"], in_u["gpu_fp32"], in_u["gpu_fp64"])
    for m, fmt in MODES.items():
        if fmt != "fp64":
            err = rec["parts"]["precision"]["errors"][m]
            assert err["logits_max_rel"] <= DEFAULT_TOLERANCE[fmt], m
            assert err["grad_max_rel_worst"] <= 10 * DEFAULT_TOLERANCE[fmt], m


def test_step_times_lower_precision_not_faster_at_this_size(rec):
    ms = rec["parts"]["precision"]["gpu_step_ms_median"]
    assert set(ms) == {"gpu_fp64", "gpu_fp32", "gpu_tf32", "gpu_bf16_autocast"} and all(v > 0 for v in ms.values())
    assert ms["gpu_tf32"] >= ms["gpu_fp32"] and ms["gpu_bf16_autocast"] >= ms["gpu_fp32"]


def test_planted_bug_shows_in_one_trial_far_above_precision_and_not_on_cpu(rec):
    bug, prec = rec["parts"]["planted_bug"], rec["parts"]["precision"]["errors"]
    assert bug["cpu"]["bitwise_equal_to_blocking"]
    trials = bug["gpu_trials"]
    assert [t["trial"] for t in trials] == [0, 1, 2]
    assert all(t["copies_done_when_read"]["fixed"] is True for t in trials)
    assert [t["trial"] for t in trials if t["tensors_wrong"] > 0] == [2]
    t0, t1, t2 = trials
    assert t0["copies_done_when_read"]["bug"] is True and t0["bug_vs_fixed"]["worst_max_rel"] == 0.0
    assert t1["copies_done_when_read"]["bug"] is False and t1["bug_vs_fixed"]["worst_max_rel"] == 0.0
    assert t0["fixed_equals_part1_gpu_fp32"]
    assert t0["fixed_vs_fp64"]["worst_max_rel"] == pytest.approx(prec["gpu_fp32"]["worst_max_rel"])
    # trial 2: loss and logits wrong, every gradient exact; the wrong loss is trial 1's loss bit for bit
    w = t2["bug_vs_fixed"]
    assert t2["tensors_wrong"] == 2 and w["grad_max_rel_worst"] == 0.0 and 0 < t2["elements_wrong_fraction"] < 1
    assert w["loss_abs_diff"] > 0 and w["logits_max_rel"] > 1
    assert w["loss"] == t1["bug_vs_fixed"]["loss"] and t1["bug_vs_fixed"]["loss_abs_diff"] == 0.0
    assert w["worst_max_rel"] > 100 * prec["gpu_bf16_autocast"]["worst_max_rel"]
    # the exercise's rule K x u: passes every honest run and flags the bug's error in fp32, TF32 and bf16
    k_min = max(v["worst_max_rel"] / UNIT_ROUNDOFF[MODES[m]] for m, v in prec.items() if MODES[m] != "fp64")
    k_max = w["worst_max_rel"] / UNIT_ROUNDOFF["bf16"]
    assert k_min == prec["gpu_fp32"]["worst_max_rel"] / UNIT_ROUNDOFF["fp32"] and k_min < k_max


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
        assert r["deterministic_slowdown"] == pytest.approx(d["ms_median"] / n["ms_median"]) and r["deterministic_slowdown"] > 1
        assert (tuple(r["shape_in"]), r["out_rows"], r["mean_adds_per_output"]) == ((1_048_576, 64), 1024, 1024)
        assert not n["bitwise_equal"] and n["elements_differ_fraction"] > 0.5 and 0 < n["max_rel_diff"] < bound / 10, op
        assert 0.5 < d["vs_fp64_max_rel"] / n["vs_fp64_max_rel"] < 2, op       # repeatable, not more accurate
    step = det["model_step"]
    assert step["default"]["bitwise_equal"] and step["deterministic"]["bitwise_equal"]
    assert step["deterministic"]["ms_median"] > step["default"]["ms_median"]

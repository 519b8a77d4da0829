"""The H200 recording behind notebooks/37_inference_latency.ipynb and section 3 of 32_quantization.ipynb
(workbench/samples/results/h200_lesson37.json, written by benchmarks/record_lesson37_h200.py): it is the H200's,
every part and variant ran, its summaries are the summaries of the per-token lists it ships, and it is small
and free of machine paths. Skipped while the file is not in the checkout (it is recorded on the GPU machine)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.lessons import RESULTS

PATH = RESULTS / "h200_lesson37.json"
VARIANTS = ("eager_cat", "eager_static", "cuda_graph", "compiled", "compiled_int8")
CONFIGS = ("bf16", "int8_weight_only", "float8_weight_only", "int8_dynamic")

pytestmark = pytest.mark.skipif(not PATH.is_file(), reason="h200_lesson37.json not recorded yet")


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_recorded_on_the_h200_every_part_ran(rec):
    assert rec["lesson"] == 37 and rec["smoke"] is False
    e = rec["env"]
    assert e["cuda_available"] is True and e["gpu"] == "NVIDIA H200"
    assert e["torchao"] == "0.18.0" and e["torch"].startswith("2.11")
    assert rec["peak"]["gbps"] == 4800.0
    for part in ("decode", "quant_compiled"):
        assert "error" not in rec[part], (part, rec[part].get("error"))
    for name in VARIANTS:
        assert "error" not in rec["decode"]["variants"][name], name
    for name in CONFIGS:
        c = rec["quant_compiled"]["configs"][name]
        assert "error" not in c and all("error" not in c[f"{m}_batch_{b}"] for m in ("eager", "compiled")
                                         for b in (1, 16, 4096)), name
    assert rec["total_wall_s"] < rec["budget_s"] + 60


def test_summaries_are_those_of_the_shipped_per_token_lists(rec):
    d = rec["decode"]
    for name, v in d["variants"].items():
        if "error" in v:
            continue
        ms = np.array(v["per_token_wall_ms"])
        assert len(ms) == v["timed_runs"] * d["model"]["new_tokens"] == v["wall_ms"]["n"], name
        for q in (50, 90, 99):  # the list is rounded to the microsecond
            assert abs(np.percentile(ms, q) - v["wall_ms"][f"p{q}"]) < 2e-3, (name, q)
        assert abs(ms.max() - v["wall_ms"]["max"]) < 1e-3
        assert v["wall_ms"]["max"] >= v["wall_ms"]["p99"] >= v["wall_ms"]["p90"] >= v["wall_ms"]["p50"]


def test_the_teacher_forced_variants_agree_with_eager(rec):
    v = rec["decode"]["variants"]
    assert v["eager_cat"]["max_abs_logit_diff_vs_eager_cat"] == 0.0
    for name in ("eager_static", "cuda_graph", "compiled"):
        if "error" not in v[name]:
            assert v[name]["argmax_agrees_with_eager_cat"] > 0.9, name


def test_small_and_free_of_machine_paths():
    text = PATH.read_text()
    assert len(text.encode()) < 60_000
    for marker in ("/root", "/home/", "/work/", "/tmp/", "/opt/"):
        assert marker not in text, marker

"""The GPU recordings behind notebooks/37_inference_latency.ipynb and section 3 of 32_quantization.ipynb.

workbench/samples/results/h100_lesson37.json is benchmarks/record_lesson37_h200.py's h200_lesson37.json from a
run on an H100 (named by the GPU that ran it): its ``decode`` part and every variant ran, its summaries are the
summaries of the per-token lists it ships, and it is small and free of machine paths. Its ``quant_compiled``
part was cut by that call's time limit; a second run of the recorder on an H100, ``--only quant_compiled``, ran
the part in full: h100_quant_compiled.json, checked here against its own contents (every config x mode x batch
measured or carrying the error it raised, the derived rates the rates of its own medians and weight bytes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.lessons import RESULTS

PATH = RESULTS / "h100_lesson37.json"
QUANT = RESULTS / "h100_quant_compiled.json"
VARIANTS = ("eager_cat", "eager_static", "cuda_graph", "compiled", "compiled_int8")
CONFIGS = ("bf16", "int8_weight_only", "float8_weight_only", "int8_dynamic")


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_recorded_on_an_h100_decode_ran_quant_compiled_was_cut(rec):
    assert rec["lesson"] == 37 and rec["smoke"] is False
    e = rec["env"]
    assert e["cuda_available"] is True and e["gpu"] == "NVIDIA H100 80GB HBM3"
    assert e["torchao"] == "0.18.0" and e["torch"].startswith("2.11")
    assert rec["peak"] == {"gbps": 3350.0, "name": "H100 SXM", "source": "NVIDIA H100 SXM datasheet"}
    assert "error" not in rec["decode"]
    for name in VARIANTS:
        assert "error" not in rec["decode"]["variants"][name], name
    assert "quant_compiled" not in rec and "total_wall_s" not in rec     # the call ended inside that part
    assert not (RESULTS / "h200_lesson37.json").exists()


def test_summaries_are_those_of_the_shipped_per_token_lists(rec):
    d = rec["decode"]
    for name, v in d["variants"].items():
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
        assert v[name]["argmax_agrees_with_eager_cat"] > 0.9, name


@pytest.mark.parametrize("path", [PATH, QUANT], ids=lambda p: p.name)
def test_small_and_free_of_machine_paths(path):
    text = path.read_text()
    assert len(text.encode()) < 60_000
    for marker in ("/root", "/home/", "/work/", "/tmp/", "/opt/"):
        assert marker not in text, marker


@pytest.fixture(scope="module")
def quant():
    return json.loads(QUANT.read_text())


def test_the_quant_file_is_a_full_run_of_that_part_on_an_h100(quant, rec):
    assert quant["lesson"] == 37 and quant["smoke"] is False and "decode" not in quant
    assert quant["recorder"] == "benchmarks/record_lesson37_h200.py --out DIR --only quant_compiled --budget 280"
    e = quant["env"]
    assert e["cuda_available"] is True and e["gpu"] == "NVIDIA H100 80GB HBM3" and e["torchao"] == "0.18.0"
    assert e["torch"] == rec["env"]["torch"] and e["driver"] == rec["env"]["driver"] and quant["peak"] == rec["peak"]
    assert 0 < quant["total_wall_s"] < quant["budget_s"]             # the recorder finished and wrote its total
    q = quant["quant_compiled"]
    assert q["batches"] == [1, 16, 4096] and q["device"] == "cuda" and set(q["configs"]) == set(CONFIGS)
    assert 0 < q["copy_gbps"] < quant["peak"]["gbps"]                 # a measured copy, below the datasheet


def test_every_config_mode_and_batch_was_measured_or_says_why_not(quant):
    q = quant["quant_compiled"]
    errors = {}
    for name in CONFIGS:
        r = q["configs"][name]
        cells = {k for k in r if "_batch_" in k}
        assert cells == {f"{m}_batch_{b}" for m in ("eager", "compiled") for b in q["batches"]}, name
        for k in cells:
            c = r[k]
            if "error" in c:
                errors[(name, k)] = c["error"]
                assert set(c) == {"error"}
                continue
            assert c["median_ms"] >= c["min_ms"] > 0 and c["host_issue_ms"] > 0 and c["reps"] >= 5, (name, k)
            assert c["weight_gbps"] == pytest.approx(r["weight_bytes"] / (c["median_ms"] * 1e-3) / 1e9)
            assert c["weight_bandwidth_fraction"] == pytest.approx(c["weight_gbps"] / quant["peak"]["gbps"])
            assert c["weight_copy_fraction"] == pytest.approx(c["weight_gbps"] / q["copy_gbps"])
            assert c["weight_bandwidth_fraction"] < 1.0               # no run read its weights faster than the GPU can
            if k.startswith("compiled"):
                assert c["graphs_compiled"] == 1, (name, k)           # compiled for real, not run eagerly
            else:
                assert "graphs_compiled" not in c
            assert (c["rel_l2_err_vs_bf16_eager"] == 0.0) == (name == "bf16"), (name, k)
            assert c["rel_l2_err_vs_bf16_eager"] < 0.05
    # only the compiled int8 dynamic calls below 17 rows failed: torch._int_mm's row limit
    assert set(errors) == {("int8_dynamic", "compiled_batch_1"), ("int8_dynamic", "compiled_batch_16")}
    for (_, k), text in errors.items():
        assert text == f"RuntimeError: self.size(0) needs to be greater than 16, but got {k.rsplit('_', 1)[1]}"


def test_quantized_weights_are_half_the_bf16_bytes_plus_their_scales(quant):
    c = quant["quant_compiled"]["configs"]
    d, h = quant["quant_compiled"]["d"], quant["quant_compiled"]["hidden"]
    bf16 = c["bf16"]["weight_bytes"]
    assert bf16 == 2 * (2 * d * h + d + h)                            # two Linear layers' weights and biases, bf16
    for name, cls in (("int8_weight_only", "Int8Tensor"), ("float8_weight_only", "Float8Tensor"),
                      ("int8_dynamic", "Int8Tensor")):
        assert c[name]["weight_class"] == cls
        extra = c[name]["weight_bytes"] - bf16 / 2                    # one byte a weight instead of two: the scales
        assert 0 < extra < 0.001 * bf16, name

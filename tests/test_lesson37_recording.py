"""The GPU recording behind notebooks/37_inference_latency.ipynb and section 3 of 32_quantization.ipynb.

workbench/samples/results/h100_lesson37.json is benchmarks/record_lesson37_h200.py's h200_lesson37.json from a
run on an H100 (named by the GPU that ran it): its ``decode`` part and every variant ran, its summaries are the
summaries of the per-token lists it ships, and it is small and free of machine paths. Its ``quant_compiled``
part was cut by the call's time limit; the five runs the recorder had printed were recovered by
benchmarks/quant_from_log.py into h100_quant_compiled_partial.json, checked here against the recorder's own
line format (a log written the way the recorder prints is read back to the shipped file)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from testdata import ROOT
from workbench.lessons import RESULTS

PATH = RESULTS / "h100_lesson37.json"
PARTIAL = RESULTS / "h100_quant_compiled_partial.json"
SCRIPT = ROOT / "benchmarks" / "quant_from_log.py"
VARIANTS = ("eager_cat", "eager_static", "cuda_graph", "compiled", "compiled_int8")
FIVE = {("bf16", "eager_batch_1"), ("bf16", "compiled_batch_1"), ("int8_weight_only", "eager_batch_1"),
        ("int8_weight_only", "compiled_batch_1"), ("float8_weight_only", "eager_batch_1")}


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


@pytest.mark.parametrize("path", [PATH, PARTIAL], ids=lambda p: p.name)
def test_small_and_free_of_machine_paths(path):
    text = path.read_text()
    assert len(text.encode()) < 60_000
    for marker in ("/root", "/home/", "/work/", "/tmp/", "/opt/"):
        assert marker not in text, marker


def test_the_partial_quant_file_holds_the_five_printed_runs_and_says_so(rec):
    q = json.loads(PARTIAL.read_text())
    assert q["source"] == "recovered from the recorder's printed lines; the part was cut by the time limit after 5 runs"
    assert q["env"] == rec["env"] and q["peak"] == rec["peak"] and q["batches"] == [1]
    assert {(n, k) for n, r in q["configs"].items() for k in r if "_batch_" in k} == FIVE
    assert len(q["not_measured"]) == 4 * 2 * 3 - 5 and "int8_dynamic/eager_batch_1" in q["not_measured"]
    for r in q["configs"].values():
        for k, c in r.items():
            if "_batch_" in k:
                assert c["weight_bandwidth_fraction"] == pytest.approx(c["weight_gbps"] / 3350.0)
                assert c["reps"] == 30 and c["median_ms"] >= c["min_ms"] > 0


def _as_printed(q):
    """The recorder's log lines for the shipped cells: ``log("quant", name, key, {k: round(v, 4) ...})``."""
    lines = ["[lesson37  132.0s] part quant_compiled"]
    for name, r in q["configs"].items():
        for key, c in r.items():
            if "_batch_" in key:
                cell = {k: v for k, v in c.items() if k not in ("child_s", "weight_bandwidth_fraction")}
                lines.append(f"[lesson37 {c['child_s']:6.1f}s] quant {name} {key} {cell}")
    return "\n".join(lines) + "\n"


def test_quant_from_log_reads_the_recorders_lines_back_to_the_shipped_file(tmp_path):
    q = json.loads(PARTIAL.read_text())
    log = tmp_path / "l37.log"
    log.write_text("noise before\n" + _as_printed(q) + _as_printed(q))            # a line printed twice is one run
    out = tmp_path / "partial.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(log), "--recording", str(PATH), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == q


def test_quant_from_log_bad_input_is_one_line_and_exit_2(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("[lesson37   1.0s] part decode\n")
    for args, says in (([str(log)], "no '[lesson37 ...] quant"), ([str(tmp_path / "nope.log")], "no such file")):
        r = subprocess.run([sys.executable, str(SCRIPT), *args, "--recording", str(PATH), "--out",
                            str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1

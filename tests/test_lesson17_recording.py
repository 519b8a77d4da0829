"""Lesson 17's recorder (benchmarks/record_lesson17_h200.py) and the recording the lesson reads.

The recorder runs here with ``--smoke`` (CPU, tiny sizes, about 15 s on 2 cores): every part runs in its own
process and writes its tables; what a CPU cannot run (the memory-efficient and cuDNN backends) is a row with
its error line, not a crash; the file's layout is a function of its content. The shipped GPU recording
(workbench/samples/results/h100_lesson17.json: the recorder's h200_lesson17.json from a run on an H100) is
checked when it is there: a real GPU run, small, no machine paths, every part ran.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from testdata import ROOT
from workbench.errors import BadArgument
from workbench.lessons import RESULTS, recorded_table, recording

sys.path.insert(0, str(ROOT / "benchmarks"))
import record_lesson17_h200 as R  # noqa: E402

PARTS = ("support", "sweep_d128", "sweep_d64", "kernels")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("lesson17")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "record_lesson17_h200.py"), "--out", str(out), "--smoke"],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    path = out / "h200_lesson17.json"
    return path.read_text(), json.loads(path.read_text())


def test_smoke_writes_every_part_with_its_environment(smoke):
    text, rec = smoke
    assert rec["lesson"] == 17 and rec["smoke"] is True
    assert rec["env"]["cuda_available"] is False and rec["env"]["gpu"] is None and rec["env"]["torch"]
    for part in PARTS:
        assert "error" not in rec[part], (part, rec[part].get("error"))
        assert rec[part]["part_wall_s"] > 0
    assert rec["total_wall_s"] < rec["budget_s"]
    assert len(text) < 60_000
    for marker in (str(ROOT), "/root/", "/home/", "/tmp/"):
        assert marker not in text, marker


def test_the_layout_is_a_function_of_the_content(smoke):
    """Keys sorted, one table row per line: the same numbers give the same file."""
    text, rec = smoke
    assert R.dumps(rec) + "\n" == text
    row_lines = [ln for ln in text.splitlines() if ln.lstrip().startswith("[") and ln.rstrip(",").endswith("]")]
    assert len(row_lines) > 100


def test_sweep_rows_cover_every_combination_in_order(smoke):
    _, rec = smoke
    z = R.sizes(True)
    for part, d in (("sweep_d128", 128), ("sweep_d64", 64)):
        p = rec[part]
        assert p["runs"]["columns"] == list(R.COLUMNS) and all(len(r) == len(R.COLUMNS) for r in p["runs"]["rows"])
        keys = [tuple(r[:5]) for r in p["runs"]["rows"]]
        assert keys == [(d, s, m, b, mode) for s in z["seqs"] for m in R.MASKS for b in R.BACKENDS for mode in R.MODES]
        assert [tuple(r[:4]) for r in p["default"]["rows"]] == list(itertools.product([d], z["seqs"], R.MASKS, R.MODES))


def test_cpu_runs_flash_and_math_and_records_the_others_as_errors(smoke):
    _, rec = smoke
    df = recorded_table(rec["sweep_d128"])
    assert set(df["status"]) == {"ok", "error", "skipped"}
    ok = df[df["status"] == "ok"]
    assert set(ok["backend"]) == {"flash", "math", "naive"}
    assert (ok["median_ms"] > 0).all() and (ok["min_ms"] <= ok["median_ms"]).all() and (ok["reps"] >= 3).all()
    assert ok["peak_extra_bytes"].isna().all()                              # no CUDA allocator on a CPU
    refused = df[df["backend"].isin(["efficient", "cudnn"])]
    assert (refused["status"] == "error").all()
    assert refused["error"].str.startswith("RuntimeError: No viable backend").all()
    naive_causal = df[(df["backend"] == "naive") & (df["mask"] == "causal")]
    assert (naive_causal["status"] == "skipped").all() and naive_causal["error"].str.contains("no is_causal").all()
    # FLOPs: 4·B·H·S²·D forward, half causal (the mask rows too), 3.5x with the backward; TFLOP/s from the median
    b, h = rec["sweep_d128"]["batch"], rec["sweep_d128"]["heads"]
    for r in df.itertuples():
        fwd = 4 * b * h * r.seq**2 * r.head_dim // (1 if r.mask == "none" else 2)
        assert r.flops == (fwd if r.mode == "fwd" else fwd * 7 // 2)
    assert ok["tflops"].round(2).equals((ok["flops"] / (ok["median_ms"] * 1e9)).round(2))
    picks = recorded_table(rec["sweep_d128"], "default")
    assert set(picks["picked"]) == {"flash"}                               # the CPU's order: flash, then math


def test_support_and_kernels_parts(smoke):
    _, rec = smoke
    sup = recorded_table(rec["support"])
    assert list(sup.columns) == list(R.SUPPORT_COLUMNS)
    assert set(zip(sup["dtype"], sup["head_dim"])) == set(itertools.product(("bfloat16", "float16", "float32"),
                                                                           (64, 128, 256, 512)))
    assert (sup.loc[sup["backend"] == "math", "status"] == "ok").all()
    k = rec["kernels"]
    assert k["what"] == "CPU ops" and set(k["masks"]) == {"none", "causal"}
    top = dict((row[0], row) for row in k["masks"]["none"]["math"]["top"])
    assert "aten::bmm" in top and k["masks"]["none"]["math"]["top_columns"] == ["name", "calls", "us"]
    assert any("flash_attention_for_cpu" in row[0] for row in k["masks"]["causal"]["flash"]["top"])
    assert "naive" not in k["masks"]["causal"] and "error" in k["masks"]["none"]["cudnn"]


def test_a_missing_recording_says_which_recorder_writes_it():
    with pytest.raises(BadArgument, match=r"record_lesson99_h200\.py --out DIR and copy DIR/h200_lesson99\.json "
                                          r"there as h100_lesson99\.json"):
        recording("h100_lesson99.json")


def test_the_shipped_recording_is_a_real_gpu_run_named_by_its_gpu():
    path = RESULTS / "h100_lesson17.json"
    text = path.read_text()
    rec = json.loads(text)
    assert rec["smoke"] is False and rec["env"]["cuda_available"] is True
    assert rec["env"]["gpu"] == "NVIDIA H100 80GB HBM3"                  # the file's name says the GPU that ran it
    assert not (RESULTS / "h200_lesson17.json").exists()
    for part in PARTS:
        assert "error" not in rec[part], (part, rec[part].get("error"))
    assert len(text) < 60_000 and R.dumps(rec) + "\n" == text
    for marker in ("/root", "/home/", "/work/", "/tmp/", "/opt/"):
        assert marker not in text, marker
    df = recorded_table(rec["sweep_d128"])
    flash = df[(df["backend"] == "flash") & (df["mask"] != "mask")]
    assert (flash["status"] == "ok").all() and (flash["peak_extra_bytes"] > 0).all()
    sup = recorded_table(rec["support"])                                 # the H100 run's support part ran out of
    skipped = sup[sup["status"] == "skipped"]                            # budget: skipped, never silently missing
    assert len(skipped) and (skipped["error"] == "skipped: out of time budget").all()

"""Lesson 37's recorder (benchmarks/record_lesson37_h200.py) on the CPU: ``--smoke --only decode`` with the eager
variants runs the subprocess, the teacher-forced generations, the per-token summaries and the JSON (about 10 s;
the compiled variants and the torchao part are left to the GPU run: compiling takes minutes on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "record_lesson37_h200.py"


def test_smoke_decode_eager_variants(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke", "--only", "decode",
                        "--variants", "eager_static,cuda_graph"], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads((tmp_path / "h200_lesson37.json").read_text())
    assert rec["smoke"] is True and rec["lesson"] == 37 and "quant_compiled" not in rec
    assert str(tmp_path) not in json.dumps(rec)  # the --out folder is written as DIR
    d = rec["decode"]
    assert set(d["variants"]) == {"eager_cat", "eager_static", "cuda_graph"}
    assert "CUDA" in d["variants"]["cuda_graph"]["error"]  # recorded as skipped on a CPU, not dropped
    new = d["model"]["new_tokens"]
    for name in ("eager_cat", "eager_static"):
        v = d["variants"][name]
        ms = np.array(v["per_token_wall_ms"])
        assert len(ms) == v["timed_runs"] * new == v["wall_ms"]["n"] > 0
        assert abs(np.percentile(ms, 50) - v["wall_ms"]["p50"]) < 2e-3
        assert v["wall_ms"]["max"] >= v["wall_ms"]["p99"] >= v["wall_ms"]["p50"] > 0
        assert v["argmax_agrees_with_eager_cat"] == 1.0
    # the static cache (in place, masked over the full length) computes what the growing one does
    assert d["variants"]["eager_static"]["max_abs_logit_diff_vs_eager_cat"] < 1e-4
    assert d["model"]["kv_cache_bytes"] == d["model"]["layers"] * 2 * d["model"]["max_len"] * d["model"]["d"] * 4


def test_unknown_variant_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke", "--variants", "eager,graph"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "unknown --variants eager, graph" in p.stderr and "Traceback" not in p.stderr

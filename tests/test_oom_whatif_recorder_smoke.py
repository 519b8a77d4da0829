"""The memory what-if recorder (benchmarks/record_oom_whatif_h200.py) on the CPU: ``--smoke`` runs the
subprocess fan-out, the simulated cap, the JSON and the bundle of one scenario (a few fixes, < 30 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "record_oom_whatif_h200.py"

FIX_KEYS = {"id", "change", "ran", "oom_step", "steps", "max_memory_reserved", "max_memory_allocated", "wall_s",
            "error"}


def test_smoke_leak_scenario(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke", "--only", "leak",
                        "--fixes", "no_leak,batch_fractions,no_cap", "--jobs", "4", "--budget-s", "120"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads((tmp_path / "leak.json").read_text())
    for key in ("scenario", "description", "model_config", "batch_size", "steps", "optimizer", "precision",
                "alloc_conf", "cap_bytes", "device", "torch", "cuda", "oom", "fixes", "batch_search"):
        assert key in rec, key
    assert rec["scenario"] == "leak" and rec["smoke"] is True and rec["leak"] is True
    # the simulated cap: the recorded run dies at some step, in a named phase
    assert rec["oom_happened"] and rec["oom"]["step"] is not None
    assert rec["oom"]["phase"] in ("forward", "backward", "optimizer", "other")
    assert rec["oom"]["message"].startswith("CUDA out of memory")
    assert rec["snapshot"] == "leak.snapshot.pickle.gz" and (tmp_path / rec["snapshot"]).exists()
    assert (tmp_path / "leak.oom.json").exists()
    fixes = {f["id"]: f for f in rec["fixes"]}
    assert {"no_leak", "no_cap"} <= set(fixes) and any(i.startswith("batch_") for i in fixes)
    for f in rec["fixes"]:
        assert FIX_KEYS <= set(f), f
        assert f["steps"] == rec["steps"]
        assert (f["oom_step"] is None) == bool(f["ran"])
    assert fixes["no_leak"]["change"] == {"leak": False} and fixes["no_leak"]["ran"]
    assert fixes["no_cap"]["change"] == {"cap_bytes": None} and fixes["no_cap"]["ran"]
    assert fixes["no_cap"]["max_memory_reserved"] > rec["cap_bytes"]
    bs = rec["batch_search"]
    assert set(bs) >= {"largest_ran", "smallest_failed", "tried"}
    assert bs["smallest_failed"] is not None and bs["smallest_failed"] <= rec["batch_size"]
    env_rec = json.loads((tmp_path / "env.json").read_text())
    assert env_rec["failures"] == {} and env_rec["scenarios"]["leak"]["oom"] is True
    with tarfile.open(tmp_path / "whatif_bundle.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"whatif/leak.json", "whatif/env.json", "whatif/leak.snapshot.pickle.gz"} <= names
    # no local path in what is written
    for f in tmp_path.iterdir():
        if f.suffix == ".json":
            assert str(ROOT) not in f.read_text(), f.name

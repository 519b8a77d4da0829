"""The memory what-if recorder (benchmarks/record_oom_whatif_h200.py) on a CUDA GPU (made for the H200):
the leak scenario with three of its fixes, in a tmp dir (about a minute)::

    python -m pytest -m gpu tests/gpu/test_oom_whatif_recorder_gpu.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "record_oom_whatif_h200.py"


def _record(out: Path, scenario: str, fixes: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--only", scenario, "--fixes", fixes,
                        "--jobs", "3", "--budget-s", "240"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / f"{scenario}.json").read_text())


def test_leak_recorded_and_its_fixes_run(tmp_path):
    from workbench.io.snapshot import load_snapshot

    rec = _record(tmp_path, "leak", "no_leak,no_cap")
    assert rec["smoke"] is False and rec["cap_bytes"] == 5 * 2**30
    # the OOM really happened, at a later step (the leak grows), with torch's message and the request
    assert rec["oom_happened"], rec["attempts"]
    assert 5 <= rec["oom"]["step"] < rec["steps"]
    assert rec["oom"]["message"].startswith("CUDA out of memory")
    assert rec["oom"]["requested_bytes"] > 0
    assert rec["oom"]["phase"] in ("forward", "backward", "optimizer", "other")
    snap = load_snapshot(tmp_path / rec["snapshot"])
    assert len(snap.events) > 100
    side = json.loads((tmp_path / rec["sidecar"]).read_text())
    assert side["requested_bytes"] == rec["oom"]["requested_bytes"] and side["torch_message"]
    fixes = {f["id"]: f for f in rec["fixes"]}
    # the leak removed runs every step under the same cap; its peak is torch's and under the cap
    assert fixes["no_leak"]["ran"] and fixes["no_leak"]["oom_step"] is None
    assert 0 < fixes["no_leak"]["max_memory_reserved"] <= rec["cap_bytes"]
    # the uncapped run: what the whole run needs, above the cap (the leak's memory)
    assert fixes["no_cap"]["ran"] and fixes["no_cap"]["max_memory_reserved"] > rec["cap_bytes"]


def test_optimizer_first_step_sgd_runs(tmp_path):
    rec = _record(tmp_path, "optimizer_first_step", "sgd,adafactor")
    assert rec["oom_happened"] and rec["oom"]["step"] == 0 and rec["oom"]["phase"] == "optimizer"
    fixes = {f["id"]: f for f in rec["fixes"]}
    assert fixes["sgd"]["ran"] and fixes["sgd"]["max_memory_reserved"] <= rec["cap_bytes"]
    assert fixes["adafactor"]["ran"] is not None

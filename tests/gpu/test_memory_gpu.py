"""Allocator history and OOM post-mortems on a real GPU (run on the H200: `make test-gpu`).

Each scenario runs in a fresh process (tests/gpu/memory_scenarios.py) so the caching allocator starts
clean and the per-process cap and OOM observer do not leak into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
MiB = 2**20


def _scenario(name: str, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, str(HERE / "memory_scenarios.py"), name, str(out)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_history_over_training_steps(tmp_path):
    from workbench.analysis.memory.oom import analyze_snapshot, memory_summary
    from workbench.io.snapshot import load_snapshot

    r = _scenario("train", tmp_path)
    snap = load_snapshot(r["path"])
    assert len(snap.events) == r["events"] > 100
    a = analyze_snapshot(snap)
    # state at the end is exact (it comes from the segments torch reports)
    assert a.timeline["allocated_bytes"].iloc[-1] == r["end"]["allocated"]
    assert a.timeline["reserved_bytes"].iloc[-1] == r["end"]["reserved"]
    # the peak over the window agrees with torch's max_memory_allocated (freed blocks are sized from the
    # trace's request, rounded to 512 B, so allow a little slack for unsplit remainders)
    assert abs(a.peak["allocated_bytes"] - r["max_allocated"]) <= max(4 * MiB, 0.02 * r["max_allocated"])
    live = a.live_at(len(a.timeline) - 1)
    by = live.groupby("category", observed=True)["requested_bytes"].sum()
    # parameters (moved with .to()), AdamW state (2 tensors per parameter) are found by their stacks
    assert abs(by.get("parameters", 0) - r["params_bytes"]) <= 0.05 * r["params_bytes"]
    assert by.get("optimizer_state", 0) >= 1.5 * r["params_bytes"]
    s = memory_summary(snap, analysis=a)
    assert s["oom"] is None
    peak_live = a.live_at(a.peak["index"]).groupby("category", observed=True)["size_bytes"].sum()
    assert peak_live.get("activations", 0) > 0


def test_capacity_oom_postmortem_matches_memory_stats(tmp_path):
    from workbench.analysis.memory.oom import oom_postmortem
    from workbench.io.snapshot import load_snapshot

    r = _scenario("capacity", tmp_path)
    assert r["error_type"] == "OutOfMemoryError"  # propagated, not swallowed or replaced
    assert r["errors"] == [] and len(r["dumps"]) == 1 and r["skipped"] == 2
    assert r["second_dir_files"] == []  # a removed handle writes nothing
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes left no temporaries
    side = r["sidecar"]
    assert side["requested_bytes"] == 256 * MiB
    assert side["torch_message"] and "out of memory" in side["torch_message"].lower()
    assert abs(side["limit_bytes"] - r["cap"]) <= 2 * MiB
    stats = side["memory_stats"]
    snap = load_snapshot(r["dumps"][0])
    rep = oom_postmortem(snap)
    assert rep is not None and rep.cause == "capacity"
    assert rep.requested_bytes == side["requested_bytes"]
    assert rep.cap_bytes == side["limit_bytes"]
    tol = 2 * MiB
    assert abs(rep.allocated_bytes - stats["allocated_bytes.all.current"]) <= tol
    assert abs(rep.reserved_bytes - stats["reserved_bytes.all.current"]) <= tol
    assert abs(rep.free_in_reserved_bytes
               - (stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"])) <= tol
    assert rep.largest_free_block_bytes < rep.requested_bytes
    assert abs(rep.allocated_bytes - r["live_bytes"]) <= tol  # what the script still held
    # advice items (issue 31): {id, text, what_if}; a capacity OOM says what must go
    assert any("Reduce the batch" in a["text"] or "live tensors must go" in a["text"] for a in rep.advice)


def test_fragmentation_oom_postmortem(tmp_path):
    from workbench.analysis.memory.oom import oom_postmortem
    from workbench.io.snapshot import load_snapshot

    r = _scenario("fragmentation", tmp_path)
    assert r["contiguous"], "the 32 MiB blocks were not carved from one segment; the scenario did not set up"
    assert r["error"] and len(r["dumps"]) == 1 and r["errors"] == []
    side = r["sidecar"]
    stats = side["memory_stats"]
    rep = oom_postmortem(load_snapshot(r["dumps"][0]))
    assert rep.requested_bytes == 64 * MiB == side["requested_bytes"]
    assert rep.cause == "fragmentation", rep.to_dict()
    assert rep.largest_free_block_bytes == 32 * MiB
    assert rep.free_in_reserved_bytes >= 256 * MiB
    tol = 2 * MiB
    assert abs(rep.allocated_bytes - stats["allocated_bytes.all.current"]) <= tol
    assert abs(rep.reserved_bytes - stats["reserved_bytes.all.current"]) <= tol
    first = next(a for a in rep.advice if a["id"] != "bigger_gpu")
    assert first["id"] == "expandable_segments" and "expandable_segments:True" in first["text"]

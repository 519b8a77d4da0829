"""The H200 recording of notebook 35 (benchmarks/record_lesson35_h200.py, shipped as
workbench/samples/results/h200_lesson35.json + the 99%/default-allocator snapshot): its structure, and the
facts the notebook states about it."""

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "workbench" / "samples" / "results"
PATH = RESULTS / "h200_lesson35.json"
GIB, MIB = 2**30, 2**20
LOCAL = re.compile(rb"/root/|/work/|/tmp/|/home/")


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def _recorder():
    spec = importlib.util.spec_from_file_location("record_lesson35_h200", ROOT / "benchmarks" / "record_lesson35_h200.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _steps(run):
    return run["steps"]


def test_env_and_config(rec):
    assert "H200" in rec["env"]["device"] and not rec["smoke"] and rec["notes"] == []
    cfg = rec["config"]
    assert cfg["headrooms_pct"] == [90, 95, 99]
    # the per-step lengths are the recorder's fixed-seed draw, inside the stated range
    assert cfg["seq_lengths"] == _recorder().seq_lengths(cfg, cfg["steps"])
    assert min(cfg["seq_lengths"]) >= cfg["seq_min"] and max(cfg["seq_lengths"]) == cfg["seq_max"]
    assert rec["wall_s"] < rec["budget_s"]


def test_no_local_paths():
    assert not LOCAL.search(PATH.read_bytes())
    snap = RESULTS / "h200_lesson35_99_off.snapshot.pickle.gz"
    assert not LOCAL.search(gzip.decompress(snap.read_bytes()))


def test_search_is_a_real_boundary(rec):
    cap = int(rec["config"]["cap_gib"] * GIB)
    for mode, s in rec["search"].items():
        assert "error" not in s, (mode, s.get("error"))
        assert s["alloc_conf"] == f"expandable_segments:{mode == 'on'}"
        tries = {t["batch_size"]: t for t in s["tries"]}
        assert tries[s["batch_size"]]["fits"] is True and tries[s["batch_size"] + 1]["fits"] is False
        assert tries[s["batch_size"] + 1]["reason"] == "out of memory"   # a real OOM ended the search
        assert s["peak_reserved_bytes"] <= cap
    assert rec["max_batch"] == rec["search"]["off"]["batch_size"] <= rec["search"]["on"]["batch_size"]


def test_estimator_against_the_search(rec):
    cap = int(rec["config"]["cap_gib"] * GIB)
    est, measured = rec["estimator"], rec["search"]["off"]
    assert "error" not in est and est["peak_reserved_bytes"] <= est["budget_bytes"] == cap
    tries = {t["batch_size"]: t for t in est["tries"]}
    assert tries[est["batch_size"] + 1]["fits"] is False          # its own boundary
    assert est["batch_size"] < measured["batch_size"]               # the estimator answers below the measured one
    at = tries[measured["batch_size"]]
    assert at["peak_allocated_bytes"] == pytest.approx(measured["peak_allocated_bytes"], rel=0.01)
    assert at["peak_reserved_bytes"] > measured["peak_reserved_bytes"]  # its reserved model is the pessimistic part


def test_runs_are_consistent(rec):
    cap = int(rec["config"]["cap_gib"] * GIB)
    assert sorted(rec["runs"]) == sorted(f"run_{p}_{m}" for p in (90, 95, 99) for m in ("off", "on"))
    for name, r in rec["runs"].items():
        assert "error" not in r, (name, r.get("error"))
        assert r["batch"] == rec["max_batch"] * r["headroom_pct"] // 100
        assert r["expandable_segments"] == name.endswith("_on")
        assert r["alloc_conf"] == f"expandable_segments:{r['expandable_segments']}"
        assert r["stopped"] is None and r["steps_done"] == len(r["steps"]) == r["steps_planned"]
        assert [s["seq"] for s in r["steps"]] == rec["config"]["seq_lengths"]
        assert r["ooms"] == sum(s["oom"] for s in r["steps"])
        assert r["eval_ooms"] == sum(e["oom"] for e in r["evals"])
        assert len(r["evals"]) == r["steps_planned"] // rec["config"]["eval_every"]
        # torch's own counter sees every error the loop caught
        assert r["stats"]["num_ooms"] == r["ooms"] + r["eval_ooms"]
        assert r["max_memory_allocated"] <= r["max_memory_reserved"] <= cap
        assert 0 <= r["cached_unused_share_end"] < 1
        peaks = [(s["peak_reserved"] - s["peak_allocated"]) / s["peak_reserved"] for s in r["steps"] if not s["oom"]]
        assert r["cached_unused_share_at_step_peak_max"] == pytest.approx(max(peaks))


def test_default_allocator_fails_on_the_longest_shape_expandable_never(rec):
    longest = rec["config"]["seq_max"]
    n_longest = sum(s == longest for s in rec["config"]["seq_lengths"])
    for p in rec["config"]["headrooms_pct"]:
        off, on = rec["runs"][f"run_{p}_off"], rec["runs"][f"run_{p}_on"]
        failed = [s for s in _steps(off) if s["oom"]]
        assert failed and all(s["seq"] == longest for s in failed)
        assert len(failed) > 0.8 * n_longest
        assert on["ooms"] == on["eval_ooms"] == off["eval_ooms"] == 0
        assert on["stats"]["num_alloc_retries"] == 0 < off["stats"]["num_alloc_retries"]
    # 99%: not one longest step ran with the default allocator
    assert rec["runs"]["run_99_off"]["ooms"] == n_longest


def test_failures_are_fragmentation_by_the_bounds(rec):
    """Per failure: free inside reserved >= reserved after the step - the step's peak allocated (nothing is
    given back after the catch) and room under the cap = cap - reserved; notebook 21's rule."""
    cap = int(rec["config"]["cap_gib"] * GIB)
    cfg = rec["config"]
    for p in cfg["headrooms_pct"]:
        r = rec["runs"][f"run_{p}_off"]
        failed = [s for s in _steps(r) if s["oom"]]
        requests = {float(re.search(r"Tried to allocate ([\d.]+) MiB", s["oom_message"]).group(1)) * MIB for s in failed}
        assert requests == {r["batch"] * cfg["seq_max"] * cfg["model"]["vocab"] * 4}   # the logits' size
        req = requests.pop()
        frag = [s["reserved"] - s["peak_allocated"] >= req > cap - s["reserved"] for s in failed]
        assert all(cap - s["reserved"] < req for s in failed)
        assert sum(frag) > 0.9 * len(frag)


def test_snapshot_matches_the_run(rec):
    pytest.importorskip("pandas")
    from workbench.analysis.memory.segments import allocator_state
    from workbench.analysis.memory.oom import analyze_snapshot, oom_postmortem
    from workbench.io.snapshot import load_snapshot

    r = rec["runs"]["run_99_off"]
    snap = load_snapshot(RESULTS / r["snapshot"]["file"])
    assert (RESULTS / r["snapshot"]["file"]).stat().st_size == r["snapshot"]["bytes"]
    assert snap.allocator_settings["expandable_segments"] is False
    a = analyze_snapshot(snap)
    assert oom_postmortem(snap, a) is None       # its history (the last steps) holds no OOM
    st = allocator_state(a.snap, a.allocs, a.peak["index"])
    last = r["steps"][-3:]
    assert min(abs(s["peak_allocated"] / st.allocated_bytes - 1) for s in last) < 1e-3
    assert st.reserved_bytes <= int(rec["config"]["cap_gib"] * GIB)

"""The H200 recording of notebook 35 (benchmarks/record_lesson35_h200.py): its structure, and the
relationships the notebook states."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATH = ROOT / "workbench" / "samples" / "results" / "h200_lesson35.json"


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def _recorder():
    spec = importlib.util.spec_from_file_location("record_lesson35_h200", ROOT / "benchmarks" / "record_lesson35_h200.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_env_and_config(rec):
    assert "H200" in rec["env"]["device"] and not rec["smoke"]
    cfg = rec["config"]
    assert cfg["headrooms_pct"] == [90, 95, 99]
    # the per-step lengths are the recorder's fixed-seed draw, inside the stated range
    assert cfg["seq_lengths"] == _recorder().seq_lengths(cfg, cfg["steps"])
    assert min(cfg["seq_lengths"]) >= cfg["seq_min"] and max(cfg["seq_lengths"]) == cfg["seq_max"]
    assert "/home/" not in json.dumps(rec) and "/tmp/" not in json.dumps(rec)


def test_search_is_a_real_boundary(rec):
    cap = int(rec["config"]["cap_gib"] * 2**30)
    for mode, s in rec["search"].items():
        assert "error" not in s, (mode, s.get("error"))
        tries = {t["batch_size"]: t["fits"] for t in s["tries"]}
        assert tries[s["batch_size"]] is True and tries[s["batch_size"] + 1] is False
        assert s["peak_reserved_bytes"] <= cap
    assert rec["max_batch"] == rec["search"]["off"]["batch_size"]
    est = rec["estimator"]
    assert "error" not in est and est["peak_reserved_bytes"] <= est["budget_bytes"] == cap


def test_runs_are_consistent(rec):
    cap = int(rec["config"]["cap_gib"] * 2**30)
    assert sorted(rec["runs"]) == sorted(f"run_{p}_{m}" for p in (90, 95, 99) for m in ("off", "on"))
    for name, r in rec["runs"].items():
        assert "error" not in r, (name, r.get("error"))
        assert r["batch"] == rec["max_batch"] * r["headroom_pct"] // 100
        assert r["expandable_segments"] == name.endswith("_on")
        assert r["alloc_conf"] == f"expandable_segments:{r['expandable_segments']}"
        assert 0 < r["steps_done"] == len(r["steps"]) <= r["steps_planned"]
        assert [s["seq"] for s in r["steps"]] == rec["config"]["seq_lengths"][: r["steps_done"]]
        assert r["ooms"] == sum(s["oom"] for s in r["steps"])
        assert r["eval_ooms"] == sum(e["oom"] for e in r["evals"])
        # torch's own counter sees every error the loop caught
        assert r["stats"]["num_ooms"] == r["ooms"] + r["eval_ooms"]
        assert r["max_memory_allocated"] <= r["max_memory_reserved"] <= cap
        assert 0 <= r["cached_unused_share_end"] < 1
        peaks = [(s["peak_reserved"] - s["peak_allocated"]) / s["peak_reserved"] for s in r["steps"] if not s["oom"]]
        assert r["cached_unused_share_at_step_peak_max"] == pytest.approx(max(peaks))

"""Memory v2 on the H200 recordings of benchmarks/record_memory_h200.py (tests/data/h200_memory/, README
there): torch's own numbers, written next to each snapshot by the recording process, are the truth."""

from __future__ import annotations

import json

import pytest
from testdata import data_path

from workbench.analysis.memory.diff import memory_diff
from workbench.analysis.memory.oom import analyze_snapshot, memory_summary, oom_postmortem
from workbench.io.snapshot import load_snapshot

MiB = 2**20


def _rec(name):
    d = data_path("h200_memory")
    meta = json.loads((d / f"{name}.json").read_text())
    snap = load_snapshot(d / f"{name}.snapshot.pickle.gz") if meta.get("snapshot") else None
    return meta, snap


@pytest.fixture(scope="module")
def pair():
    out = {}
    for p in ("fp32", "bf16"):
        meta, snap = _rec(f"pair_{p}")
        out[p] = (meta, snap, analyze_snapshot(snap))
    return out


# ------------------------------------------------------------------------------------- allocator settings

# -------------------------------------------------------------------------------------------- OOM causes

def test_fragmentation_oom_advice_is_what_fixed_it():
    meta, snap = _rec("oom_fragmented")
    fixed, _ = _rec("oom_fragmented_expandable")
    assert meta["oom"] and meta["free_in_reserved_before_request"] >= meta["request_bytes"]
    r = oom_postmortem(snap)
    assert r.cause == "fragmentation"
    assert r.advice[0]["text"].startswith("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert r.advice[0]["id"] == "expandable_segments" and r.advice[0]["what_if"]["fits"]
    # the same allocations, with the advice applied, in a fresh process on the H200: no OOM
    assert fixed["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and fixed["oom"] is False


# ------------------------------------------------------------------------------------ where in the step

# --------------------------------------------------------------------------------- what predates recording

def test_parameters_before_the_recording_are_inferred_from_adamw_state(pair):
    meta, snap, a = pair["fp32"]
    al = a.allocs
    addrs = {p["addr"]: p["nbytes"] for p in meta["parameters"]}
    rows = al[al["addr"].isin(list(addrs)) & al["preexisting"]]
    assert len(rows) == len(addrs)  # every parameter predates the recording
    assert set(rows["category"].astype(str)) == {"parameters"}
    assert (rows["confidence"] >= 0.8).all()
    assert rows["reason"].str.contains("optimizer state").all()
    # the state tensors alive at the end (their addresses served other tensors earlier)
    state = al[al["addr"].isin([s["addr"] for s in meta["optimizer_state"]]) & (al["free_index"] >= al.attrs["n_events"])]
    assert len(state) == len(meta["optimizer_state"]) and set(state["category"].astype(str)) == {"optimizer_state"}


# ----------------------------------------------------------------------------------------- diff and peaks

def test_pair_peaks_are_torchs(pair):
    # within 0.5%: blocks freed before the snapshot that the allocator handed out whole (the remainder
    # too small to split) are counted at their request's size (docs/memory.md, "How a snapshot is read")
    for p, (meta, snap, a) in pair.items():
        assert a.peak["allocated_bytes"] == pytest.approx(meta["max_memory_allocated"], rel=0.005), p
        assert a.peak["allocated_bytes"] <= meta["max_memory_allocated"]


def test_pair_diff_on_the_step_axis(pair):
    (mb, _, a32), (mt, _, a16) = pair["fp32"], pair["bf16"]
    d = memory_diff(a32, a16)
    s = d.summary()
    assert s["axis"] == "step" and s["base"]["steps_method"] == "annotations"
    assert s["base"]["steps"] == mb["steps"] and s["test"]["steps"] == mt["steps"]
    for side, meta in ((s["base"], mb), (s["test"], mt)):
        got = [x["peak_allocated_bytes"] for x in side["per_step"]]
        want = [x["max_memory_allocated"] for x in meta["per_step"]]
        assert got == pytest.approx(want, rel=0.005)
        assert [x["name"] for x in side["per_step"]] == [f"ProfilerStep#{i}" for i in range(meta["steps"])]
    # torch: bf16 autocast lowers this model's peak by about a fifth
    want = mt["max_memory_allocated"] - mb["max_memory_allocated"]
    assert s["peak_allocated_delta_bytes"] == pytest.approx(want, rel=0.02) and want < 0
    cats = {r["category"]: r for r in s["by_category"]}
    assert cats["activations"]["delta_bytes"] < 0  # bf16 autocast keeps half-size activations
    assert sum(r["base_bytes"] for r in s["by_category"]) == s["base"]["peak_allocated_bytes"]


def test_cached_unused_share_at_the_end_is_torchs(pair):
    for p, (meta, snap, a) in pair.items():
        s = memory_summary(snap, analysis=a)
        want = (meta["end_reserved"] - meta["end_allocated"]) / meta["end_reserved"]
        assert s["cached_unused_share"] == pytest.approx(want, abs=1e-4), p


def test_settings_of_a_snapshot_recorded_with_expandable_segments():
    # written by the OOM observer during the batch search of the first run (history off by then): the
    # allocator's settings are in it all the same, and with no history nothing is guessed as parameters
    snap = load_snapshot(data_path("h200_memory", "oom_forward_expandable.snapshot.pickle.gz"))
    meta = json.loads(data_path("h200_memory", "oom_forward_expandable.json").read_text())
    assert meta["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    s = memory_summary(snap)
    st = s["allocator_settings"]
    assert st["recorded"] and st["expandable_segments"] is True and st["conf"] == "expandable_segments:True"
    assert st["max_split_size_bytes"] is None and st["garbage_collection_threshold"] is None
    assert st["roundup_power2_divisions"] is None
    assert s["source"]["expandable_segments"] is True and s["events"] == 0
    cats = {r["category"]: r["bytes"] for r in s["peak"]["by_category"]}
    # blocks with their allocation stack (module __init__) are parameters; the stackless rest stays unknown
    assert set(cats) == {"parameters", "unknown"} and cats["unknown"] > 4 * 2**30
    # torch's own numbers at that OOM: the cap was 6 GiB and the run had reserved nearly all of it
    assert s["reserved_bytes"] <= meta["cap_bytes"]


def test_diff_with_a_snapshot_without_history(pair):
    # one side has no history (only its segments): one axis in ms, its peak is its state
    bare = analyze_snapshot(load_snapshot(data_path("h200_memory", "oom_forward_expandable.snapshot.pickle.gz")))
    meta, _, a32 = pair["fp32"]
    s = memory_diff(bare, a32).summary()
    assert s["axis"] == "ms" and s["base"]["events"] == 0 and s["base"]["steps"] == 0
    assert s["base"]["peak_allocated_bytes"] == int(bare.snap.segments["allocated_size_bytes"].sum())
    assert s["test"]["peak_allocated_bytes"] == pytest.approx(meta["max_memory_allocated"], rel=0.005)

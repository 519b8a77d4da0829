"""Memory analysis on the real H200 snapshots, checked against independent numbers: torch's own OOM
message, the peak torch reported while recording, the raw pickle's blocks, and torch.profiler's
category timeline of the same model."""

from __future__ import annotations

import gzip
import json
import pickle

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.analysis.memory.segments import allocator_state, allocator_state_timeline, segment_layout
from workbench.analysis.memory.allocations import (
    CATEGORIES,
    allocation_categories,
    allocations,
    category_timeline,
    group_live,
    live_allocations,
    memory_timeline,
    peak_memory,
    profiler_category_peak,
    stack_features,
    surviving_allocations,
    user_frame_labels,
)
from workbench.analysis.memory.oom import analyze_snapshot, memory_summary, oom_postmortem
from workbench.io.profiler_memory import load_memory_timeline
from workbench.io.snapshot import load_snapshot, snapshot_from_dict
from workbench.units import format_bytes

from testdata import data_path

OOM = samples.path("h200_oom_snapshot")
TRAIN = samples.path("h200_train_snapshot")
MiB, GiB = 2**20, 2**30



def _raw(path):
    with gzip.open(path) as f:
        return pickle.load(f)


# --------------------------------------------------------------------------------------------- timeline

def test_peak_matches_what_torch_reported_while_recording(train):
    # workbench/samples/README.md: "peak allocated 1,222,204,928 B" (torch.cuda.max_memory_allocated)
    assert train.peak["allocated_bytes"] == 1_222_204_928


def test_timeline_ends_at_the_snapshot_state(train, oom):
    for a, path in ((train, TRAIN), (oom, OOM)):
        raw = _raw(path)
        assert a.timeline["allocated_bytes"].iloc[-1] == sum(s["allocated_size"] for s in raw["segments"])
        assert a.timeline["reserved_bytes"].iloc[-1] == sum(s["total_size"] for s in raw["segments"])
        assert len(a.timeline) == len(raw["device_traces"][0])


def test_timeline_steps_follow_the_events(train):
    """Between consecutive events the allocated total moves by exactly the event's (rounded) size."""
    tl = train.timeline
    raw = _raw(TRAIN)["device_traces"][0]
    d = np.diff(np.r_[tl.attrs["start_allocated_bytes"], tl["allocated_bytes"].to_numpy()])
    live_end = set(train.allocs.loc[train.allocs["free_index"] >= len(tl), "alloc_index"].tolist())
    for i, e in enumerate(raw):
        rounded = max(512, -(-e["size"] // 512) * 512)
        if e["action"] == "alloc":
            assert d[i] == rounded or (i in live_end and d[i] >= rounded), i
        elif e["action"] == "free_completed":
            assert d[i] <= -rounded or d[i] == -rounded, i
        else:
            assert d[i] == 0, i


def test_live_at_peak_adds_up(train, oom):
    for a in (train, oom):
        live = live_allocations(a.allocs, a.peak["index"])
        assert live["size_bytes"].sum() == a.peak["allocated_bytes"]
        assert live["size_bytes"].is_monotonic_decreasing


def test_preexisting_allocations_explain_the_start(train):
    tl, al = train.timeline, train.allocs
    assert al.loc[al["alloc_index"] < 0, "size_bytes"].sum() == tl.attrs["start_allocated_bytes"]


def test_category_timeline_sums_to_allocated(train):
    ct = category_timeline(train.snap, train.allocs, train.timeline)
    total = ct[[f"{c}_bytes" for c in CATEGORIES]].sum(axis=1).to_numpy()
    assert np.array_equal(total, train.timeline["allocated_bytes"].to_numpy())


# --------------------------------------------------------------------------------------------- stacks

def test_user_frames_skip_torch_internals(train, oom):
    labels = user_frame_labels(oom.snap)
    g = group_live(oom.live_at(oom.peak["index"]), labels, "frame")
    top = g.iloc[0]
    assert top["frame"] == "probe/gpu_probe.py:66 forward"  # the user's model code, not torch/nn
    assert not any("site-packages/torch" in f for f in g["frame"])
    gf = group_live(oom.live_at(oom.peak["index"]), labels, "function")
    assert "probe/gpu_probe.py:forward" in set(gf["function"])
    assert g["bytes"].sum() == gf["bytes"].sum() == oom.peak["allocated_bytes"]


def test_stack_features_see_optimizer_and_backward(train):
    f = stack_features(train.snap)
    assert f["optimizer"].sum() > 0 and f["backward"].sum() > 0 and f["forward"].sum() > 0
    # every stack flagged optimizer really has a torch/optim frame
    for sid in np.flatnonzero(f["optimizer"].to_numpy()):
        assert any("torch/optim/" in fn for fn in train.snap.stack_frames(int(sid))["filename"])


# --------------------------------------------------------------------------------------------- categories

def test_categories_agree_with_the_profilers_timeline(train):
    """torch.profiler's own category timeline of the same model (samples/h200_train.memory_timeline)
    saw 75,657,216 B of parameters and 151,314,432 B of optimizer state; the snapshot's stack-based
    categories must find the same."""
    prof = load_memory_timeline(samples.path("h200_memory_timeline"))
    live = train.live_at(train.peak["index"])
    # the profiler counts tensor bytes (what was requested), the allocator whole blocks
    by = live.groupby("category", observed=True)["requested_bytes"].sum()
    assert by["parameters"] == prof["parameters_bytes"].max() == 75_657_216
    assert by["optimizer_state"] == prof["optimizer_state_bytes"].max() == 151_314_432
    # activations dominate the peak, as in the profiler's timeline
    assert by.idxmax() == "activations"
    pk = profiler_category_peak(prof)
    assert pk["by_category"]["activations"] == max(pk["by_category"].values())
    assert pk["confidence"] == 1.0


def test_every_attribution_has_a_confidence_and_reason(train):
    al = train.allocs
    assert set(al["category"].astype(str)) <= set(CATEGORIES)
    assert al["confidence"].between(0, 1).all() and al["reason"].str.len().gt(0).all()
    strong = al[al["category"].astype(str) == "parameters"]
    assert (strong["confidence"] >= 0.9).all()


def test_profiler_timeline_raw_form_matches_independent_sum():
    path = data_path("hta_memory_timeline.raw.gz")
    rows = json.loads(gzip.decompress(path.read_bytes()))
    frame = load_memory_timeline(path)
    expected = {}
    for _t, _action, nbytes, cat in rows:
        expected[cat] = expected.get(cat, 0) + nbytes
    last = frame.iloc[-1]
    from workbench.io.profiler_memory import PROFILER_CATEGORIES

    for i, name in enumerate(PROFILER_CATEGORIES):
        assert last[f"{name}_bytes"] == expected.get(i, 0), name
    assert frame["time_us"].is_monotonic_increasing


# --------------------------------------------------------------------------------------------- allocator state

@pytest.mark.parametrize("path", [TRAIN, OOM])
def test_reconstructed_holes_are_the_inactive_blocks(path):
    snap = load_snapshot(path)
    al = allocations(snap)
    lay = segment_layout(snap, al)
    raw = _raw(path)
    holes = sorted(lay.loc[lay["free"], "size_bytes"].tolist())
    inactive = sorted(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "inactive")
    assert holes == inactive
    used = sorted(lay.loc[~lay["free"], "size_bytes"].tolist())
    active = sorted(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert used == active


def test_allocator_state_over_time_is_consistent(train):
    st = allocator_state_timeline(train.snap, train.allocs, points=40, extra_indices=[train.peak["index"]])
    assert len(st) >= 40 and train.peak["index"] in set(st["index"])
    tl = train.timeline.set_index("index")
    assert np.array_equal(st["allocated_bytes"].to_numpy(), tl.loc[st["index"], "allocated_bytes"].to_numpy())
    assert np.array_equal(st["reserved_bytes"].to_numpy(), tl.loc[st["index"], "reserved_bytes"].to_numpy())
    assert (st["free_in_reserved_bytes"] == st["reserved_bytes"] - st["allocated_bytes"]).all()
    assert st["fragmentation"].between(0, 1).all()
    assert (st["largest_free_block_bytes"] <= st["free_in_reserved_bytes"]).all()


# --------------------------------------------------------------------------------------------- OOM

def test_oom_postmortem_agrees_with_torchs_message(oom):
    # torch: "4.19 GiB allowed; 3.94 GiB allocated by PyTorch, 255.59 MiB reserved but unallocated"
    r = oom_postmortem(oom.snap, oom)
    assert r.requested_bytes == 1_073_741_824
    assert round(r.allocated_bytes / GiB, 2) == 3.94
    assert round(r.free_in_reserved_bytes / MiB, 2) == 255.59
    assert round(r.reserved_bytes / GiB, 2) == 4.19
    assert format_bytes(r.free_in_reserved_bytes) == "255.59 MiB"
    assert r.cause == "capacity"
    assert r.largest_free_block_bytes < r.requested_bytes
    # no cap recorded: short by the request minus what the large pool (the only one serving >1 MiB) had free
    raw = _raw(OOM)
    large_free = sum(b["size"] for s in raw["segments"] if s["segment_type"] == "large"
                     for b in s["blocks"] if b["state"] == "inactive")
    assert r.pool == "large" and r.shortfall_bytes == r.requested_bytes - large_free
    text = "\n".join(x["text"] for x in r.advice)
    for needle in ("Reduce the batch", "checkpoint", "autocast", "GiB"):
        assert needle in text, needle
    # a capacity OOM (1 GiB asked, 256 MiB free in reserved): allocator settings cannot help, none advised
    assert "expandable_segments:True" not in text and "max_split_size_mb" not in text
    # 8 blocks (its parameter sizes), died in the first block's forward; the whole step, not what was live
    # when the request failed, sets the cut: the estimator's 91% (largest batch 6 of 64), not 24%
    assert r.position["phase"] == "forward" and r.position["layers"] == 8 and r.position["layer"] == 1
    assert r.step_need["optimizer_state_assumed"]
    assert 88 <= r.step_need["batch_cut_pct"] <= 95
    r64 = oom_postmortem(oom.snap, oom, batch_size=64)
    assert r64.step_need["largest_batch"] in (5, 6, 7)
    # the advice item (issue 31) replays the same step through the allocator model: the same batch
    item = r64.advice[0]
    assert item["id"] == "batch" and item["largest_batch"] in (5, 6, 7) and item["what_if"]["fits"]
    assert r.by_category["activations"]["bytes"] > r.by_category["parameters"]["bytes"]
    assert r.top_live[0]["bytes"] == 1_073_741_824


def test_no_oom_gives_none(train):
    assert oom_postmortem(train.snap, train) is None


def _synthetic(free_pattern_mib, request_mib, seg_mib=100, block_mib=5, stack=None):
    """One large segment cut into equal blocks; blocks whose index is in free_pattern are freed again,
    then an allocation of request_mib fails. Returns the snapshot dict (trace + final state)."""
    base = 1 << 40
    frames = stack or [{"name": "step", "filename": "train.py", "line": 3}]
    ev = [{"action": "segment_alloc", "addr": base, "size": seg_mib * MiB, "stream": 0, "time_us": 0, "frames": frames}]
    n = seg_mib // block_mib
    t = 1
    for i in range(n):
        ev.append({"action": "alloc", "addr": base + i * block_mib * MiB, "size": block_mib * MiB, "stream": 0,
                   "time_us": t, "frames": frames})
        t += 1
    for i in free_pattern_mib:
        for act in ("free_requested", "free_completed"):
            ev.append({"action": act, "addr": base + i * block_mib * MiB, "size": block_mib * MiB, "stream": 0,
                       "time_us": t, "frames": frames})
            t += 1
    ev.append({"action": "oom", "addr": 0, "size": request_mib * MiB, "stream": 0, "time_us": t,
               "device_free": 0, "frames": frames})
    blocks = []
    freed = set(free_pattern_mib)
    # the allocator merges neighbouring free blocks
    i = 0
    while i < n:
        if i in freed:
            j = i
            while j < n and j in freed:
                j += 1
            blocks.append({"address": base + i * block_mib * MiB, "size": (j - i) * block_mib * MiB,
                           "requested_size": 0, "state": "inactive", "frames": []})
            i = j
        else:
            blocks.append({"address": base + i * block_mib * MiB, "size": block_mib * MiB,
                           "requested_size": block_mib * MiB, "state": "active_allocated", "frames": frames})
            i += 1
    used = (n - len(freed)) * block_mib * MiB
    seg = {"device": 0, "address": base, "total_size": seg_mib * MiB, "allocated_size": used, "active_size": used,
           "requested_size": used, "stream": 0, "segment_type": "large", "is_expandable": False, "frames": [],
           "blocks": blocks}
    return {"segments": [seg], "device_traces": [ev], "allocator_settings": {}}


def test_fragmentation_oom_is_told_from_capacity():
    # every other 5 MiB block freed: 50 MiB free in 10 holes of 5 MiB; a 20 MiB request cannot fit
    snap = snapshot_from_dict(_synthetic(range(0, 20, 2), 20), "synthetic-frag")
    r = oom_postmortem(snap)
    assert r.cause == "fragmentation"
    assert r.free_in_reserved_bytes == 50 * MiB and r.largest_free_block_bytes == 5 * MiB
    # the first allocator-setting advice; replayed with 20 MiB pages on a full device (no cap known: what was
    # reserved is all there is), 5 MiB holes free no page: it does not fit, and the item says so
    exp = [x for x in r.advice if x["id"] != "bigger_gpu"][0]
    assert exp["id"] == "expandable_segments" and exp["what_if"]["cap_bytes"] == 100 * MiB
    assert "expandable_segments:True" in exp["text"] and "50.00 MiB" in exp["text"]
    st = allocator_state(snap, analyze_snapshot(snap).allocs)
    assert st.free_blocks == 10 and st.fragmentation == pytest.approx(1 - 5 / 50)
    # the same holes, but a request larger than all free memory: capacity
    r2 = oom_postmortem(snapshot_from_dict(_synthetic(range(0, 20, 2), 60), "synthetic-cap"))
    assert r2.cause == "capacity" and r2.shortfall_bytes == 10 * MiB
    # contiguous free space that fits: then it is not fragmentation either (capacity: the cap refused)
    r3 = oom_postmortem(snapshot_from_dict(_synthetic(range(0, 4), 20), "synthetic-contig"))
    assert r3.largest_free_block_bytes == 20 * MiB and r3.cause == "capacity"


def test_cap_from_the_sidecar_changes_the_shortfall():
    snap = snapshot_from_dict(_synthetic(range(0, 20, 2), 60), "synthetic-cap")
    snap.extra["oom"] = {"limit_bytes": 105 * MiB, "torch_message": None}
    r = oom_postmortem(snap)
    assert r.cap_bytes == 105 * MiB
    assert r.shortfall_bytes == 60 * MiB - 50 * MiB - 5 * MiB
    snap.extra["oom"] = {"torch_message": "Tried to allocate 60.00 MiB. ... 1.50 GiB allowed; ..."}
    assert oom_postmortem(snap).cap_bytes == int(1.5 * GiB)


def test_leak_across_steps_is_flagged():
    frames_leak = [{"name": "step", "filename": "leaky.py", "line": 10}]
    frames_tmp = [{"name": "step", "filename": "train.py", "line": 20}]
    base = 1 << 40
    ev = [{"action": "segment_alloc", "addr": base, "size": 200 * MiB, "stream": 0, "time_us": 0, "frames": []}]
    t, leaked = 1, []
    for step in range(20):
        a = base + step * 2 * MiB
        ev.append({"action": "alloc", "addr": a, "size": MiB, "stream": 0, "time_us": t, "frames": frames_leak})
        leaked.append(a)
        tmp = base + 100 * MiB
        ev.append({"action": "alloc", "addr": tmp, "size": MiB, "stream": 0, "time_us": t + 1, "frames": frames_tmp})
        ev.append({"action": "free_completed", "addr": tmp, "size": MiB, "stream": 0, "time_us": t + 2,
                   "frames": frames_tmp})
        t += 3
    blocks, cur = [], base
    for a in leaked:
        if a > cur:
            blocks.append({"address": cur, "size": a - cur, "state": "inactive", "frames": []})
        blocks.append({"address": a, "size": MiB, "state": "active_allocated", "frames": frames_leak})
        cur = a + MiB
    blocks.append({"address": cur, "size": base + 200 * MiB - cur, "state": "inactive", "frames": []})
    seg = {"device": 0, "address": base, "total_size": 200 * MiB, "allocated_size": 20 * MiB, "blocks": blocks}
    snap = snapshot_from_dict({"segments": [seg], "device_traces": [ev]}, "synthetic-leak")
    s = memory_summary(snap)
    leak = [f for f in s["findings"] if f["id"] == "growing_allocations"]
    assert leak and leak[0]["evidence"]["frame"] == "leaky.py:10 step" and leak[0]["evidence"]["count"] == 20
    a = analyze_snapshot(snap)
    surv = surviving_allocations(a.allocs, a.labels)
    assert surv.iloc[0]["bytes"] == 20 * MiB and bool(surv.iloc[0]["leak_like"])


def test_findings_are_rules_over_the_analysis(oom, train):
    from workbench.analysis.findings import Finding

    fs = oom.findings
    assert fs is oom.findings and all(isinstance(f, Finding) for f in fs)  # computed once
    assert [f.id for f in fs] == ["oom_capacity"] and fs[0].severity == "critical"
    assert fs[0].evidence["requested_bytes"] == oom.oom.requested_bytes
    assert memory_summary(oom.snap, analysis=oom)["findings"] == [f.as_dict() for f in fs]
    assert train.findings == ()
    with pytest.raises(ValueError, match="severity"):
        Finding("x", "severe", "not a severity")


def test_history_that_starts_mid_run_is_said():
    # five frees of blocks allocated before the first recorded event, then one allocation
    ev = [{"action": "free_completed", "addr": (1 << 40) + i * MiB, "size": MiB, "stream": 0, "time_us": i,
           "frames": []} for i in range(5)]
    ev.append({"action": "alloc", "addr": (1 << 40) + 10 * MiB, "size": MiB, "stream": 0, "time_us": 10,
               "frames": [{"name": "step", "filename": "train.py", "line": 20}]})
    a = analyze_snapshot(snapshot_from_dict({"segments": [], "device_traces": [ev]}, "synthetic-truncated"))
    assert [(f.id, f.evidence) for f in a.findings] == [("history_truncated", {"preexisting_freed": 5})]


def test_no_leak_finding_on_real_training(train):
    s = memory_summary(train.snap, analysis=train)
    assert not [f for f in s["findings"] if f["id"] == "growing_allocations"]


# --------------------------------------------------------------------------------------------- summary

def test_summary_has_the_design_keys(oom):
    s = memory_summary(oom.snap, analysis=oom)
    for k in ("source", "events", "segments", "peak", "allocated_bytes", "reserved_bytes", "oom", "findings"):
        assert k in s
    assert set(s["peak"]) >= {"allocated_bytes", "top_allocations"}
    assert set(s["oom"]) >= {"requested_bytes", "allocated_bytes", "reserved_bytes", "free_in_reserved_bytes",
                             "largest_free_block_bytes", "cause", "advice"}
    assert s["events"] == 150 and s["segments"] == 36
    assert [f["id"] for f in s["findings"]][0] == "oom_capacity"
    assert all({"id", "severity", "message", "evidence"} <= set(f) for f in s["findings"])
    json.dumps(s)  # plain JSON types only


def test_multi_device_snapshot_picks_a_device():
    d0 = _synthetic(range(0, 20, 2), 20)
    d1 = _synthetic([], 1)
    for s in d1["segments"]:
        s["device"] = 1
        s["address"] += 1 << 41
        for b in s["blocks"]:
            b["address"] += 1 << 41
    ev1 = [dict(e, addr=e["addr"] + (1 << 41)) for e in d1["device_traces"][0] if e["action"] != "oom"]
    snap = snapshot_from_dict({"segments": d0["segments"] + d1["segments"], "device_traces": [d0["device_traces"][0], ev1]})
    assert snap.devices == [0, 1]
    a0 = analyze_snapshot(snap)  # the device with the OOM
    assert a0.device == 0
    a1 = analyze_snapshot(snap, device=1)
    assert a1.timeline["allocated_bytes"].iloc[-1] == 100 * MiB
    assert len(a1.timeline) == len(ev1)


# --------------------------------------------------------------------------------------------- profiler memory events

def test_profiler_memory_events_match_the_snapshot_of_the_same_run(train):
    """samples/h200_train_step (torch.profiler, profile_memory) and samples/h200_train_snapshot were
    recorded on the same steps: two artifacts, one answer."""
    from workbench.io.profiler_memory import load_profiler_memory

    snap = load_profiler_memory(samples.path("h200_train_step"))
    assert snap.layout == "profiler" and snap.extra["device_type"] == "cuda"
    a = analyze_snapshot(snap)
    # the running total the profiler printed with every event is reproduced exactly
    assert np.array_equal(a.timeline["allocated_bytes"].to_numpy(), snap.extra["total_allocated_bytes"])
    assert np.array_equal(a.timeline["reserved_bytes"].to_numpy(), snap.extra["reserved_bytes"])
    assert a.peak["allocated_bytes"] == train.peak["allocated_bytes"] == 1_222_204_928
    acts = a.live_at(a.peak["index"]).groupby("category", observed=True)["size_bytes"].sum()["activations"]
    acts_snap = train.live_at(train.peak["index"]).groupby("category", observed=True)["size_bytes"].sum()["activations"]
    assert acts == acts_snap
    top = group_live(a.live_at(a.peak["index"]), a.labels, "frame").iloc[0]
    assert top["frame"].startswith("gpu_probe.py:") and top["frame"].endswith("forward")


def test_profiler_memory_errors(tmp_path):
    from workbench.errors import BadArtifact
    from workbench.io.profiler_memory import load_profiler_memory

    with pytest.raises(BadArtifact, match="no memory events"):
        load_profiler_memory(samples.path("cpu_only"))
    with pytest.raises(BadArtifact, match="no cpu memory events|no such"):
        f = tmp_path / "t.json"
        f.write_text(json.dumps({"traceEvents": [{"name": "[memory]", "ph": "i", "ts": 1, "args": {
            "Device Type": 1, "Bytes": 512, "Addr": 1, "Total Allocated": 512}}]}))
        load_profiler_memory(f, device="cpu")
    with pytest.raises(BadArtifact, match="not a readable"):
        f = tmp_path / "bad.json"
        f.write_text("{")
        load_profiler_memory(f)


def test_cpp_only_stacks_name_their_backward_node_not_a_shape_function():
    """Autograd's worker thread allocates with C++-only stacks: the label is the backward node it ran in
    (AddmmBackward0), never a shape function (at::meta::structured_mm) or a '??:0' frame."""
    from workbench.analysis.memory.allocations import user_frame_labels
    from workbench.io import load_snapshot

    snap = load_snapshot(samples.path("h200_train_snapshot"))
    labels = user_frame_labels(snap)["frame"]
    names = snap.frames["name"].astype(str).to_numpy()
    assert not any(lab.startswith("??") or "at::meta::" in lab for lab in labels)
    for sid, st in enumerate(snap.stacks):
        frames = [names[f] for f in st]
        nodes = [n for n in frames if n.startswith("torch::autograd::generated::") and "::apply(" in n]
        python = [f for f in st if str(snap.frames["filename"].iloc[f]).endswith(".py")]
        if nodes and not python:
            want = nodes[0].split("::")[3]
            assert labels[sid] == f"{want} (autograd backward)", (labels[sid], nodes[0])
    assert "AddmmBackward0 (autograd backward)" in labels

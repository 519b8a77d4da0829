"""Two allocator snapshots on one axis: ``workbench diff A.pickle.gz B.pickle.gz`` and
``MemoryPanel.compare`` on the shipped H200 snapshots (recorded numbers as truth)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.memory.diff import aligned_timeline, memory_diff
from workbench.analysis.memory.oom import analyze_snapshot
from workbench.analysis.memory.steps import step_boundaries
from workbench.cli import main
from workbench.io.snapshot import load_snapshot

TRAIN = str(samples.path("h200_train_snapshot"))
OOM = str(samples.path("h200_oom_snapshot"))
TRACE = str(samples.path("h200_train_step"))



def test_steps_of_the_training_snapshot(train):
    # 3 AdamW steps were recorded; the optimizer's own ranges say so, and the allocation pattern alone
    # (no annotations) finds the same two later boundaries
    s = step_boundaries(train.snap, train.device)
    assert s["method"] == "optimizer_annotations" and len(s["starts"]) == 3
    no_ann = load_snapshot(TRAIN)
    no_ann.annotations = no_ann.annotations.iloc[0:0]
    p = step_boundaries(no_ann, train.device)
    assert p["method"] == "allocation_pattern" and p["starts"][1:] == s["starts"][1:]
    tl = aligned_timeline(train, s)
    assert tl.attrs["axis"] == "step"
    assert np.all(np.diff(tl["x"].to_numpy()) >= 0)  # monotone on the step axis
    for k, start in enumerate(s["starts"]):
        assert tl["x"].iloc[start] == pytest.approx(k)


def test_diff_of_a_snapshot_with_itself_is_zero(capsys):
    assert main(["diff", TRAIN, TRAIN, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "memory" and doc["axis"] == "step"
    assert doc["peak_allocated_delta_bytes"] == 0 and doc["peak_reserved_delta_bytes"] == 0
    assert all(r["delta_bytes"] == 0 for r in doc["by_category"] + doc["by_frame"])


def test_peak_vs_peak_by_category_and_frame(capsys, train, oom):
    assert main(["diff", TRAIN, OOM, "--json", "--top", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # torch's numbers (workbench/samples/README.md): peak allocated 1,222,204,928 B for the training run;
    # the OOM's last successful allocation left 3.94 GiB allocated + the 1 GiB block it had just made
    assert doc["base"]["peak_allocated_bytes"] == 1_222_204_928
    assert doc["test"]["peak_allocated_bytes"] == oom.peak["allocated_bytes"]
    assert doc["base"]["steps"] == 3 and doc["test"]["steps"] == 1
    assert doc["peak_allocated_delta_bytes"] == doc["test"]["peak_allocated_bytes"] - 1_222_204_928
    # the categories split each peak exactly
    assert sum(r["base_bytes"] for r in doc["by_category"]) == 1_222_204_928
    assert sum(r["test_bytes"] for r in doc["by_category"]) == doc["test"]["peak_allocated_bytes"]
    cats = {r["category"]: r for r in doc["by_category"]}
    assert cats["optimizer_state"]["test_bytes"] == 0 and cats["optimizer_state"]["base_bytes"] > 0
    assert len(doc["by_frame"]) == 5
    deltas = [abs(r["delta_bytes"]) for r in doc["by_frame"]]
    assert deltas == sorted(deltas, reverse=True)
    # the three steps' peaks: the first (no optimizer state yet) is the lowest
    ps = [s["peak_allocated_bytes"] for s in doc["base"]["per_step"]]
    assert max(ps) == 1_222_204_928 and ps[0] < ps[1]


def test_text_and_html(capsys, tmp_path):
    out = tmp_path / "m.html"
    assert main(["diff", TRAIN, OOM, "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert "peak allocated: 1.14 GiB -> 3.94 GiB" in text and "by category at each peak" in text
    html = out.read_text()
    assert "Peak vs peak" in html and "plotly" in html.lower()


def test_a_trace_and_a_snapshot_are_refused(capsys):
    assert main(["diff", TRAIN, TRACE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace" in err[0] and "snapshot" in err[0]


def test_panel_compare(train, oom):
    from workbench.panels.memory import MemoryPanel

    c = MemoryPanel.compare(train, oom, labels=("train", "oom"))
    assert c.diff is not None and c.diff.axis == "step"
    names = [t.name for t in c.figure.data]
    assert {"train allocated", "oom allocated", "train reserved", "oom reserved"} <= set(names)
    assert "train" in c.table.value and "By category" in c.table.value
    assert "wb-memory-compare" in c._dom_classes


def test_memory_diff_without_steps_falls_back_to_ms(train):
    # a history without annotations and without telling stacks has no step boundaries: the axis is ms
    snap = load_snapshot(TRAIN)
    snap.annotations = snap.annotations.iloc[0:0]
    snap.stacks = [()] * len(snap.stacks)
    bare = analyze_snapshot(snap)
    d = memory_diff(train, bare)
    assert d.axis == "ms" and d.base_side["steps"] == 0
    assert d.base_side["peak_allocated_bytes"] == d.test_side["peak_allocated_bytes"] == 1_222_204_928


def test_block_position_in_the_forward_of_the_six_layer_snapshot(train):
    # the training sample is a 6-layer transformer (workbench/samples/README.md): each step's forward makes
    # 108 allocations, 18 per block; from the 3rd allocation of block 2 on, every position is placed
    from workbench.analysis.memory.steps import event_phases, oom_position
    from workbench.io.snapshot import Action

    snap = train.snap
    ph = event_phases(snap, train.device)
    starts = step_boundaries(snap, train.device, ph)["starts"]
    codes = snap.events["action"].cat.codes.to_numpy()
    fwd = [i for i in range(starts[2], len(ph)) if ph[i] == "forward" and codes[i] == int(Action.ALLOC)]
    assert len(fwd) == 108
    for pos in range(20, 108, 7):
        r = oom_position(snap, train, fwd[pos], ph)
        assert r["layers"] == 6 and r["phase"] == "forward" and r["step"] == 3
        assert r["layer"] == pos // 18 + 1, (pos, r)
    r = oom_position(snap, train, fwd[-1], ph)
    assert r["text"] == "forward of block 6 of 6, step 3" and r["confidence"] >= 0.8
    # 5 complete blocks before it hold the same live bytes each
    assert r["forward_total_bytes"] == r["prefix_bytes"] + 6 * r["block_bytes"]

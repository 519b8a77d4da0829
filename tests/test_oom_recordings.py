"""The OOM post-mortem on the H200 recordings of benchmarks/record_oom_h200.py (tests/data/h200_memory/,
README there): torch's own numbers, read inside the recording process (the OOM observer's
``memory_stats()``, the forward hooks, real two-step runs under the same cap), are the truth."""

from __future__ import annotations

import json
import math
import sys

import pytest
from testdata import ROOT, data_path

from workbench.analysis.memory.oom import analyze_snapshot, memory_summary, oom_postmortem
from workbench.io.snapshot import load_snapshot
from workbench.units import format_bytes

MiB = 2**20


def _rec(name):
    d = data_path("h200_memory")
    meta = json.loads((d / f"{name}.json").read_text()) if (d / f"{name}.json").exists() else {}
    snap = load_snapshot(d / f"{name}.snapshot.pickle.gz")
    return meta, snap


@pytest.fixture(scope="module", params=["oom_midforward", "oom_midforward_expandable"])
def forward(request):
    meta, snap = _rec(request.param)
    a = analyze_snapshot(snap)
    return request.param, meta, snap, a, oom_postmortem(snap, a, batch_size=meta["batch"])


ALL = ["oom_midforward", "oom_midforward_expandable", "oom_capacity", "oom_capacity_expandable"]


@pytest.mark.parametrize("name", ALL)
def test_allocator_state_at_the_oom_is_torchs(name):
    # torch's memory_stats() read inside the OOM observer, the moment the request failed; with
    # expandable segments too (the snapshot lists the mapped ranges, the history the pieces mapped)
    _, snap = _rec(name)
    st = snap.extra["oom"]["memory_stats"]
    r = oom_postmortem(snap)
    assert r.requested_bytes == snap.extra["oom"]["requested_bytes"]
    assert r.cap_bytes == snap.extra["oom"]["limit_bytes"]
    assert r.allocated_bytes == st["allocated_bytes.all.current"]
    assert r.reserved_bytes == st["reserved_bytes.all.current"]
    assert r.free_in_reserved_bytes == st["reserved_bytes.all.current"] - st["allocated_bytes.all.current"]
    assert r.cause == "capacity" and r.free_in_reserved_bytes < r.requested_bytes


def test_the_recordings_are_what_they_say(forward):
    name, meta, snap, a, r = forward
    want = "expandable_segments:True" if name.endswith("expandable") else "expandable_segments:False"
    assert meta["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == want
    assert memory_summary(snap, analysis=a)["allocator_settings"]["conf"] == want
    assert meta["oom"] and meta["oom_phase"] == "forward" and meta["blocks"] == 16
    assert meta["request_bytes"] == r.requested_bytes
    # the recorded run was the first step of a fresh model and optimizer: the hooks saw 8 blocks
    # complete, each keeping the same bytes, before the request of block 9 failed
    assert meta["oom_block_index"] == 8 and len(set(meta["block_kept_bytes"])) == 1


def test_oom_position_is_the_block_it_died_in(forward):
    _, meta, _, _, r = forward
    pos = r.position
    assert pos["phase"] == "forward" and pos["layers"] == meta["blocks"]
    assert pos["layer"] == meta["oom_block_index"] + 1  # hooks count from 0
    # the recorder died in the first forward: a zero_grad before it (the fresh run's clean-up) is no
    # step of its own
    assert pos["step"] == 1
    assert pos["text"] == f"forward of block {meta['oom_block_index'] + 1} of 16, step 1"
    # the bytes one block keeps, found from the allocation pattern alone, are what the hooks measured
    assert pos["block_bytes"] == meta["block_kept_bytes"][0]


def test_batch_advice_is_a_batch_that_runs(forward):
    _, meta, _, _, r = forward
    truth = meta["largest_batch_that_fits"]  # binary search on real runs: two full AdamW steps under the cap
    ran = {row["batch"]: row["fits"] for row in meta["largest_batch_search"]}
    assert ran[truth] and not ran[truth + 1]
    need = r.step_need
    assert need["optimizer_state_assumed"] and need["optimizer_state_bytes"] == 2 * meta["parameter_bytes"]
    assert need["parameters_bytes"] == meta["parameter_bytes"] and need["budget_bytes"] == meta["cap_bytes"]
    adv = need["largest_batch"]
    # never above what ran, and not far below it
    assert adv is not None and math.ceil(2 * truth / 3) <= adv <= truth, (adv, truth)
    # the advice item (issue 31: replayed through the allocator model) names the batch that ran
    item = next(x for x in r.advice if x["id"] == "batch")
    assert item["largest_batch"] == truth and item["what_if"]["fits"]
    assert f"the largest that fits is about {truth}" in item["text"]
    # the recorder applied the post-mortem it had then (the live memory at the OOM, no optimizer state,
    # no backward): its advice was run, and did not fit
    if meta.get("advised_run"):
        assert meta["advised_batch"] > truth and meta["advised_run"]["fits"] is False


def test_step_need_is_torchs_peak(forward):
    # the step's peak, predicted from a snapshot that died in block 9 of the first forward, against
    # torch's max_memory_allocated of two full steps at the batches that ran: within 5%
    _, meta, _, _, r = forward
    need = r.step_need
    for row in meta["largest_batch_search"]:
        if row["fits"]:
            pred = need["static_bytes"] + need["scaling_bytes"] * row["batch"] / meta["batch"]
            assert pred == pytest.approx(row["max_memory_allocated"], rel=0.05), row["batch"]
            assert pred <= row["max_memory_allocated"] + 0.05 * meta["cap_bytes"]
    # at batch 1 and 2 the optimizer step is the peak (parameters, gradients, AdamW state and the
    # foreach temporaries), not the activations
    for row in meta.get("extra_peaks", []):
        assert need["optimizer_peak_bytes"] == pytest.approx(row["max_memory_allocated"], rel=0.02)


def test_step_need_agrees_with_workbench_estimate(forward):
    torch = pytest.importorskip("torch")
    from workbench.capture.estimate import estimate

    sys.path.insert(0, str(ROOT / "examples"))
    from estimate_families import DecoderLM, lm_loss

    _, meta, _, _, r = forward
    cfg, b = meta["model_config"], meta["batch"]
    e = estimate(lambda: DecoderLM(**cfg), lambda bs: torch.randint(0, cfg["vocab"], (bs, meta["seq_len"])),
                 lambda p: torch.optim.AdamW(p, lr=1e-4), batch_size=b, loss_fn=lm_loss)
    # the same model at the batch that died: the estimator sees the whole step (head and loss too), the
    # post-mortem only the forward up to block 9
    assert r.step_need["step_bytes"] == pytest.approx(e.peak_allocated_bytes, rel=0.05)
    assert e.peak_phase == "backward" and e.by_category["gradients"] == 0  # as the post-mortem assumes
    assert e.by_category["optimizer_state"] == r.step_need["optimizer_state_bytes"]


def test_capacity_ooms_get_no_allocator_setting_advice():
    for name in ALL:
        _, snap = _rec(name)
        text = "\n".join(x["text"] for x in oom_postmortem(snap).advice)
        assert "expandable_segments:True" not in text and "max_split_size_mb" not in text, name
        assert "cannot help" in text, name


def test_an_expandable_on_oom_is_never_advised_to_set_it():
    meta, snap = _rec("oom_midforward_expandable")
    r = oom_postmortem(snap, batch_size=meta["batch"])
    assert r.allocator_settings["expandable_segments"] is True
    assert "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments" not in "\n".join(x["text"] for x in r.advice)
    assert not any(x["id"] in ("expandable_segments", "max_split_size") for x in r.advice)
    # it gets the batch advice all the same (the same step, the same cap)
    adv = r.step_need["largest_batch"]
    assert adv is not None and 1 <= adv <= meta["largest_batch_that_fits"]
    item = next(x for x in r.advice if x["id"] == "batch")
    assert 1 <= item["largest_batch"] <= meta["largest_batch_that_fits"]
    assert f"the largest that fits is about {item['largest_batch']}" in item["text"]


def test_capacity_advice_is_what_fixed_it():
    # expandable segments on did not help (it failed with them); freeing what the post-mortem says
    # must go, in whole 200 MiB tensors, made the same request fit; one tensor fewer did not
    meta, snap = _rec("oom_capacity_expandable")
    assert meta["oom"] and meta["settings"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    r = oom_postmortem(snap)
    need = math.ceil(r.shortfall_bytes / meta["piece_bytes"])
    assert r.advice[0]["id"] == "free_live" and r.advice[0]["what_if"]["fits"]
    assert f"at least {format_bytes(r.shortfall_bytes)} of live tensors must go" in r.advice[0]["text"]
    runs = {x["freed_pieces"]: x["fits"] for x in meta["free_and_retry"]}
    assert runs[need] is True and runs[need - 1] is False
    # expandable off: the same live tensors and request, the same numbers (its retry was cut by the
    # recorder's time limit; the snapshot and torch's numbers were written before)
    _, off = _rec("oom_capacity")
    r_off = oom_postmortem(off)
    assert r_off.allocator_settings["expandable_segments"] is False
    assert r_off.shortfall_bytes == r.shortfall_bytes and r_off.requested_bytes == r.requested_bytes

"""Issue 32, part 3: copies named by direction, size and the host time they block, with the fix for that
direction, and .item()-like reads said once (with the sync finding); launches attributed to the op that
issues them, with the fix that fits each owner. (What each owner's fix would save needs before/after pairs
recorded on a GPU: not predicted here.)"""

from __future__ import annotations

import pytest
from testdata import DATA

from workbench import samples
from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.analysis.trace.findings import _owner_fix, copy_directions, launch_owners_per_step

PAIRS = DATA / "h200_pairs"


def _by_id(a):
    return {f.id: f for f in a.findings}


def test_pageable_uploads_name_direction_size_blocked_host_time_and_the_pinning_fix():
    a = TraceAnalysis(PAIRS / "copies" / "pageable.light.trace.json.gz")
    f = _by_id(a)["memcpy_heavy"]
    h = f.evidence["by_direction"]["HtoD"]
    assert h["copies"] == 1 and h["pageable"] == 1 and h["bytes"] == 64 * 2**20
    assert h["host_blocked_us"] >= h["gpu_us"] > 0  # a pageable copy blocks the host at least that long
    assert "host-to-device copy a step of 64.0 MiB" in f.message and "the host waits" in f.message
    assert "pin_memory" in f.message and "device-to-host" not in f.message


def test_item_reads_are_said_once_with_the_sync_they_wait_in():
    a = TraceAnalysis(PAIRS / "sync" / "h5.9_g6.5_item.light.trace.json.gz")
    d = copy_directions(a)["DtoH"]
    assert d["reads"] == d["copies"] == 1 and d["bytes"] == 4  # one 4-byte .item() a step
    assert d["host_blocked_us"] > 1000  # the read waits for the queued GPU work (cudaStreamSynchronize)
    fs = _by_id(a)
    assert "memcpy_heavy" not in fs  # the same waits: not a second finding
    s = fs["sync_bound"]
    assert s.evidence["device_to_host_reads_per_step"] == 1
    assert ".item()-like" in s.message and "4 B" in s.message


def test_launches_are_attributed_to_their_owner():
    eager = launch_owners_per_step(TraceAnalysis(PAIRS / "launch" / "eager.light.trace.json.gz"))
    assert eager[0]["owner"].startswith("eager ops (aten::") and eager[0]["launches_per_step"] == 600
    assert set(eager[0]["ops"]) == {"aten::add_", "aten::mul_"}
    a = TraceAnalysis(samples.path("h200_train_step"))
    owners = {o["owner"]: o for o in launch_owners_per_step(a)}
    assert owners["backward (autograd)"]["launches_per_step"] == 314
    assert owners["Optimizer.step#AdamW.step"]["launches_per_step"] == 16  # foreach: few launches already
    assert "few launches already" in owners["Optimizer.step#AdamW.step"]["fix"]
    lb = _by_id(TraceAnalysis(samples.path("lesson11_bf16_light")))["launch_bound"]
    assert list(lb.evidence["owners"])[0] == "backward (autograd)"
    assert lb.evidence["owners"]["backward (autograd)"]["launches_per_step"] > 100
    assert "by the op that issues them" in lb.message


@pytest.mark.parametrize("owner, launches, fix", [
    ("Optimizer.step#AdamW.step", 400, "AdamW(..., fused=True)"),
    ("Optimizer.step#RMSprop.step", 400, "RMSprop(..., foreach=True)"),
    ("Optimizer.zero_grad#AdamW.zero_grad", 200, "set_to_none=True"),
    ("backward (autograd)", 300, "torch.compile"),
    ("eager ops", 600, "CUDA graph"),
])
def test_each_owner_gets_its_fix(owner, launches, fix):
    assert fix in _owner_fix(owner, launches)

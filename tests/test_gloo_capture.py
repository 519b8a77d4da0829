"""workbench.capture.gloo on real processes: two gloo DDP ranks (spawned), a planted straggler, no_sync
accumulation and a collective timeout, checked against the raw trace events and the cross-rank view;
and that no rank outlives the run, also when it is stopped at its deadline."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from workbench.analysis.trace.ranks import load_ranks  # noqa: E402
from workbench.capture.gloo import GlooSpec, run_gloo_ddp  # noqa: E402
from workbench.errors import BadArgument, WorkbenchError  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch has no gloo backend")

K = 3  # micro-batches
DELAY_MS = 30.0


def children() -> list[int]:
    """Live rank processes started by this one (children running multiprocessing's spawn_main, from /proc:
    independent of torch's bookkeeping; the spawn start method's resource tracker is not a rank)."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == me and fields[0] != "Z" and b"spawn_main" in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_gloo_ddp(tmp_path_factory.mktemp("gloo"), world=2, steps=3, straggler_rank=1, delay_ms=DELAY_MS,
                        micro_batches=K, timeout_s=1.0)


def all_reduces_per_step(path) -> list[int]:
    """gloo:all_reduce events inside each ProfilerStep of one trace, from the raw JSON."""
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    ar = [e["ts"] for e in ev if e.get("name") == "gloo:all_reduce"]
    return [sum(lo <= t < hi for t in ar) for lo, hi in steps]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_no_rank_outlives_the_run(run):
    assert children() == []


def test_the_planted_straggler_is_named(run):
    assert [p.name for p in run.traces] == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    view = load_ranks(run.traces, processes=1, cache=False)
    assert view.world_size == 2 and view.unmatched == 0
    s = view.straggler
    assert s is not None and s["rank"] == 1
    slept = run.measured[1]["slept_ms"]
    assert len(slept) == 3 and min(slept) >= DELAY_MS and run.measured[0]["slept_ms"] == []
    # rank 0 waits about as long as rank 1 slept (not exactly: their compute differs a little)
    assert 0.5 * DELAY_MS < s["wait_ms_per_step"] < 2 * DELAY_MS
    assert (view.collectives["last_rank"] == 1).all()


def test_no_sync_all_reduces_once_per_bucket_instead_of_once_per_micro_batch(run):
    per_step = all_reduces_per_step(run.traces[0])
    buckets = per_step[0]
    assert buckets >= 1 and set(per_step) == {buckets}  # the same buckets every training step
    for r in range(2):
        sync = all_reduces_per_step(run.accumulation["sync"][r])
        quiet = all_reduces_per_step(run.accumulation["no_sync"][r])
        assert sync == [K * buckets] and quiet == [buckets]
    view = load_ranks(run.accumulation["no_sync"], processes=1, cache=False)
    assert len(view.collectives) == buckets and view.unmatched == 0
    # the same gradients either way (to float32 rounding)
    for r in range(2):
        assert run.measured[r]["accumulation"]["grad_max_abs_diff"] < 1e-5


def test_the_collective_nobody_joins_times_out(run):
    t = run.timeout
    assert t is not None and t["error"] is not None and "timed out" in t["message"].lower()
    assert t["timeout_s"] == 1.0 and 0.95 <= t["waited_s"] < 1.0 + 10.0
    assert "timeout" not in run.measured[1]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_run_past_its_deadline_is_stopped_and_leaves_no_process(tmp_path):
    with pytest.raises(WorkbenchError, match="did not finish within"):
        run_gloo_ddp(tmp_path, world=2, deadline_s=0.3)
    assert children() == []


@pytest.mark.parametrize("fields, match", [
    ({"world": 1}, "2 to 64 ranks"),
    ({"straggler_rank": 2}, "not a rank of world size 2"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"micro_batches": 64}, "micro_batches=64"),
])
def test_bad_specs_are_refused_before_any_process_starts(tmp_path, fields, match):
    with pytest.raises(BadArgument, match=match):
        run_gloo_ddp(tmp_path, **fields)
    assert list(tmp_path.iterdir()) == [] and children() == []
    with pytest.raises(BadArgument):
        GlooSpec(**fields).check()

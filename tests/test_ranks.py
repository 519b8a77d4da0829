"""The cross-rank view on real 4-process gloo DDP runs (workbench/samples/ranks, samples ranks_*, recorded by
benchmarks/record_gloo_ranks.py): straggler, collective matching, per-rank time, skipping, cache."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from testdata import DATA, ROOT
from workbench.analysis.trace.ranks import (
    RankFrame,
    cross_rank,
    load_ranks,
    rank_frame,
    ranks_summary,
)
from workbench.analysis.trace.tables import temporal_breakdown
from workbench.errors import BadArgument, BadArtifact
from workbench.io import load_trace
from workbench.io.rank_cache import cache_path
from workbench.io.rank_loading import load_rank_frames
from workbench import samples

RANKS = samples.path("ranks_healthy").parent
SCENARIOS = ("healthy", "straggler", "slow_collective")


def truth(scenario: str) -> dict:
    return json.loads((RANKS / scenario / "truth.json").read_text())


def raw_events(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


@pytest.fixture(scope="module")
def views():
    return {s: load_ranks(RANKS / s, processes=1, cache=False) for s in SCENARIOS}


def test_the_straggler_is_named_with_its_injected_delay(views):
    t = truth("straggler")
    s = views["straggler"].straggler
    assert s is not None and s["rank"] == t["straggler_rank"]
    # the others wait about as long as it slept before each forward (20%: the 2-core machine that
    # recorded it also slowed the ranks that shared a core)
    assert s["wait_ms_per_step"] == pytest.approx(t["injected_delay_ms"], rel=0.20)
    ev = s["evidence"]
    assert ev["last_arrival_fraction"] > 0.5 and ev["straggler_wait_us"] < min(
        v for k, v in ev["others_wait_us_per_step"].items()
    ) * ev["steps"]
    f = next(f for f in views["straggler"].findings if f.id == "straggler")
    assert f"rank {t['straggler_rank']}" in f.message and f.severity in ("warning", "critical")


@pytest.mark.parametrize("scenario", ["healthy", "slow_collective"])
def test_no_straggler_when_no_rank_was_slowed(views, scenario):
    v = views[scenario]
    assert v.straggler is None
    assert "straggler" not in {f.id for f in v.findings}
    # the last arrival moves around: no rank is last at a majority of the collectives
    counts = v.collectives["last_rank"].value_counts()
    assert counts.max() <= len(v.collectives) / 2


def test_collectives_are_matched_across_ranks_with_skew_from_the_raw_events(views):
    v = views["straggler"]
    t = truth("straggler")
    # DDP on this model: 2 gradient buckets -> 2 gloo all-reduces per step, on every rank
    assert len(v.collectives) == 2 * t["steps"] and v.unmatched == 0
    assert set(v.collectives["ranks"]) == {t["world_size"]}
    assert (v.collectives["last_rank"] == t["straggler_rank"]).all()
    # independent: the n-th gloo:all_reduce of each rank, in time order (one host: clocks as they are)
    starts = {}
    for r in range(t["world_size"]):
        ev = [e for e in raw_events(RANKS / "straggler" / f"rank{r}.pt.trace.json.gz")
              if e.get("name") == "gloo:all_reduce" and e.get("ph") == "X"]
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw_events(RANKS / "straggler" / f"rank{r}.pt.trace.json.gz")
                       if str(e.get("name", "")).startswith("ProfilerStep#"))
        ev = [e for e in ev if e["ts"] >= steps[0][0]]
        starts[r] = sorted(e["ts"] for e in ev)[: len(v.collectives)]
    skew = np.max([starts[r] for r in starts], axis=0) - np.min([starts[r] for r in starts], axis=0)
    assert np.allclose(np.sort(v.collectives["skew_us"].to_numpy()), np.sort(skew), rtol=1e-9, atol=1e-3)
    assert (v.ranks["clock_offset_us"] == 0).all()  # one host_name: one clock


def test_slow_collective_is_the_transfer_not_the_wait(views):
    v = views["slow_collective"]
    c = v.collectives
    # the extra all-reduce of 4M floats is the third collective of every step, and the slowest
    big = c[c["seq"] == 2]
    assert len(big) == truth("slow_collective")["steps"]
    assert (big["transfer_us"].to_numpy() > big["skew_us"].to_numpy()).all()
    assert big["transfer_us"].median() > 2 * c[c["seq"] < 2]["transfer_us"].median()
    f = next(f for f in v.findings if f.id == "slow_collective")
    assert f.evidence["longest_transfer_us"] == pytest.approx(c["transfer_us"].max())
    # and it costs more per step than the healthy run's collectives do
    h = next((f for f in views["healthy"].findings if f.id == "slow_collective"), None)
    assert h is None or h.evidence["transfer_per_step_us"] < f.evidence["transfer_per_step_us"]


def test_per_rank_time_against_the_step_annotations(views):
    for scenario, v in views.items():
        t = truth(scenario)
        assert list(v.ranks["rank"]) == list(range(t["world_size"])) and v.world_size == t["world_size"]
        for r, row in v.ranks.set_index("rank").iterrows():
            ev = raw_events(RANKS / scenario / f"rank{r}.pt.trace.json.gz")
            steps = [e["dur"] for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")]
            assert row["steps"] == len(steps) == t["steps"]
            # (CPU-only ranks: the step ends with its annotation; step_ms is rounded to 0.1 us, the one
            # set of numbers every front prints, tests/test_one_set_of_numbers.py)
            assert row["step_ms"] == pytest.approx(np.median(steps) / 1e3, abs=5e-5)
            assert row["compute_us"] > 0 and row["communication_us"] > 0
            assert 0 <= row["exposed_communication_us"] <= row["communication_us"] + 1e-6
            total = row["compute_us"] + row["exposed_communication_us"] + row["memory_us"] + row["idle_us"]
            assert total == pytest.approx(row["window_us"], rel=1e-9)
            assert 0 <= row["overlap"] <= 1
    # the straggler waits least: it is the one everybody else waits for
    st = views["straggler"].ranks.set_index("rank")
    assert st["wait_us"].idxmin() == truth("straggler")["straggler_rank"]


def test_gloo_collectives_are_communication_in_the_breakdown():
    for r in range(4):
        br = temporal_breakdown(load_trace(RANKS / "healthy" / f"rank{r}.pt.trace.json.gz"))
        assert br["communication_us"] > 0 and br["compute_us"] == 0


def test_json_document_keys(views):
    doc = ranks_summary(views["straggler"])
    assert {"world_size", "ranks", "straggler", "collectives", "findings", "skipped"} <= set(doc)
    assert {"rank", "steps", "step_ms", "compute_us", "communication_us", "exposed_communication_us",
            "idle_us"} <= set(doc["ranks"][0])
    assert set(doc["straggler"]) == {"rank", "wait_ms_per_step", "evidence"}
    assert {"pg", "seq", "duration_us", "skew_us", "last_rank"} <= set(doc["collectives"][0])
    json.dumps(doc, allow_nan=False)  # plain JSON, no NaN
    assert all("/" not in r["file"] for r in doc["ranks"])  # no machine paths
    assert ranks_summary(views["healthy"])["straggler"] is None


def test_non_trace_files_in_a_folder_are_skipped_with_a_note(tmp_path, views):
    # the shipped folders hold truth.json, which is JSON but no trace
    assert [s[0].rsplit("/", 1)[-1] for s in views["healthy"].skipped] == ["truth.json"]
    for r in range(4):
        shutil.copy(RANKS / "healthy" / f"rank{r}.pt.trace.json.gz", tmp_path)
    (tmp_path / "notes.txt").write_text("not a trace")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a"')[:-8])
    v = load_ranks(tmp_path, processes=1, cache=False)
    assert len(v.ranks) == 4
    skipped = {p.rsplit("/", 1)[-1]: msg for p, msg in v.skipped}
    assert set(skipped) == {"notes.txt", "config.json", "cut.json.gz"}
    assert "traceEvents" in skipped["config.json"] and "truncated" in skipped["cut.json.gz"]
    doc = ranks_summary(v)
    assert {s["file"] for s in doc["skipped"]} == set(skipped)
    assert all(str(tmp_path) not in s["reason"] for s in doc["skipped"])
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(BadArtifact, match="holds no loadable trace"):
        load_ranks(empty, processes=1, cache=False)


def _rewrite(src, dst, rank=None, drop_dist=False):
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    if drop_dist:
        doc.pop("distributedInfo", None)
    elif rank is not None:
        doc["distributedInfo"]["rank"] = rank
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)


def test_ranks_from_file_names_when_the_traces_do_not_say(tmp_path):
    # file names say rank 10..13 in an order unlike the directory listing; no distributedInfo. (Was
    # w13..w10: any last number in a name was taken for the rank, which made a pid or timestamp a rank,
    # 'rank 830992'; issue 32 asks for distributedInfo, so only a name that says rank<N> is read now.)
    for r, name in enumerate(["w_rank13.json.gz", "w_rank10.json.gz", "w_rank12.json.gz", "w_rank11.json.gz"]):
        _rewrite(RANKS / "straggler" / f"rank{r}.pt.trace.json.gz", tmp_path / name, drop_dist=True)
    v = load_ranks(tmp_path, processes=1, cache=False)
    assert list(v.ranks["rank"]) == [10, 11, 12, 13]
    assert v.straggler["rank"] == 12  # rank2's trace is w12
    assert v.world_size == 4


def test_two_traces_of_one_rank_are_refused():
    f = rank_frame(load_trace(RANKS / "healthy" / "rank0.pt.trace.json.gz"))
    with pytest.raises(BadArgument, match="both are rank 0"):
        cross_rank([f, f])


def test_process_pool_gives_the_same_frames(tmp_path):
    paths = sorted((RANKS / "healthy").glob("rank*.json.gz"))
    a = load_rank_frames(paths, RankFrame, processes=1, cache=False)
    b = load_rank_frames(paths, RankFrame, processes=2, cache=False)
    assert ranks_summary(cross_rank(a)) == ranks_summary(cross_rank(b))


def test_cache_round_trip_and_key(tmp_path):
    src = RANKS / "straggler" / "rank2.pt.trace.json.gz"
    cold = load_rank_frames([src], RankFrame, processes=1, cache_dir=tmp_path)[0]
    target = cache_path(src, tmp_path)
    assert target.is_file()
    warm = load_rank_frames([src], RankFrame, processes=1, cache_dir=tmp_path)[0]
    assert isinstance(warm, RankFrame)
    assert warm.time == cold.time and warm.rank == cold.rank == 2 and warm.host == cold.host
    assert warm.steps.equals(cold.steps)
    assert warm.collectives.reset_index(drop=True).equals(cold.collectives.reset_index(drop=True))
    # a different file (rank rewritten) has another key; a stale entry can never be read for it
    other = tmp_path / "copy.json.gz"
    _rewrite(src, other, rank=7)
    assert cache_path(other, tmp_path) != target
    assert load_rank_frames([other], RankFrame, processes=1, cache_dir=tmp_path)[0].rank == 7
    # next to the trace: a hidden folder the folder listing ignores
    shutil.copy(src, tmp_path / "r.json.gz")
    load_rank_frames([tmp_path / "r.json.gz"], RankFrame, processes=1, cache_dir="next")
    assert cache_path(tmp_path / "r.json.gz", "next").parent == tmp_path / ".workbench-cache"
    assert cache_path(tmp_path / "r.json.gz", "next").is_file()


def test_recorder_script_documents_what_it_writes():
    text = (ROOT / "benchmarks" / "record_gloo_ranks.py").read_text()
    for s in SCENARIOS:
        assert s in text and (RANKS / s / "truth.json").is_file()
    t = truth("straggler")
    assert t["backend"] == "gloo" and t["world_size"] == 4
    slept = t["measured"][str(t["straggler_rank"])]["slept_ms"]
    assert len(slept) == t["steps"] and min(slept) >= t["injected_delay_ms"]


# ------------------------------------------------------------------------------------------------ CLI


def _cli(*args, cwd=ROOT, env_cache=None):
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), WORKBENCH_CACHE_DIR=str(env_cache or ROOT / "build" / "no-cache"))
    return subprocess.run([sys.executable, "-m", "workbench", "ranks", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)


def test_cli_text_json_and_html(tmp_path):
    r = _cli(RANKS / "straggler", "--html", tmp_path / "ranks.html", env_cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert "straggler: rank 2" in r.stdout and "[critical] straggler" in r.stdout
    assert "skipped" in r.stderr and "truth.json" in r.stderr
    html = (tmp_path / "ranks.html").read_text()
    assert "Time per rank" in html and "Collectives" in html and "rank 2 (straggler)" in html
    # a quoted glob, JSON, through the cache written above
    r = _cli(str(RANKS / "straggler" / "rank*.pt.trace.json.gz"), "--json", env_cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["straggler"]["rank"] == 2 and doc["skipped"] == [] and len(list((tmp_path / "cache").iterdir())) == 4


def _folder_with(folder, files):
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.mark.parametrize("make, expect", [
    (lambda d: d / "missing", "no such file or folder"),
    (lambda d: _folder_with(d / "only_config", {"c.json": "{}", "notes.txt": "x"}), "holds no loadable trace"),
    (lambda d: str(d / "nothing*.json.gz"), "matches no file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, make, expect):
    target = make(tmp_path)
    r = _cli(target, "--no-cache")
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if not line.startswith("workbench ranks: skipped")]
    assert len(err) == 1 and err[0].startswith("workbench ranks: error:") and expect in err[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_workbench_trace_on_a_folder_skips_its_non_trace_json():
    r = subprocess.run([sys.executable, "-m", "workbench", "trace", RANKS / "healthy", "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["traces"]) == 4 and all(t["breakdown"]["communication_us"] > 0 for t in doc["traces"])
    assert "skipped" in r.stderr and "truth.json" in r.stderr
    # named on the command line, the same file is an error
    r = subprocess.run([sys.executable, "-m", "workbench", "trace", RANKS / "healthy" / "truth.json",
                        RANKS / "healthy" / "rank0.pt.trace.json.gz"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 2 and "truth.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_nccl_kernels_are_matched_on_real_gpu_ranks():
    # two ranks of a 128-rank NCCL run (HTA's test data): collectives are the NCCL kernels, keyed by stream
    v = load_ranks(DATA / "multi_rank", processes=1, cache=False)
    assert v.world_size == 128 and list(v.ranks["rank"]) == [0, 1]
    assert "missing_ranks" in {f.id for f in v.findings}
    raw = {r: sorted((e["ts"], e["dur"], e["args"]["stream"]) for e in raw_events(DATA / "multi_rank" / f"sampled_rank-{r}.json.gz")
                     if e.get("cat") == "kernel" and "nccl" in e["name"].lower()) for r in (0, 1)}
    assert len(v.collectives) == len(raw[0]) == len(raw[1]) and v.unmatched == 0
    assert set(v.collectives["where"]) == {"gpu"}
    assert set(v.collectives["pg"]) == {f"stream {s}" for _, _, s in raw[0]}
    # durations: the median over the two ranks of the n-th kernel on each stream
    for stream in {s for _, _, s in raw[0]}:
        d0 = [d for _, d, s in raw[0] if s == stream]
        d1 = [d for _, d, s in raw[1] if s == stream]
        got = v.collectives[v.collectives["pg"] == f"stream {stream}"].sort_values("start_us")["duration_us"]
        assert np.allclose(got.to_numpy(), (np.array(d0) + np.array(d1)) / 2)


def test_a_fifo_is_refused_when_named_and_skipped_in_a_folder(tmp_path):
    """A named pipe would block a reader forever: named on the command line it is one line and exit 2,
    found in a rank folder it is skipped with a note naming it."""
    import os
    import shutil
    import subprocess
    import sys

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "workbench", "ranks", str(fifo)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "FIFO" in r.stderr and "Traceback" not in r.stderr
    folder = tmp_path / "ranks"
    shutil.copytree(samples.path("ranks_straggler"), folder)
    os.mkfifo(folder / "stuck.json")
    r = subprocess.run([sys.executable, "-m", "workbench", "ranks", str(folder), "--json", "--no-cache"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"skipped {folder / 'stuck.json'}: not a regular file" in r.stderr


def test_a_cache_hit_names_the_file_it_was_read_for(tmp_path):
    src = RANKS / "healthy" / "rank1.pt.trace.json.gz"
    load_rank_frames([src], RankFrame, processes=1, cache_dir=tmp_path)  # writes the entry
    copy = tmp_path / "renamed.json.gz"
    shutil.copy(src, copy)
    hit = load_rank_frames([copy], RankFrame, processes=1, cache_dir=tmp_path)[0]
    assert hit.file == "renamed.json.gz" and hit.path == str(copy) and hit.rank == 1


def test_a_number_in_a_file_name_is_not_a_rank(tmp_path):
    """Issue 32: a pid or timestamp in a file name ('..._830992.json.gz') is no rank; without
    distributedInfo and without rank<N> in the names the ranks follow the order given."""
    for r, name in enumerate(["trace_830992.json.gz", "trace_17.json.gz"]):
        _rewrite(RANKS / "healthy" / f"rank{r}.pt.trace.json.gz", tmp_path / name, drop_dist=True)
    v = load_ranks(tmp_path, processes=1, cache=False)
    assert sorted(v.ranks["rank"]) == [0, 1]
    assert v.warnings == []  # one job: same device, recorded together


def test_mixed_devices_and_runs_far_apart_are_warned(tmp_path):
    """Issue 32: an A100 and a V100 trace recorded 189 days apart are no job; ranks and diff say so."""
    from workbench import samples
    from workbench.analysis.trace.diff import diff_summary, trace_diff

    a, b = samples.path("a100_alexnet"), samples.path("v100_nccl_rank0")
    _rewrite(a, tmp_path / "rank0.json.gz", drop_dist=True)
    _rewrite(b, tmp_path / "rank1.json.gz", drop_dist=True)
    v = load_ranks(tmp_path, processes=1, cache=False)
    assert any(w.startswith("mixed devices") for w in v.warnings)
    assert any(w.startswith("runs far apart") and "days" in w for w in v.warnings)
    assert ranks_summary(v)["warnings"] == v.warnings
    doc = diff_summary(trace_diff(load_trace(a), load_trace(b)))
    assert [w.split(":")[0] for w in doc["warnings"]] == ["mixed devices", "runs far apart"]
    same = diff_summary(trace_diff(load_trace(a), load_trace(a)))
    assert same["warnings"] == []


def test_exposed_communication_advice_names_overlap_fixes_only(views):
    """gradient_as_bucket_view saves a gradient copy (memory); it does not move an all-reduce, so the
    overlap advice must not offer it."""
    f = next(f for f in views["straggler"].findings if f.id == "exposed_communication")
    assert "bucket_cap_mb" in f.message and "prefetch" in f.message
    assert "gradient_as_bucket_view" not in f.message

"""Faults at scale in the cross-rank view: a Dask worker killed in the middle of a 256-rank run, torn
Parquet cache entries, and corrupt or truncated ranks among 64.

The ranks are the 4-rank ``ranks_straggler`` sample (workbench/samples/ranks/straggler) repeated (rank i is a copy of rank
i mod 4 with its ``distributedInfo`` rank and world size rewritten), so every collective is on every rank.
What must hold: the run finishes with every rank (Dask retries the dead worker's tasks) or names the ranks
it could not read and then gives no straggler verdict; no cache file is ever half written; a torn cache
entry is detected, ignored and rewritten; a damaged rank is reported and the others analysed.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testdata import ROOT, stop_processes
from workbench import samples

RANKS = Path(samples.path("ranks_straggler"))


def _make_ranks(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    docs = [gzip.decompress((RANKS / f"rank{r}.pt.trace.json.gz").read_bytes()) for r in range(4)]
    out = []
    for i in range(n):
        text = docs[i % 4]
        head = f'"rank":{i % 4},"world_size":4'.encode()
        assert head in text
        text = text.replace(head, f'"rank":{i},"world_size":{n}'.encode(), 1)
        p = folder / f"rank{i}.pt.trace.json.gz"
        p.write_bytes(gzip.compress(text, compresslevel=1, mtime=0))
        out.append(p)
    return out


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*.parquet") if not p.name.startswith("."))


def _env(tmp_path):
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WORKBENCH_CACHE_DIR=str(tmp_path / "cache"),
                DASK_DISTRIBUTED__WORKER__DAEMON="False")


# ---------------------------------------------------------------------------------- damaged ranks


def test_corrupt_and_truncated_ranks_among_64_are_reported_and_the_others_analysed(tmp_path):
    from workbench.analysis.trace.ranks import load_ranks, ranks_summary

    paths = _make_ranks(tmp_path / "run", 64)
    whole = paths[5].read_bytes()
    paths[5].write_bytes(whole[: len(whole) // 2])  # truncated
    bad = bytearray(paths[9].read_bytes())
    bad[len(bad) // 3: len(bad) // 3 + 64] = b"\x00" * 64  # corrupt in the middle
    paths[9].write_bytes(bytes(bad))
    cache = tmp_path / "cache"
    view = load_ranks(tmp_path / "run", processes=2, cache_dir=cache)
    assert len(view.ranks) == 62 and 5 not in set(view.ranks["rank"]) and 9 not in set(view.ranks["rank"])
    assert sorted(Path(p).name for p, _ in view.unread) == ["rank5.pt.trace.json.gz", "rank9.pt.trace.json.gz"]
    assert view.straggler is None  # rank 5 or 9 may be the one the others wait for
    f = {x.id: x for x in view.findings}
    assert f["unread_ranks"].evidence["unread"] == 2 and f["unread_ranks"].evidence["analysed"] == 62
    assert len(view.collectives) > 0 and view.unmatched == 0  # the 62 are matched among themselves
    doc = ranks_summary(view)
    assert doc["unread"] == ["rank5.pt.trace.json.gz", "rank9.pt.trace.json.gz"] and doc["straggler"] is None
    from workbench.report import ranks_report

    out = ranks_report(view, tmp_path / "ranks.html")
    assert "straggler: not judged (2 rank trace(s) could not be read" in Path(out).read_text()
    # the CLI (from the cache now): exit 0, the two files named on stderr and in the text, no verdict
    r = subprocess.run([sys.executable, "-m", "workbench", "ranks", str(tmp_path / "run"), "--cache-dir", str(cache)],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "skipped" in r.stderr and "rank5.pt.trace.json.gz" in r.stderr and "rank9.pt.trace.json.gz" in r.stderr
    assert "straggler: not judged (2 rank trace(s) could not be read" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------ torn cache


def test_torn_cache_entries_are_detected_and_rebuilt(tmp_path):
    from workbench.analysis.trace.ranks import load_ranks, ranks_summary
    from workbench.io import rank_cache

    cache = tmp_path / "cache"
    first = ranks_summary(load_ranks(RANKS, processes=1, cache_dir=cache))
    entries = _entries(cache)
    assert len(entries) == 4 and all(rank_cache.load_frame(e) is not None for e in entries)
    sizes = {e: e.stat().st_size for e in entries}
    torn = entries[0]
    torn.write_bytes(torn.read_bytes()[: sizes[torn] // 2])  # cut short (a full disk, a copy)
    flipped = entries[1]
    data = bytearray(flipped.read_bytes())
    for i in range(8, min(len(data) // 2, 400)):  # damage the first pages, keep the footer
        data[i] ^= 0x5A
    flipped.write_bytes(bytes(data))
    zero = entries[2]
    zero.write_bytes(b"")
    assert rank_cache.load_frame(torn) is None and rank_cache.load_frame(flipped) is None
    assert rank_cache.load_frame(zero) is None
    again = ranks_summary(load_ranks(RANKS, processes=1, cache_dir=cache))
    assert again == first
    assert _entries(cache) == entries
    assert all(rank_cache.load_frame(e) is not None for e in entries), "a torn entry was not rewritten"
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")], "a temporary file was left"


def test_cache_write_is_atomic_when_the_writer_dies(tmp_path):
    """A writer killed mid-write (SIGKILL between writing and renaming) leaves no entry under a cache name."""
    code = (
        "import os, signal, sys\n"
        "import pyarrow.parquet as pq\n"
        "real = pq.write_table\n"
        "def dying(table, where, **kw):\n"
        "    real(table, where, **kw)\n"
        "    with open(where, 'r+b') as f: f.truncate(100)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "pq.write_table = dying\n"
        "from workbench.analysis.trace.ranks import load_ranks\n"
        "load_ranks(sys.argv[1], processes=1, cache_dir=sys.argv[2])\n"
    )
    cache = tmp_path / "cache"
    p = subprocess.run([sys.executable, "-c", code, str(RANKS), str(cache)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == -signal.SIGKILL, p.stderr[-500:]
    assert _entries(cache) == [], "a half-written file sits under a cache name"


# ------------------------------------------------------------------------- a worker killed mid-run


distributed = pytest.importorskip("distributed", reason="the dask extra (pip install 'gpu-workbench[dask]')")


def _start_cluster(tmp: Path, env: dict, log):
    sched_file = tmp / "scheduler.json"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
         "--scheduler-file", str(sched_file)], env=env, stdout=log, stderr=log)]
    deadline = time.monotonic() + 60
    while not sched_file.exists():
        if time.monotonic() > deadline or procs[0].poll() is not None:
            raise RuntimeError("dask scheduler did not start")
        time.sleep(0.2)
    address = json.loads(sched_file.read_text())["address"]
    for _ in range(2):  # two workers without nannies: a killed one stays dead
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
             "--host", "127.0.0.1", "--memory-limit", "2GB"], env=env, stdout=log, stderr=log))
    return address, procs


def test_a_worker_killed_in_the_middle_of_256_ranks(tmp_path):
    from workbench.analysis.trace.ranks import load_ranks, ranks_summary
    from workbench.io import rank_cache

    run = tmp_path / "run"
    _make_ranks(run, 256)
    cache = tmp_path / "cache"
    env = _env(tmp_path)
    log = open(tmp_path / "cluster.log", "w")
    address, procs = _start_cluster(tmp_path, env, log)
    cli = None
    try:
        client = distributed.Client(address, timeout=30)
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)  # {worker address: pid}
        client.close()
        victim = sorted(pids.values())[0]
        cli = subprocess.Popen([sys.executable, "-m", "workbench", "ranks", str(run), "--json", "--scheduler", address,
                                "--cache-dir", str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env=env)
        deadline = time.monotonic() + 120
        while not cache.exists() or len(_entries(cache)) < 32:  # the middle of the run
            assert cli.poll() is None, cli.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no progress on the cluster"
            time.sleep(0.05)
        done_at_kill = len(_entries(cache))
        os.kill(victim, signal.SIGKILL)
        out, err = cli.communicate(timeout=300)
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        stop_processes(procs)
        log.close()
    assert done_at_kill < 256, "the run ended before the kill: not a test of it"
    assert cli.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    doc = json.loads(out)
    given = {r["rank"] for r in doc["ranks"]}
    unread = doc["unread"]
    assert len(given) + len(unread) == 256
    # no half-written entry under a cache name: every entry reads and verifies
    entries = _entries(cache)
    assert all(rank_cache.load_frame(e) is not None for e in entries)
    # the reference: the same ranks in this process, from the cache (every entry a hit; any rank the
    # cluster lost is read from its trace here)
    print(f"killed a worker after {done_at_kill} of 256 ranks; read {len(given)}, unread {len(unread)}")
    local = ranks_summary(load_ranks(run, processes=1, cache_dir=cache))
    if not unread:
        assert given == set(range(256))
        assert doc == json.loads(json.dumps(local))
    else:  # the ranks it could not read are named, and no straggler is guessed without them
        assert doc["straggler"] is None
        assert "unread_ranks" in {f["id"] for f in doc["findings"]}
        assert all(u in err for u in unread)


def test_ranks_the_cluster_gives_up_on_are_named_and_no_straggler_is_guessed():
    """When Dask stops retrying (``KilledWorker``: the task's workers died ``allowed-failures`` times) or
    loses a task, that rank is named as unread and the others analysed, in path order."""
    from workbench.analysis.trace.ranks import load_ranks, ranks_summary

    class KilledWorker(Exception):
        pass

    class Future:
        def __init__(self, fn, path, kw):
            self.fn, self.path, self.kw = fn, path, kw

        def result(self):
            if self.path.endswith("rank2.pt.trace.json.gz"):  # the straggler itself is the one lost
                raise KilledWorker(f"Attempted to run task {self.path} on 4 different workers, all died")
            return self.fn(self.path, **self.kw)

    class Client:
        def map(self, fn, paths, pure=True, **kw):
            return [Future(fn, p, kw) for p in paths]

        def cancel(self, futures):
            pass

    full = load_ranks(RANKS, processes=1, cache=False)
    assert full.straggler["rank"] == 2
    view = load_ranks(RANKS, client=Client(), cache=False)
    assert list(view.ranks["rank"]) == [0, 1, 3]
    assert view.straggler is None, "a straggler named among the ranks that were read"
    (path, why), = view.unread
    assert path.endswith("rank2.pt.trace.json.gz") and "its worker died while reading it" in why
    doc = ranks_summary(view)
    assert doc["unread"] == ["rank2.pt.trace.json.gz"] and doc["straggler"] is None


from workbench.analysis.trace.ranks import RankFrame  # noqa: E402


class _DyingFrame(RankFrame):
    """A RankFrame whose reduction kills its worker process on rank 1 (as the OOM killer would)."""

    @classmethod
    def from_trace(cls, trace):
        if str(trace.path).endswith("rank1.pt.trace.json.gz"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().from_trace(trace)


def test_a_local_worker_process_that_dies_costs_only_its_rank():
    from workbench.io.rank_loading import load_rank_frames

    paths = sorted(RANKS.glob("rank*.pt.trace.json.gz"))
    skipped = []
    frames = load_rank_frames(paths, _DyingFrame, processes=2, cache=False,
                              on_skip=lambda p, msg: skipped.append((p, msg)))
    assert [f.rank for f in frames] == [0, 2, 3]
    (path, msg), = skipped
    assert path.endswith("rank1.pt.trace.json.gz") and "worker process died" in msg

"""The cross-rank view through a real Dask cluster: a `dask scheduler` and a `dask worker` started on
loopback as subprocesses, reached by address (the CLI's --scheduler) and through a Client (Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from testdata import ROOT, stop_processes
from workbench import samples

distributed = pytest.importorskip("distributed", reason="the dask extra (pip install 'gpu-workbench[dask]')")

RANKS = samples.path("ranks_healthy").parent  # the shipped gloo runs (samples ranks_*)


def _env(tmp_path):
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WORKBENCH_CACHE_DIR=str(tmp_path / "cache"),
                DASK_DISTRIBUTED__WORKER__DAEMON="False")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dask")
    sched_file = tmp / "scheduler.json"
    env = _env(tmp)
    procs = []
    log = open(tmp / "cluster.log", "w")
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--no-dashboard", "--scheduler-file", str(sched_file)], env=env, stdout=log, stderr=log))
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                pytest.fail(f"dask scheduler did not start: {(tmp / 'cluster.log').read_text()[-2000:]}")
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", address, "--nworkers", "1", "--nthreads", "1",
             "--no-dashboard", "--host", "127.0.0.1", "--memory-limit", "2GB"], env=env, stdout=log, stderr=log))
        client = distributed.Client(address, timeout=30)
        client.wait_for_workers(1, timeout=60)
        yield address, client
        client.close()
    finally:
        stop_processes(procs)
        log.close()


def test_same_answer_through_a_client_as_in_local_processes(cluster, tmp_path):
    from workbench.analysis.trace.ranks import load_ranks, ranks_summary

    _, client = cluster
    local = ranks_summary(load_ranks(RANKS / "straggler", processes=1, cache=False))
    remote_view = load_ranks(RANKS / "straggler", client=client, cache=False)
    assert ranks_summary(remote_view) == local
    assert remote_view.straggler["rank"] == 2
    # what came back is the compact per-rank frame (a few tables), not a trace
    frame = remote_view.frames[0]
    assert not hasattr(frame, "events") and len(frame.collectives) == 8


def test_cli_scheduler_gives_the_same_json(cluster, tmp_path):
    address, _ = cluster
    env = _env(tmp_path)
    args = [sys.executable, "-m", "workbench", "ranks", str(RANKS / "straggler"), "--json", "--no-cache"]
    local = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    remote = subprocess.run(args + ["--scheduler", address], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert json.loads(remote.stdout)["straggler"]["rank"] == 2


def test_cli_scheduler_that_is_not_there_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "workbench", "ranks", str(RANKS / "healthy"), "--no-cache",
                        "--scheduler", f"tcp://127.0.0.1:{port}"], capture_output=True, text=True, cwd=ROOT,
                       env=_env(tmp_path), timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0] and "dask scheduler" in lines[0]

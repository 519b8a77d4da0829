"""The cases that could crash, hang or exhaust the process, run in a subprocess of their own: a
timeout (a hang fails the case, not the suite), an address-space limit (RLIMIT_AS: a memory blow-up
is a MemoryError or a clean refusal, never the machine's swap) and the exit status (a signal such as
SIGSEGV fails the case). Large inputs are generated as compressed streams, never materialised."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hostile_cases as hc
from hostile_harness import ROOT, assert_clean, digest_tree

GiB = 2**30


def _run(argv: list, cwd: Path, timeout: float = 120, mem_bytes: int | None = 3 * GiB, env: dict | None = None):
    def limit():
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WORKBENCH_PROGRESS_AFTER_S="3600")
    e.pop("WORKBENCH_MAX_DECODED_BYTES", None)
    e.update(env or {})
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "workbench", *map(str, argv)], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, preexec_fn=limit, env=e)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def _case(tmp_path: Path, name: str, data: bytes) -> Path:
    f = tmp_path / name
    f.write_bytes(data)
    return f


def _clean_refusal(rc, err, names, ok_codes=(2,)):
    assert rc >= 0, f"killed by signal {-rc}: {err[-500:]}"
    assert_clean(rc, err, names, ok_codes=ok_codes)


def test_deep_tuple_action_does_not_crash(tmp_path):
    f = _case(tmp_path, "deep_action.pickle", hc.deep_action_snapshot(10**6))
    before = digest_tree(tmp_path)
    rc, out, err, _ = _run(["memory", f.name, "--json"], tmp_path)
    _clean_refusal(rc, err, (f.name,), ok_codes=(0, 2))
    assert digest_tree(tmp_path) == before


def test_deep_tuple_dict_key_does_not_crash(tmp_path):
    # the unpickler itself hashes a dict key: nothing but isolation can stop that segfault
    f = _case(tmp_path, "deep_key.pickle", hc.deep_key_snapshot(10**6))
    rc, out, err, _ = _run(["memory", f.name], tmp_path)
    _clean_refusal(rc, err, (f.name,))


def test_memo_reference_bomb_is_refused_within_bounded_memory(tmp_path):
    f = _case(tmp_path, "memo_bomb.pickle.gz", hc.memo_bomb(10**8))
    assert f.stat().st_size < 1 << 20  # ~200 KB on disk for 10^8 references
    rc, out, err, wall = _run(["memory", f.name], tmp_path, mem_bytes=3 * GiB)
    _clean_refusal(rc, err, (f.name,))
    assert "decompresses to more than" in err or "memo references" in err, err


def test_brace_then_gigabytes_of_spaces_is_bounded(tmp_path):
    # '{' + 5 GiB of spaces: ~5 MB of gzip; refused as it inflates (the rate check) or once 16 MiB of
    # whitespace were skipped, nothing held in memory
    f = _case(tmp_path, "spaces.json.gz", hc.gzip_repeated(b"{", b" " * (1 << 20), 5 * 1024))
    rc, out, err, wall = _run(["trace", f.name], tmp_path, mem_bytes=3 * GiB)
    _clean_refusal(rc, err, (f.name,))
    assert "decompresses to more than" in err or "whitespace before its events" in err, err


def test_decoded_limit_is_overridable(tmp_path):
    # one event whose name runs for 80 MiB (no 'ph'): over the 64 MiB limit of an 80 KB file
    f = _case(tmp_path, "long_event.json.gz", hc.gzip_repeated(b'{"traceEvents": [{"name": "', b"k" * (1 << 20), 80,
                                                               b'"}]}'))
    rc, out, err, _ = _run(["trace", f.name], tmp_path)
    _clean_refusal(rc, err, (f.name,))
    assert "decompresses to more than" in err and "WORKBENCH_MAX_DECODED_BYTES" in err, err
    rc, out, err, _ = _run(["trace", f.name], tmp_path, env={"WORKBENCH_MAX_DECODED_BYTES": "1G"})
    _clean_refusal(rc, err, (f.name,))
    assert "decompresses to more than" not in err, err  # read to the end, then refused for what it is


def test_one_huge_nvml_line_is_refused_without_reading_it(tmp_path):
    f = _case(tmp_path, "one_line.jsonl.gz",
              hc.gzip_repeated(b'{"t_s": 0, "gpu": 0, "x": "', b"a" * (1 << 20), 5 * 1024, b'"}\n'))
    rc, out, err, wall = _run(["monitor", "--replay", f.name, "--quiet"], tmp_path, mem_bytes=3 * GiB)
    _clean_refusal(rc, err, (f.name,))
    assert "longer than" in err or "decompresses to more than" in err, err


def test_trace_without_event_boundary_is_linear(tmp_path):
    # one event whose string runs for 48 MiB: no '},{' anywhere, the pending buffer must not be rescanned
    f = _case(tmp_path, "no_boundary.json.gz",
              hc.gzip_repeated(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "pid": 0, '
                               b'"tid": 0, "name": "', b"k" * (1 << 20), 48, b'"}]}'))
    rc, out, err, wall = _run(["trace", f.name, "--json"], tmp_path, timeout=120, mem_bytes=4 * GiB)
    _clean_refusal(rc, err, (f.name,), ok_codes=(0, 2))
    assert wall < 90, wall


def test_fifo_input_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.json.gz"
    os.mkfifo(fifo)
    for argv in (["trace", fifo.name], ["memory", fifo.name], ["monitor", "--replay", fifo.name]):
        rc, out, err, wall = _run(argv, tmp_path, timeout=60)
        _clean_refusal(rc, err, (fifo.name,))
        assert "FIFO" in err, err


def test_looping_replay_at_huge_speed_stops(tmp_path):
    code = (
        "import time; from workbench import samples; from workbench.capture.sampler import ReplaySampler\n"
        "s = ReplaySampler(samples.path('h200_nvml_session'), speed=1e300, loop=True, interval_s=0.01)\n"
        "s.start(); time.sleep(0.5); t = time.perf_counter(); s.stop()\n"
        "assert not s.running, 'thread still alive after stop()'\n"
        "print(round(time.perf_counter() - t, 3))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert float(p.stdout.strip()) < 5


def test_stop_ends_the_replay_thread_in_process():
    from workbench import samples
    from workbench.capture.sampler import ReplaySampler

    for speed, loop in ((1.0, False), (1e6, True), (1e300, True)):
        s = ReplaySampler(samples.path("h200_nvml_session"), speed=speed, loop=loop, interval_s=0.01)
        s.start()
        time.sleep(0.2)
        s.stop()
        assert not s.running
        assert not any(t.name == s.thread_name and t.is_alive() for t in threading.enumerate())
    with pytest.raises(ValueError, match="finite"):
        ReplaySampler(samples.path("h200_nvml_session"), speed=float("inf"))


def test_last_resort_line_and_debug_traceback(tmp_path):
    """An unexpected exception (a bug) is one line with 'please report'; WORKBENCH_DEBUG=1 adds the traceback."""
    code = ("import sys; from workbench import cli; import workbench.commands.trace as t\n"
            "t.run = lambda args: 1 / 0\n"
            "sys.exit(cli.main(['trace', 'x.json']))\n")
    for debug in ("", "1"):
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), WORKBENCH_DEBUG=debug))
        assert p.returncode == 2
        last = p.stderr.strip().splitlines()[-1]
        assert "please report" in last and "x.json" in last and "ZeroDivisionError" in last, last
        assert ("Traceback" in p.stderr) == bool(debug)


def test_the_sentinel_pickles_really_run_code_under_plain_pickle(tmp_path):
    """Control experiment: plain pickle.load on the corpus's code-running pickles creates the sentinel
    (in a throw-away folder and process), so its absence after gpu-workbench loaded them means something."""
    import gzip

    from hostile_harness import CORPUS

    for name in hc.CODE_RUNNING:
        data = (CORPUS / "snapshot" / name).read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        d = tmp_path / name
        d.mkdir()
        (d / "p").write_bytes(data)
        subprocess.run([sys.executable, "-c", "import pickle; pickle.loads(open('p', 'rb').read())"], cwd=d,
                       capture_output=True, timeout=30)
        assert (d / hc.SENTINEL).exists(), f"{name} does not run code under plain pickle: not a proof"

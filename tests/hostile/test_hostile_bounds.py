"""Refusals come before the memory and the time (docs/safety.md, "Bounds while reading").

Each case runs ``workbench`` in a subprocess and measures it: its peak resident memory (``os.wait4``'s
``ru_maxrss``: the process and the children it waited for, such as the forked snapshot unpickler) and
its wall time. A refusal must name its limit, and the peak must stay within twice that limit and within
1 GiB; a reader that skips (blank lines, whitespace, bytes after a pickle) must stop in bounded time and
say so. Inputs of gigabytes are generated as repeated deflate blocks (``hostile_cases.gzip_repeated``):
a few MB on disk, nothing large materialised. Also here: the one-line refusals of the estimate command
and of an absurd trace time, ``--debug``, and Ctrl-C's exit code 130.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hostile_cases as hc
from hostile_harness import CORPUS, ROOT, assert_clean, run_cli

GiB, MiB = 2**30, 2**20
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def _measured(argv: list, cwd: Path, timeout: float = 120, env: dict | None = None):
    """``workbench argv`` in a subprocess: (exit code, stdout, stderr, wall seconds, peak RSS bytes)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", WORKBENCH_PROGRESS_AFTER_S="3600")
    e.pop("WORKBENCH_MAX_DECODED_BYTES", None)
    e.update(env or {})
    out, err = cwd / ".stdout", cwd / ".stderr"
    t0 = time.perf_counter()
    rss = cwd / ".maxrss"
    # A small launcher runs the command and reports its peak: a process forked from this (large) pytest
    # process carries pytest's RSS high-water mark into its ru_maxrss across exec, one forked from the
    # launcher carries only the launcher's.
    with open(out, "w") as o, open(err, "w") as r:
        p = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(rss), sys.executable, "-m", "workbench",
                              *map(str, argv)], cwd=cwd, stdout=o, stderr=r, env=e, start_new_session=True)
    killer = threading.Timer(timeout, lambda: os.killpg(p.pid, signal.SIGKILL))
    killer.start()
    try:
        p.wait()
    finally:
        killer.cancel()
    wall = time.perf_counter() - t0
    assert wall < timeout, f"killed after {timeout} s: {argv}"
    return p.returncode, out.read_text(), err.read_text(), wall, int(rss.read_text()) * 1024


_LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _named_limit(err: str) -> int:
    """The decoded limit a refusal names: 'at most X for this' or 'decompresses to more than X ('."""
    m = (re.search(r"at most ([\d.]+) (B|KiB|MiB|GiB|TiB) for this", err)
         or re.search(r"decompresses to more than ([\d.]+) (B|KiB|MiB|GiB|TiB) \(", err))
    assert m, f"the refusal names no limit: {err}"
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _refused_within(rc, err, wall, peak, names, max_wall):
    assert rc == 2, (rc, err[-500:])
    assert_clean(rc, err, names)
    assert len(err.strip().splitlines()) == 1, err
    assert wall < max_wall, f"{wall:.1f} s"


@pytest.mark.parametrize("unit_refs", [4096, 1 << 19], ids=["275to1", "1000to1"])
def test_memo_bomb_of_1e9_references_is_refused_before_the_memory(tmp_path, unit_refs):
    # 10^9 two-byte memo references (2 GB of pickle, 8 GB of list if built): 7.2 MB / 1.9 MB of gzip
    f = tmp_path / "memo_1e9.pickle.gz"
    f.write_bytes(hc.memo_bomb(10**9, unit_refs))
    rc, out, err, wall, peak = _measured(["memory", f.name], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert "decompresses to more than" in err, err
    limit = _named_limit(err)
    assert peak <= min(2 * limit, GiB), f"peak {peak / MiB:.0f} MiB for a named limit of {limit / MiB:.0f} MiB"


def test_gigabyte_of_blank_nvml_lines_is_refused_in_bounded_time(tmp_path):
    # ~10^9 blank lines (1 GiB, 1 MB of gzip): skipped in bulk and refused after 16 MiB of them
    f = tmp_path / "blank.jsonl.gz"
    f.write_bytes(hc.gzip_repeated(b"", b"\n" * MiB, 1024))
    rc, out, err, wall, peak = _measured(["monitor", "--replay", f.name, "--quiet"], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert "blank lines" in err and "refused after skipping" in err, err
    assert peak <= GiB
    # timeline sniffs the file's head first (64 KiB of blank lines: no known kind): refused as quickly
    rc, out, err, wall, peak = _measured(["timeline", "--nvml", f.name], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)


def test_blank_lines_then_a_csv_are_refused_too(tmp_path):
    f = tmp_path / "blank_then_csv.csv.gz"
    f.write_bytes(hc.gzip_repeated(b"", b"\r\n" * (MiB // 2), 64, b"t_s,gpu\n0,0\n"))
    rc, out, err, wall, peak = _measured(["monitor", "--replay", f.name, "--quiet"], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert "blank lines" in err, err


def test_gigabyte_of_valid_nvml_rows_is_refused_before_any_row_is_built(tmp_path):
    # 1 GiB of valid rows compresses ~250:1 (deflate's best for a 250-byte period), under the default
    # limit; with a 256 MiB limit it must be refused having built nothing (the gzip is inflated once,
    # to its end, before rows are parsed)
    row = json.dumps(hc.nvml_row()).encode() + b"\n"
    f = tmp_path / "rows.jsonl.gz"
    f.write_bytes(hc.gzip_repeated(b"", row * (MiB // len(row)), 1024))
    rc, out, err, wall, peak = _measured(["monitor", "--replay", f.name, "--quiet"], tmp_path,
                                         env={"WORKBENCH_MAX_DECODED_BYTES": "256M"})
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    limit = _named_limit(err)
    assert limit == 256 * MiB
    assert peak <= min(2 * limit, GiB), f"peak {peak / MiB:.0f} MiB"


def test_trace_of_gigabytes_of_spaces_is_refused_early(tmp_path):
    # '{' + 5 GiB of spaces (~5 MB of gzip): refused as it inflates (rate) or by the whitespace bound
    f = tmp_path / "spaces.json.gz"
    f.write_bytes(hc.gzip_repeated(b"{", b" " * MiB, 5 * 1024))
    rc, out, err, wall, peak = _measured(["trace", f.name], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert peak <= GiB


def test_trace_whitespace_before_the_events_is_bounded(tmp_path):
    # 40 MiB of spaces at ~256:1 (under the rate) before traceEvents: the reader skips at most 16 MiB
    f = tmp_path / "ws.json.gz"
    unit = (b" " * 4000 + b"\n") * 16
    f.write_bytes(hc.gzip_repeated(b"{", unit, (40 * MiB) // len(unit), b'"traceEvents": []}'))
    rc, out, err, wall, peak = _measured(["trace", f.name], tmp_path, env={"WORKBENCH_MAX_DECODED_BYTES": "1G"})
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert "whitespace before its events" in err and "refused after skipping" in err, err


def test_bytes_after_a_snapshot_pickle_are_bounded(tmp_path):
    import pickle

    data = pickle.dumps(hc.base_snapshot(), protocol=4)
    f = tmp_path / "trailing.pickle.gz"
    f.write_bytes(hc.gzip_repeated(data, b"\x00" * MiB, 64))
    rc, out, err, wall, peak = _measured(["memory", f.name], tmp_path)
    _refused_within(rc, err, wall, peak, (f.name,), max_wall=60)
    assert "after the end of its pickle" in err, err


# ------------------------------------------------------------------------------ one-line refusals

_MODEL_CASES = ("model_keyerror.py", "model_zerodivision.py", "model_calls_cuda.py", "model_not_module.py",
                "batch_returns_int.py", "model_exits.py")


def _stage(name: str, work: Path, kind: str = "estimate") -> Path:
    src = CORPUS / kind / (name + ".case" if kind == "estimate" else name)
    dst = work / name
    dst.write_bytes(src.read_bytes())
    return dst


def test_model_file_refusals_are_one_line(_in_empty_folder):
    good = (CORPUS / "estimate" / "valid.py.case").read_bytes()
    # a ValueError whose message runs over several lines: still one line
    (_in_empty_folder / "model_valueerror.py").write_bytes(
        good.replace(b"return torch.nn.Linear(8, 8)", b"raise ValueError('bad shape\\nsecond line\\nthird')"))
    for name in _MODEL_CASES + ("model_valueerror.py",):
        f = _stage(name, _in_empty_folder) if name != "model_valueerror.py" else _in_empty_folder / name
        for argv in (["estimate", f.name], ["estimate", f.name, "--json"]):
            rc, out, err = run_cli(argv)
            assert rc == 2, (name, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1, (name, err)
            assert f.name in lines[0] and "error" in lines[0] and "Traceback" not in err, lines[0]
    _, _, err = run_cli(["estimate", "model_calls_cuda.py"])
    assert ".cuda()" in err and "default device" in err, err
    _, _, err = run_cli(["estimate", "model_keyerror.py"])
    assert "model() raised KeyError" in err and "line 3" in err, err
    _, _, err = run_cli(["estimate", "model_valueerror.py"])
    assert "model() raised ValueError: bad shape second line third at line 3" in err, err
    _, _, err = run_cli(["estimate", "model_not_module.py"])
    assert "model() returned int, not a torch.nn.Module" in err, err


def test_debug_shows_the_users_traceback(_in_empty_folder):
    f = _stage("model_keyerror.py", _in_empty_folder)
    for argv in (["--debug", "estimate", f.name], ["estimate", f.name, "--debug"]):
        rc, out, err = run_cli(argv)
        assert rc == 2
        assert "Traceback" in err and f'File "{f.name}", line 3, in model' in err, err
        assert err.strip().splitlines()[-1].startswith("workbench estimate: error: model_keyerror.py")


def test_absurd_trace_time_is_one_line(_in_empty_folder):
    f = _stage("ts_1e308.json", _in_empty_folder, "trace")
    for argv in (["trace", f.name], ["trace", f.name, "--json"], ["trace", f.name, "--html", "out.html"]):
        rc, out, err = run_cli(argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert f.name in err and "beyond any clock" in err and "re-export" in err, err
    assert not (_in_empty_folder / "out.html").exists()


def test_no_command_is_one_line(_in_empty_folder):
    rc, out, err = run_cli([])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "give a command" in err, err


# ----------------------------------------------------------------------------------------- Ctrl-C


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_estimate_interrupted_exits_130(tmp_path):
    f = tmp_path / "valid.py"
    f.write_bytes((CORPUS / "estimate" / "valid.py.case").read_bytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for delay in (0.5, 2.5):
        p = subprocess.Popen([sys.executable, "-m", "workbench", "estimate", f.name], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
        if p.returncode == 0:  # finished before the signal (a fast machine): nothing to interrupt
            continue
        assert p.returncode == 130, (delay, p.returncode, err)
        assert err.strip().splitlines()[-1].endswith("interrupted") and "Traceback" not in err, err


def test_ctrl_c_during_shutdown_is_still_130(tmp_path):
    # the command is done; a SIGINT while the process winds down (here: in an atexit callback, as torch's
    # teardown would take time) must end it with 130, not a death by signal, and output is flushed
    from workbench import samples

    code = ("import atexit, os, signal, sys, time\n"
            "from workbench.cli import console_main\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))\n"
            "console_main(['memory', sys.argv[1], '--json'])\n")
    p = subprocess.run([sys.executable, "-c", code, str(samples.path("h200_oom_snapshot"))], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, preexec_fn=_default_sigint,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 130, (p.returncode, p.stderr[-500:])
    assert json.loads(p.stdout)["oom"], "the command's output was lost"
    # without a signal: the command's own exit code
    code0 = ("import sys\nfrom workbench.cli import console_main\nconsole_main(['memory', sys.argv[1], '--json'])\n")
    p = subprocess.run([sys.executable, "-c", code0, str(samples.path("h200_oom_snapshot"))], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0 and json.loads(p.stdout)["oom"], p.stderr[-500:]

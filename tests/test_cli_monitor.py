"""`workbench monitor` end to end, in subprocesses: replay, CSV, no NVML, Ctrl-C, Prometheus scrape."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from testdata import default_sigint

from workbench import samples
from workbench.analysis.nvml import interval_stats
from workbench.commands.monitor import format_interval_line, format_line
from workbench.io.nvml import load_nvml_session

SAMPLE = samples.path("h200_nvml_session")
EXE = [sys.executable, "-m", "workbench", "monitor"]
LINE = re.compile(r"^\s+\d+\.\d\ds  gpu0  util +\d+% \(max +\d+%\)  mem +\d+\.\d/140\.4 GiB +\d+ W \(max +(\d+) W\)"
                  r" +\d+ C +\d+ MHz$")


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_replay_prints_lines_and_writes_csv(tmp_path):
    out = tmp_path / "session.csv.gz"
    r = subprocess.run(EXE + ["--replay", str(SAMPLE), "--speed", "50", "--interval", "0.05", "--csv", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) >= 3 and all(LINE.match(line) for line in lines), lines[:3]
    # Printed lines sample the newest row at each tick, so on a loaded machine they may skip phases;
    # the CSV holds every replayed row, busy and idle phases both.
    back = load_nvml_session(out)
    assert len(back) == 427
    assert back["util_gpu_pct"].max() >= 90 and back["util_gpu_pct"].min() == 0
    assert f"wrote 427 samples to {out}" in r.stderr
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.startswith("workbench monitor: 427 samples from 1 GPU(s)")
    assert "peak mem 8.8 GiB" in summary and "peak 577 W" in summary and "max 57 C" in summary
    # each line is its interval's mean and max, so the peak the summary reports is on a line
    assert max(int(LINE.match(line).group(1)) for line in lines) == round(back["power_w"].max()) == 577


def test_replay_by_sample_name_and_duration():
    t0 = time.perf_counter()
    r = subprocess.run(EXE + ["--replay", "h200_nvml_session", "--duration", "1.5", "--interval", "0.5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert 2 <= len(r.stdout.splitlines()) <= 4  # ~3 ticks in 1.5 s at real speed
    assert time.perf_counter() - t0 < 60


@pytest.mark.skipif(_nvml_present(), reason="NVML is present here")
def test_without_nvml_one_line_and_exit_2():
    r = subprocess.run(EXE + ["--duration", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("workbench monitor: error: NVML not available: NVML Shared Library Not Found")
    assert "--replay FILE" in err[0] and "Traceback" not in r.stderr


def test_bad_replay_file_and_bad_interval(tmp_path):
    bad = tmp_path / "garbage.jsonl"
    bad.write_text("{not json\n")
    r = subprocess.run(EXE + ["--replay", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(EXE + ["--replay", str(SAMPLE), "--interval", "0.001"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--interval" in r.stderr
    r = subprocess.run(EXE + ["--replay", str(SAMPLE), "--csv", str(tmp_path / "x.xlsx")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "x.xlsx" in r.stderr


def test_ctrl_c_stops_cleanly_with_summary_and_csv(tmp_path):
    out = tmp_path / "s.jsonl"
    p = subprocess.Popen(EXE + ["--replay", str(SAMPLE), "--loop", "--speed", "5", "--interval", "0.1",
                                "--csv", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        first = p.stdout.readline()  # wait until it is really sampling
        assert LINE.match(first.rstrip("\n")), first
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, stderr
    assert "Traceback" not in stderr
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith("workbench monitor: interrupted; ") and "GPU(s)" in summary
    assert len(load_nvml_session(out)) > 0


def test_prometheus_endpoint_serves_gauges_per_gpu():
    port = _free_port()
    p = subprocess.Popen(EXE + ["--replay", str(SAMPLE), "--loop", "--speed", "10", "--interval", "0.1",
                                "--prometheus", str(port), "--bind", "127.0.0.1", "--quiet", "--duration", "60"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    text = ""
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    assert resp.status == 200
                    text = resp.read().decode()
                if 'workbench_gpu_power_watts{gpu="0"}' in text:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    values = dict(re.findall(r'^(workbench_gpu_\w+)\{gpu="0"\} (\S+)$', text, re.M))
    assert "# TYPE workbench_gpu_power_watts gauge" in text
    assert 70 <= float(values["workbench_gpu_power_watts"]) <= 580   # the recording's range
    assert float(values["workbench_gpu_memory_total_bytes"]) == 150754820096
    assert 345e6 <= float(values["workbench_gpu_sm_clock_hertz"]) <= 1980e6  # MHz -> Hz
    assert re.search(r'^workbench_samples_total\{gpu="0"\} [1-9]', text, re.M)
    assert p.returncode == 0


def test_format_line_shows_throttling_but_not_idle():
    row = {"gpu": 3, "util_gpu_pct": 97.0, "mem_used_bytes": 34.1 * 2**30, "mem_total_bytes": 139.8 * 2**30,
           "power_w": 312.4, "temp_c": 61.0, "sm_clock_mhz": 1980.0, "throttle_reasons": "gpu_idle,sw_power_cap"}
    assert format_line(row) == "gpu3  util  97%  mem  34.1/139.8 GiB   312 W   61 C  1980 MHz  [sw_power_cap]"
    row.update(throttle_reasons="gpu_idle", power_w=float("nan"))
    assert format_line(row) == "gpu3  util  97%  mem  34.1/139.8 GiB     ? W   61 C  1980 MHz"


def test_interval_stats_are_the_intervals_mean_and_max():
    frame = load_nvml_session(SAMPLE)
    chunk = frame[(frame["t_s"] >= 10) & (frame["t_s"] < 13)]
    st = interval_stats(chunk).iloc[0]
    assert st["samples"] == len(chunk) > 10
    assert st["util_gpu_mean_pct"] == pytest.approx(chunk["util_gpu_pct"].mean())
    assert st["util_gpu_max_pct"] == chunk["util_gpu_pct"].max()
    assert st["power_max_w"] == chunk["power_w"].max() and st["power_mean_w"] == pytest.approx(chunk["power_w"].mean())
    assert st["mem_used_max_bytes"] == chunk["mem_used_bytes"].max() and st["temp_max_c"] == chunk["temp_c"].max()
    line = format_interval_line(st)
    assert f"(max {chunk['power_w'].max():4.0f} W)" in line and line.startswith("gpu0  util ")


def _in_pty(args, cols=120, timeout=60):
    """Run ``workbench monitor ARGS`` with stdout on a pseudo-terminal of ``cols`` columns; returns
    (exit code, what the terminal received, stderr)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the terminal's own size
    p = subprocess.Popen(EXE + args, stdout=slave, stdin=slave, stderr=subprocess.PIPE, close_fds=True, env=env)
    os.close(slave)
    buf = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            buf += data
        elif p.poll() is not None:
            break
    os.close(master)
    err = p.communicate(timeout=30)[1].decode()
    return p.returncode, buf.decode(errors="replace"), err


def test_in_a_terminal_the_screen_is_redrawn_in_place():
    rc, screen, err = _in_pty(["--replay", str(SAMPLE), "--speed", "25", "--interval", "0.2"])
    assert rc == 0, err
    # redrawn in place: rich moves the cursor up and erases the previous frame's lines, many times
    frames = screen.count("workbench monitor")
    assert frames >= 3 and screen.count("\x1b[1A\x1b[2K") >= 3 * (frames - 1)
    assert not re.search(r"\d\.\d\ds  gpu0  util", screen)  # no scrolling log lines
    last = screen.rsplit("workbench monitor", 1)[1]
    assert "replaying h200_nvml_session.jsonl.gz" in last and "427 samples" in last
    assert "█" in screen and "░" in last  # bars
    assert re.search(r"util +\S+ +\d+% max +\d+%", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", last))
    # the peak the summary reports is on the screen
    assert "session peaks: gpu0 util 100%, mem 8.8 GiB, power 577 W, temp 57 C" in last
    assert "processes are not recorded in a replay" in last
    assert "peak 577 W" in err.strip().splitlines()[-1]


def test_plain_in_a_terminal_prints_lines():
    rc, screen, err = _in_pty(["--replay", str(SAMPLE), "--speed", "50", "--interval", "0.1", "--plain"])
    assert rc == 0, err
    lines = [line for line in screen.replace("\r", "").splitlines() if line.strip()]
    assert len(lines) >= 3 and all(LINE.match(line) for line in lines), lines[:3]
    assert "\x1b[1A" not in screen

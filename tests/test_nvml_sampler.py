"""Samplers on a CPU machine: the replay sampler, the ring, thread lifetimes, and the NVML side that is
real here (the library is missing; NVML's own NotSupported error through the query helper)."""

from __future__ import annotations

import collections
import math
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.capture.nvml import NvmlSampler, nvml_query
from workbench.capture.sampler import RING_COLUMNS, ReplaySampler, SampleRing, Sampler, _ThreadedSampler
from workbench.errors import NoNVML
from workbench.io.nvml import NVML_COLUMNS, load_nvml_session

SAMPLE = samples.path("h200_nvml_session")


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def _workbench_threads():
    return [t for t in threading.enumerate() if t.name.startswith("workbench") and t.is_alive()]


# -- replay ---------------------------------------------------------------------------------------


def test_replay_plays_every_row_unchanged():
    ref = load_nvml_session(SAMPLE)
    s = ReplaySampler(SAMPLE, speed=500)
    assert isinstance(s, Sampler)
    with s:
        assert s.wait(timeout=20)
    assert s.finished and not s.running and s.error is None
    got = s.frame()
    assert list(got.columns) == list(NVML_COLUMNS)
    assert len(got) == len(ref)
    np.testing.assert_allclose(got["t_s"], ref["t_s"] - ref["t_s"].iloc[0])
    for col in ("util_gpu_pct", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz"):
        np.testing.assert_array_equal(got[col].to_numpy(), ref[col].to_numpy())
    assert s.gpus == [0]
    assert s.recorded_interval_s == pytest.approx(0.05, abs=0.01)


def test_replay_paces_rows_by_their_time():
    s = ReplaySampler(SAMPLE, speed=10, interval_s=0.02)
    t0 = time.perf_counter()
    s.start()
    time.sleep(0.5)
    n_mid = len(s.frame())
    wall = time.perf_counter() - t0
    s.stop()
    f = s.frame()
    # at 10x, 0.5 s of wall time is ~5 s of recording (~100 of 427 rows), certainly not all of it
    assert 0 < n_mid < 427
    assert f["t_s"].max() <= wall * 10 + 0.5
    assert f["t_s"].max() >= 1.0


def test_replay_loop_keeps_time_increasing_and_repeats_values():
    s = ReplaySampler(SAMPLE, speed=400, loop=True)
    with s:
        deadline = time.time() + 20
        while len(s.frame()) < 900 and time.time() < deadline:
            time.sleep(0.05)
    f = s.frame()
    assert len(f) >= 900
    assert f["t_s"].is_monotonic_increasing
    np.testing.assert_array_equal(f["util_gpu_pct"].iloc[427:854].to_numpy(), f["util_gpu_pct"].iloc[:427].to_numpy())
    assert f["t_s"].iloc[427] > f["t_s"].iloc[426]


def test_resume_after_stop_continues_not_restarts():
    s = ReplaySampler(SAMPLE, speed=20)
    s.start()
    time.sleep(0.3)
    s.stop()
    n1 = len(s.frame())
    t1 = s.frame()["t_s"].max()
    s.start()
    time.sleep(0.3)
    s.stop()
    f = s.frame()
    assert len(f) > n1 and f["t_s"].is_monotonic_increasing and f["t_s"].max() > t1
    assert not f.duplicated(["t_s", "gpu"]).any()


def test_marks_live_and_recorded(tmp_path):
    s = ReplaySampler(SAMPLE, speed=50)
    with s:
        time.sleep(0.2)
        t = s.mark("warmup done")
        s.wait(timeout=20)
    assert 0 < t < 25.5
    out = s.save(tmp_path / "rec.jsonl.gz")
    back = load_nvml_session(out)
    assert len(back) == 427 and back.attrs["marks"] == [{"t_s": t, "label": "warmup done"}]
    # replaying the recording replays its marks at their time
    r = ReplaySampler(out, speed=500)
    with r:
        r.wait(timeout=20)
    assert r.marks() == [{"t_s": pytest.approx(t), "label": "warmup done"}]


def test_replay_of_a_frame_with_two_gpus():
    one = load_nvml_session(SAMPLE)
    two = pd.concat([one, one.assign(gpu=1, util_gpu_pct=one["util_gpu_pct"] / 2)]).sort_values("t_s", kind="stable")
    s = ReplaySampler(two, speed=500)
    with s:
        s.wait(timeout=20)
    f = s.frame()
    assert s.gpus == [0, 1] and s.source == "replaying a session frame"
    assert f.groupby("gpu").size().to_dict() == {0: 427, 1: 427}
    assert f.loc[f.gpu == 1, "util_gpu_pct"].max() == one["util_gpu_pct"].max() / 2


def test_history_is_bounded():
    s = ReplaySampler(SAMPLE, speed=500, max_rows=100)
    with s:
        s.wait(timeout=20)
    f = s.frame()
    assert len(f) == 100 and s.ring.count == 427
    np.testing.assert_allclose(f["t_s"].to_numpy(), s._data[-100:, 0])


def test_rows_since_gives_only_new_rows():
    s = ReplaySampler(SAMPLE, speed=40)
    seen, cursor = [], 0
    with s:
        while s.running:
            rows, cursor = s.rows_since(cursor)
            seen.append(rows)
            time.sleep(0.03)
    rows, cursor = s.rows_since(cursor)
    seen.append(rows)
    allrows = np.concatenate(seen)
    assert len(allrows) == 427 and cursor == 427
    assert np.all(np.diff(allrows[:, 0]) >= 0)


def test_ring_matches_a_deque_under_wraparound():
    rng = np.random.default_rng(0)
    ring = SampleRing(capacity=37)
    ref = collections.deque(maxlen=37)
    n = 0
    for _ in range(200):
        k = int(rng.integers(0, 60))
        chunk = np.arange(n, n + k, dtype=float)[:, None] * np.ones((1, len(RING_COLUMNS)))
        if k == 1 and rng.random() < 0.5:
            ring.append(chunk[0])
        else:
            ring.extend(chunk)
        ref.extend(range(n, n + k))
        n += k
        assert ring.all()[:, 0].tolist() == list(ref)
        assert ring.count == n
    rows, cur = ring.rows_since(n - 5)
    assert rows[:, 0].tolist() == list(ref)[-5:] and cur == n


def test_interval_limits():
    with pytest.raises(ValueError, match="100 Hz"):
        NvmlSampler(interval_s=0.001)
    with pytest.raises(ValueError, match="speed"):
        ReplaySampler(SAMPLE, speed=0)


# -- threads always end -------------------------------------------------------------------------


def _start_stop_cycles_leak_no_thread(cycles: int):
    before = threading.active_count()
    s = ReplaySampler(SAMPLE, speed=1.0, loop=True)
    for _ in range(cycles):
        s.start()
        s.stop()
        assert not s.running
    assert threading.active_count() == before
    assert _workbench_threads() == []


def test_fifty_start_stop_cycles_leak_no_thread():
    _start_stop_cycles_leak_no_thread(50)


@pytest.mark.slow
def test_thousand_start_stop_cycles_leak_no_thread():
    _start_stop_cycles_leak_no_thread(1000)


def test_thread_ends_when_the_with_block_raises():
    s = ReplaySampler(SAMPLE, speed=1.0, loop=True)
    with pytest.raises(RuntimeError):
        with s:
            assert s.running
            raise RuntimeError("user code failed")
    assert not s.running
    with pytest.raises(KeyboardInterrupt):
        with s:
            raise KeyboardInterrupt  # what Jupyter's interrupt raises in the cell
    assert not s.running and _workbench_threads() == []


class _Broken(_ThreadedSampler):
    """A sampler whose read fails on the third tick, as a driver call might."""

    thread_name = "workbench-test-broken"

    def __init__(self):
        super().__init__(interval_s=0.01, history_s=10, max_rows=None)
        self.n = 0

    def _open(self):
        return 1

    def _now(self):
        return float(self.n)

    def _tick(self):
        self.n += 1
        if self.n == 3:
            raise OSError("device fell off the bus")
        self.ring.append([self.n, 0] + [0.0] * (len(RING_COLUMNS) - 2))
        return True


def test_thread_ends_and_reports_when_a_read_raises():
    s = _Broken().start()
    assert s.wait(timeout=5)
    assert isinstance(s.error, OSError) and "fell off" in str(s.error)
    assert len(s.frame()) == 2
    s.stop()


def test_atexit_stops_a_sampler_left_running():
    code = textwrap.dedent(
        f"""
        import atexit, threading
        def check():  # registered first, so it runs after workbench's own exit hook
            alive = [t.name for t in threading.enumerate() if t.name.startswith("workbench") and t.is_alive()]
            print("alive at exit:", alive, "running:", s.running, flush=True)
        atexit.register(check)
        from workbench.capture.sampler import ReplaySampler
        s = ReplaySampler({str(SAMPLE)!r}, loop=True).start()
        assert s.running
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "alive at exit: [] running: False" in r.stdout


def test_sampler_stats_report_own_cpu_time():
    s = ReplaySampler(SAMPLE, speed=20, interval_s=0.01)
    with s:
        time.sleep(0.4)
    st = s.stats()
    assert st["samples"] > 5 and st["wall_s"] >= 0.3
    assert 0 < st["cpu_s"] < st["wall_s"]


# -- NVML: what is real on this machine ---------------------------------------------------------


def test_nvml_is_not_touched_at_import_or_construction():
    r = subprocess.run(
        [sys.executable, "-c",
         "import sys; from workbench.capture.nvml import NvmlSampler; s = NvmlSampler(); "
         "print('pynvml' in sys.modules)"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.skipif(_nvml_present(), reason="NVML is present here; this test is about a machine without it")
def test_missing_nvml_library_becomes_no_nvml_with_cause_and_fix():
    import pynvml

    s = NvmlSampler()
    with pytest.raises(NoNVML) as ei:
        s.start()
    msg = str(ei.value)
    assert "NVML not available: NVML Shared Library Not Found" in msg  # NVML's own reason
    assert "libnvidia-ml.so.1" in msg and "--replay" in msg           # and the fixes
    assert isinstance(ei.value.__cause__, pynvml.NVMLError_LibraryNotFound)
    assert not s.running and _workbench_threads() == []
    with pytest.raises(NoNVML):
        s.devices()


def test_query_helper_turns_not_supported_into_missing_value():
    import pynvml

    seen = []

    def fan_speed():
        raise pynvml.NVMLError_NotSupported()  # NVML's real exception class, as the H200 answers for fans

    v = nvml_query(fan_speed, on_error=lambda kind, exc: seen.append((kind, str(exc))))
    assert math.isnan(v)
    assert seen == [("unsupported", "Not Supported")]

    def flaky():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    assert nvml_query(flaky, default=None, on_error=lambda kind, exc: seen.append(kind)) is None
    assert seen[-1] == "error"
    with pytest.raises(ZeroDivisionError):  # a bug is not an NVML answer: it propagates
        nvml_query(lambda: 1 / 0)
    assert nvml_query(lambda a, b: a + b, 2, 3) == 5


def test_unsupported_metric_is_asked_once_then_skipped():
    import pynvml

    s = NvmlSampler()
    calls = []

    def nvlink_state():
        calls.append(1)
        raise pynvml.NVMLError_NotSupported()

    assert s._read(0, "nvlink", nvlink_state) is None
    assert s._read(0, "nvlink", nvlink_state) is None
    assert len(calls) == 1 and s.unsupported == {(0, "nvlink"): "Not Supported"}

    def timeout():
        calls.append(2)
        raise pynvml.NVMLError_Timeout()

    s._read(0, "power", timeout)
    s._read(0, "power", timeout)
    assert calls.count(2) == 2 and s.errors[(0, "power")] == 2  # transient: asked again


def test_tick_drops_an_unsupported_read_keeps_the_others_and_carries_slow_metrics():
    """The sampler's tick with NVML's real return codes: NotSupported is asked once and left out,
    a transient error leaves a gap and is counted, a metric read every k-th tick keeps its value."""
    import ctypes

    import pynvml

    from workbench.capture.nvml import _Read
    from workbench.capture.sampler import SampleRing, _COL

    s = NvmlSampler(interval_s=0.01)
    s._pynvml = pynvml
    s.gpus = [0]
    s._rows = [[math.nan] * len(RING_COLUMNS)]
    s._rows[0][1] = 0
    s.ring = SampleRing(64)
    s._t0 = time.perf_counter()
    mem, fan, power = ctypes.c_ulonglong(0), ctypes.c_uint(0), ctypes.c_uint(0)
    answers = {"fan": [], "power": []}

    def read_mem():
        mem.value += 1
        return 0

    def read_fan():  # the H200's answer for fan speed
        answers["fan"].append(1)
        return pynvml.NVML_ERROR_NOT_SUPPORTED

    def read_power():
        answers["power"].append(1)
        if len(answers["power"]) == 2:
            return pynvml.NVML_ERROR_TIMEOUT
        power.value = 300_000
        return 0

    reads = [
        _Read("memory", read_mem, (), ((_COL["mem_used_bytes"], mem, "value", 1),), "test"),
        _Read("fan", read_fan, (), ((_COL["temp_c"], fan, "value", 1),), "test"),
        _Read("power", read_power, (), ((_COL["power_w"], power, "value", 0.001),), "test"),
    ]
    reads[2].every = 2
    for r in reads:
        r.gpu = 0
    s._readers = [reads]
    for _ in range(6):
        s._tick()
    f = s.frame()
    assert f.mem_used_bytes.tolist() == [1, 2, 3, 4, 5, 6]
    assert len(answers["fan"]) == 1 and s.unsupported == {(0, "fan"): "Not Supported"}
    assert f.temp_c.isna().all()
    # power read on ticks 0, 2, 4; the second read timed out: a gap until the next good read
    assert len(answers["power"]) == 3 and s.errors == {(0, "power"): 1}
    assert f.power_w.tolist()[:2] == [300.0, 300.0]
    assert f.power_w.iloc[2:4].isna().all() and f.power_w.iloc[4:].tolist() == [300.0, 300.0]
    assert [r.name for r in s._readers[0]] == ["memory", "power"]

"""NVML sampler benchmark: the sampler's own CPU cost at 10 Hz and 100 Hz, the highest sustainable rate,
NVML call latencies, and what the live panel costs a running cell.

    python benchmarks/bench_nvml.py                  # NVML where present, else the replay sampler
    python benchmarks/bench_nvml.py --mode replay --gpus 8
    python benchmarks/bench_nvml.py --mode nvml --seconds 10 --json nvml_bench.json   # on the GPU machine

Numbers:
- ``cpu %`` is the sampling thread's own CPU time (time.thread_time inside the thread) over wall time;
  ``process cpu %`` is the whole process (resource.getrusage) over wall time while the main thread
  sleeps, so it also counts the slow PCIe/energy thread and the interpreter's housekeeping.
- The peer in the same run: a bare loop of the same pynvml calls with no sampler around it (nvml mode),
  the floor any Python sampler can reach.
- Panel: the redraw thread's CPU per redraw, and a fixed pure-Python workload timed with and
  without sampler + panel running (the "does the plot slow my cell" number).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _proc_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _replay_frame(gpus: int):
    import pandas as pd

    from workbench import samples
    from workbench.io.nvml import load_nvml_session

    one = load_nvml_session(samples.path("h200_nvml_session"))
    return pd.concat([one.assign(gpu=g) for g in range(gpus)]).sort_values(["t_s", "gpu"], kind="stable")


def _make_sampler(mode: str, hz: float, gpus: int):
    from workbench.capture.nvml import NvmlSampler
    from workbench.capture.sampler import ReplaySampler

    if mode == "nvml":
        return NvmlSampler(interval_s=1.0 / hz if hz else 0.0)
    # play the recording (427 rows in 25.4 s per GPU) at the speed that makes rows arrive at `hz`
    # per GPU, waking at that rate
    frame = _replay_frame(gpus)
    one = frame[frame.gpu == 0]
    recorded_hz = (len(one) - 1) / (one.t_s.iloc[-1] - one.t_s.iloc[0])
    return ReplaySampler(frame, speed=hz / recorded_hz, loop=True, interval_s=1.0 / hz)


def sampler_cost(mode: str, hz: float, seconds: float, gpus: int) -> dict:
    s = _make_sampler(mode, hz, gpus)
    c0, w0 = _proc_cpu(), time.perf_counter()
    with s:
        time.sleep(seconds)
    wall = time.perf_counter() - w0
    proc = _proc_cpu() - c0
    st = s.stats()
    f = s.frame()
    n_gpus = f.gpu.nunique()
    return {
        "target_hz": hz, "gpus": int(n_gpus), "ticks": st["samples"], "overruns": st["overruns"],
        "achieved_hz_per_gpu": len(f) / n_gpus / st["wall_s"] if n_gpus else 0.0,
        "thread_cpu_pct": 100 * st["cpu_fraction"], "process_cpu_pct": 100 * proc / wall,
        "cpu_us_per_tick": 1e6 * st["cpu_s"] / max(1, st["samples"]),
    }


def max_rate(seconds: float) -> dict:
    from workbench.capture.nvml import NvmlSampler

    s = NvmlSampler(interval_s=0.0, slow_interval_s=None, max_rows=1_000_000)
    with s:
        time.sleep(seconds)
    st = s.stats()
    return {"ticks_per_s": st["samples"] / st["wall_s"], "gpus": len(s.gpus),
            "us_per_tick": 1e6 * st["wall_s"] / max(1, st["samples"]), "thread_cpu_pct": 100 * st["cpu_fraction"]}


def seven_reads(nv, h) -> None:
    """The sampler's fast metrics for one GPU as plain pynvml calls (the peer's work)."""
    nv.nvmlDeviceGetMemoryInfo(h)
    nv.nvmlDeviceGetUtilizationRates(h)
    nv.nvmlDeviceGetPowerUsage(h)
    nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
    nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
    nv.nvmlDeviceGetCurrentClocksEventReasons(h)


def raw_pynvml_loop(seconds: float) -> dict:
    """The peer: the same reads in a bare loop, no sampler, no ring, no error handling."""
    from workbench.capture.nvml import open_nvml

    nv = open_nvml()
    hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    n, end = 0, time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < end:
        for h in hs:
            seven_reads(nv, h)
        n += 1
    wall = time.perf_counter() - t0
    return {"ticks_per_s": n / wall, "us_per_tick": 1e6 * wall / max(1, n), "gpus": len(hs)}


def call_latencies() -> dict:
    from workbench.capture.nvml import nvml_query, open_nvml

    nv = open_nvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "memory": (lambda: nv.nvmlDeviceGetMemoryInfo(h), 2000),
        "utilization": (lambda: nv.nvmlDeviceGetUtilizationRates(h), 2000),
        "power": (lambda: nv.nvmlDeviceGetPowerUsage(h), 2000),
        "temperature": (lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), 2000),
        "sm_clock": (lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), 2000),
        "clocks_event_reasons": (lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h), 2000),
        "pcie_tx": (lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES), 20),
        "total_energy": (lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), 50),
        "fan_speed": (lambda: nv.nvmlDeviceGetFanSpeed(h), 200),
    }
    out = {}
    for name, (fn, n) in calls.items():
        errs = []
        times = []
        for _ in range(n):
            t = time.perf_counter()
            nvml_query(fn, on_error=lambda k, e: errs.append(k))
            times.append(time.perf_counter() - t)
        out[name] = {"median_us": 1e6 * statistics.median(times), "calls": n,
                     "answer": errs[0] if errs else "ok"}
    return out


def _workload(n: int = 3_000_000) -> float:
    t = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i % 7
    return time.perf_counter() - t


def panel_cost(mode: str, seconds: float, gpus: int, window_s: float = 60.0, rounds: int = 5) -> dict:
    """Redraw cost, and a pure-Python 'cell' timed with sampler+panel off and on, alternating
    (min of ``rounds`` each) so a noisy machine affects both sides alike."""
    from workbench.panels.nvml import LiveGpuPanel

    s = _make_sampler(mode, 10.0, gpus)
    p = LiveGpuPanel(s, window_s=window_s, refresh_s=0.1)
    off, on = [], []
    try:
        time.sleep(1.0)  # fill the window a little
        r0, c0 = p.redraws, p.redraw_s
        w0 = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - w0
        redraws = p.redraws - r0
        cpu = p.redraw_s - c0
        points = sum(len(t.x) for t in p.figure.data)
        # a cell of about a second: long enough for ~10 redraws and 10 sampler ticks to land inside it
        n = int(1_000_000 / max(_workload(1_000_000), 1e-3))
        for _ in range(rounds):
            p.pause()
            s.stop()
            off.append(_workload(n))
            s.start()
            p.resume()
            time.sleep(0.3)
            on.append(_workload(n))
    finally:
        p.close()
        s.stop()
    base, with_panel = min(off), min(on)
    return {
        "gpus": gpus, "window_s": window_s, "redraws_per_s": redraws / wall,
        "ms_cpu_per_redraw": 1e3 * cpu / max(1, redraws), "redraw_cpu_pct": 100 * cpu / wall,
        "points_on_screen": points, "cell_workload_s": base, "cell_workload_with_panel_s": with_panel,
        "cell_slowdown_pct": 100 * (with_panel / base - 1),
        "cell_slowdown_pct_median_pairs": 100 * (statistics.median(b / a for a, b in zip(off, on)) - 1),
        "cell_rounds_off_s": off, "cell_rounds_on_s": on,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["auto", "nvml", "replay"], default="auto")
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    ap.add_argument("--gpus", type=int, default=1, help="replay mode: pretend this many GPUs (copies of the recording)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    mode = args.mode
    if mode == "auto":
        from workbench.capture.nvml import open_nvml
        from workbench.errors import NoNVML

        try:
            open_nvml()
            mode = "nvml"
        except NoNVML as exc:
            print(f"# {exc}\n# -> replay mode", file=sys.stderr)
            mode = "replay"

    res = {"mode": mode, "date": dt.date.today().isoformat(), "machine": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()}
    if mode == "nvml":
        from workbench.capture.nvml import NvmlSampler

        res["devices"] = NvmlSampler().devices().to_dict("records")
        res["call_latency"] = call_latencies()
    print(f"mode={mode} seconds={args.seconds}", file=sys.stderr)
    res["cost"] = []
    for hz in (10.0, 100.0):
        r = sampler_cost(mode, hz, args.seconds, args.gpus)
        res["cost"].append(r)
        print(f"  {hz:>5.0f} Hz: achieved {r['achieved_hz_per_gpu']:.1f} Hz/GPU on {r['gpus']} GPU(s), "
              f"thread CPU {r['thread_cpu_pct']:.3f}% of a core ({r['cpu_us_per_tick']:.0f} us/tick), "
              f"process CPU {r['process_cpu_pct']:.2f}%, overruns {r['overruns']}", file=sys.stderr)
    if mode == "nvml":
        res["max_rate"] = max_rate(min(args.seconds, 3.0))
        res["raw_pynvml_loop"] = raw_pynvml_loop(min(args.seconds, 3.0))
        m, raw = res["max_rate"], res["raw_pynvml_loop"]
        print(f"  highest rate: sampler {m['ticks_per_s']:.0f} ticks/s ({m['us_per_tick']:.1f} us/tick, "
              f"{m['gpus']} GPUs); bare pynvml loop {raw['ticks_per_s']:.0f} ticks/s ({raw['us_per_tick']:.1f} us)",
              file=sys.stderr)
        for name, c in res["call_latency"].items():
            print(f"  {name:<22} {c['median_us']:9.1f} us  {c['answer']}", file=sys.stderr)
    for g in sorted({1, args.gpus if mode == "replay" else 1}):
        pc = panel_cost(mode, args.seconds, g)
        res.setdefault("panel", []).append(pc)
        print(f"  panel ({g} GPU, {pc['window_s']:.0f} s window, {pc['points_on_screen']} points): "
              f"{pc['redraws_per_s']:.1f} redraws/s, {pc['ms_cpu_per_redraw']:.1f} ms CPU each "
              f"({pc['redraw_cpu_pct']:.1f}% of a core); pure-Python cell {pc['cell_workload_s']:.3f} s -> "
              f"{pc['cell_workload_with_panel_s']:.3f} s with sampler+panel ({pc['cell_slowdown_pct']:+.1f}%)",
              file=sys.stderr)
    text = json.dumps(res, indent=1, default=float)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

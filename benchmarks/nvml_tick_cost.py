"""Where a 100 Hz NVML sampler's CPU goes: the wake-up alone, the reads through pynvml, the same reads as
direct ctypes calls into libnvidia-ml, and the driver's own sample buffers (nvmlDeviceGetSamples).

    python benchmarks/nvml_tick_cost.py --seconds 4 --json out.json      # on a GPU machine

Each variant runs in a background thread that wakes every 10 ms for ``--seconds``; its CPU is the thread's
own ``time.thread_time`` over wall time (% of one core), and per wake-up in microseconds. With ``--busy``
the main thread keeps the GPU busy with a matmul loop meanwhile (torch), as a training cell would.
The survey of nvmlDeviceGetSamples reports, per sampling type, how many samples the driver buffered
over one second and their spacing: what a sampler that wakes rarely could still recover.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import threading
import time


def _pynvml():
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def run_thread(body, seconds: float, interval: float = 0.01, sleeper: str = "sleep") -> dict:
    """Run ``body()`` every ``interval`` in a thread for ``seconds``; its CPU share and cost per wake."""
    result = {}
    stop = threading.Event()

    def loop():
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        n, due = 0, time.perf_counter()
        while True:
            body()
            n += 1
            due += interval
            delay = due - time.perf_counter()
            if delay < 0:
                due, delay = time.perf_counter(), 0
            if sleeper == "sleep":
                time.sleep(delay)
                if stop.is_set():
                    break
            elif stop.wait(delay):
                break
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
        result.update(wakes=n, hz=n / wall, cpu_pct=100 * cpu / wall, us_per_wake=1e6 * cpu / n)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join()
    return result


def pynvml_reads(nv, h):
    from bench_nvml import seven_reads

    return lambda: seven_reads(nv, h)


def pynvml_subset(nv, h):
    def body():
        nv.nvmlDeviceGetMemoryInfo(h)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    return body


def ctypes_reads(nv, h):
    f = nv._nvmlGetFunctionPointer
    mem, util = nv.c_nvmlMemory_t(), nv.c_nvmlUtilization_t()
    power, temp, sm, mclk = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    reasons = ctypes.c_ulonglong()
    calls = [
        (f("nvmlDeviceGetMemoryInfo"), (h, ctypes.byref(mem))),
        (f("nvmlDeviceGetUtilizationRates"), (h, ctypes.byref(util))),
        (f("nvmlDeviceGetPowerUsage"), (h, ctypes.byref(power))),
        (f("nvmlDeviceGetTemperature"), (h, ctypes.c_int(0), ctypes.byref(temp))),
        (f("nvmlDeviceGetClockInfo"), (h, ctypes.c_int(1), ctypes.byref(sm))),
        (f("nvmlDeviceGetClockInfo"), (h, ctypes.c_int(2), ctypes.byref(mclk))),
        (f("nvmlDeviceGetCurrentClocksEventReasons"), (h, ctypes.byref(reasons))),
    ]
    row = [0.0] * 12

    def body():
        for fn, args in calls:
            fn(*args)
        row[2] = mem.used
        row[3] = mem.total
        row[4] = util.gpu
        row[5] = util.memory
        row[6] = power.value * 0.001
        row[7] = temp.value
        row[8] = sm.value
        row[9] = mclk.value
        row[10] = reasons.value
    return body


def survey_samples(nv, h, seconds: float = 1.0) -> dict:
    """Per sampling type: samples the driver buffered in ``seconds`` and their spacing."""
    out = {}
    names = {0: "total_power", 1: "gpu_util", 2: "mem_util", 5: "sm_clock", 6: "mem_clock", 7: "module_power"}
    starts = {}
    for k in names:
        try:
            _, s = nv.nvmlDeviceGetSamples(h, k, 0)
            starts[k] = max((x.timeStamp for x in s), default=0)
        except nv.NVMLError as exc:
            out[names[k]] = {"error": str(exc)}
    time.sleep(seconds)
    for k, start in starts.items():
        t0 = time.perf_counter()
        _, s = nv.nvmlDeviceGetSamples(h, k, start)
        call_us = 1e6 * (time.perf_counter() - t0)
        ts = sorted(x.timeStamp for x in s if x.timeStamp > start)
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        out[names[k]] = {
            "samples_in_window": len(ts), "window_s": seconds, "call_us": round(call_us, 1),
            "median_gap_ms": round(statistics.median(gaps) / 1000, 2) if gaps else None,
            "min_gap_ms": round(min(gaps) / 1000, 2) if gaps else None,
            "buffer_len": len(s),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--json")
    ap.add_argument("--old", help="a copy of an earlier workbench/capture/nvml.py to run beside the current one")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--per-metric", action="store_true", help="only: each read alone at 100 Hz")
    args = ap.parse_args()
    nv = _pynvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    res = {"gpu": nv.nvmlDeviceGetName(h), "driver": nv.nvmlSystemGetDriverVersion()}
    if args.per_metric:
        reads = {
            "nothing": lambda: None,
            "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
            "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "memory+power+sm_clock+reasons": pynvml_subset(nv, h),
        }
        for rep in range(2):
            for name, body in reads.items():
                r = run_thread(body, args.seconds)
                res[f"{name} #{rep}"] = r
                print(f"{name:32s} #{rep} {r['cpu_pct']:5.2f}% of a core  {r['us_per_wake']:6.1f} us/wake", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1, default=str)
        return

    busy = {"on": False}
    from workbench.capture.nvml import NvmlSampler

    def gpu_loop():
        import torch

        a = torch.randn(4096, 4096, device="cuda")
        while busy["on"]:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()

    variants = {
        "wake only (time.sleep)": (lambda: None, "sleep"),
        "pynvml 7 reads": (pynvml_reads(nv, h), "sleep"),
        "ctypes 7 reads": (ctypes_reads(nv, h), "sleep"),
    }
    samplers = {"new": NvmlSampler}
    if args.old:  # the sampler as it was before, loaded from a copy of its file: old and new in the same run
        import importlib.util

        spec = importlib.util.spec_from_file_location("workbench.capture._nvml_old", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        samplers["old"] = old.NvmlSampler
    configs = []
    for rep in range(args.repeats):
        for hz in (100, 10):
            for name, cls in samplers.items():
                configs.append((f"{name} sampler {hz} Hz", cls, hz, {}))
        configs.append(("new sampler 100 Hz, SM clock + reasons every 20 ms", NvmlSampler, 100,
                        {"cadence_s": {"sm_clock": 0.02, "throttle": 0.02}}))
    for phase in ("idle", "busy"):
        if phase == "busy":
            busy["on"] = True
            g = threading.Thread(target=gpu_loop, daemon=True)
            g.start()
            time.sleep(2)
        for name, (body, sleeper) in variants.items():
            r = run_thread(body, args.seconds, sleeper=sleeper)
            res[f"{phase}: {name}"] = r
            print(f"{phase:5s} {name:54s} {r['hz']:6.1f} Hz  {r['cpu_pct']:5.2f}% of a core  {r['us_per_wake']:6.1f} us/wake", flush=True)
        for name, cls, hz, kw in configs:
            s = cls(interval_s=1.0 / hz, slow_interval_s=None, **kw)
            with s:
                time.sleep(args.seconds)
            st = s.stats()
            r = {"hz": st["samples"] / st["wall_s"], "cpu_pct": 100 * st["cpu_fraction"],
                 "us_per_wake": 1e6 * st["cpu_s"] / max(st["samples"], 1), "overruns": st["overruns"]}
            res.setdefault(f"{phase}: {name}", []).append(r)
            print(f"{phase:5s} {name:54s} {r['hz']:6.1f} Hz  {r['cpu_pct']:5.2f}% of a core  {r['us_per_wake']:6.1f} us/wake"
                  f"  {r['overruns']} overruns", flush=True)
            if name.startswith("new") and phase == "idle" and "cadence" not in res:
                res["cadence"] = s.cadence().to_dict("records")
        res[f"samples survey ({phase})"] = survey_samples(nv, h)
    busy["on"] = False
    print(json.dumps(res.get("cadence"), indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()

"""What the flight recorder (workbench.capture.watch) costs a training step: always on, and during a capture.

    python benchmarks/bench_watch.py                        # CPU: a small transformer step
    python benchmarks/bench_watch.py --device cuda          # GPU: a CPU-bound bf16 step and a GPU-bound fp32 step
    python benchmarks/bench_watch.py --rounds 8 --steps 40 --json watch_bench.json

Three numbers per step:

- **bookkeeping**: the recorder's own work per step, with an empty step (``with w.step(): pass``), in
  microseconds: what ``step()`` adds whatever the step does (step timing, the signal flag, the CAPTURE
  poll; on a GPU the two CUDA events and reading the finished ones);
- **light watch**: the step with the recorder on against the step without it, in rounds that alternate
  the two (so drift hits both): the median over rounds of the ratio of the two halves' medians, steps
  synchronised with the device after each; on a GPU
  twice: the recorder with the allocator history ring and NVML (its defaults), and without them;
- **during a capture**: the median of the captured (profiled, light detail) steps against the unwatched
  median, and the wall time the capture's end takes (trace, snapshot and NVML written).

On a GPU, also **the allocator history's cost accounting** (``history``), the model the recorder's
``memory_history="auto"`` decides by, measured here apart from the A/B (whose noise floor on a host-bound
step is a few percent): allocations per step (``allocation.all.allocated`` of ``torch.cuda.memory_stats``),
the Python depth of the step's recorded allocations (from a snapshot of one step's history, against the
recorder's assumption: the loop's depth + STEP_FRAMES), one allocation and its free timed with the history
recording Python stacks (at two depths), recording no stacks ('sizes') and off
(``calibrate_history(off=True)``), and so the modelled overheads: allocations x (cost - cost off) / step
time, printed next to the A/B results of the same modes. The A/B configurations include the default
(``auto``: its decision is made in untimed warm-up steps before each watched half's timed steps, and
printed) and ``python`` (stacks throughout, the default before ``auto``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

from workbench.capture.watch import watch  # noqa: E402
from workbench.capture.watch_history import STEP_FRAMES, calibrate_history, history_cost, stacks_us_at  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_profiler import make_step  # noqa: E402  (the same steps the profiler's cost is measured on)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bookkeeping_us(device: str, folder: str, n: int = 20000, **options) -> float:
    """The recorder's cost per step with nothing in the step (median of 5 runs of n steps)."""
    w = watch(folder, slow_factor=None, baseline=False, handle_signal=True, device=device, **options)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            with w.step():
                pass
        runs.append((time.perf_counter() - t0) / n * 1e6)
    w.close()
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    empty = (time.perf_counter() - t0) / n * 1e6
    return statistics.median(runs) - empty


_AUTO_WARMUP = 4  # the auto mode's warm-up in the A/B (its decision is made before the timed steps)


def light_watch(step, device: str, folder: str, rounds: int, steps: int, **options) -> dict:
    """Alternating rounds of `steps` plain and `steps` watched steps; per-step times, device-synchronised.
    With memory_history 'auto' on a GPU, each watched half first runs its warm-up, untimed, so the timed
    steps are the ones after the recorder's decision."""
    plain, watched, ratios, problems, decisions = [], [], [], [], []
    auto = device.startswith("cuda") and options.get("memory_history", "auto") == "auto"
    if auto:
        options = {"warmup": _AUTO_WARMUP, **options}
    lead = options["warmup"] + 1 if auto else 0
    for _ in range(3):  # warm-up (allocator, kernels, cuBLAS)
        step()
    sync(device)
    for r in range(rounds):
        got = {0: [], 1: []}
        for mode in ((0, 1) if r % 2 == 0 else (1, 0)):
            # the recorder lives only through its half: the allocator history and the NVML thread are
            # process-wide, so the plain half must run without them
            w = watch(folder, slow_factor=None, baseline=False, device=device, **options) if mode else None
            for _ in range(lead if mode else 0):
                with w.step():
                    step()
                sync(device)  # as the timed steps are: the warm-up's event times are read at once
            if w is not None and auto:
                decisions.append((w.history_mode, (w.history_cost or {}).get("cost_pct")))
            for _ in range(steps):
                t0 = time.perf_counter()
                if mode:
                    with w.step():
                        step()
                else:
                    step()
                sync(device)
                got[mode].append((time.perf_counter() - t0) * 1e3)
            if w is not None:
                w.close()
                problems += w.problems
        plain += got[0]
        watched += got[1]
        ratios.append(statistics.median(got[1]) / statistics.median(got[0]))
    p, q = statistics.median(plain), statistics.median(watched)
    # the overhead: the median over rounds of (watched / plain) - 1, each round's two halves side by side
    out = {"plain_ms": round(p, 4), "watched_ms": round(q, 4),
           "overhead_pct": round((statistics.median(ratios) - 1) * 100, 2),
           "round_ratio_spread_pct": round((max(ratios) - min(ratios)) * 100, 1), "problems": sorted(set(problems))}
    if auto:  # what the recorder decided in each watched half: (mode, its estimate of the stacks' cost, %)
        modes = [m for m, _ in decisions]
        out["auto_modes"] = {m: modes.count(m) for m in sorted(set(map(str, modes)))}
        costs = [c for _, c in decisions if c is not None]
        out["auto_cost_pct"] = ([round(min(costs), 2), round(statistics.median(costs), 2), round(max(costs), 2)]
                                if costs else None)
    return out


def _depth() -> int:
    """The caller's Python depth (its own frame counted)."""
    n, f = 0, sys._getframe(1)
    while f is not None:
        n += 1
        f = f.f_back
    return n


def _frames_per_alloc(step) -> dict:
    """The Python frames torch recorded with one step's allocations (a snapshot of one step's history), and
    what the recorder would assume: the depth of the frame that calls the step + STEP_FRAMES."""
    assumed = _depth() + STEP_FRAMES
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python", max_entries=1_000_000)
    try:
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(None)
    frames = [len(e.get("frames") or ()) for trace in snap.get("device_traces", ()) for e in trace
              if e.get("action") == "alloc"]
    if not frames:
        return {"allocs": 0, "assumed": assumed}
    return {"allocs": len(frames), "mean": round(statistics.mean(frames), 1), "median": statistics.median(frames),
            "none_pct": round(100 * sum(f == 0 for f in frames) / len(frames), 1), "assumed": assumed}


def history_accounting(step, device: str, steps: int = 10) -> dict:
    """The allocator history's cost by the model: allocations per step x the cost of one recorded
    allocation (and its free) / the step's time, per mode."""
    for _ in range(3):
        step()
    sync(device)
    torch.cuda.memory._record_memory_history(None)
    a0 = torch.cuda.memory_stats()["allocation.all.allocated"]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    allocs = (torch.cuda.memory_stats()["allocation.all.allocated"] - a0) / steps
    step_ms = statistics.median(times)
    frames = _frames_per_alloc(step)
    cal = calibrate_history(device, off=True, repeats=5)
    assumed = frames["assumed"]  # the recorder's assumption, for the same call of step()
    at = {"assumed": stacks_us_at(cal, assumed)}
    if frames.get("mean") is not None:
        at["measured"] = stacks_us_at(cal, frames["mean"])
    off = cal["off_us"]
    model = {f"python_at_{k}_frames_pct": round(allocs * max(us - off, 0) / 1e3 / step_ms * 100, 2)
             for k, us in at.items()}
    model["sizes_pct"] = round(allocs * max(cal["sizes_us"] - off, 0) / 1e3 / step_ms * 100, 2)
    # what auto decides from these numbers (its own estimate uses the step timed with stacks on; here the
    # step without them, plus the modelled stacks' cost)
    stacks_ms = step_ms * (1 + model["python_at_assumed_frames_pct"] / 100)
    decision = history_cost(allocs, stacks_ms, at["assumed"], cal["sizes_us"], off_us=off)
    return {"allocs_per_step": round(allocs, 1), "step_ms_no_history": round(step_ms, 4),
            "frames_per_alloc": frames, "frames_assumed": assumed,
            "us_per_alloc": {"python_at_assumed": round(at["assumed"], 3),
                             "python_at_measured": round(at["measured"], 3) if "measured" in at else None,
                             "python_at_depths": dict(zip(map(str, cal["depths"]), cal["python_us"])),
                             "sizes": cal["sizes_us"], "off": off},
            "model_overhead_pct": model, "auto_would_choose": decision["mode"],
            "auto_cost_pct": decision["cost_pct"], "auto_sizes_cost_pct": decision["sizes_cost_pct"],
            "calibration_s": cal["seconds"]}


def during_capture(step, device: str, folder: str, captures: int, capture_steps: int, **options) -> dict:
    plain = []
    for i in range(23):  # without a recorder (its allocator history is process-wide)
        t0 = time.perf_counter()
        step()
        sync(device)
        if i >= 3:
            plain.append((time.perf_counter() - t0) * 1e3)
    if device.startswith("cuda"):  # memory_history 'auto' decides before the captures
        options = {"warmup": _AUTO_WARMUP, **options}
    w = watch(folder, capture_steps=capture_steps, slow_factor=None, baseline=False, device=device, **options)
    for _ in range(_AUTO_WARMUP + 2):
        with w.step():
            step()
        sync(device)
    ends, profiled = [], []
    for _ in range(captures):
        w.capture("benchmark")
        for i in range(capture_steps + 5):
            t0 = time.perf_counter()
            with w.step():
                step()
            dt = time.perf_counter() - t0
            if i == capture_steps - 1:
                ends.append(dt * 1e3)  # the last captured step: its end writes the files
        profiled += w.captures[-1]["step_ms"][1:]  # the first holds the profiler's start
    w.close()
    base = statistics.median(plain)
    prof = statistics.median(profiled)
    return {"plain_ms": round(base, 4), "captured_ms": round(prof, 4),
            "captured_overhead_pct": round((prof / base - 1) * 100, 1),
            "capture_end_ms": round(statistics.median(ends), 1), "captures": len(w.captures),
            "problems": w.problems}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--captures", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kinds", default=None, help="comma-separated workloads to run (default: all of the device's)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dev = args.device
    cuda = dev.startswith("cuda")
    kinds = ["cpu-bound bf16", "gpu-bound fp32"] if cuda else ["small cpu"]
    if args.kinds:
        kinds = [k for k in kinds if k in args.kinds.split(",")]
    out = {"machine": platform.node(), "cpu": platform.processor() or platform.machine(),
           "cores": os.cpu_count(), "torch": torch.__version__, "device": dev,
           "gpu": torch.cuda.get_device_name(0) if cuda else None, "date": time.strftime("%Y-%m-%d"), "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        out["bookkeeping_us"] = round(bookkeeping_us(dev, os.path.join(tmp, "bk"), memory_history=False, nvml=False), 2)
        print(f"bookkeeping per step (empty step): {out['bookkeeping_us']:.2f} us", flush=True)
        for kind in kinds:
            step = make_step(kind, dev)
            r = {}
            if cuda:  # the model first: allocations, the cost of one, the step
                r["history"] = history_accounting(step, dev)
                print(f"{kind:>16} {'history':<26} {json.dumps(r['history'])}", flush=True)
            r["light"] = light_watch(step, dev, os.path.join(tmp, kind + "-l"), args.rounds, args.steps)
            if cuda:  # the allocator history's and NVML's shares, apart and together
                for label, opts in (("light_history_python", {"memory_history": "python"}),
                                    ("light_history_alloc", {"memory_history": "alloc"}),
                                    ("light_history_sizes", {"memory_history": "sizes"}),
                                    ("light_no_history", {"memory_history": False}),
                                    ("light_no_nvml", {"nvml": False}),
                                    ("light_no_history_no_nvml", {"memory_history": False, "nvml": False})):
                    r[label] = light_watch(step, dev, os.path.join(tmp, kind + "-" + label), args.rounds,
                                           args.steps, **opts)
            r["capture"] = during_capture(step, dev, os.path.join(tmp, kind + "-c"), args.captures, 3)
            out["results"][kind] = r
            for k, v in r.items():
                print(f"{kind:>16} {k:<26} {json.dumps(v)}", flush=True)
            if cuda:  # the model next to the A/B, mode by mode
                m = r["history"]["model_overhead_pct"]
                print(f"{kind:>16} history: {r['history']['allocs_per_step']:.0f} allocations a step; "
                      f"model vs A/B (% of a step): python stacks {m['python_at_assumed_frames_pct']:+.2f} "
                      f"(at the measured depth {m.get('python_at_measured_frames_pct', float('nan')):+.2f}) vs "
                      f"{r['light_history_python']['overhead_pct'] - r['light_no_history']['overhead_pct']:+.2f}; "
                      f"sizes {m['sizes_pct']:+.2f} vs "
                      f"{r['light_history_sizes']['overhead_pct'] - r['light_no_history']['overhead_pct']:+.2f}; "
                      f"auto chose {r['light'].get('auto_modes')} (its estimate {r['light'].get('auto_cost_pct')})",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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


def light_watch(step, device: str, folder: str, rounds: int, steps: int, **options) -> dict:
    """Alternating rounds of `steps` plain and `steps` watched steps; per-step times, device-synchronised."""
    plain, watched, ratios, problems = [], [], [], []
    for _ in range(3):  # warm-up (allocator, kernels, cuBLAS)
        step()
    sync(device)
    for r in range(rounds):
        got = {0: [], 1: []}
        for mode in ((0, 1) if r % 2 == 0 else (1, 0)):
            # the recorder lives only through its half: the allocator history and the NVML thread are
            # process-wide, so the plain half must run without them
            w = watch(folder, slow_factor=None, baseline=False, device=device, **options) if mode else None
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
    return {"plain_ms": round(p, 4), "watched_ms": round(q, 4),
            "overhead_pct": round((statistics.median(ratios) - 1) * 100, 2),
            "round_ratio_spread_pct": round((max(ratios) - min(ratios)) * 100, 1), "problems": sorted(set(problems))}


def during_capture(step, device: str, folder: str, captures: int, capture_steps: int, **options) -> dict:
    plain = []
    for i in range(23):  # without a recorder (its allocator history is process-wide)
        t0 = time.perf_counter()
        step()
        sync(device)
        if i >= 3:
            plain.append((time.perf_counter() - t0) * 1e3)
    w = watch(folder, capture_steps=capture_steps, slow_factor=None, baseline=False, device=device, **options)
    for _ in range(5):
        with w.step():
            step()
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
            r = {"light": light_watch(step, dev, os.path.join(tmp, kind + "-l"), args.rounds, args.steps)}
            if cuda:  # the allocator history's and NVML's shares, apart and together
                for label, opts in (("light_history_alloc", {"memory_history": "alloc"}),
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What profiling costs a step, per detail level: workbench's profile_steps against bare torch.profiler
with the same options, in the same run.

    python benchmarks/bench_profiler.py                      # CPU: a small transformer step
    python benchmarks/bench_profiler.py --device cuda        # GPU: a CPU-bound bf16 step and a GPU-bound fp32 step
    python benchmarks/bench_profiler.py --steps 10 --json profiler_bench.json

For each step and detail (light, standard, full) it prints the median un-profiled step, the median
profiled step through ``workbench.capture.profile_steps`` and through a bare ``torch.profiler.profile``
loop with the same schedule and options (the peer), and the size of the trace. Steps are timed with
a device synchronise. The un-profiled medians are taken right before each profiled run.
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
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402

from workbench.capture.profiler import DETAILS, profile_steps  # noqa: E402


def make_step(kind: str, device: str):
    torch.manual_seed(0)
    if kind == "cpu-bound bf16":  # many small kernels: the host is the bottleneck (d=768, 6 layers)
        d, layers, batch, seq, dtype = 768, 6, 8, 64, torch.bfloat16
    elif kind == "gpu-bound fp32":
        d, layers, batch, seq, dtype = 1024, 6, 32, 512, None
    else:  # small CPU step
        d, layers, batch, seq, dtype = 256, 2, 8, 64, None
    layer = torch.nn.TransformerEncoderLayer(d, nhead=8, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, d, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        if dtype is not None:
            with torch.autocast(device_type=device.split(":")[0], dtype=dtype):
                loss = model(x).float().square().mean()
        else:
            loss = model(x).square().mean()
        loss.backward()
        opt.step()

    return step


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(step, device) -> float:
    t0 = time.perf_counter()
    step()
    sync(device)
    return (time.perf_counter() - t0) * 1e3


def bare_torch(step, device, detail, steps, out: Path) -> tuple[float, float]:
    """The peer: torch.profiler used directly, same schedule and options. Returns (median ms, seconds to export)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    ms = []
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=steps), **DETAILS[detail]) as prof:
        for i in range(steps + 2):
            t = timed(step, device)
            if i >= 2:
                ms.append(t)
            prof.step()
    t0 = time.perf_counter()
    prof.export_chrome_trace(str(out))
    return statistics.median(ms), time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device; run with --device cpu", file=sys.stderr)
        return 2
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    kinds = ["cpu-bound bf16", "gpu-bound fp32"] if args.device.startswith("cuda") else ["small cpu fp32"]
    machine = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or platform.machine()
    print(f"# {machine}, torch {torch.__version__}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"{args.steps} profiled steps, {time.strftime('%Y-%m-%d')}")
    print(f"{'step':<16} {'detail':<9} {'unprofiled ms':>13} {'workbench ms':>12} {'bare torch ms':>13} "
          f"{'wb cost':>8} {'trace MB':>8}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            step = make_step(kind, args.device)
            for _ in range(3):
                timed(step, args.device)
            for detail in DETAILS:
                res = profile_steps(step, steps=args.steps, detail=detail, out_dir=tmp, device=args.device,
                                    measure_cost=True, progress=False, verbose=False)
                base = [timed(step, args.device) for _ in range(min(args.steps, 3))]
                peer_ms, _ = bare_torch(step, args.device, detail, args.steps, Path(tmp) / f"peer_{detail}.json")
                row = {
                    "step": kind, "detail": detail, "unprofiled_ms": res.cost.baseline_ms,
                    "workbench_ms": res.cost.profiled_ms, "bare_torch_ms": peer_ms,
                    "bare_torch_unprofiled_ms": statistics.median(base),
                    "trace_mb": res.path.stat().st_size / 1e6,
                }
                rows.append(row)
                print(f"{kind:<16} {detail:<9} {row['unprofiled_ms']:13.1f} {row['workbench_ms']:12.1f} "
                      f"{peer_ms:13.1f} {row['workbench_ms'] / row['unprofiled_ms']:7.2f}x {row['trace_mb']:8.2f}")
                print(f"  {res.cost}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

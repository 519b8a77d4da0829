"""Record the CUDA-streams sample on a GPU: host-to-device copies serial with compute, and overlapped.

Run on the H200 from the repository root (about 30 s)::

    python benchmarks/record_streams_h200.py

It writes, for notebooks/33_cuda_streams.ipynb:

- ``workbench/samples/h200_streams_serial.trace.json.gz``: light Kineto trace (no shapes, no stacks) of 2
  iterations of the serial version: each chunk copied from pageable host memory with a blocking
  ``.to("cuda")``, then computed on, all on the default stream;
- ``workbench/samples/h200_streams_overlap.trace.json.gz``: the same work with pinned host memory,
  ``non_blocking=True`` copies issued on a side stream one chunk ahead, and events ordering each
  chunk's compute after its copy (``record_stream`` keeps the allocator from reusing a chunk early);
- ``workbench/samples/results/h200_streams.json``: timings from CUDA events outside the profiler
  (median of ``--iters`` iterations): copy alone (pageable, pinned), compute alone, serial, pinned on
  the default stream (faster copies, no overlap) and overlapped; plus the parameters, the checksum
  agreement of the three versions, the GPU and torch version and the date.

The compute per chunk is calibrated (``--repeat auto``) so that it takes about as long as the pinned
copy of a chunk: then overlap can hide up to half of the serial time, and the picture is clear. Each
trace must stay under 1 MB; the script says so if it does not.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from workbench.capture.profiler import profile_steps

SAMPLES = ROOT / "workbench" / "samples"


def compute(x: torch.Tensor, w: torch.Tensor, repeat: int) -> torch.Tensor:
    """The work done on one chunk: ``repeat`` matmuls with a fixed weight, reduced to one number."""
    for _ in range(repeat):
        x = torch.relu(x @ w)
    return x.sum()


def run_serial(pageable, w, repeat):
    out = []
    for chunk in pageable:
        x = chunk.to("cuda")                      # pageable source: staged by the driver, blocks the host
        out.append(compute(x, w, repeat))
    return torch.stack(out).sum()


def run_pinned(pinned, w, repeat):
    out = []
    for chunk in pinned:
        x = chunk.to("cuda", non_blocking=True)   # pinned source: DMA at full PCIe speed, host returns at once
        out.append(compute(x, w, repeat))         # same stream: still waits for its copy
    return torch.stack(out).sum()


def run_overlap(pinned, w, repeat, copy_stream):
    main = torch.cuda.current_stream()

    def load(chunk):
        with torch.cuda.stream(copy_stream):
            x = chunk.to("cuda", non_blocking=True)
            done = torch.cuda.Event()
            done.record(copy_stream)
        return x, done

    out = []
    nxt = load(pinned[0])
    for i in range(len(pinned)):
        x, done = nxt
        main.wait_event(done)                     # compute on chunk i only after its copy
        x.record_stream(main)                     # its memory is in use on the main stream too
        if i + 1 < len(pinned):
            nxt = load(pinned[i + 1])             # copy chunk i+1 while chunk i is computed
        out.append(compute(x, w, repeat))
    return torch.stack(out).sum()


def cuda_ms(fn, iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=8, help="chunks per iteration (default 8)")
    p.add_argument("--rows", type=int, default=2048, help="rows of a chunk; a chunk is rows x 4096 fp32 (default 2048: 32 MiB)")
    p.add_argument("--repeat", default="auto", help="matmuls per chunk, or 'auto' to match the pinned copy time")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per version (default 10)")
    p.add_argument("--out-dir", type=Path, default=SAMPLES, help="where the traces go (default workbench/samples)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_streams_h200: no CUDA device (torch.cuda.is_available() is False); run it on the GPU machine",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    dim = 4096
    pageable = [torch.randn(args.rows, dim) for _ in range(args.chunks)]
    pinned = [c.pin_memory() for c in pageable]
    w = torch.randn(dim, dim, device="cuda") / dim ** 0.5
    copy_stream = torch.cuda.Stream()
    chunk_bytes = pageable[0].numel() * pageable[0].element_size()

    # calibrate: one chunk's copy (pageable, pinned) and one matmul on it
    on_gpu = pinned[0].to("cuda")
    copy_pageable = statistics.median(cuda_ms(lambda: pageable[0].to("cuda"), 10))
    copy_pinned = statistics.median(cuda_ms(lambda: pinned[0].to("cuda", non_blocking=True), 10))
    one_matmul = statistics.median(cuda_ms(lambda: compute(on_gpu, w, 1), 10))
    repeat = max(1, round(copy_pinned / one_matmul)) if args.repeat == "auto" else int(args.repeat)
    compute_chunk = statistics.median(cuda_ms(lambda: compute(on_gpu, w, repeat), 10))

    versions = {
        "serial": lambda: run_serial(pageable, w, repeat),
        "pinned": lambda: run_pinned(pinned, w, repeat),
        "overlap": lambda: run_overlap(pinned, w, repeat, copy_stream),
    }
    checks = {name: fn().item() for name, fn in versions.items()}  # also warms each version up
    same = max(checks.values()) - min(checks.values()) <= 1e-6 * max(abs(v) for v in checks.values())
    timings = {name: cuda_ms(fn, args.iters) for name, fn in versions.items()}

    args.out_dir.mkdir(parents=True, exist_ok=True)
    traces = {}
    for name in ("serial", "overlap"):
        path = args.out_dir / f"h200_streams_{name}.trace.json.gz"
        result = profile_steps(versions[name], steps=2, wait=0, warmup=1, detail="light", device="cuda",
                               path=path, progress=False, verbose=False)
        size = path.stat().st_size
        traces[name] = {"file": path.name, "bytes": size, "profiled_step_ms": list(result.step_ms)}
        print(f"{path.name}: {size / 1e3:.0f} kB" + ("  (over 1 MB: lower --chunks or --repeat)" if size > 1e6 else ""))

    med = {name: statistics.median(t) for name, t in timings.items()}
    record = {
        "what": "host-to-device copies and compute: serial (pageable, blocking) vs pinned (default stream) vs "
                "overlapped (pinned, non_blocking, side stream); CUDA-event timings outside the profiler",
        "gpu": torch.cuda.get_device_name(0),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/record_streams_h200.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "params": {"chunks": args.chunks, "chunk_bytes": chunk_bytes, "chunk_shape": [args.rows, dim],
                   "matmuls_per_chunk": repeat, "iters": args.iters, "tf32": False},
        "per_chunk_ms": {"copy_pageable": copy_pageable, "copy_pinned": copy_pinned, "compute": compute_chunk},
        "h2d_gb_per_s": {"pageable": chunk_bytes / copy_pageable / 1e6, "pinned": chunk_bytes / copy_pinned / 1e6},
        "iteration_ms_median": med,
        "iteration_ms": timings,
        "results_agree": bool(same),
        "traces": traces,
    }
    out = args.out_dir / "results" / "h200_streams.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"iteration_ms_median": med, "per_chunk_ms": record["per_chunk_ms"],
                      "results_agree": same}, indent=1))
    print(f"written: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

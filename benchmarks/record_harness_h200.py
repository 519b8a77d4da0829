"""Record the harness's ledger on the GPU machine (H200) for the transformer of the issue:
12 layers, d=1024, batch 32x512, fused AdamW, under fp32 / TF32 / AMP bf16 / AMP fp16 (GradScaler) /
per-block checkpointing / bf16 + checkpointing, and optionally light traces of fp32 and bf16.

    python benchmarks/record_harness_h200.py --out benchmarks/results/harness_h200.json [--traces DIR]

The JSON ledger loads anywhere with ``workbench.io.load_ledger`` (ComparePanel, notebooks on CPU).
Expected (measured by hand on the H200): fp32 365 ms / 15.0 GiB, TF32 123 ms, bf16 50 ms / 9.1 GiB,
fp16 50 ms, fp32 + checkpointing 450 ms / 3.8 GiB, bf16 + checkpointing 76 ms / 3.3 GiB. ~1 minute.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "gpu"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "harness_h200.json"))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--traces", metavar="DIR", help="also record light traces of fp32 and amp_bf16 into DIR")
    ap.add_argument("--device", default="cuda", help="device (default cuda; cpu only to try the script)")
    args = ap.parse_args()

    import test_harness_gpu as family  # the model family of tests/gpu/test_harness_gpu.py

    from workbench.capture.configurations import amp_bf16, amp_fp16, checkpointing, combine, fp32, tf32
    from workbench.capture.runner import run_experiment

    Block, _ = family._model_classes()
    work = family._workload(args.layers, args.batch_size)
    configs = [fp32(), tf32(), amp_bf16(), amp_fp16(), checkpointing(Block),
               combine(amp_bf16(), checkpointing(Block))]
    exp = run_experiment(work, configs, device=args.device, steps=args.steps, warmup=3, check_steps=2,
                         name=f"h200-transformer-{args.layers}x1024-bs{args.batch_size}")
    if args.traces:
        os.environ["WORKBENCH_TRACE_DIR"] = args.traces
        traced = run_experiment(work, [fp32(), amp_bf16()], device=args.device, steps=1, warmup=1,
                                check_steps=0, trace=True, energy=False, name=exp.name + "-traces")
        paths = traced.ledger.set_index("configuration")["trace_path"]
        for r in exp.results:
            if r.name in paths.index:
                r.row["trace_path"] = os.path.relpath(paths[r.name], Path(args.out).parent)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    exp.save(args.out, append=False)
    cols = ["configuration", "status", "step_ms_median", "peak_allocated_bytes", "energy_j_per_step",
            "check_verdict", "check_loss_rel_err"]
    led = exp.ledger[cols].copy()
    led["peak_gib"] = led.pop("peak_allocated_bytes").astype("float64") / 2**30
    print(led.to_string(index=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

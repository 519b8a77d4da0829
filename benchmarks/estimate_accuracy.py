"""Accuracy of the peak-memory estimate on a real GPU (run on the H200).

For six model families built from torch.nn (examples/estimate_families.py: MLP, CNN, U-Net, LSTM,
transformer encoder, decoder-only LM), several batch sizes, fp32/bf16 and activation checkpointing, it runs
two real training steps (AdamW) and compares torch.cuda.max_memory_allocated() and
max_memory_reserved() with the estimate made on fake tensors (on this machine's CPU, like a
laptop would). Writes OUT.json and OUT.md; prints progress. About 2-4 minutes on an H200.

    python benchmarks/estimate_accuracy.py --out benchmarks/results/estimate_accuracy_h200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

from estimate_families import FAMILIES, adamw  # noqa: E402
from workbench.capture.estimate import CUBLAS_WORKSPACE_BYTES, measure_step_memory, warm_up_cublas  # noqa: E402
from workbench.capture.estimate import estimate  # noqa: E402

BATCHES = {"mlp": (256, 2048), "cnn": (32, 128), "unet": (8, 32), "lstm": (16, 64), "encoder": (8, 32),
           "decoder_lm": (4, 16)}
QUICK = {"mlp": (256,), "cnn": (32,), "unet": (8,), "lstm": (16,), "encoder": (8,), "decoder_lm": (4,)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path without extension: writes OUT.json and OUT.md")
    ap.add_argument("--quick", action="store_true", help="one batch size per family (about a minute)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("estimate_accuracy: no CUDA device; run this on the GPU machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ws = warm_up_cublas()
    print(f"cuBLAS workspaces held after warm-up: {ws / 2**20:.1f} MiB "
          f"(modelled: 2 x {CUBLAS_WORKSPACE_BYTES / 2**20:.0f} MiB)", flush=True)
    rows = []
    t_start = time.perf_counter()
    batches = QUICK if args.quick else BATCHES
    configs = [(f, bs, p, c) for f in args.families.split(",") for bs in batches[f]
               for p in ("fp32", "bf16") for c in (False, True)]
    try:
        for i, (fam, bs, prec, ck) in enumerate(configs, 1):
            build, batch, loss = FAMILIES[fam]
            t0 = time.perf_counter()
            est = estimate(build, batch, adamw, precision=prec, batch_size=bs, loss_fn=loss, checkpointing=ck,
                           strict_fp32=prec == "fp32")
            t_est = time.perf_counter() - t0
            real = measure_step_memory(build, batch, adamw, precision=prec, batch_size=bs, loss_fn=loss, checkpointing=ck,
                                       strict_fp32=prec == "fp32")
            row = {
                "family": fam, "batch_size": bs, "precision": prec, "checkpointing": ck,
                "estimate_allocated_bytes": est.peak_allocated_bytes,
                "estimate_reserved_bytes": est.peak_reserved_bytes,
                "real_allocated_bytes": real["max_allocated_bytes"],
                "real_reserved_bytes": real["max_reserved_bytes"],
                "base_allocated_bytes": real["base_allocated_bytes"],
                "estimate_peak_phase": est.peak_phase,
                "estimate_s": round(t_est, 2),
            }
            row["allocated_error_pct"] = 100 * (row["estimate_allocated_bytes"] / row["real_allocated_bytes"] - 1)
            row["reserved_error_pct"] = 100 * (row["estimate_reserved_bytes"] / row["real_reserved_bytes"] - 1)
            rows.append(row)
            print(f"[{i}/{len(configs)}] {fam} bs={bs} {prec} ckpt={ck}: allocated est "
                  f"{row['estimate_allocated_bytes'] / 2**30:.3f} GiB vs real {row['real_allocated_bytes'] / 2**30:.3f} "
                  f"({row['allocated_error_pct']:+.1f}%), reserved est {row['estimate_reserved_bytes'] / 2**30:.3f} vs "
                  f"{row['real_reserved_bytes'] / 2**30:.3f} ({row['reserved_error_pct']:+.1f}%), "
                  f"estimate {t_est:.1f}s", flush=True)
    except KeyboardInterrupt:
        print("interrupted: writing the rows measured so far", file=sys.stderr)
    meta = {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "cublas_workspace_measured_bytes": ws, "cublas_workspace_modelled_bytes": 2 * CUBLAS_WORKSPACE_BYTES,
        "wall_s": round(time.perf_counter() - t_start, 1), "steps": 2, "optimizer": "AdamW (foreach)",
    }
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"Device {meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']}), {meta['date']}; "
             f"2 training steps, AdamW; cuBLAS workspaces measured {ws / 2**20:.0f} MiB.", "",
             "| family | batch | precision | ckpt | est. allocated GiB | real allocated GiB | error | "
             "est. reserved GiB | real reserved GiB | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['batch_size']} | {r['precision']} | {'yes' if r['checkpointing'] else 'no'} | "
                     f"{r['estimate_allocated_bytes'] / 2**30:.3f} | {r['real_allocated_bytes'] / 2**30:.3f} | "
                     f"{r['allocated_error_pct']:+.1f}% | {r['estimate_reserved_bytes'] / 2**30:.3f} | "
                     f"{r['real_reserved_bytes'] / 2**30:.3f} | {r['reserved_error_pct']:+.1f}% |")
    if rows:
        errs = [abs(r["allocated_error_pct"]) for r in rows]
        within = sum(e <= 10 for e in errs)
        lines += ["", f"Allocated: {within}/{len(rows)} within 10%; median |error| {sorted(errs)[len(errs) // 2]:.1f}%, "
                  f"max {max(errs):.1f}%."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Calibrate the estimator's cuDNN convolution workspaces on the H200 (issue 21: reserved within 10%).

Two processes of their own, one after the other, so that neither sees the other's allocator or cuDNN
plan cache:

1. ``calibrate``: for every convolution family row (the recorded ones of families.json and the held-out
   ones below), :func:`workbench.capture.cudnn_calibration.calibrate` measures each distinct convolution
   call in isolation (one layer's tensors, forward / backward-data / backward-weight); all go into one
   table, ``DIR/conv_workspaces_h200.json``, with the seconds each row took.
2. ``truth``: torch's peaks of the held-out rows (``measure_step_memory``, two AdamW steps, cuBLAS warmed
   up first, as the families recording did): ``DIR/families_heldout.json``. These rows' batch sizes were
   never recorded before, so neither the rules nor this calibration were looked at against them.

Run from the repository root on the GPU machine::

    python benchmarks/calibrate_families_h200.py --out DIR [--budget 300]

Then, on any machine: ``python benchmarks/estimate_vs_recording.py ... --workspaces DIR/conv_workspaces_h200.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

RECORDED = [("cnn", 32), ("cnn", 128), ("unet", 8), ("unet", 32)]
HELD_OUT = [("cnn", 8), ("cnn", 64), ("unet", 16)]
PRECISIONS = ("fp32", "tf32", "bf16")


def child(kind: str, out: Path, budget_s: float) -> int:
    import torch

    from estimate_families import FAMILIES, adamw

    t_end = time.perf_counter() + budget_s
    rec: dict = {"kind": kind, "rows": []}
    try:
        if kind == "calibrate":
            from workbench.analysis.memory.cudnn_model import ConvWorkspaces
            from workbench.capture.cudnn_calibration import calibrate

            table = ConvWorkspaces()
            for fam, bs in RECORDED + HELD_OUT:
                for prec in PRECISIONS:
                    if time.perf_counter() > t_end:
                        rec["rows"].append({"family": fam, "batch_size": bs, "precision": prec, "skipped": "time"})
                        continue
                    build, batch_fn, loss_fn = FAMILIES[fam]
                    t0 = time.perf_counter()
                    n0 = len(table)
                    calibrate(build, batch_fn, adamw, precision=prec, strict_fp32=prec == "fp32", batch_size=bs, loss_fn=loss_fn, table=table,
                              progress=False)
                    took = time.perf_counter() - t0
                    rec["rows"].append({"family": fam, "batch_size": bs, "precision": prec,
                                        "calls_added": len(table) - n0, "seconds": round(took, 2)})
                    print(f"calibrate {fam} {bs} {prec}: +{len(table) - n0} calls in {took:.1f} s", flush=True)
                    table.save(out / "conv_workspaces_h200.json")
        elif kind == "truth":
            from workbench.capture.estimate import measure_step_memory, warm_up_cublas

            warm_up_cublas()
            for fam, bs in HELD_OUT:
                for prec in PRECISIONS:
                    if time.perf_counter() > t_end:
                        rec["rows"].append({"family": fam, "batch_size": bs, "precision": prec, "skipped": "time"})
                        continue
                    build, batch_fn, loss_fn = FAMILIES[fam]
                    row = {"family": fam, "batch_size": bs, "precision": prec, "checkpointing": False, "steps": 2}
                    row.update(measure_step_memory(build, batch_fn, adamw, precision=prec, strict_fp32=prec == "fp32", batch_size=bs,
                                                   loss_fn=loss_fn))
                    rec["rows"].append(row)
                    print(f"truth {fam} {bs} {prec}: allocated {row['max_allocated_bytes'] / 2**30:.3f} GiB, "
                          f"reserved {row['max_reserved_bytes'] / 2**30:.3f} GiB", flush=True)
                    (out / "families_heldout.json").write_text(json.dumps({"rows": rec["rows"]}, indent=1) + "\n")
        rec["env"] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version(),
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    except Exception:
        rec["error"] = traceback.format_exc()[-3000:].replace(str(ROOT), "<repo>")
        print(rec["error"], file=sys.stderr)
    (out / f"child_{kind}.json").write_text(json.dumps(rec, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for each process")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args.child, out, args.budget)
    for kind in ("calibrate", "truth"):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--out", str(out), "--budget", str(args.budget), "--child", kind],
                           timeout=args.budget + 120)
        print(f"{kind}: rc={r.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the H200 sweep of benchmarks/record_cudnn_fp32_h200.py (stored small as
tests/data/h200_memory/cudnn_conv_sweep.json) says about cuDNN's convolution workspaces, per mode (``fp32``
= no TF32, ``tf32``, ``bf16``) and direction, on the ``fit`` shapes and on the held-out ``test`` shapes
(every third shape, fixed before the run):

- tensor-core math (bf16, TF32): how many calls :func:`workbench.analysis.memory.cudnn_model.conv_workspace_bytes`
  (NHWC copies) gets within 10% (or 1 MiB);
- fp32 without TF32: how many calls take any workspace, how many of those equal the FFT formula
  (:func:`~workbench.analysis.memory.cudnn_model.fft_workspace_bytes`, within 1 MiB + 0.5%), and whether the
  upper bound covers every call.

    python benchmarks/fit_cudnn_fp32_h200.py tests/data/h200_memory/cudnn_conv_sweep.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis.memory import cudnn_model as cm  # noqa: E402

MiB = 2**20
DIRECTIONS = ("forward", "backward_data", "backward_weight")


def close(a: int, b: int, rel: float = 0.10) -> bool:
    return abs(a - b) <= rel * max(a, b) + MiB


def calls(rec: dict):
    """(split, mode, direction, x, w, y, transposed, bytes) per measured call (second call: cached plan)."""
    for r in rec.get("sweep", {}).get("rows", []):
        if "error" in r:
            continue
        for d in DIRECTIONS:
            if d in r:
                yield r["split"], r["mode"], d, r["x"], r["w"], r["y"], bool(r["shape"][6]), r[d]["warm_bytes"]


def summary(rec: dict) -> dict:
    """Counts per (mode, direction, split): calls, rule within 10% (tensor-core modes), or for fp32 calls
    with workspace, FFT-formula matches, and the bound's misses."""
    out: dict = {}
    for split, mode, d, x, w, y, tr, b in calls(rec):
        c = out.setdefault(f"{mode}/{d}/{split}", Counter())
        c["calls"] += 1
        el = 2 if mode == "bf16" else 4
        math = "tf32" if mode == "tf32" else "fp32"
        if mode != "fp32":
            c["rule_within_10pct"] += close(b, cm.conv_workspace_bytes(d, x, w, y, el, transposed=tr, math=math))
            continue
        up = cm.conv_workspace_upper_bytes(d, x, w, y, 4, transposed=tr)
        c["bound_misses"] += b > up + MiB
        if b > 0:
            c["with_workspace"] += 1
            if d == "forward" and not tr:
                c["fft_formula"] += close(b, cm.fft_workspace_bytes(x, w), 0.005)
    return {k: dict(v) for k, v in sorted(out.items())}


def main(argv=None) -> int:
    rec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    s = summary(rec)
    print("| mode / direction / split | calls | NHWC rule within 10% | fp32: with workspace | fp32 forward = FFT | "
          "bound misses |")
    print("|---|---|---|---|---|---|")
    for k, c in s.items():
        print(f"| {k} | {c['calls']} | {c.get('rule_within_10pct', '-')} | {c.get('with_workspace', '-')} | "
              f"{c.get('fft_formula', '-')} | {c.get('bound_misses', '-')} |")
    plans = rec.get("log", {}).get("frontend_plans", [])
    if plans:
        print("\ncuDNN frontend's chosen plans (log part):")
        for p in plans:
            print(f"  {p['engine']:<50} {','.join(n.replace('CUDNN_NUMERICAL_NOTE_', '') for n in p['notes']):<16} "
                  f"{p['workspace_bytes'] / MiB:9.2f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

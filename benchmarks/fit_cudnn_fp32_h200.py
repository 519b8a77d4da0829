"""What the H200 sweep of benchmarks/record_cudnn_fp32_h200.py says about cuDNN's convolution workspaces:
per mode (fp32 = no TF32, tf32, bf16) and direction, which algorithms ran (from the kernel names), how
well each algorithm's workspace formula (workbench.analysis.cudnn_model) predicts the bytes, and whether
the choice of algorithm follows from the shape (fitted on the ``fit`` shapes, checked on the held-out
``test`` shapes).

    python benchmarks/fit_cudnn_fp32_h200.py tests/data/h200_memory/h200_cudnn_fp32.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis import cudnn_model as cm  # noqa: E402

MiB = 2**20
DIRECTIONS = ("forward", "backward_data", "backward_weight")


def calls(rec: dict):
    """(row, mode, direction, x, w, y, stride, transposed, bytes, kernels) per measured call."""
    for r in rec.get("sweep", {}).get("rows", []):
        if "error" in r:
            continue
        n, ci, co, hw, k, s, tr = r["shape"]
        for d in DIRECTIONS:
            c = r.get(d)
            if not c:
                continue
            yield r, r["mode"], d, r["x"], r["w"], r["y"], s, bool(tr), c["warm_bytes"], c.get("kernels") or []


def main(argv=None) -> int:
    rec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    by = defaultdict(list)
    for item in calls(rec):
        by[(item[1], item[2])].append(item)
    for key in sorted(by):
        items = by[key]
        algos = Counter(cm.conv_algorithm(k) for *_, k in items)
        print(f"== {key}: {len(items)} calls, workspace > 0 in {sum(1 for i in items if i[8] > 0)}; algorithms {dict(algos)}")
        per_algo = defaultdict(list)
        for r, mode, d, x, w, y, s, tr, b, ks in items:
            a = cm.conv_algorithm(ks)
            pred = cm.conv_algorithm_workspace_bytes(a, d, x, w, y, 2 if mode == "bf16" else 4, stride=s, transposed=tr)
            per_algo[a].append((b, pred, x, w, y, s, tr, r["split"]))
        for a, lst in per_algo.items():
            known = [(b, p) for b, p, *_ in lst if p is not None]
            exact = sum(1 for b, p in known if abs(b - p) <= max(0.02 * b, 64 << 10))
            print(f"   {a:<22} {len(lst):4d} calls, formula known for {len(known)}, within 2%: {exact}")
            for b, p, x, w, y, s, tr, split in lst[:6]:
                print(f"      x={x} w={w} s={s} tr={tr} {split}: {b / MiB:8.2f} MiB  formula "
                      f"{'-' if p is None else f'{p / MiB:8.2f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

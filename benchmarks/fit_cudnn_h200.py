"""What cuDNN asked the caching allocator for on the H200, per op, from benchmarks/record_memory_h200.py's
``cudnn_sweep.json`` and ``families.json`` (the per-op rows): convolution workspaces against candidate
sizes (input, output, weight, im2col), LSTM reserve space and workspaces against T·B·H·layers.

    python benchmarks/fit_cudnn_h200.py /work/h200/memory        # prints tables for RESULTS.md
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def _t(a):
    return a if isinstance(a, dict) and "shape" in a else None


def conv_rows(sweep: dict, families: dict | None = None):
    """(source, direction, dtype, x_shape, w_shape, y_shape, transposed, workspace_bytes, row) per cuDNN call."""
    out = []

    def add(src, r):
        op = r["op"]
        args = r["args"]
        if op == "convolution":
            x, w = _t(args[0]), _t(args[1])
            y = _t(r["outputs"][0]) if r["outputs"] else None
            if x and w and y:
                out.append((src, "forward", x["dtype"], x["shape"], w["shape"], y["shape"], bool(args[6]),
                            r["transient_bytes"], r))
        elif op == "convolution_backward":
            gy, x, w = _t(args[0]), _t(args[1]), _t(args[2])
            if gy and x and w:
                out.append((src, "backward", x["dtype"], x["shape"], w["shape"], gy["shape"], bool(args[7]),
                            r["transient_bytes"], r))

    for row in sweep.get("conv", []):
        for r in row.get("ops", []):
            add("sweep", r)
    for fam in (families or {}).get("rows", []):
        for r in fam.get("ops", []):
            add(f"{fam['family']}/{fam['batch_size']}/{fam['precision']}", r)
    return out


def main(argv=None) -> int:
    d = Path((argv or sys.argv[1:])[0])
    sweep = json.loads((d / "cudnn_sweep.json").read_text())
    fams = json.loads((d / "families.json").read_text()) if (d / "families.json").exists() else None
    rows = conv_rows(sweep, fams)
    by = defaultdict(list)
    for src, direction, dtype, x, w, y, tr, ws, _ in rows:
        el = 4 if dtype == "float32" else 2
        feats = {"x": math.prod(x) * el, "y": math.prod(y) * el, "w": math.prod(w) * el,
                 "im2col": (math.prod(y) // y[1]) * (w[1] if not tr else w[0]) * w[2] * w[3] * el}
        by[(direction, dtype)].append((src, x, w, y, tr, ws, feats))
    for key, items in sorted(by.items()):
        print(f"== {key}: {len(items)} calls, workspace > 0 in {sum(1 for i in items if i[5] > 0)}")
        for src, x, w, y, tr, ws, f in items[:80]:
            print(f"  {src:<22} x={x} w={w} y={y} tr={tr} ws={ws / 2**20:8.2f} MiB  "
                  + " ".join(f"{k}={ws / v:6.2f}" for k, v in f.items() if v))
    for row in sweep.get("lstm", []):
        print("LSTM", {k: row.get(k) for k in ("batch", "seq", "input", "hidden", "layers", "dtype", "weight_bytes",
                                              "weight_storages", "error")})
        for r in row.get("ops", []) + [dict(x, op="AC:" + x["op"]) for x in row.get("autocast_ops", [])]:
            outs = [o.get("nbytes") if isinstance(o, dict) else o for o in r.get("outputs", [])]
            print(f"   {r['op']:<28} out={r['output_bytes']:>12} transient={r['transient_bytes']:>12} outs={outs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The LSTM rules of workbench.analysis.memory.cudnn_model against the LSTM sweep of
benchmarks/record_cudnn_fp32_h200.py (``lstm_sweep.json``: nn.LSTM, batch first, fp32 / bf16 / fp32 under
bf16 autocast, every third shape held out), per shape and split:

- reserve space: ``lstm_reserve_bytes`` vs the reserve tensor autograd saved (``reserve_bytes``);
- forward transient (peak above what the forward leaves): time-major input copy + ``lstm_workspace_bytes``;
- forward retained: output + h_n + c_n + reserve (+ under autocast the bf16 input and the flat bf16 weights).

    python benchmarks/fit_lstm_h200.py tests/data/h200_memory/lstm_sweep.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis.memory import cudnn_model as cm  # noqa: E402

MiB = 2**20


def predictions(row: dict) -> dict:
    n, t, i, h, layers = row["shape"]
    el = 4 if row["mode"] == "fp32" else 2
    n_w = row["parameter_count"]
    reserve = cm.lstm_reserve_bytes("LSTM", t, n, i, h, layers, False, el)
    ws = cm.lstm_workspace_bytes("forward", "LSTM", t, n, i, h, layers, False, el, n_w)
    x_copy = n * t * i * el
    out = n * t * h * el + 2 * layers * n * h * el
    retained = out + reserve + ((n * t * i + n_w) * el if row["mode"] == "autocast" else 0)
    return {"reserve": reserve, "forward_transient": x_copy + ws, "forward_retained": retained}


def compare(rec: dict) -> list[dict]:
    out = []
    for r in rec.get("rows", []):
        if "error" in r or "forward" not in r:
            continue
        p = predictions(r)
        m = {"reserve": r.get("reserve_bytes"), "forward_transient": r["forward"]["transient_bytes"],
             "forward_retained": r["forward"]["retained_bytes"]}
        row = {"shape": r["shape"], "mode": r["mode"], "split": r["split"]}
        for k in p:
            if m[k]:
                row[k] = {"measured": m[k], "model": p[k], "error_pct": round(100 * (p[k] / m[k] - 1), 2)}
        out.append(row)
    return out


def refit(rec: dict, split: str = "fit") -> tuple[float, float, float] | None:
    """Least squares of the forward workspace (transient minus the input copy) on elements per state,
    the weight buffer's bytes and a constant, over one split's fp32 and bf16 rows: (elements per state,
    weight factor, constant bytes)."""
    import numpy as np

    a, b = [], []
    for r in rec.get("rows", []):
        if "error" in r or "forward" not in r or r["split"] != split or r["mode"] == "autocast":
            continue
        n, t, i, h, layers = r["shape"]
        el = 4 if r["mode"] == "fp32" else 2
        ws = r["forward"]["transient_bytes"] - n * t * i * el
        if ws <= 0:
            continue
        a.append([t * n * h * layers * el, r["parameter_count"] * el, 1.0])
        b.append(ws)
    if len(b) < 3:
        return None
    x, *_ = np.linalg.lstsq(np.array(a), np.array(b, dtype=float), rcond=None)
    return float(x[0]), float(x[1]), float(x[2])


def main(argv=None) -> int:
    rec = json.loads(Path((argv or sys.argv[1:])[0]).read_text())
    fit = refit(rec)
    if fit:
        print(f"refit on the fit rows: {fit[0]:.3f} elements per state + {fit[1]:.3f} x weight bytes + "
              f"{fit[2] / MiB:.2f} MiB (model: {cm.WORKSPACE_ELEMS_PER_STATE} / {cm.WORKSPACE_WEIGHT_BYTES_FACTOR} / "
              f"{cm.WORKSPACE_EXTRA_BYTES / MiB:.2f} MiB)")
    rows = compare(rec)
    print("| shape (B, T, in, hidden, layers) | mode | split | reserve error | forward transient error | "
          "forward retained error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[k]['error_pct']:+.1f}%" if k in r else "-" for k in ("reserve", "forward_transient",
                                                                          "forward_retained")]
        print(f"| {tuple(r['shape'])} | {r['mode']} | {r['split']} | " + " | ".join(cells) + " |")
    for split in ("fit", "test"):
        for k in ("reserve", "forward_transient", "forward_retained"):
            errs = [abs(r[k]["error_pct"]) for r in rows if r["split"] == split and k in r]
            if errs:
                print(f"{split} {k}: {sum(e <= 5 for e in errs)}/{len(errs)} within 5%, max {max(errs):.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

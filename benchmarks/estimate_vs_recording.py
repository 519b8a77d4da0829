"""The estimate's accuracy against torch's peaks recorded on the H200 (``families.json`` written by
benchmarks/record_memory_h200.py; a copy of its totals is tests/data/h200_memory/families.json).

The estimates run here, on this machine's CPU (fake tensors, as on a laptop); the truth is the
H200's ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` over the same two AdamW
steps (``measure_step_memory``, cuBLAS workspaces taken beforehand as in estimate_accuracy.py).
Writes OUT.json and OUT.md.

    OMP_NUM_THREADS=1 python benchmarks/estimate_vs_recording.py tests/data/h200_memory/families.json \\
        --out benchmarks/results/estimate_accuracy_h200_v4 --note "..."
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from estimate_families import FAMILIES, adamw  # noqa: E402
from workbench.capture.estimate import estimate  # noqa: E402

GiB = 2**30
CONV_FAMILIES = ("cnn", "unet")


@contextlib.contextmanager
def recorded_workspaces(row: dict):
    """While active, the estimator's convolution workspaces are the ones cuDNN took on the H200 in this
    row's run (its per-op rows: a forward's transient peak; a backward's, given to its weight-gradient
    call, 0 to its data-gradient call): what is left of the error is not the workspace sizes' doing."""
    from workbench.analysis.memory import cudnn_model
    table = {}
    for o in row.get("ops", []):
        a = o["args"]
        if o["op"] == "convolution":
            table[("forward", tuple(a[0]["shape"]), tuple(a[1]["shape"]))] = o["transient_bytes"]
        elif o["op"] == "convolution_backward":
            table[("backward_weight", tuple(a[1]["shape"]), tuple(a[2]["shape"]))] = o["transient_bytes"]
    real = cudnn_model.conv_workspace_bytes

    def replay(direction, x, w, y, el, **kw):
        return table.get((direction, tuple(x), tuple(w)), 0)

    cudnn_model.conv_workspace_bytes = replay
    try:
        yield
    finally:
        cudnn_model.conv_workspace_bytes = real


def rows_for(recording: dict, families=None, table=None) -> list[dict]:
    out = []
    for r in recording["rows"]:
        if "max_allocated_bytes" not in r or (families and r["family"] not in families):
            continue
        build, batch, loss = FAMILIES[r["family"]]
        t0 = time.perf_counter()
        # The measurement warmed cuBLAS up first (estimate_accuracy.py does the same): the process held its
        # two workspaces, in segments of their own, before the step (base_*), and the step's allocations
        # never landed in them. Compared: each side's memory above that, so the estimate runs with the
        # cuBLAS workspaces already taken (cublas_workspace_bytes=0) rather than subtracting them from its
        # peak afterwards (the replay may have fitted them into cached blocks, so a subtraction is wrong).
        e = estimate(build, batch, adamw, precision=r["precision"], batch_size=r["batch_size"], loss_fn=loss,
                     strict_fp32=r["precision"] == "fp32",
                     checkpointing=r.get("checkpointing", False), cublas_workspace_bytes=0)
        row = {"family": r["family"], "batch_size": r["batch_size"], "precision": r["precision"],
               "estimate_allocated_bytes": e.peak_allocated_bytes,
               "estimate_reserved_bytes": e.peak_reserved_bytes,
               "real_allocated_bytes": r["max_allocated_bytes"] - r["base_allocated_bytes"],
               "real_reserved_bytes": r["max_reserved_bytes"] - r["base_reserved_bytes"],
               "raw_real_allocated_bytes": r["max_allocated_bytes"], "raw_real_reserved_bytes": r["max_reserved_bytes"],
               "workspace_bytes": e.by_category.get("workspace", 0),
               # with every unpredictable (fp32 cuDNN) workspace at its most
               "upper_allocated_bytes": e.peak_allocated_upper_bytes,
               "upper_reserved_bytes": e.peak_reserved_upper_bytes}
        if any(o["op"] == "convolution" for o in r.get("ops", [])):
            with recorded_workspaces(r):
                e2 = estimate(build, batch, adamw, precision=r["precision"], batch_size=r["batch_size"], loss_fn=loss,
                     strict_fp32=r["precision"] == "fp32",
                              checkpointing=r.get("checkpointing", False), cublas_workspace_bytes=0)
            row["recorded_ws_allocated_error_pct"] = round(100 * (e2.peak_allocated_bytes / row["real_allocated_bytes"] - 1), 2)
            row["recorded_ws_reserved_error_pct"] = round(100 * (e2.peak_reserved_bytes / row["real_reserved_bytes"] - 1), 2)
        if table is not None and any(k.endswith("|fp32|fp32|nchw") or "|tc|" in k or "|tf32|" in k
                                     for k in table.entries) and r["family"] in CONV_FAMILIES:
            # with the workspaces measured on the H200 by benchmarks/calibrate_families_h200.py (each
            # convolution alone, in another process than the truth's)
            e3 = estimate(build, batch, adamw, precision=r["precision"], batch_size=r["batch_size"], loss_fn=loss,
                     strict_fp32=r["precision"] == "fp32",
                          checkpointing=r.get("checkpointing", False), cublas_workspace_bytes=0, conv_workspaces=table)
            cw = e3.meta["conv_workspaces"]
            row.update(calibrated_allocated_bytes=e3.peak_allocated_bytes, calibrated_reserved_bytes=e3.peak_reserved_bytes,
                       calibrated_calls=cw["calls"], calibrated_measured=cw["measured"],
                       calibrated_allocated_error_pct=round(100 * (e3.peak_allocated_bytes / row["real_allocated_bytes"] - 1), 2),
                       calibrated_reserved_error_pct=round(100 * (e3.peak_reserved_bytes / row["real_reserved_bytes"] - 1), 2))
        row["held_out"] = bool(r.get("held_out"))
        took = time.perf_counter() - t0
        row["allocated_error_pct"] = round(100 * (row["estimate_allocated_bytes"] / row["real_allocated_bytes"] - 1), 2)
        row["reserved_error_pct"] = round(100 * (row["estimate_reserved_bytes"] / row["real_reserved_bytes"] - 1), 2)
        out.append(row)
        print(f"{row['family']} bs={row['batch_size']} {row['precision']}: allocated {row['allocated_error_pct']:+.1f}%, "
              f"reserved {row['reserved_error_pct']:+.1f}% ({took:.1f} s)", flush=True)
    return out


def _up(r) -> str:
    return "x" if r.get("upper_reserved_bytes", r["estimate_reserved_bytes"]) != r["estimate_reserved_bytes"] else "-"


def table(rows: list[dict]) -> str:
    lines = ["| family | batch | precision | est. allocated GiB | real allocated GiB | error | est. reserved GiB | "
             "real reserved GiB | error | upper bound allocated / reserved GiB | with the recorded workspaces: "
             "allocated / reserved error | calibrated: allocated / reserved error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rec = (f"{r['recorded_ws_allocated_error_pct']:+.1f}% / {r['recorded_ws_reserved_error_pct']:+.1f}%"
               if "recorded_ws_reserved_error_pct" in r else "-")
        up = (f"{r['upper_allocated_bytes'] / GiB:.3f} / {r['upper_reserved_bytes'] / GiB:.3f}"
              if r.get("upper_reserved_bytes", r["estimate_reserved_bytes"]) != r["estimate_reserved_bytes"] else "-")
        cal = (f"{r['calibrated_allocated_error_pct']:+.1f}% / {r['calibrated_reserved_error_pct']:+.1f}%"
               if "calibrated_reserved_error_pct" in r else "-")
        lines.append(f"| {r['family']}{' (held out)' if r.get('held_out') else ''} | {r['batch_size']} | {r['precision']} | {r['estimate_allocated_bytes'] / GiB:.3f} | "
                     f"{r['real_allocated_bytes'] / GiB:.3f} | {r['allocated_error_pct']:+.1f}% | "
                     f"{r['estimate_reserved_bytes'] / GiB:.3f} | {r['real_reserved_bytes'] / GiB:.3f} | "
                     f"{r['reserved_error_pct']:+.1f}% | {up} | {rec} | {cal} |")
    if rows:
        a = [abs(r["allocated_error_pct"]) for r in rows]
        v = [abs(r["reserved_error_pct"]) for r in rows]
        lines += ["", f"Allocated: {sum(x <= 5 for x in a)}/{len(rows)} within 5% (max {max(a):.1f}%); "
                  f"reserved: {sum(x <= 10 for x in v)}/{len(rows)} within 10% (max {max(v):.1f}%). Rows with an upper "
                  f"bound whose real peaks lie between estimate and bound: allocated "
                  f"{sum(r['estimate_allocated_bytes'] <= r['real_allocated_bytes'] <= r['upper_allocated_bytes'] for r in rows if '-' not in _up(r))}"
                  f"/{sum('-' not in _up(r) for r in rows)}, reserved "
                  f"{sum(r['estimate_reserved_bytes'] <= r['real_reserved_bytes'] <= r['upper_reserved_bytes'] for r in rows if '-' not in _up(r))}"
                  f"/{sum('-' not in _up(r) for r in rows)}."]
        # the estimate as a user with a calibration table gets it: calibrated where measured, else the rules
        best_a = [abs(r.get("calibrated_allocated_error_pct", r["allocated_error_pct"])) for r in rows]
        best_v = [abs(r.get("calibrated_reserved_error_pct", r["reserved_error_pct"])) for r in rows]
        if any("calibrated_reserved_error_pct" in r for r in rows):
            lines += ["", f"With the calibration (convolution families calibrated, the others as estimated): allocated "
                      f"{sum(x <= 5 for x in best_a)}/{len(rows)} within 5% (max {max(best_a):.1f}%); reserved "
                      f"{sum(x <= 10 for x in best_v)}/{len(rows)} within 10% (max {max(best_v):.1f}%)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families_json", nargs="+", help="truth files (rows of torch's peaks); a file whose name says "
                    "'heldout' marks its rows held out")
    ap.add_argument("--workspaces", default=None, help="a convolution workspace table measured on the GPU "
                    "(benchmarks/calibrate_families_h200.py): adds the calibrated estimate's errors")
    ap.add_argument("--out", required=True, help="path without extension: OUT.json and OUT.md")
    ap.add_argument("--families", default=None, help="comma-separated subset")
    ap.add_argument("--note", default="", help="a line written above the table (machine, date, command)")
    args = ap.parse_args(argv)
    rec = {"rows": []}
    for path in args.families_json:
        held = "heldout" in Path(path).name
        rec["rows"] += [dict(r, held_out=held) for r in json.loads(Path(path).read_text())["rows"]]
    ws_table = None
    if args.workspaces:
        from workbench.analysis.memory.cudnn_model import ConvWorkspaces
        ws_table = ConvWorkspaces.load(args.workspaces)
    rows = rows_for(rec, args.families.split(",") if args.families else None, ws_table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"truth": args.families_json, "note": args.note, "estimated_on": "CPU (fake tensors)",
            "workspaces": args.workspaces, "workspace_table": ws_table.meta if ws_table is not None else None,
            "command": f"python benchmarks/estimate_vs_recording.py {' '.join(args.families_json)} --out {args.out}"
                       + (f" --workspaces {args.workspaces}" if args.workspaces else "")
                       + (f" --families {args.families}" if args.families else "")}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text((args.note + "\n\n" if args.note else "") + table(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Roofline/MFU on the H200 GPT recordings against the hand count and the unprofiled measurements.

    python benchmarks/roofline_h200_pairs.py [--ceilings tests/data/h200_ceilings.json]

Reads tests/data/h200_pairs/gpt/ (traces recorded with shapes by benchmarks/record_diagnosis_h200.py,
``truth.json``: hand FLOP count and CUDA-event step times without the profiler) and prints, per
precision: model FLOPs from the trace vs the hand count, MFU on the measured unprofiled step, on the
trace's own step and on the diagnosis' estimate of the unprofiled step, the top GEMM kernel's TFLOP/s,
and the fp32 trace's TF32 / bf16 what-ifs against the measured steps. ``--ceilings``: the same with the
measured matmul/copy ceilings as the peaks. Markdown tables for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis.trace.peaks import peak_for, peak_from_ceilings  # noqa: E402
from workbench.analysis.trace.roofline import precision_what_ifs, roofline  # noqa: E402
from workbench.io import load_trace  # noqa: E402

GPT = ROOT / "tests" / "data" / "h200_pairs" / "gpt"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ceilings", help="measured ceilings JSON (record_ceilings_h200.py) to use as the peaks")
    args = ap.parse_args(argv)
    truth = json.loads((GPT / "truth.json").read_text())
    hand = truth["hand_count"]["total_flops"]
    peak = None
    if args.ceilings:
        c = json.loads(Path(args.ceilings).read_text())
        sheet = peak_for(c["device"])
        peak = peak_from_ceilings(c, name=f"{sheet.name if sheet else c['device']} measured")
    print(f"peaks: {'measured ' + args.ceilings if peak else 'datasheet'}")
    print("| precision | model FLOPs (trace / hand) | measured ms (no profiler) | MFU on it (hand) | trace step ms | "
          "MFU on it | estimated unprofiled ms | MFU on it | top GEMM kernel TFLOP/s (% of roof) |")
    print("|---|---|---|---|---|---|---|---|---|")
    traces = {}
    for v in ("bf16", "tf32", "fp32"):
        t = traces[v] = load_trace(GPT / f"{v}.standard.trace.json.gz")
        ms = truth["measured"][v]["median_ms"]
        rl_m = roofline(t, peak=peak, step_ms=ms)
        rl = roofline(t, peak=peak, costs=rl_m.costs)
        s = rl_m.step
        comp = s["peak_tflops_dtype"]
        hand_mfu = hand / (ms * 1e-3) / (comp * 1e12)
        k = rl.kernels[(rl.kernels["kind"] == "gemm") & rl.kernels["tflops"].notna()].iloc[0]
        print(f"| {v} | {s['model_flops'] / 1e12:.4f} / {hand / 1e12:.4f} TFLOP ({s['model_flops'] / hand - 1:+.2%}) | "
              f"{ms:.2f} | {100 * s['mfu']:.1f}% ({100 * hand_mfu:.1f}%) of {comp} | {s['step_ms_trace']:.2f} | "
              f"{100 * s['mfu_trace']:.1f}% | {rl.step['step_ms']:.2f} | {100 * rl.step['mfu']:.1f}% | "
              f"{k['tflops']:.1f} ({100 * k['roofline_fraction']:.0f}%) |")
    w = precision_what_ifs(traces["fp32"], roofline(traces["fp32"], peak=peak))
    m = truth["measured"]
    print()
    print("| what-if on the fp32 trace | predicted step ms | measured ms | predicted saving | measured saving | error of the saving |")
    print("|---|---|---|---|---|---|")
    for v in ("tf32", "bf16"):
        pred_saving = w[v].saved_fraction * m["fp32"]["median_ms"]
        meas_saving = m["fp32"]["median_ms"] - m[v]["median_ms"]
        print(f"| {v} | {w[v].step_ms_if_fixed:.2f} (on the trace's {w[v].step_ms:.2f}) | {m[v]['median_ms']:.2f} | "
              f"{pred_saving:.1f} ms | {meas_saving:.1f} ms | {pred_saving / meas_saving - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Measure what convolutions reach on this GPU at each math: strict fp32, TF32, bf16 with NCHW tensors and
bf16 with channels_last (NHWC), over a sweep of common layer shapes (ResNet/VGG/U-Net-like 1x1 and 3x3
convolutions, strided and not, 64-512 channels, 7-112 px, batch 32-128).

    python benchmarks/record_conv_ceilings_h200.py --out DIR

Writes ``DIR/conv_ceilings.json``: per shape and math the median time (CUDA events, 5 warm-up calls, 15
timed) of the forward and of the two backward convolutions (cudnn.benchmark off, as by default), the
FLOPs, and the achieved TFLOP/s; plus per math the median over shapes of the speed-up against strict fp32
(forward + backward summed). The step model's precision what-ifs for convolutions read these ratios
(:mod:`workbench.analysis.trace.roofline`) instead of assuming a convolution reaches the same fraction of
the tensor-core GEMM roof as of the fp32 one. The sweep shares no shape on purpose with the conv_precision
pair of benchmarks/record_diagnosis_h200.py that checks the prediction.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path

MODES = ("fp32_strict", "tf32", "bf16_nchw", "bf16_nhwc")


def shapes():
    # (batch, c_in, hw, c_out, kernel, stride): bottleneck 1x1s, 3x3s, strided downsamples, stems
    out = []
    for n, c, hw in ((32, 64, 112), (64, 64, 56), (64, 128, 28), (128, 256, 14), (128, 512, 7), (32, 96, 72),
                     (64, 192, 36), (32, 320, 24)):
        out.append((n, c, hw, c, 3, 1))
        out.append((n, c, hw, 4 * c if c <= 128 else c // 2, 1, 1))
        out.append((n, c, hw, 2 * c, 3, 2))
    out.append((64, 3, 192, 64, 7, 2))
    out.append((32, 3, 256, 32, 3, 1))
    return out


def conv_flops(n, c, hw, k, ks, s):
    ho = (hw + 2 * (ks // 2) - ks) // s + 1
    return 2.0 * n * k * ho * ho * c * ks * ks


def measure(mode, shape):
    import torch

    n, c, hw, k, ks, s = shape
    bf16 = mode.startswith("bf16")
    dt = torch.bfloat16 if bf16 else torch.float32
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dt)
    w = torch.randn(k, c, ks, ks, device="cuda", dtype=dt)
    if mode == "bf16_nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    aten = torch.ops.aten
    geo = ([s, s], [ks // 2, ks // 2], [1, 1], False, [0, 0], 1)
    y = aten.convolution(x, w, None, *geo)
    gy = torch.randn_like(y)
    fns = {"forward": lambda: aten.convolution(x, w, None, *geo),
           "backward_data": lambda: aten.convolution_backward(gy, x, w, None, *geo, [True, False, False]),
           "backward_weight": lambda: aten.convolution_backward(gy, x, w, None, *geo, [False, True, False])}
    res = {}
    for d, f in fns.items():
        for _ in range(5):
            f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        res[d] = statistics.median(ts)
    del x, w, y, gy
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch

    torch.backends.cudnn.benchmark = False
    rows = []
    for shape in shapes():
        row = {"batch": shape[0], "c_in": shape[1], "hw": shape[2], "c_out": shape[3], "kernel": shape[4],
               "stride": shape[5], "flops_forward": conv_flops(*shape), "ms": {}}
        for mode in MODES:
            try:
                row["ms"][mode] = measure(mode, shape)
            except Exception as exc:  # recorded, never fatal
                row["ms"][mode] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        total = {m: sum(v.values()) for m, v in row["ms"].items() if "error" not in v}
        row["tflops_step"] = {m: 3 * row["flops_forward"] / (t * 1e-3) / 1e12 for m, t in total.items() if t > 0}
        rows.append(row)
        print(json.dumps({"shape": shape, "ms_total": {m: round(t, 3) for m, t in total.items()}}), flush=True)
        torch.cuda.empty_cache()
    speedup = {}
    for mode in MODES[1:]:
        r = [sum(x["ms"]["fp32_strict"].values()) / sum(x["ms"][mode].values()) for x in rows
             if "error" not in x["ms"].get(mode, {"error": 1}) and "error" not in x["ms"]["fp32_strict"]]
        speedup[mode] = {"median": statistics.median(r), "min": min(r), "max": max(r), "shapes": len(r)}
    out = {"format": "gpu-workbench/conv-ceilings/1", "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "cudnn_benchmark": False,
           "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "speedup_vs_fp32_strict": speedup, "shapes": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "conv_ceilings.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(speedup), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

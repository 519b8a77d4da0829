"""Measure, on a GPU, a sample of the estimator's layer corpus and calibrate the convolution workspaces the
package ships (issue: estimator v3).

    python benchmarks/record_corpus_h200.py --out DIR [--jobs 4] [--batch-size 32]

Writes ``DIR/corpus_measured.json``: for every corpus case (tests/estimate_corpus.py) at ``fp32`` (torch's
flags as an untouched script has them: cuDNN convolutions in TF32, matmuls in fp32) and ``bf16`` (autocast),
the real step's ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after a cuBLAS warm-up
(:func:`workbench.capture.estimate.measure.measure_step_memory`), the conv workspace table measured for the
case first, and the environment. And ``DIR/conv_workspaces.json``: one table holding every convolution call
of the corpus sample, of the example models (examples/estimate_cnn.py, examples/estimate_families.py) and of
a ResNet-50 at 224 px, at several batch sizes and at fp32 (TF32 convolutions), strict fp32 and bf16, with
channels_last for the ResNet-50: the table shipped in ``workbench/capture/estimate/tables/``.

Each job is a fresh process holding a slice of the cases (the caching allocator's peaks are per process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "examples")]


def resnet50(channels_last: bool = False):
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, c_in, width, stride):
            super().__init__()
            c_out = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(inplace=True), nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
            self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
                         if stride != 1 or c_in != c_out else nn.Identity())
            self.act = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.body(x) + self.skip(x))

    layers, c = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                 nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(c, width, stride if i == 0 else 1))
            c = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000))


def _sgd(params):
    import torch
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adamw(params):
    import torch
    return torch.optim.AdamW(params, lr=1e-3)


def table_workloads():
    """(label, model_fn, inputs_fn, optimizer_fn, loss_fn, batch sizes, precisions) calibrated into the table."""
    import torch
    import estimate_cnn
    import estimate_families as fam

    def img(size, cl=False):
        def f(bs):
            x = torch.randn(bs, 3, size, size)
            return (x.contiguous(memory_format=torch.channels_last) if cl else x,)
        return f

    def r50(cl):
        def f():
            m = resnet50()
            return m.to(memory_format=torch.channels_last) if cl else m
        return f

    yield "resnet50_224", r50(False), img(224), _sgd, None, (8, 16, 32, 64, 128), ("fp32", "strict", "bf16")
    yield "resnet50_224_channels_last", r50(True), img(224, True), _sgd, None, (16, 32, 64, 128), ("bf16",)
    yield "estimate_cnn", estimate_cnn.model, estimate_cnn.batch, estimate_cnn.optimizer, None, (8, 16, 32, 64, 128), \
        ("fp32", "strict", "bf16")
    yield "families_cnn", fam.cnn, fam.cnn_batch, _adamw, None, (8, 16, 32, 64), ("fp32", "strict", "bf16")
    yield "families_unet", fam.unet, fam.unet_batch, _adamw, None, (4, 8, 16, 32), ("fp32", "strict", "bf16")


def _precision(p):
    return ("fp32", True) if p == "strict" else (p, False)


def worker(args) -> int:
    import torch

    from workbench.analysis.memory.cudnn_model import ConvWorkspaces
    from workbench.capture.cudnn_calibration import calibrate
    from workbench.capture.estimate.measure import measure_step_memory, warm_up_cublas
    from estimate_corpus import corpus

    out = Path(args.out)
    table = ConvWorkspaces()
    warm_up_cublas()
    rows = []
    if args.part == "table":
        for label, mf, inf, of, lf, sizes, precs in table_workloads():
            for p in precs:
                prec, strict = _precision(p)
                for bs in sizes:
                    t0 = time.perf_counter()
                    try:
                        calibrate(mf, inf, of, prec, bs, lf, table=table, progress=False, strict_fp32=strict)
                        rec = {"workload": label, "precision": p, "batch_size": bs, "calibrated": len(table)}
                        if bs == 32 and label.startswith("resnet50"):
                            rec["measured"] = measure_step_memory(mf, inf, of, precision=prec, batch_size=bs,
                                                                  loss_fn=lf, strict_fp32=strict)
                    except Exception as exc:  # recorded, never fatal
                        rec = {"workload": label, "precision": p, "batch_size": bs,
                               "error": f"{type(exc).__name__}: {exc}"[:400]}
                    rec["seconds"] = round(time.perf_counter() - t0, 2)
                    rows.append(rec)
                    print(json.dumps(rec), flush=True)
    else:
        cases = corpus()
        k, n = (int(v) for v in args.part.split("/"))
        for case in cases[k::n]:
            for p in ("fp32", "bf16"):
                prec, strict = _precision(p)
                rec = {"case": case.name, "family": case.family, "precision": p, "batch_size": args.batch_size}
                t0 = time.perf_counter()
                try:
                    one = ConvWorkspaces()
                    calibrate(case.model, case.batch, case.optimizer, prec, args.batch_size, case.loss, table=one,
                              progress=False, strict_fp32=strict)
                    table.entries.update(one.entries)
                    rec["workspaces"] = one.entries
                    rec["measured"] = measure_step_memory(case.model, case.batch, case.optimizer, precision=prec,
                                                          batch_size=args.batch_size, loss_fn=case.loss,
                                                          strict_fp32=strict)
                except Exception as exc:  # recorded, never fatal
                    rec["error"] = f"{type(exc).__name__}: {exc}"[:400]
                    rec["trace"] = traceback.format_exc()[-800:]
                rec["seconds"] = round(time.perf_counter() - t0, 2)
                rows.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k not in ("workspaces", "trace")}), flush=True)
    if not table.meta:
        from workbench.capture.cudnn_calibration import _environment
        table.meta.update(_environment("cuda"))
    name = args.part.replace("/", "of")
    (out / f"part_{name}.json").write_text(json.dumps({"rows": rows, "table": table.to_dict()}) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=400)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.part:
        return worker(args)
    parts = [f"{k}/{args.jobs}" for k in range(args.jobs)] + ["table"]
    t0 = time.perf_counter()
    procs = {p: subprocess.Popen([sys.executable, __file__, "--out", str(out), "--part", p,
                                  "--batch-size", str(args.batch_size)]) for p in parts}
    status = {}
    for p, proc in procs.items():
        try:
            status[p] = proc.wait(timeout=max(5.0, args.timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            status[p] = "timeout"
    import torch

    from workbench.analysis.memory.cudnn_model import ConvWorkspaces
    from workbench.capture.cudnn_calibration import _environment

    rows, table = [], ConvWorkspaces()
    for p in parts:
        f = out / f"part_{p.replace('/', 'of')}.json"
        if f.exists():
            d = json.loads(f.read_text())
            rows += d["rows"]
            table.entries.update(d["table"]["entries"])
    table.meta.update(_environment("cuda"))
    table.meta["holds"] = ("the corpus sample (tests/estimate_corpus.py, batch %d), examples/estimate_cnn.py, "
                           "examples/estimate_families.py cnn/unet, a ResNet-50 at 224 px" % args.batch_size)
    table.save(out / "conv_workspaces.json")
    env = {"status": status, "seconds": round(time.perf_counter() - t0, 1), **_environment("cuda"),
           "batch_size": args.batch_size}
    corpus_rows = [r for r in rows if "case" in r]
    (out / "corpus_measured.json").write_text(json.dumps({"env": env, "rows": corpus_rows,
                                                          "table_runs": [r for r in rows if "workload" in r]},
                                                         indent=1, sort_keys=True) + "\n")
    bad = [r for r in rows if "error" in r]
    print(f"{len(corpus_rows)} corpus runs, {len(table)} table entries, {len(bad)} errors, {env['seconds']} s; "
          f"status {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

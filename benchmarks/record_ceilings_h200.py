"""Measure the GPU's ceilings (matmul TFLOP/s per dtype, device copy GB/s) and write them as JSON.

Run on the H200 from the repository root (under a minute)::

    python benchmarks/record_ceilings_h200.py --out OUTDIR

Writes ``OUTDIR/ceilings.json``: :func:`workbench.capture.ceilings.measure_ceilings` (square torch.mm at
N = 4096 and 8192 for bf16 / fp16 / tf32 / fp32, best N, median of CUDA-event timed calls; a 1 GiB
device-to-device copy counted read + write; a 256 MiB pinned host-to-device copy), the datasheet row it
is compared with, the driver and clocks from NVML when available, and the measurement repeated
``--rounds`` times (each round's figures kept, so the spread is visible). The roofline tests and
benchmarks/RESULTS.md read the copy kept in tests/data/h200_ceilings.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _nvml() -> dict:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        out = {"driver": pynvml.nvmlSystemGetDriverVersion(),
               "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
               "mem_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM),
               "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}
        pynvml.nvmlShutdown()
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}
    except Exception as exc:  # NVML is optional here: the measurement does not need it
        return {"nvml_error": f"{type(exc).__name__}: {exc}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for ceilings.json")
    ap.add_argument("--rounds", type=int, default=3, help="repeat the whole measurement this many times")
    args = ap.parse_args(argv)
    from workbench.capture.ceilings import measure_ceilings
    from workbench.errors import WorkbenchError

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rounds = []
    for i in range(args.rounds):
        try:
            r = measure_ceilings()
        except WorkbenchError as exc:
            print(f"record_ceilings_h200: {exc}", file=sys.stderr)
            return 2
        rounds.append(r)
        print(f"round {i}: " + ", ".join(f"{k} {v['tflops']} TFLOP/s (N={v['size']})" for k, v in r["matmul"].items())
              + f"; copy {r['copy']['gbps']} GB/s; h2d pinned {r['h2d_pinned']['gbps']} GB/s", flush=True)
    # the reported figure per ceiling: the best round (ceilings are maxima), every round kept
    best = dict(rounds[0])
    best["matmul"] = {k: max((r["matmul"][k] for r in rounds), key=lambda v: v["tflops"]) for k in rounds[0]["matmul"]}
    best["copy"] = max((r["copy"] for r in rounds), key=lambda v: v["gbps"])
    best["h2d_pinned"] = max((r["h2d_pinned"] for r in rounds), key=lambda v: v["gbps"])
    if best.get("datasheet"):
        sheet = best["datasheet"]
        best["fraction_of_datasheet"] = {
            **{k: round(v["tflops"] / sheet["peak_tflops"][k], 3) for k, v in best["matmul"].items()
               if k in sheet["peak_tflops"]},
            "copy": round(best["copy"]["gbps"] / sheet["peak_gbps"], 3)}
    best["rounds"] = [{"matmul": {k: v["tflops"] for k, v in r["matmul"].items()}, "copy_gbps": r["copy"]["gbps"],
                       "h2d_pinned_gbps": r["h2d_pinned"]["gbps"]} for r in rounds]
    best["env"] = _nvml()
    best["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "ceilings.json").write_text(json.dumps(best, indent=1) + "\n")
    print(json.dumps({k: best[k] for k in ("device", "matmul", "copy", "fraction_of_datasheet", "seconds")
                      if k in best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

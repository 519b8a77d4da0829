"""What reading the GPM counters costs: one nvmlGpmSampleGet, one nvmlGpmMetricsGet (the 12 metrics the
sampler reads), and NvmlSampler's own CPU share at 10 Hz with and without GPM.

    python benchmarks/gpm_cost.py --seconds 5 --json out.json      # on a Hopper (or newer) GPU machine

Results with machine and date go in benchmarks/RESULTS.md ("GPM counters").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _call_cost_us(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from workbench.capture.nvml import GPM_METRICS, NvmlSampler, gpm_support, open_nvml

    nv = open_nvml()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    res = {"gpu": nv.nvmlDeviceGetName(h), "gpm": gpm_support(nv, h) or "supported"}
    if res["gpm"] == "supported":
        a, b = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, a)
        res["sample_get_us"] = _call_cost_us(lambda: nv.nvmlGpmSampleGet(h, b), 50)
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        ids = [getattr(nv, name) for name, _scale in GPM_METRICS.values() if hasattr(nv, name)]
        req.numMetrics = len(ids)
        for i, mid in enumerate(ids):
            req.metrics[i].metricId = mid
        req.sample1, req.sample2 = a, b
        res["metrics_get_us"] = _call_cost_us(lambda: nv.nvmlGpmMetricsGet(req), 50)
        res["metrics"] = len(ids)
    for gpm in (False, True):
        s = NvmlSampler(interval_s=0.1, slow_interval_s=None, gpm=gpm)
        with s:
            time.sleep(args.seconds)
        st = s.stats()
        res[f"sampler_cpu_pct_gpm_{'on' if gpm else 'off'}"] = 100 * st["cpu_fraction"]
    print(json.dumps(res, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()

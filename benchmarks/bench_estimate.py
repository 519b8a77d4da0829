"""Time and memory of estimating one training step of a ~1-billion-parameter model on the CPU.

Target (docs/architecture.md, "Speed targets"): seconds on 2 CPU cores, and no real memory proportional to the model.
Each configuration runs in a fresh subprocess so its peak RSS (ru_maxrss) is its own. Side by side:
the process that only imports torch (the floor), and the hand arithmetic people use (16 bytes per
parameter for fp32 AdamW: weights, gradients, two states), which ignores activations.

    OMP_NUM_THREADS=1 python benchmarks/bench_estimate.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {examples!r})
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
out = {{"import_s": t_import}}
if {run!r}:
    from estimate_families import DecoderLM, adamw
    from workbench.capture.estimate import estimate
    t1 = time.perf_counter()
    e = estimate(lambda: DecoderLM(d_model=2048, layers=20, heads=16, vocab=32000, max_len=2048),
                 lambda bs: (torch.randint(0, 32000, (bs, 1024)),), adamw, precision={precision!r}, batch_size=4)
    out.update(estimate_s=time.perf_counter() - t1, parameters=e.meta["parameters"],
               peak_allocated_bytes=e.peak_allocated_bytes, peak_reserved_bytes=e.peak_reserved_bytes,
               events=len(e.timeline))
out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def child(run: bool, precision: str = "bf16") -> dict:
    code = CHILD.format(examples=str(ROOT / "examples"), run=run, precision=precision)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    floor = child(False)
    print(f"import torch only: {floor['import_s']:.1f} s, peak RSS {floor['max_rss_mib']:.0f} MiB", flush=True)
    for prec in ("fp32", "bf16"):
        r = child(True, prec)
        p = r["parameters"]
        print(f"estimate {prec}: {p / 1e9:.2f} B parameters, batch 4 x 1024 tokens: {r['estimate_s']:.1f} s, "
              f"{r['events']:,} alloc/free events, peak RSS {r['max_rss_mib']:.0f} MiB "
              f"(+{r['max_rss_mib'] - floor['max_rss_mib']:.0f} MiB over import torch; the fp32 weights alone "
              f"would be {p * 4 / 2**20:,.0f} MiB); estimate {r['peak_allocated_bytes'] / 2**30:.1f} GiB allocated, "
              f"{r['peak_reserved_bytes'] / 2**30:.1f} GiB reserved; hand arithmetic 16 B/param = "
              f"{16 * p / 2**30:.1f} GiB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

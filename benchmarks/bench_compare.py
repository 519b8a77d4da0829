"""Before/after tools, side by side with their peers, each run in a fresh process.

1. Trace diff: ``load_trace`` x2 + ``trace_diff`` against Holistic Trace Analysis's
   ``TraceDiff.compare_traces`` (its own parser) on the same two files: wall time of the work and
   peak RSS of the process.
2. Harness timing: the median step ``run_experiment`` reports against a hand-written
   ``time.perf_counter`` loop over the same step (the numbers should agree; the harness adds its
   bookkeeping between steps, not inside them).

    OMP_NUM_THREADS=1 python benchmarks/bench_compare.py [--base A.json.gz --test B.json.gz]

Defaults: the shipped 3-step H200 trace against the 24-step H200 trace in /work/shared/data/h200
(86 MB of JSON, 273,782 events), when present.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIG = Path("/work/shared/data/h200/big_transformer_24steps.trace.json.gz")

WORKBENCH_DIFF = """
import json, resource, sys, time
t0 = time.perf_counter()
from workbench.io import load_trace
from workbench.analysis import trace_diff
d = trace_diff(load_trace(sys.argv[1]), load_trace(sys.argv[2]))
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rows": len(d.kernels) + len(d.ops)}))
"""

HTA_DIFF = """
import json, os, resource, sys, time, shutil, tempfile, logging
logging.disable(logging.WARNING)
dirs = []
for p in sys.argv[1:3]:
    d = tempfile.mkdtemp(prefix="hta-diff-")
    os.symlink(os.path.abspath(p), os.path.join(d, os.path.basename(p)))
    dirs.append(d)
t0 = time.perf_counter()
from hta.trace_diff import TraceDiff
df = TraceDiff.compare_traces(dirs[0], dirs[1])
wall = time.perf_counter() - t0
for d in dirs:
    shutil.rmtree(d)
print(json.dumps({"wall_s": wall, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rows": len(df)}))
"""

HARNESS = """
import json, statistics, time, torch
torch.set_num_threads(1)
from workbench.capture.configurations import Workload, fp32
from workbench.capture.runner import run_experiment
def model():
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                                                     torch.nn.Linear(1024, 256)) for _ in range(4)])
def batch(n, dev):
    return torch.randn(n, 256, device=dev)
def loss(m, x):
    return m(x).square().mean()
steps = 30
# hand-written loop (the peer): same model, batch, optimizer
torch.manual_seed(0)
m = model(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3); x = batch(64, "cpu")
times = []
for i in range(steps + 3):
    t0 = time.perf_counter()
    l = loss(m, x); l.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if i >= 3:
        times.append((time.perf_counter() - t0) * 1e3)
hand = statistics.median(times)
t0 = time.perf_counter()
exp = run_experiment(Workload(model, batch, loss, batch_size=64), [fp32()], device="cpu", steps=steps,
                     warmup=3, check_steps=0, memory=False, progress=False)
wall = time.perf_counter() - t0
print(json.dumps({"hand_ms": hand, "harness_ms": exp.ledger.loc[0, "step_ms_median"], "harness_wall_s": wall,
                  "steps": steps}))
"""


def _run(code: str, *args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", KINETO_LOG_LEVEL="6", TORCH_CPP_LOG_LEVEL="ERROR")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                         env=env, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=str(ROOT / "workbench/samples/h200_train_step.trace.json.gz"))
    ap.add_argument("--test", default=str(BIG) if BIG.exists() else str(ROOT / "workbench/samples/a100_alexnet.trace.json.gz"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-hta", action="store_true")
    args = ap.parse_args()
    print(f"machine: {platform.node()} ({os.cpu_count()} cores), python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    sizes = {p: Path(p).stat().st_size / 2**20 for p in (args.base, args.test)}
    print(f"diff {args.base} ({sizes[args.base]:.1f} MiB gz) -> {args.test} ({sizes[args.test]:.1f} MiB gz)")
    print("| tool | wall s (best of %d) | peak RSS MiB | rows |" % args.repeat)
    print("|---|---|---|---|")
    tools = [("workbench load_trace x2 + trace_diff", WORKBENCH_DIFF)]
    if not args.skip_hta:
        tools.append(("HTA TraceDiff.compare_traces (peer)", HTA_DIFF))
    for name, code in tools:
        runs = [_run(code, args.base, args.test) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["wall_s"])
        print(f"| {name} | {best['wall_s']:.2f} | {max(r['rss_mib'] for r in runs):.0f} | {best['rows']} |")
    h = _run(HARNESS)
    print()
    print("| step timing (CPU, 4x MLP 256-1024, batch 64, AdamW) | median ms |")
    print("|---|---|")
    print(f"| hand-written perf_counter loop (peer) | {h['hand_ms']:.2f} |")
    print(f"| run_experiment, fp32 ({h['steps']} timed steps; whole run {h['harness_wall_s']:.1f} s) | {h['harness_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

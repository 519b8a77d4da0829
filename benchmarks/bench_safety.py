"""What the hostile-input guarantees cost on real files (docs/safety.md).

Contenders, each a fresh process (imports included), alternating within each round, median of the rounds:
  snapshot_isolated   workbench.io.load_snapshot on the 1.6M-event H200 snapshot, unpickled in a forked child
                      (the default on Linux)
  snapshot_inprocess  the same with WORKBENCH_SNAPSHOT_ISOLATION=0 (unpickled in the calling process)
  trace               workbench.io.load_trace on the 24-step H200 trace (bounded streaming, CRC checked)
Peak RSS: the largest of the process and its waited-for children (ru_maxrss of RUSAGE_CHILDREN seen
from this benchmark, i.e. the bigger of the loader and its fork).

Usage: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_safety.py [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

SNAP = "/work/shared/data/h200/big_transformer.snapshot.pickle.gz"
TRACE = "/work/shared/data/h200/big_transformer_24steps.trace.json.gz"
CODE = {
    "snapshot_isolated": f"from workbench.io import load_snapshot; s = load_snapshot({SNAP!r}, progress=False); print(len(s.events))",
    "snapshot_inprocess": f"from workbench.io import load_snapshot; s = load_snapshot({SNAP!r}, progress=False); print(len(s.events))",
    "trace": f"from workbench.io import load_trace; t = load_trace({TRACE!r}); print(t.n_events)",
}


def measure(name: str) -> tuple[float, float, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if name == "snapshot_inprocess":
        env["WORKBENCH_SNAPSHOT_ISOLATION"] = "0"
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CODE[name]], stdout=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    out = p.stdout.read().decode().strip()
    assert os.waitstatus_to_exitcode(status) == 0, name
    return wall, ru.ru_maxrss / 1024, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"{platform.node()} {platform.machine()} Python {platform.python_version()} cpus={os.cpu_count()} "
          f"load={os.getloadavg()[0]:.1f} {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    res: dict[str, list] = {k: [] for k in CODE}
    for _ in range(args.runs):
        for k in CODE:
            res[k].append(measure(k))
    for k, rows in res.items():
        walls = [r[0] for r in rows]
        print(f"{k:20} median {statistics.median(walls):6.2f} s  runs {', '.join(f'{w:.2f}' for w in walls)}  "
              f"peak RSS {max(r[1] for r in rows):,.0f} MiB  ({rows[0][2]} events)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Load + summarise a Kineto trace: gpu-workbench vs Holistic Trace Analysis and plain JSON parsing.

Each contender runs in a fresh Python process (so imports and caches do not leak between them), in
turn, ``--runs`` times; the child times only its work (imports excluded, reported separately; wall
and CPU seconds, the CPU ratio being the steadier one on a shared machine) and
reports its own peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which includes the
interpreter and the imported libraries). Medians are printed.

Contenders:
  workbench        workbench.io.load_trace + TraceAnalysis(trace).summary() (= trace_summary: the `workbench trace
                   --json` work: diagnosis, roofline, findings); also reports the load, the step numbers
                   and the diagnosis (step graph + diagnose, after the step numbers it reads) alone, and a
                   second summary() on the same analysis (warm: the analysis keeps what it computed)
  workbench_load   workbench.io.load_trace alone
  workbench_cli    the command itself: workbench.cli.main(["trace", PATH, "--json"]) (its lazy imports
                   included in the work; the printed JSON kept in memory, not written)
  workbench_exe    the same in the process the `workbench` executable makes: console_main's keep_pyarrow_out
                   first (pandas runs without pyarrow for `trace`; see workbench/cli.py)
  hta_parse        hta.common.trace.parse_trace_file (HTA's parser; its analyses come on top)
  gzip_orjson      gzip.decompress + orjson.loads of the file (no DataFrame at all)
  naive_pandas     gzip + orjson.loads + pandas.DataFrame(traceEvents)

Usage:
  .venv/bin/python benchmarks/bench_trace.py [--runs 3] [FILE ...]
  (default files: /work/shared/data/h200/big_transformer_24steps.trace.json.gz and the V100
   ns_resolution trace from HTA's test data, when present)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_FILES = [
    "/work/shared/data/h200/big_transformer_24steps.trace.json.gz",
    "/work/shared/data/hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]

CONTENDERS = {
    "workbench": (
        "from workbench.io import load_trace\nfrom workbench.analysis import TraceAnalysis",
        "_t = time.perf_counter()\nt = load_trace(PATH)\nextra['load_s'] = time.perf_counter() - _t\n"
        "a = TraceAnalysis(t)\n_t = time.perf_counter()\na.numbers\nextra['numbers_s'] = time.perf_counter() - _t\n"
        "_t = time.perf_counter()\na.diagnosis\nextra['diagnosis_s'] = time.perf_counter() - _t\n"
        "s = a.summary(10)\nassert s['gpu']['kernel_count'] >= 0",
    ),
    "workbench_load": (
        "from workbench.io import load_trace",
        "t = load_trace(PATH)",
    ),
    "workbench_cli": (
        "import contextlib, io\nfrom workbench.cli import main",
        "with contextlib.redirect_stdout(io.StringIO()) as _out:\n    rc = main(['trace', PATH, '--json'])\n"
        "assert rc == 0 and _out.getvalue().startswith('{')",
    ),
    "workbench_exe": (
        "import contextlib, io\nfrom workbench.cli import keep_pyarrow_out, main\n"
        "keep_pyarrow_out(['trace', PATH, '--json'])",
        "with contextlib.redirect_stdout(io.StringIO()) as _out:\n    rc = main(['trace', PATH, '--json'])\n"
        "assert rc == 0 and _out.getvalue().startswith('{')",
    ),
    "hta_parse": (
        "import logging\nlogging.disable(logging.WARNING)\nfrom hta.common.trace import parse_trace_file",
        "meta, df, sym = parse_trace_file(PATH)",
    ),
    "gzip_orjson": (
        "import gzip, orjson",
        "d = orjson.loads(gzip.decompress(open(PATH, 'rb').read()))",
    ),
    "naive_pandas": (
        "import gzip, orjson, pandas as pd",
        "d = orjson.loads(gzip.decompress(open(PATH, 'rb').read()))\ndf = pd.DataFrame(d['traceEvents'])",
    ),
}

_CHILD = """
import json, resource, sys, time
PATH = sys.argv[1]
t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
c1 = time.process_time()
extra = {{}}
{work}
t2 = time.perf_counter()
extra["work_cpu_s"] = time.process_time() - c1
if "a" in dir() and hasattr(a, "summary"):  # warm: the same analysis asked again
    a.summary(10)
    extra["warm_s"] = time.perf_counter() - t2
print(json.dumps({{"import_s": t1 - t0, "work_s": t2 - t1,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}}))
"""


def run_child(name: str, path: str) -> dict:
    imports, work = CONTENDERS[name]
    code = _CHILD.format(imports=imports, work=work)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed on {path}:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_wall_s"] = wall
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=list(CONTENDERS), help="run only these contenders")
    ap.add_argument("--json", help="also write the medians to this JSON file")
    args = ap.parse_args(argv)
    files = args.files or [f for f in DEFAULT_FILES if Path(f).exists()]
    names = args.only or list(CONTENDERS)
    try:
        import hta  # noqa: F401
    except ImportError:
        print("note: holistictraceanalysis not installed (pip install 'gpu-workbench[bench]'); skipping hta_parse",
              file=sys.stderr)
        names = [n for n in names if n != "hta_parse"]
    results = {}
    try:
        for path in files:
            size = Path(path).stat().st_size
            print(f"\n{path}  ({size / 2**20:.1f} MiB on disk)", flush=True)
            samples: dict[str, list[dict]] = {n: [] for n in names}
            for r in range(args.runs):  # interleave contenders so machine drift hits them all alike
                for n in names:
                    samples[n].append(run_child(n, path))
                    print(f"  run {r + 1}/{args.runs} {n:<15} {samples[n][-1]['work_s']:.2f} s", file=sys.stderr, flush=True)
            med = {
                n: {k: statistics.median(s[k] for s in v) for k in v[0]} for n, v in samples.items()
            }
            # the workbench run's own ratios, median over runs
            for v in samples.values():
                if "diagnosis_s" in v[0]:
                    med_share = statistics.median(s["diagnosis_s"] / s["load_s"] for s in v)
                    print(f"  workbench: load {statistics.median(s['load_s'] for s in v):.3f} s, step numbers "
                          f"{statistics.median(s['numbers_s'] for s in v):.3f} s, diagnosis (step graph + replays) "
                          f"{statistics.median(s['diagnosis_s'] for s in v):.3f} s ({100 * med_share:.0f}% of the load), "
                          f"summary asked again on the same analysis {statistics.median(s['warm_s'] for s in v) * 1e6:.0f} us")
            results[path] = med
            ref = med.get("hta_parse")
            print(f"{'contender':<16}{'work s':>9}{'work CPU s':>11}{'import s':>10}{'process s':>11}{'peak RSS MiB':>14}"
                  f"{'vs HTA time':>13}{'vs HTA CPU':>12}{'vs HTA RSS':>12}")
            for n, m in med.items():
                rt = f"{ref['work_s'] / m['work_s']:.1f}x faster" if ref and n != "hta_parse" else ""
                rc = f"{ref['work_cpu_s'] / m['work_cpu_s']:.1f}x" if ref and n != "hta_parse" else ""
                rr = f"{m['peak_rss_mib'] / ref['peak_rss_mib']:.2f}" if ref and n != "hta_parse" else ""
                print(f"{n:<16}{m['work_s']:>9.2f}{m['work_cpu_s']:>11.2f}{m['import_s']:>10.2f}{m['process_wall_s']:>11.2f}"
                      f"{m['peak_rss_mib']:>14.0f}{rt:>13}{rc:>12}{rr:>12}")
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

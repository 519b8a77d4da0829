"""The cross-rank view against Holistic Trace Analysis: many ranks, one big trace cold, a cached reload.

Run from the repository root (about 3 minutes on 2 cores; HTA is the `bench` extra)::

    OMP_NUM_THREADS=1 python benchmarks/bench_ranks.py [--ranks 8 16 32 64] [--runs 3]

1. **Many ranks.** ``--ranks`` sets of real rank traces: HTA's own two-rank NCCL test traces
   (``tests/data/multi_rank/sampled_rank-{0,1}``, 4,855 / 4,720 events) copied alternately with
   ``distributedInfo.rank`` / ``world_size`` rewritten. Contenders, each in a fresh process on the same
   folder: ``workbench`` = ``load_ranks(folder, cache=False)`` + ``ranks_summary`` (per-rank reduction in a
   local process pool, matching, straggler, findings); ``hta`` = ``TraceAnalysis(trace_dir=folder)`` (its
   multi-rank parser, also a process pool) + ``get_temporal_breakdown()`` + ``get_comm_comp_overlap()``.
2. **One trace, cold.** The V100 trace (HTA test data ``ns_resolution_trace``, shipped as
   ``v100_nccl_rank0``; the 51 MB held-out V100 trace named in the team's targets is not on this machine):
   ``load_trace`` + ``trace_summary``, ``load_trace`` + ``rank_frame`` (what a ranks worker does) and HTA's
   ``parse_trace_file``, each in a fresh process.
3. **Warm.** ``io.rank_loading.load_rank_frame(path, RankFrame)`` on the same trace with its Parquet
   cache present (in-process, after imports), and the whole ``workbench ranks TRACE --json`` command
   with a warm cache.

Time: wall seconds in the child after its imports (``work_s``) and its imports (``import_s``). Memory:
the peak of the summed RSS of the child and all its worker processes, sampled every 20 ms by this script
(psutil), since both tools load ranks in worker processes. Results: printed as Markdown, and written to
``benchmarks/results/ranks_cpu.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
SRC = [ROOT / "tests" / "data" / "multi_rank" / f"sampled_rank-{i}.json.gz" for i in (0, 1)]
V100 = ROOT / "workbench" / "samples" / "v100_nccl_rank0.trace.json.gz"

PRELUDE = """import time, json, sys, logging
logging.disable(logging.WARNING)
t0 = time.perf_counter()
"""
MULTI = {
    "workbench": ("from workbench.analysis.trace.ranks import load_ranks, ranks_summary",
                  "doc = ranks_summary(load_ranks(PATH, cache=False)); assert len(doc['ranks']) == N"),
    "hta": ("from hta.trace_analysis import TraceAnalysis",
            "a = TraceAnalysis(trace_dir=PATH); a.get_temporal_breakdown(visualize=False); "
            "a.get_comm_comp_overlap(visualize=False); assert len(a.t.traces) == N"),
}
SINGLE = {
    "workbench load + trace_summary": ("from workbench.io import load_trace\nfrom workbench.analysis import trace_summary",
                                       "trace_summary(load_trace(PATH))"),
    "workbench load + rank_frame": ("from workbench.io import load_trace\nfrom workbench.analysis.trace.ranks import rank_frame",
                                    "rank_frame(load_trace(PATH))"),
    "hta parse_trace_file": ("from hta.common.trace import parse_trace_file", "parse_trace_file(PATH)"),
}


def _child_code(imports: str, work: str, path: str, n: int) -> str:
    return (PRELUDE + imports + "\nt1 = time.perf_counter()\n"
            + f"PATH = {path!r}\nN = {n}\n" + work + "\n"
            + "t2 = time.perf_counter()\nprint(json.dumps({'import_s': t1 - t0, 'work_s': t2 - t1}))\n")


def _run(code: str, env: dict) -> dict:
    """Run a child; sample the summed RSS of it and its descendants."""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        try:
            proc = psutil.Process(p.pid)
        except psutil.NoSuchProcess:
            return
        while not stop.is_set():
            try:
                total = proc.memory_info().rss
                for c in proc.children(recursive=True):
                    try:
                        total += c.memory_info().rss
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                break
            peak = max(peak, total)
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = p.communicate(timeout=1800)
    stop.set()
    th.join()
    if p.returncode != 0:
        raise SystemExit(f"child failed ({p.returncode}):\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_mib"] = peak / 2**20
    return res


def make_ranks(n: int, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for src in SRC:
        with gzip.open(src, "rt") as f:
            docs.append(json.load(f))
    for r in range(n):
        doc = docs[r % 2]
        dist = dict(doc.get("distributedInfo") or {})
        dist.update(rank=r, world_size=n)
        doc = dict(doc, distributedInfo=dist)
        with gzip.open(folder / f"rank-{r}.json.gz", "wt", compresslevel=1) as f:
            json.dump(doc, f)
    return folder


def _median(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--runs", type=int, default=1, help="runs per multi-rank contender (median)")
    ap.add_argument("--single-runs", type=int, default=3, help="runs per single-trace contender (median)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ranks_cpu.json"))
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    results: dict = {
        "machine": f"{platform.node() and 'this VM'}: {os.cpu_count()} CPUs, "
                   f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}",
        "date": _dt.date.today().isoformat(), "multi": {}, "single": {}, "warm": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in args.ranks:
            folder = make_ranks(n, tmp / f"r{n}")
            results["multi"][n] = {}
            for name, (imp, work) in MULTI.items():
                rows = []
                for _ in range(args.runs):
                    rows.append(_run(_child_code(imp, work, str(folder), n), env))
                results["multi"][n][name] = _median(rows)
                m = results["multi"][n][name]
                print(f"{n:>3} ranks {name:<10} work {m['work_s']:7.2f} s  import {m['import_s']:.2f} s  "
                      f"peak {m['peak_mib']:7.0f} MiB", flush=True)
        for name, (imp, work) in SINGLE.items():
            rows = [_run(_child_code(imp, work, str(V100), 1), env) for _ in range(args.single_runs)]
            results["single"][name] = _median(rows)
            m = results["single"][name]
            print(f"V100 {name:<32} work {m['work_s']:6.2f} s  import {m['import_s']:.2f} s  "
                  f"peak {m['peak_mib']:6.0f} MiB", flush=True)
        cache = tmp / "cache"
        warm_code = (PRELUDE + "from workbench.analysis.trace.ranks import RankFrame\n"
                     "from workbench.io.rank_loading import load_rank_frame\n"
                     f"load_rank_frame({str(V100)!r}, RankFrame, cache_dir={str(cache)!r})\n"  # cold: writes it
                     "ts = []\nfor _ in range(7):\n    a = time.perf_counter()\n"
                     f"    f = load_rank_frame({str(V100)!r}, RankFrame, cache_dir={str(cache)!r})\n"
                     "    ts.append(time.perf_counter() - a)\n"
                     "ts.sort(); print(json.dumps({'warm_s': ts[len(ts) // 2], 'min_s': ts[0]}))\n")
        r = subprocess.run([sys.executable, "-c", warm_code], capture_output=True, text=True, env=env, cwd=ROOT)
        if r.returncode:
            raise SystemExit(r.stderr[-2000:])
        warm = json.loads(r.stdout.strip().splitlines()[-1])
        results["warm"]["load_rank_frame (cache hit, in process)"] = warm
        cli = []
        for _ in range(3):
            a = time.perf_counter()
            subprocess.run([sys.executable, "-m", "workbench", "ranks", str(V100), "--json", "--cache-dir", str(cache)],
                           capture_output=True, env=env, cwd=ROOT, check=True)
            cli.append(time.perf_counter() - a)
        results["warm"]["workbench ranks --json (warm cache, whole command)"] = {"wall_s": statistics.median(cli)}
        print("warm:", json.dumps(results["warm"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    # markdown
    print("\n| ranks | workbench work s | HTA work s | speed-up | workbench peak MiB | HTA peak MiB | memory ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, row in results["multi"].items():
        w, h = row["workbench"], row["hta"]
        print(f"| {n} | {w['work_s']:.2f} | {h['work_s']:.2f} | {h['work_s'] / w['work_s']:.1f}x | "
              f"{w['peak_mib']:.0f} | {h['peak_mib']:.0f} | {w['peak_mib'] / h['peak_mib']:.2f} |")
    ref = results["single"]["hta parse_trace_file"]
    print("\n| V100, cold process | work s | import s | work + import s | peak MiB | vs HTA (work + import) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in results["single"].items():
        tot, rtot = m["work_s"] + m["import_s"], ref["work_s"] + ref["import_s"]
        print(f"| {name} | {m['work_s']:.2f} | {m['import_s']:.2f} | {tot:.2f} | {m['peak_mib']:.0f} | "
              f"{rtot / tot:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Summarise a large allocator snapshot: gpu-workbench vs torch's own ``_memory_viz`` and plain unpickling.

Target (docs/architecture.md, "Speed targets"): the whole ``workbench memory --json`` summary within 2x the time of unpickling the
file, and under 4 GB of RAM, on the 1.6M-event H200 snapshot.

Each contender runs as its own command in a fresh process, one after another; wall time is measured
around the process (imports included: it is what a user waits for) and peak RSS is the child's own
``ru_maxrss`` from ``os.wait4``. torch's ``_memory_viz`` reads only an uncompressed pickle, so the file
is decompressed once to a temporary file first (not timed) and every contender reads that same
uncompressed file; the gzip file is measured too for the tools that read it.

Contenders:
  unpickle              pickle.load of the file (what torch's _memory_viz and most scripts do first)
  unpickle_nogc         the same with the cyclic garbage collector paused (the fastest plain unpickle)
  workbench_summary     `workbench memory FILE --json` (safe load, columns, lifetimes, categories, peak, state)
  workbench_load        workbench.io.snapshot.load_snapshot alone
  torch_stats           python -m torch.cuda._memory_viz stats FILE   (segment summary only)
  torch_trace           python -m torch.cuda._memory_viz trace FILE   (one text line per event)
  torch_trace_plot      python -m torch.cuda._memory_viz trace_plot FILE -o out.html  (the HTML viewer's data)

Usage:
  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_memory.py [FILE] [--timeout 600] [--skip NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = "/work/shared/data/h200/big_transformer.snapshot.pickle.gz"
PY = sys.executable


def _measure(cmd: list[str], timeout: float, stdout=subprocess.DEVNULL) -> dict:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = t0 + timeout
    status, ru = None, None
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            _, status, ru = os.wait4(p.pid, 0)
            return {"wall_s": None, "rss_mib": ru.ru_maxrss / 1024, "rc": "timeout"}
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "rss_mib": ru.ru_maxrss / 1024, "rc": rc, "stderr": err[-300:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default=DEFAULT)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--runs", type=int, default=1, help="rounds; contenders alternate within a round, medians shown")
    ap.add_argument("--once", nargs="*", default=["torch_trace_plot"], help="contenders run in the first round only")
    args = ap.parse_args(argv)
    src = Path(args.file)
    if not src.is_file():
        print(f"{src}: not found (the benchmark needs the big H200 snapshot from /work/shared/data/h200)",
              file=sys.stderr)
        return 2
    tmpdir = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    try:
        raw = tmpdir / "snapshot.pickle"
        print(f"decompressing {src} -> {raw} (not timed) ...", file=sys.stderr)
        with gzip.open(src, "rb") as f, open(raw, "wb") as out:
            shutil.copyfileobj(f, out, 16 << 20)
        html = tmpdir / "out.html"
        load_code = ("import pickle,sys\nwith open(sys.argv[1],'rb') as f: d=pickle.load(f)\n"
                     "print(len(d['device_traces'][0]))")
        gz_load = ("import pickle,gzip,sys\nwith gzip.open(sys.argv[1],'rb') as f: d=pickle.load(f)\n")
        wb = [PY, "-m", "workbench", "memory", "--json"]
        cases = [
            ("unpickle", [PY, "-c", load_code, str(raw)]),
            ("unpickle_gz", [PY, "-c", gz_load, str(src)]),
            # the fastest plain unpickle: the cyclic GC paused, as workbench does while loading
            ("unpickle_nogc", [PY, "-c", "import gc\ngc.disable()\n" + load_code, str(raw)]),
            ("workbench_summary", wb + [str(raw)]),
            ("workbench_summary_gz", wb + [str(src)]),
            ("workbench_load", [PY, "-c", "import sys\nfrom workbench.io.snapshot import load_snapshot\n"
                                          "s=load_snapshot(sys.argv[1])\nprint(len(s.events))", str(raw)]),
            ("torch_stats", [PY, "-m", "torch.cuda._memory_viz", "stats", str(raw)]),
            ("torch_trace", [PY, "-m", "torch.cuda._memory_viz", "trace", str(raw)]),
            ("torch_trace_plot", [PY, "-m", "torch.cuda._memory_viz", "trace_plot", str(raw), "-o", str(html)]),
        ]
        print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"python {platform.python_version()}; file {src} ({src.stat().st_size / 2**20:.1f} MiB gz, "
              f"{raw.stat().st_size / 2**20:.1f} MiB raw)")
        cases = [(n, c) for n, c in cases if n not in args.skip]
        runs: dict[str, list] = {n: [] for n, _ in cases}
        for k in range(args.runs):  # round-robin, so a busy moment of the machine hits every contender
            for name, cmd in cases:
                if k and name in args.once:
                    continue
                print(f"round {k + 1}/{args.runs}: {name} ...", file=sys.stderr, flush=True)
                r = _measure(cmd, args.timeout)
                runs[name].append(r)
                if r["rc"] not in (0, "timeout"):
                    print(f"  stderr: {r.get('stderr', '')}", file=sys.stderr)
        print(f"load average at the end: {os.getloadavg()[0]:.1f} (1 min)")
        print("| contender | wall s (median) | wall s (each run) | peak RSS MiB | rc |")
        print("|---|---:|---|---:|---|")
        results = {}
        for name, _ in cases:
            rs = runs[name]
            walls = [r["wall_s"] for r in rs if r["wall_s"] is not None]
            med = statistics.median(walls) if walls else None
            results[name] = {"wall_s": med, "rss_mib": max(r["rss_mib"] for r in rs)}
            each = ", ".join("timeout" if r["wall_s"] is None else f"{r['wall_s']:.1f}" for r in rs)
            wall = "timeout" if med is None else f"{med:.1f}"
            print(f"| {name} | {wall} | {each} | {results[name]['rss_mib']:,.0f} | {rs[-1]['rc']} |", flush=True)
        u, w = results.get("unpickle"), results.get("workbench_summary")
        if u and w and u["wall_s"] and w["wall_s"]:
            print(f"\nworkbench summary / unpickle: {w['wall_s'] / u['wall_s']:.2f}x time; "
                  f"peak RSS {w['rss_mib'] / 1024:.2f} GiB (target: <= 2x, < 4 GB)")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the timeline shows of a big trace, and what picking it costs: the 24-step H200 trace of the
shared data (273,782 events, 12,384 kernels) by default.

    python benchmarks/bench_timeline.py [TRACE]

Prints, for the whole trace and for one step's window: events in the window, kernels in it, kernels the
old longest-first cut (20,000 longest events) kept, kernels trace_window keeps, and the time
trace_window, timeline_figure and the Perfetto export take (median of 3).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from workbench.analysis import step_summary
from workbench.analysis.windows import flow_pairs, trace_window
from workbench.figures.trace import timeline_figure
from workbench.io import load_trace
from workbench.io.chrome_trace import write_chrome_trace

DEFAULT = "/work/shared/data/h200/big_transformer_24steps.trace.json.gz"


def _median(fn, n=3):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _longest_first_kernels(ev, lo, hi, budget=20_000):
    keep = (ev["cat"].astype(str) != "Trace").to_numpy().copy()
    ts = ev["ts_us"].to_numpy(float)
    dur = np.nan_to_num(ev["dur_us"].to_numpy(float))
    if lo is not None:
        keep &= (ts + dur >= lo) & (ts <= hi)
    idx = np.flatnonzero(keep)
    if len(idx) > budget:
        idx = idx[np.argpartition(-dur[idx], budget - 1)[:budget]]
    return int((ev["cat"].astype(str).to_numpy()[idx] == "kernel").sum())


def main(path: str = DEFAULT) -> None:
    tr = load_trace(path)
    ev = tr.events
    steps = step_summary(tr)
    windows = [("whole trace", None, None)]
    if len(steps):
        r = steps.iloc[len(steps) // 2]
        windows.append((f"step {int(r['step'])}", float(r["start_us"]), float(r["start_us"] + r["dur_us"])))
    print(f"{Path(path).name}: {len(ev):,} events, {int((ev['cat'].astype(str) == 'kernel').sum()):,} kernels")
    for label, lo, hi in windows:
        t_win, w = _median(lambda: trace_window(tr, lo, hi))
        t_fig, _ = _median(lambda: timeline_figure(tr, lo, hi))
        k_in = int((w.events["cat"].astype(str) == "kernel").sum())
        old = _longest_first_kernels(ev, lo, hi)
        full = trace_window(tr, lo, hi, max_events=10**12)
        with tempfile.TemporaryDirectory() as d:
            t_exp, out = _median(lambda: write_chrome_trace(full.events, Path(d) / "w.json", metadata=tr.metadata,
                                                            flows=flow_pairs(full.events)), n=1)
            size = out.stat().st_size
        print(f"{label}: {w.n_window:,} events in view, {w.n_gpu_window:,} GPU events; kernels shown: "
              f"longest-first {old:,}, trace_window {k_in:,}; trace_window {t_win * 1e3:.0f} ms, "
              f"timeline_figure {t_fig * 1e3:.0f} ms; Perfetto export of {len(full.events):,} events "
              f"{t_exp:.2f} s, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:])

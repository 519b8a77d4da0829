"""What a background thread waking 10 times a second costs a pure-Python notebook cell (the GIL hand-over),
by what the thread does: nothing, a little Python, the NVML/replay sampler, sampler + live panel.

    python benchmarks/gil_cost.py [--mode nvml|replay] [--rounds 5]

Each line: the median over paired rounds of (cell time with the thread) / (cell time without) - 1, for a
pure-Python cell of about one second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nvml import _make_sampler, _workload  # noqa: E402


def slowdown(start, stop, n: int, rounds: int) -> tuple[float, float]:
    ratios = []
    for _ in range(rounds):
        a = _workload(n)
        start()
        time.sleep(0.3)
        b = _workload(n)
        stop()
        ratios.append(b / a - 1)
    return 100 * statistics.median(ratios), 100 * min(ratios)


def ticker(hz: float, work_iters: int):
    stop = threading.Event()

    def run():
        while not stop.wait(1.0 / hz):
            x = 0
            for i in range(work_iters):
                x += i

    def start():
        stop.clear()
        threading.Thread(target=run, daemon=True).start()

    return start, stop.set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="replay", choices=["nvml", "replay"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--switch", type=float, default=None, help="sys.setswitchinterval for the run")
    args = ap.parse_args()
    if args.switch:
        sys.setswitchinterval(args.switch)
    n = int(1_000_000 / _workload(1_000_000))
    print(f"cell ~{_workload(n):.2f} s; switch interval {sys.getswitchinterval() * 1e3:.1f} ms", flush=True)
    for label, hz, iters in [("thread, 10 Hz, no work", 10, 0), ("thread, 10 Hz, ~0.1 ms Python", 10, 2000),
                             ("thread, 10 Hz, ~1.5 ms Python", 10, 30000), ("thread, 100 Hz, no work", 100, 0)]:
        med, lo = slowdown(*ticker(hz, iters), n, args.rounds)
        print(f"{label:40s} median {med:5.1f}%  min {lo:5.1f}%", flush=True)
    from workbench.panels.nvml import LiveGpuPanel

    import workbench.capture.sampler as nvml_mod  # _pause and its slice live with the thread plumbing

    slice_now = nvml_mod._PAUSE_SLICE_S
    for hz, slice_s in ((10, slice_now), (10, 0.05), (100, slice_now)):
        nvml_mod._PAUSE_SLICE_S = slice_s
        s = _make_sampler(args.mode, hz, 1)
        med, lo = slowdown(s.start, s.stop, n, args.rounds)
        label = f"{args.mode} sampler {hz} Hz, sleeps <= {slice_s * 1e3:.0f} ms"
        print(f"{label:40s} median {med:5.1f}%  min {lo:5.1f}%", flush=True)
    nvml_mod._PAUSE_SLICE_S = slice_now
    for refresh in (0.2, 0.1):
        s = _make_sampler(args.mode, 10, 1)
        p = LiveGpuPanel(s, window_s=60, refresh_s=refresh)
        p.pause()
        s.stop()
        med, lo = slowdown(lambda: (s.start(), p.resume()), lambda: (p.pause(), s.stop()), n, args.rounds)
        label = f"{args.mode} sampler 10 Hz + panel every {refresh} s"
        print(f"{label:40s} median {med:5.1f}%  min {lo:5.1f}%", flush=True)
        p.close()


if __name__ == "__main__":
    main()

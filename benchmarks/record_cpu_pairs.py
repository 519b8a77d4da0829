"""Record CPU before/after pairs for the CPU-only diagnosis: a small training step whose Dataset is slow
(sleep-dominated, like reading files), with ``DataLoader(num_workers=0)`` and ``num_workers=N``.

For each variant it writes a profiled trace (light detail: CPU activities, no shapes/stacks, a few steps,
gzipped) and times the same step without the profiler (``time.perf_counter`` around each step, median over
``--timed`` steps). ``truth.json`` holds the measured times; ``tests/test_cpu_diagnosis.py`` checks that the
diagnosis of the ``workers0`` trace predicts the ``workers<N>`` step (the input what-if) and the unprofiled
step (the profiler what-if) within 25%.

    OMP_NUM_THREADS=1 python benchmarks/record_cpu_pairs.py --out tests/data/cpu_pairs

Run on a 2-core machine: a sleep-dominated Dataset keeps the effect of more workers robust to load.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, schedule  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

SAMPLE_SLEEP_S = 0.0015  # per sample: 16 samples a batch -> ~24 ms of "I/O" a step on the main process
BATCH = 16


class SlowDataset(Dataset):
    """Each sample costs a sleep (I/O-like) and a little tensor work."""

    def __init__(self, n: int = 100_000):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(SAMPLE_SLEEP_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def make_step(workers: int):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=BATCH, num_workers=workers,
                        persistent_workers=workers > 0, prefetch_factor=4 if workers else None)
    it = iter(loader)

    def step():
        x, y = next(it)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def timed(step, n: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        step()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def profiled(step, path: Path, steps: int) -> None:
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=10, warmup=1, active=steps, repeat=1),
                 record_shapes=False, with_stack=False, profile_memory=False) as prof:
        for _ in range(11 + steps):  # 10 steps without recording: workers drain what they prefetched meanwhile
            step()
            prof.step()
    raw = path.with_suffix("")  # .json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/data/cpu_pairs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per trace")
    ap.add_argument("--timed", type=int, default=30, help="steps timed without the profiler")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    truth = {"about": __doc__.split("\n\n")[0], "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
             "torch": torch.__version__, "sample_sleep_s": SAMPLE_SLEEP_S, "batch": BATCH, "variants": {}}
    for name, workers in (("workers0", 0), (f"workers{args.workers}", args.workers)):
        step = make_step(workers)
        ms = timed(step, args.timed)
        trace = out / f"{name}.light.trace.json.gz"
        profiled(step, trace, args.steps)
        ms_after = timed(step, args.timed, warmup=2)
        allms = ms + ms_after
        truth["variants"][name] = {"num_workers": workers, "trace": trace.name,
                                   "unprofiled_step_ms_median": statistics.median(allms),
                                   "unprofiled_step_ms": [round(x, 3) for x in allms]}
        print(f"{name}: unprofiled median {statistics.median(allms):.2f} ms "
              f"(before {statistics.median(ms):.2f}, after {statistics.median(ms_after):.2f}); trace {trace}")
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Record a flight recorder's folder on a CPU, for lesson 19 (long runs): a small training loop under
``watch(...)`` whose data slows down at a known step, with a CAPTURE file and a SIGUSR2 on the way.

The loop: an MLP (64 -> 256 -> 256 -> 10, AdamW) fed by ``DataLoader(num_workers=0)`` in order from a
Dataset whose every sample waits ``--fast-ms`` (like reading it from local storage), and from the sample of
step ``--slow-from`` on waits ``--slow-ms`` instead (the run reached a shard on slow storage; the slowdown
lasts to the end). On the way, at the end of step ``--file-at`` the script writes ``DIR/CAPTURE`` with a
note, and at the end of step ``--signal-at`` it sends itself SIGUSR2 (both as an operator would, between two
steps). The recorder: ``watch(DIR, capture_steps=3, slow_factor=3.0, warmup=20, poll_s=0)``, the rest its
defaults. It takes a ``baseline`` capture after the warm-up, a ``file`` and a ``signal`` capture, and a
``slow`` capture of the steps after the first slow one.

Besides what ``watch`` writes (``index.jsonl`` and the captures' traces), the script writes
``recording.json`` into the folder: what it injected (the steps above, the waits), the unprofiled step
times the recorder kept (``w.recent_steps()``, every unprofiled step of the run), the environment. Nothing
in the folder names a local path (checked before it finishes).

    OMP_NUM_THREADS=1 python benchmarks/record_watch_cpu.py --out workbench/samples/watch/cpu_slow_data
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from workbench.capture.watch import watch  # noqa: E402

BATCH = 16


class ShardedDataset(Dataset):
    """Samples read from storage: ``fast_ms`` each, ``slow_ms`` from sample ``slow_from_sample`` on."""

    def __init__(self, fast_ms: float, slow_ms: float, slow_from_sample: int, n: int = 1_000_000):
        self.fast_s, self.slow_s, self.slow_from, self.n = fast_ms / 1e3, slow_ms / 1e3, slow_from_sample, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.slow_s if i >= self.slow_from else self.fast_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def record(out: Path, steps: int, slow_from: int, file_at: int, signal_at: int, fast_ms: float, slow_ms: float) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(ShardedDataset(fast_ms, slow_ms, slow_from * BATCH), batch_size=BATCH, shuffle=False,
                        num_workers=0)
    options = dict(capture_steps=3, slow_factor=3.0, warmup=20, poll_s=0)
    w = watch(out, **options)
    it = iter(loader)
    for i in range(steps):
        with w.step():
            x, y = next(it)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if i == file_at:
            (out / "CAPTURE").write_text(f"operator: loss looked noisy around step {i}")
        if i == signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
    unprofiled = [[s, round(ms, 4)] for s, ms in w.recent_steps()]
    w.close()
    if w.problems:
        raise SystemExit("the recorder said: " + "; ".join(w.problems))
    return {
        "what": "lesson 19: a training loop under watch() whose data slows down at a known step",
        "recorded_by": "benchmarks/record_watch_cpu.py",
        "watch_options": options,
        "injected": {"steps": steps, "slow_from_step": slow_from, "batch": BATCH, "sample_fast_ms": fast_ms,
                     "sample_slow_ms": slow_ms, "capture_file_after_step": file_at, "sigusr2_after_step": signal_at},
        "model": "MLP 64-256-256-10, AdamW lr 1e-3, DataLoader(num_workers=0, shuffle=False)",
        "unprofiled_steps": unprofiled,
        "env": {"machine": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
                "python": platform.python_version(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
    }


def check_no_local_paths(out: Path) -> None:
    import gzip

    here = str(Path.cwd())
    home = os.path.expanduser("~")
    for p in out.iterdir():
        raw = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
        text = raw.decode("utf-8", "replace")
        for bad in {here, home, str(out.resolve()), "/tmp/"} - {"/"}:
            if bad and bad in text:
                raise SystemExit(f"{p.name} names a local path ({bad}); not written")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="the folder to write (replaced)")
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--slow-from", type=int, default=90)
    ap.add_argument("--file-at", type=int, default=40)
    ap.add_argument("--signal-at", type=int, default=60)
    ap.add_argument("--fast-ms", type=float, default=0.05)
    ap.add_argument("--slow-ms", type=float, default=1.5)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    rec = record(args.out, args.steps, args.slow_from, args.file_at, args.signal_at, args.fast_ms, args.slow_ms)
    (args.out / "recording.json").write_text(json.dumps(rec, indent=1) + "\n")
    check_no_local_paths(args.out)
    for line in (args.out / "index.jsonl").read_text().splitlines():
        c = json.loads(line)
        print(f"{c['reason']:<9} steps {c['first_step']}-{c['first_step'] + c['steps'] - 1}  trigger {c['trigger_step']}"
              f"  {c['trace']}")
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"{args.out}: {total:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

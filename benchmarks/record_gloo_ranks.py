"""Record real multi-process torch.distributed (gloo, CPU) DDP runs as test data for ``workbench ranks``.

Run from the repository root on any CPU machine (about 30 s; 4 processes, one thread each)::

    python benchmarks/record_gloo_ranks.py

It writes ``tests/data/ranks/<scenario>/rank<N>.pt.trace.json.gz`` (one Kineto trace per rank, CPU
activities only, no shapes, no stacks) and ``tests/data/ranks/<scenario>/truth.json`` for three
scenarios of the same DDP training loop (a 4-layer MLP, batch 32, SGD, ``--world`` processes):

- ``healthy``: every rank does the same work;
- ``straggler``: rank ``--straggler-rank`` sleeps ``--delay-ms`` before every forward pass, so the
  others wait for it in DDP's gradient all-reduce;
- ``slow_collective``: every rank does the same work, then all-reduces an extra large buffer
  (``--big-elems`` float32s) each step: a collective that is slow for everyone, with no one late.

truth.json holds what was injected and what was measured outside the profiler: per rank the wall time
of every profiled step (``time.perf_counter`` around the step), the sleep actually slept by the
straggler, the world size, torch version and date. Local paths are stripped from the traces
(``traceName`` becomes the file name); nothing else is changed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "ranks"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, scenario: str, args, tmp: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 256, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    big = torch.ones(args.big_elems) if scenario == "slow_collective" else None
    straggles = scenario == "straggler" and rank == args.straggler_rank
    slept: list[float] = []

    def step():
        if straggles:
            t0 = time.perf_counter()
            time.sleep(args.delay_ms / 1e3)
            slept.append((time.perf_counter() - t0) * 1e3)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        if big is not None:
            dist.all_reduce(big)

    for _ in range(3):  # warm-up outside the profiler (DDP builds its buckets on the first steps)
        step()
    dist.barrier()
    from torch.profiler import ProfilerActivity, profile, schedule

    times = []
    sched = schedule(wait=0, warmup=1, active=args.steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(1 + args.steps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
            prof.step()
    raw = Path(tmp) / f"rank{rank}.json"
    prof.export_chrome_trace(str(raw))
    dist.barrier()
    dist.destroy_process_group()
    with open(Path(tmp) / f"rank{rank}.times.json", "w") as f:
        json.dump({"step_ms": times[1:], "slept_ms": slept[-args.steps:] if slept else []}, f)


def _strip(doc: dict, name: str) -> dict:
    doc["traceName"] = name
    return doc


def record(scenario: str, args) -> None:
    import torch
    import torch.multiprocessing as mp

    out = OUT / scenario
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        mp.spawn(_worker, args=(args.world, port, scenario, args, tmp), nprocs=args.world, join=True)
        ranks = {}
        for r in range(args.world):
            name = f"rank{r}.pt.trace.json.gz"
            doc = json.loads((Path(tmp) / f"rank{r}.json").read_text())
            doc = _strip(doc, name)
            text = json.dumps(doc, separators=(",", ":"))
            if tmp in text or str(ROOT) in text or os.path.expanduser("~") + "/" in text:
                raise SystemExit(f"{scenario} rank {r}: a local path is still in the trace")
            with gzip.open(out / name, "wt", compresslevel=9) as f:
                f.write(text)
            ranks[str(r)] = json.loads((Path(tmp) / f"rank{r}.times.json").read_text())
    truth = {
        "scenario": scenario,
        "world_size": args.world,
        "backend": "gloo",
        "steps": args.steps,
        "straggler_rank": args.straggler_rank if scenario == "straggler" else None,
        "injected_delay_ms": args.delay_ms if scenario == "straggler" else 0.0,
        "extra_all_reduce_elems": args.big_elems if scenario == "slow_collective" else 0,
        "measured": ranks,
        "torch": torch.__version__,
        "date": _dt.date.today().isoformat(),
        "recorded_with": "benchmarks/record_gloo_ranks.py",
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    sizes = sum(p.stat().st_size for p in out.glob("*.gz"))
    print(f"{scenario}: {args.world} ranks, {sizes / 1024:.0f} KiB of traces")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--delay-ms", type=float, default=30.0)
    ap.add_argument("--straggler-rank", type=int, default=2)
    ap.add_argument("--big-elems", type=int, default=4_000_000)
    ap.add_argument("--only", choices=["healthy", "straggler", "slow_collective"], action="append")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for scenario in args.only or ["healthy", "straggler", "slow_collective"]:
        record(scenario, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

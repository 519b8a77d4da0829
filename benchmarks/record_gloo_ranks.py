"""Record real multi-process torch.distributed (gloo, CPU) DDP runs as test data for ``workbench ranks``.

Run from the repository root on any CPU machine (about 30 s; 4 processes, one thread each)::

    python benchmarks/record_gloo_ranks.py [--out DIR]

It writes ``DIR/<scenario>/rank<N>.pt.trace.json.gz`` (default DIR: ``workbench/samples/ranks``; one Kineto trace
per rank, CPU activities only, no shapes, no stacks) and ``DIR/<scenario>/truth.json`` for three
scenarios of the same DDP training loop (a 4-layer MLP, batch 32, SGD, ``--world`` processes):

- ``healthy``: every rank does the same work;
- ``straggler``: rank ``--straggler-rank`` sleeps ``--delay-ms`` before every forward pass, so the
  others wait for it in DDP's gradient all-reduce;
- ``slow_collective``: every rank does the same work, then all-reduces an extra large buffer
  (``--big-elems`` float32s) each step: a collective that is slow for everyone, with no one late.

The ranks are run by ``workbench.capture.gloo.run_gloo_ddp`` (the same code notebook 14 runs live).
truth.json holds what was injected and what was measured outside the profiler: per rank the wall time
of every profiled step, the sleep actually slept by the straggler, the world size, torch version and
date. Local paths are checked to be absent from the traces (``traceName`` is the file name).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "workbench" / "samples" / "ranks"
sys.path.insert(0, str(ROOT))


def record(scenario: str, args) -> None:
    import torch

    from workbench.capture.gloo import GlooSpec, run_gloo_ddp

    out = Path(args.out) / scenario
    out.mkdir(parents=True, exist_ok=True)
    spec = GlooSpec(
        world=args.world, steps=args.steps,
        straggler_rank=args.straggler_rank if scenario == "straggler" else None, delay_ms=args.delay_ms,
        big_elems=args.big_elems if scenario == "slow_collective" else 0,
    )
    with tempfile.TemporaryDirectory() as tmp:
        run = run_gloo_ddp(tmp, spec)
        for r, src in enumerate(run.traces):
            name = f"rank{r}.pt.trace.json.gz"
            with gzip.open(src, "rt") as f:
                doc = json.load(f)
            doc["traceName"] = name
            text = json.dumps(doc, separators=(",", ":"))
            if tmp in text or str(ROOT) in text or os.path.expanduser("~") + "/" in text:
                raise SystemExit(f"{scenario} rank {r}: a local path is still in the trace")
            with gzip.open(out / name, "wt", compresslevel=9) as f:
                f.write(text)
    ranks = {str(r): {"step_ms": m["step_ms"], "slept_ms": m["slept_ms"]} for r, m in run.measured.items()}
    truth = {
        "scenario": scenario,
        "world_size": args.world,
        "backend": "gloo",
        "steps": args.steps,
        "straggler_rank": spec.straggler_rank,
        "injected_delay_ms": args.delay_ms if scenario == "straggler" else 0.0,
        "extra_all_reduce_elems": spec.big_elems,
        "measured": ranks,
        "torch": torch.__version__,
        "date": _dt.date.today().isoformat(),
        "recorded_with": "benchmarks/record_gloo_ranks.py",
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    sizes = sum(p.stat().st_size for p in out.glob("*.gz"))
    print(f"{scenario}: {args.world} ranks, {sizes / 1024:.0f} KiB of traces, {run.wall_s:.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(OUT), help="where the scenario folders go (default: workbench/samples/ranks)")
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

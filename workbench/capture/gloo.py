"""Real multi-process torch.distributed runs on a CPU (gloo): DDP training in N processes, profiled per rank.

    from workbench.capture.gloo import run_gloo_ddp
    run = run_gloo_ddp(world=2, straggler_rank=1, delay_ms=30, micro_batches=4, timeout_s=1.5)
    run.traces            # one Kineto trace per rank of the profiled steps -> workbench.load_ranks(run.traces)
    run.accumulation      # {"sync": traces, "no_sync": traces}: one optimizer step of k micro-batches each
    run.timeout           # what rank 0 got from a collective the other ranks never joined

Each rank is a process started with the ``spawn`` method (so it works from a Jupyter kernel: the rank's
function lives here, importable), joins one gloo process group on a free loopback port and trains the
same small MLP under ``DistributedDataParallel`` (batch 32, SGD, one CPU thread per rank). Then, in that
one process group:

1. ``steps`` training steps profiled with :func:`workbench.capture.profile_steps` (``detail="light"``,
   one profiler warm-up step), after ``warmup_steps`` unprofiled ones (DDP builds its buckets on the
   first steps). ``straggler_rank`` sleeps ``delay_ms`` before every forward pass; ``big_elems > 0``
   adds an all-reduce of that many float32s to every step (a collective slow for everyone).
2. ``micro_batches = k > 0``: one optimizer step of k micro-batches (the batch split in k) profiled
   twice, each micro-batch's backward all-reducing (``sync``) and under ``ddp.no_sync()`` for all but
   the last (``no_sync``); then both kinds of accumulation once more unprofiled from the same weights,
   to compare their gradients.
3. ``timeout_s``: a new process group with that timeout; rank 0 enters an all-reduce on it that no
   other rank joins (they wait at a barrier of the main group instead, as ranks stuck in different
   collectives do). Rank 0's error, its type and how long it waited are kept; then rank 0 reaches the
   barrier and every rank finishes.

The parent waits at most ``deadline_s`` and terminates (then kills) any rank still alive when it
returns or raises: no process is left behind.

``benchmarks/record_gloo_ranks.py`` records ``workbench/samples/ranks`` (samples ``ranks_*``) with this module; notebook 14 runs it.
torch is imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from workbench.errors import BadArgument, WorkbenchError

__all__ = ["GlooSpec", "GlooRun", "run_gloo_ddp", "MAIN_GROUP_TIMEOUT_S"]

MAIN_GROUP_TIMEOUT_S = 60.0  # the main process group's timeout: a stuck collective fails after this
TRACE_SUFFIX = ".pt.trace.json.gz"


@dataclass(frozen=True)
class GlooSpec:
    """What the ranks do (see the module docstring)."""

    world: int = 2
    steps: int = 4
    warmup_steps: int = 3
    straggler_rank: int | None = None
    delay_ms: float = 30.0
    big_elems: int = 0
    micro_batches: int = 0
    timeout_s: float | None = None
    batch: int = 32

    def check(self) -> "GlooSpec":
        if not 2 <= self.world <= 64:
            raise BadArgument(f"world={self.world}: give 2 to 64 ranks")
        if self.steps < 1 or self.warmup_steps < 0:
            raise BadArgument(f"need steps >= 1 and warmup_steps >= 0 (got {self.steps}, {self.warmup_steps})")
        if self.straggler_rank is not None and not 0 <= self.straggler_rank < self.world:
            raise BadArgument(f"straggler_rank={self.straggler_rank} is not a rank of world size {self.world}")
        if not 0 <= self.delay_ms < 10_000:
            raise BadArgument(f"delay_ms={self.delay_ms}: give 0 to 10000 ms")
        if self.big_elems < 0:
            raise BadArgument(f"big_elems={self.big_elems} must be >= 0")
        if not 0 <= self.micro_batches <= self.batch:
            raise BadArgument(f"micro_batches={self.micro_batches}: give 0 (none) to the batch size {self.batch}")
        if self.timeout_s is not None and not 0 < self.timeout_s < MAIN_GROUP_TIMEOUT_S:
            raise BadArgument(f"timeout_s={self.timeout_s}: give more than 0 and less than {MAIN_GROUP_TIMEOUT_S:g} s")
        return self


@dataclass(frozen=True)
class GlooRun:
    """What :func:`run_gloo_ddp` recorded. ``measured[rank]``: ``step_ms`` (the profiled steps' wall
    times), ``slept_ms`` (the straggler's sleeps in those steps), ``accumulation`` (``sync_ms`` and
    ``no_sync_ms``: the profiled optimizer step's wall time; ``grad_max_abs_diff``: the largest
    difference between the two kinds' gradients). ``timeout``: rank 0's ``error`` (exception type or
    None), ``message``, ``waited_s`` and ``timeout_s``."""

    folder: Path
    spec: GlooSpec
    traces: tuple[Path, ...]
    accumulation: dict[str, tuple[Path, ...]] = field(default_factory=dict)
    measured: dict[int, dict] = field(default_factory=dict)
    timeout: dict | None = None
    wall_s: float = 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trace(folder: Path, part: str, rank: int) -> Path:
    return folder / part / f"rank{rank}{TRACE_SUFFIX}"


# ------------------------------------------------------------------------------------------ a rank


def _rank_main(rank: int, spec_fields: dict, port: int, folder: str) -> None:
    """One rank (the function ``torch.multiprocessing`` starts in each spawned process)."""
    import datetime as dt

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.capture.profiler import profile_steps

    spec = GlooSpec(**spec_fields)
    out = Path(folder)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=spec.world,
                            timeout=dt.timedelta(seconds=MAIN_GROUP_TIMEOUT_S))
    try:
        torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10),
        )
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)  # each rank its own data
        x = torch.randn(spec.batch, 256, generator=g)
        y = torch.randint(0, 10, (spec.batch,), generator=g)
        big = torch.ones(spec.big_elems) if spec.big_elems else None
        straggles = rank == spec.straggler_rank
        slept: list[float] = []

        def step():
            if straggles:
                t0 = time.perf_counter()
                time.sleep(spec.delay_ms / 1e3)
                slept.append((time.perf_counter() - t0) * 1e3)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            if big is not None:
                dist.all_reduce(big)

        def profiled(fn, part: str, steps: int):
            dist.barrier()  # the ranks start the profiled steps together
            return profile_steps(fn, steps=steps, wait=0, warmup=1, detail="light", path=_trace(out, part, rank),
                                 device="cpu", measure_cost=False, progress=False, verbose=False)

        for _ in range(spec.warmup_steps):
            step()
        res = profiled(step, "steps", spec.steps)
        result: dict = {"rank": rank, "step_ms": list(res.step_ms), "slept_ms": slept[-spec.steps:],
                        "torch": torch.__version__}

        if spec.micro_batches:
            k = spec.micro_batches
            chunks = list(zip(x.tensor_split(k), y.tensor_split(k)))  # exactly k micro-batches

            def accumulate(sync: bool, update: bool = True):
                opt.zero_grad(set_to_none=True)
                for i, (xb, yb) in enumerate(chunks):
                    # no_sync: the gradients add up locally; the last backward all-reduces the sum
                    quiet = ddp.no_sync() if not sync and i < len(chunks) - 1 else contextlib.nullcontext()
                    with quiet:
                        (torch.nn.functional.cross_entropy(ddp(xb), yb) * (len(yb) / len(y))).backward()
                if update:
                    opt.step()

            acc = {}
            for part, sync in (("sync", True), ("no_sync", False)):
                r = profiled(lambda s=sync: accumulate(s), part, 1)
                acc[f"{part}_ms"] = r.step_ms[0]
            grads = {}
            for sync in (True, False):  # the same weights, no update: the two kinds' gradients
                accumulate(sync, update=False)
                grads[sync] = [p.grad.detach().clone() for p in ddp.parameters()]
            acc["grad_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(grads[True], grads[False]))
            opt.zero_grad(set_to_none=True)
            result["accumulation"] = acc

        if spec.timeout_s is not None:
            group = dist.new_group(list(range(spec.world)), timeout=dt.timedelta(seconds=spec.timeout_s),
                                   backend="gloo")
            if rank == 0:
                t0 = time.perf_counter()
                try:
                    dist.all_reduce(torch.ones(4), group=group)  # nobody else comes
                    outcome = {"error": None, "message": ""}
                except Exception as exc:  # what a stuck collective raises once the timeout has passed
                    outcome = {"error": type(exc).__name__, "message": str(exc)}
                outcome.update(waited_s=time.perf_counter() - t0, timeout_s=spec.timeout_s)
                result["timeout"] = outcome
            dist.barrier()  # the other ranks wait here, in a different collective, until rank 0 gives up
        tmp = out / f".rank{rank}.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out / f"rank{rank}.json")
        dist.barrier()
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ the run


def run_gloo_ddp(folder: str | os.PathLike | None = None, spec: GlooSpec | None = None, *,
                 deadline_s: float = 120.0, **fields) -> GlooRun:
    """Start ``spec.world`` processes (``spawn``), one gloo rank each, run the spec and return what they
    recorded. ``folder``: where the traces go (default: a new temporary folder). Keyword arguments
    override ``spec``'s fields (``run_gloo_ddp(world=2, straggler_rank=1)``). A rank that raises makes
    this raise (torch's ``ProcessRaisedException``, with the rank's traceback); a run still going after
    ``deadline_s`` is stopped with a :class:`~workbench.errors.WorkbenchError`."""
    from workbench._optional import import_optional

    import_optional("torch", "to run distributed ranks")
    import torch.multiprocessing as mp

    spec = replace(spec or GlooSpec(), **fields).check()
    out = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="gloo-ddp-"))
    out.mkdir(parents=True, exist_ok=True)
    for r in range(spec.world):
        (out / f"rank{r}.json").unlink(missing_ok=True)
    t0 = time.perf_counter()
    ctx = mp.start_processes(_rank_main, args=(asdict(spec), _free_port(), str(out)), nprocs=spec.world,
                             join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=0.1):
            if time.perf_counter() - t0 > deadline_s:
                raise WorkbenchError(f"the {spec.world} gloo ranks did not finish within {deadline_s:g} s; "
                                     "they were stopped")
    finally:
        for p in ctx.processes:  # a rank still alive (deadline, another rank raised): stop it
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    wall = time.perf_counter() - t0
    measured = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(spec.world)}
    ranks = range(spec.world)
    return GlooRun(
        folder=out,
        spec=spec,
        traces=tuple(_trace(out, "steps", r) for r in ranks),
        accumulation={p: tuple(_trace(out, p, r) for r in ranks) for p in ("sync", "no_sync")}
        if spec.micro_batches else {},
        measured=measured,
        timeout=measured[0].get("timeout"),
        wall_s=wall,
    )

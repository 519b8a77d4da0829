# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 14 · Many GPUs: a step is as fast as its slowest rank
#
# With `DistributedDataParallel` (DDP) every rank (one process per GPU) runs the same model on its own
# part of the batch, then the ranks **all-reduce** the gradients: each bucket of gradients is summed
# across ranks while the backward pass is still running, and every rank ends the step with the same
# average. An all-reduce cannot finish before the last rank has brought its part. So one slow rank (a
# **straggler**: a slower data loader, a longer sequence, a busier host) makes every other rank *wait*
# inside the collective, and that wait looks like communication time in their profiles.
#
# The one idea of this lesson: **read a distributed step across ranks, not one rank at a time**. The
# workbench's cross-rank view (`load_ranks`, `RanksPanel`, `workbench ranks`) puts one trace per rank
# side by side, matches the collectives, and says who arrived last and how long the others waited.
# Three things follow from the same picture:
#
# 1. a **straggler** is named by the waits it causes in the *others*, not by its own profile (the one
#    here sleeps, so it looks idle; one doing extra work would look busy);
# 2. during **gradient accumulation**, `ddp.no_sync()` turns k all-reduces per bucket into one;
# 3. a rank that **never comes** to a collective blocks the others until the process group's
#    **timeout**; then, on gloo (the backend run here), they get an exception they could catch. On NCCL
#    the timeout is enforced by a watchdog thread that by default tears the whole process down
#    (`TORCH_NCCL_ASYNC_ERROR_HANDLING`), so there is no exception to catch (section 4).
#
# **What runs here.** Everything below is real `torch.distributed` over the **gloo** backend in CPU
# processes: a recorded 4-rank run, then two ranks started live from this notebook. The cross-rank view
# reads NCCL traces from GPUs the same way (it matches NCCL kernels as it matches gloo's collectives).
# **There are no H200 multi-GPU numbers in this lesson**: the multi-GPU recording needs a machine with
# several GPUs, and none was available, so no NCCL run on H200s has been recorded. Section 5 shows what
# an NCCL trace looks like with the only NCCL trace shipped, a single-rank **V100** recording.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json, subprocess, sys
from pathlib import Path
import numpy as np
import pandas as pd
import torch
from workbench import RanksPanel, load_ranks, samples
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# Real 4-process gloo DDP runs, recorded by benchmarks/record_gloo_ranks.py and shipped as the samples
# ranks_healthy, ranks_straggler, ranks_slow_collective (provenance: workbench/samples/README.md)
RECORDED = samples.path("ranks_straggler").parent  # the folder of the three runs


def truth_of(scenario):
    return json.loads((RECORDED / scenario / "truth.json").read_text())


def ranks_of(folder_or_files):
    """The cross-rank view, read in this process, without the on-disk cache."""
    return load_ranks(folder_or_files, processes=1, cache=False)


# %% [markdown]
# ## 1 · A recorded run: four ranks, one of them late
#
# `benchmarks/record_gloo_ranks.py` ran a small MLP under DDP in 4 processes (gloo, batch 32 per rank,
# 4 profiled steps, one trace per rank). In the `straggler` run one rank sleeps before every forward
# pass; `truth.json` says which one and how long it actually slept. The view does not read `truth.json`:
# it finds the straggler from the traces alone.

# %% tags=["nbval-check-output"]
truth = truth_of("straggler")
view = ranks_of(sorted((RECORDED / "straggler").glob("rank*.pt.trace.json.gz")))
slept = truth["measured"][str(truth["straggler_rank"])]["slept_ms"]
print(f"injected: rank {truth['straggler_rank']} sleeps {truth['injected_delay_ms']:.0f} ms before each forward "
      f"(slept {np.median(slept):.1f} ms, median of {len(slept)} steps)")
s = view.straggler
print(f"found:    rank {s['rank']}; it arrived last at {s['evidence']['last_arrivals']} of "
      f"{s['evidence']['collectives']} all-reduces; the others wait {s['wait_ms_per_step']:.1f} ms per step for it")
cols = ["rank", "steps", "step_ms", "compute_us", "communication_us", "idle_us", "wait_us"]
display(view.ranks[cols].assign(**{c: view.ranks[c] / 1e3 for c in cols if c.endswith("_us")})
        .rename(columns=lambda c: c.replace("_us", "_ms")).round(1))

# %% [markdown]
# **Who waits for whom.** Read the table by column. The step times are about equal: the all-reduce ties
# the ranks together, so the step time does not point at anyone. The three punctual ranks spend most of
# their window in *communication*, and most of that is `wait` (from their own arrival at an all-reduce
# to the last rank's). The straggler waits for nobody and communicates the least; what it has instead is
# *idle* time: the sleep, which no op covers. A look at one rank's profile would blame "slow
# communication" on the punctual ranks; the cross-rank view blames the late one. (The takeaways cell
# asserts each of these on the data.)
#
# Each matched all-reduce has a **start skew** (last arrival minus first: waiting) and a **transfer**
# (what it takes once everyone is there: the collective itself):

# %% tags=["nbval-check-output"]
c = view.collectives
print(c[["step", "seq", "skew_us", "transfer_us", "last_rank"]]
      .assign(skew_ms=c["skew_us"] / 1e3, transfer_ms=c["transfer_us"] / 1e3)
      .drop(columns=["skew_us", "transfer_us"]).round(1).to_string(index=False))
per_step = c.groupby("step").size()
print(f"{len(c)} all-reduces matched across the 4 ranks: {per_step.iloc[0]} per step (DDP's gradient buckets); "
      f"last to arrive: rank(s) {sorted(set(c['last_rank']))}")
idle = view.ranks.set_index("rank").loc[s["rank"], "idle_us"] / 1e3
print(f"the straggler's idle time: {idle:.1f} ms over the profile; it slept {sum(slept):.1f} ms in those steps")

# %% [markdown]
# For contrast, the `healthy` run of the same loop (nobody sleeps): no straggler is named, the last
# arrival moves from rank to rank (no rank is last at a majority of the all-reduces), and the skews are
# smaller (not zero: four processes shared two CPU cores when it was recorded). And the `slow_collective`
# run, where every rank also all-reduces an extra buffer each step: that collective is slow for everyone
# once all have arrived (a long transfer), with no one late (a small skew).

# %% tags=["nbval-check-output"]
healthy = ranks_of(sorted((RECORDED / "healthy").glob("rank*.pt.trace.json.gz")))
print("straggler:", healthy.straggler)
print("last arrivals per rank:", healthy.collectives["last_rank"].value_counts().sort_index().to_dict(),
      f"of {len(healthy.collectives)}")
print(f"median start skew: healthy {healthy.collectives['skew_us'].median() / 1e3:.1f} ms, "
      f"straggler run {view.collectives['skew_us'].median() / 1e3:.1f} ms")
slow = ranks_of(sorted((RECORDED / "slow_collective").glob("rank*.pt.trace.json.gz")))
sc = slow.collectives
print(f"slow_collective (extra all-reduce of {truth_of('slow_collective')['extra_all_reduce_elems']:,} floats): "
      f"straggler {slow.straggler}")
print(sc.assign(which=np.where(sc["seq"] == 2, "extra buffer", "gradient bucket"))
      .groupby("which")[["skew_us", "transfer_us"]].median().div(1e3).round(1)
      .rename(columns={"skew_us": "median skew ms", "transfer_us": "median transfer ms"}).to_string())

# %% [markdown]
# The same view as a panel: the verdict and findings on top; tabs for each rank's time (sort by "waiting
# for others"), the collectives' skew against transfer, and the per-rank timeline of the collectives.

# %% tags=["nbval-ignore-output"]
RanksPanel(view)

# %% [markdown]
# And from a terminal, `workbench ranks FOLDER` (here in the recordings' folder, so that no path of this
# machine is printed; `--json` gives the document of docs/json.md, `--html` a report):

# %% tags=["nbval-check-output"]
cli = subprocess.run([sys.executable, "-m", "workbench", "ranks", "straggler/", "--no-cache", "--processes", "1"],
                     cwd=RECORDED, capture_output=True, text=True)
print(cli.stdout)
print(f"exit code {cli.returncode}; on stderr: {cli.stderr.split(': has')[0].strip()} (not a trace)")

# %% [markdown]
# ## 2 · Live: two ranks started from this notebook, one planted straggler
#
# `workbench.capture.gloo.run_gloo_ddp` (what `benchmarks/record_gloo_ranks.py` records with) starts the ranks as processes
# (the `spawn` start method, which works inside a Jupyter kernel because the rank's function lives in an
# importable module), joins them in one gloo process group on a free loopback port and runs the same
# DDP loop. Each rank profiles its steps with `workbench.capture.profile_steps` into its own trace.
# Here: 2 ranks, rank 1 sleeps 30 ms before every forward; after the profiled steps the same processes
# also run the accumulation of section 3 and the timeout of section 4. The parent stops any rank still
# alive when the call returns.

# %% tags=["nbval-ignore-output"]
from workbench.capture.gloo import run_gloo_ddp

DELAY_MS, MICRO_BATCHES, TIMEOUT_S = 30.0, 4, 1.0
live = run_gloo_ddp(world=2, steps=4, straggler_rank=1, delay_ms=DELAY_MS, micro_batches=MICRO_BATCHES,
                    timeout_s=TIMEOUT_S)
print(f"2 ranks, {live.wall_s:.1f} s from spawn to exit (starting the processes and importing torch included)")
print("traces:", [p.name for p in live.traces])

# %% tags=["nbval-ignore-output"]
lv = ranks_of(live.traces)
ls = lv.straggler
slept_live = live.measured[1]["slept_ms"]
print(f"found: rank {ls['rank']}, last at {ls['evidence']['last_arrivals']} of {ls['evidence']['collectives']} "
      f"all-reduces; rank 0 waits {ls['wait_ms_per_step']:.1f} ms per step (rank 1 slept "
      f"{np.median(slept_live):.1f} ms per step)")
display(lv.ranks[cols].assign(**{c: lv.ranks[c] / 1e3 for c in cols if c.endswith("_us")})
        .rename(columns=lambda c: c.replace("_us", "_ms")).round(1))
assert ls["rank"] == 1 and (lv.collectives["last_rank"] == 1).all()
assert 0.5 * DELAY_MS < ls["wait_ms_per_step"] < 2 * DELAY_MS

# %% tags=["nbval-ignore-output"]
RanksPanel(lv)

# %% [markdown]
# ## 3 · Gradient accumulation: `no_sync()` all-reduces once, not once per micro-batch
#
# Accumulating k micro-batches before one optimizer step saves memory (notebook 34). Under DDP each
# `backward()` normally all-reduces its buckets, so k micro-batches cost k rounds of all-reduces, where
# one would do: averaging the locally summed gradients once gives the same result (checked below). Inside
# `with ddp.no_sync():` the backward only accumulates; the last micro-batch, outside it, all-reduces the
# sum once:
#
# ```python
# for i, (xb, yb) in enumerate(micro_batches):
#     quiet = ddp.no_sync() if i < k - 1 else contextlib.nullcontext()
#     with quiet:
#         (loss_fn(ddp(xb), yb) / k).backward()
# opt.step()
# ```
#
# The live ranks ran one such optimizer step twice, profiled: without `no_sync` and with it. Count the
# all-reduces in each rank's trace (the cross-rank view matches them across the ranks):

# %% tags=["nbval-check-output"]
BUCKETS = int(lv.collectives.groupby("step").size().median())  # all-reduces of one ordinary training step
acc = {part: ranks_of(paths) for part, paths in live.accumulation.items()}
counts = {part: int(len(v.collectives)) for part, v in acc.items()}
print(f"one training step: {BUCKETS} all-reduces (one per gradient bucket)")
print(f"{MICRO_BATCHES} micro-batches, every backward syncs: {counts['sync']} all-reduces")
print(f"{MICRO_BATCHES} micro-batches under no_sync:        {counts['no_sync']} all-reduces")
diff = max(live.measured[r]["accumulation"]["grad_max_abs_diff"] for r in live.measured)
print("same gradients either way (to float32 rounding):", diff < 1e-5)

# %% [markdown]
# On GPUs the saved all-reduces are NCCL transfers over NVLink or the network; how much that saves per
# step on H200s is not measured here (no multi-GPU recording).

# %% [markdown]
# ## 4 · A rank that never comes: the timeout
#
# The last thing the live ranks did: rank 0 entered an all-reduce on a process group created with
# `timeout=datetime.timedelta(seconds=TIMEOUT_S)`, and rank 1 never joined it (it waited at a barrier of
# the main group instead, the way ranks end up in *different* collectives when one skips a collective
# or calls them in another order).
# Without a timeout rank 0 would wait for ever; with one it gets an exception once the time is up. The
# default timeout is long (torch's `default_pg_timeout`, printed below; NCCL groups have their own,
# `default_pg_nccl_timeout`), so a real hang takes that long to turn into an error.

# %% tags=["nbval-ignore-output"]
from torch.distributed.constants import default_pg_timeout

t = live.timeout
print(f"rank 0 got {t['error']} after {t['waited_s']:.2f} s (timeout {t['timeout_s']:g} s):")
print("   ", t["message"].split("] ", 1)[-1][:160])  # the part after gloo's source location
print("torch's default process-group timeout:", default_pg_timeout)
assert t["error"] is not None and "timed out" in t["message"].lower()
assert TIMEOUT_S * 0.95 <= t["waited_s"] < TIMEOUT_S + 10

# %% [markdown]
# What this shows holds for **gloo**: the collective raised an exception in rank 0's Python code, which
# could catch it. **NCCL behaves differently by default**: its collectives run asynchronously on the GPU
# and a watchdog thread in each process enforces the timeout; when it fires, the default
# (`TORCH_NCCL_ASYNC_ERROR_HANDLING`, which tears down on error) aborts the communicator and ends the
# process, so no `except` in the training loop runs, and the job's launcher sees a dead rank. Nothing
# on NCCL was recorded for this lesson (no multi-GPU machine), so that part is the documented behaviour,
# not a run shown here.
#
# In practice: keep the timeout well above the slowest *legitimate* wait (a checkpoint save on rank 0, a
# long first compile), but short enough that a hung job dies instead of holding GPUs. The gloo error
# above says only that a receive timed out, not which rank is missing: each rank's own logs, or the
# cross-rank view of a profile, tell you that.

# %% [markdown]
# ## 5 · What an NCCL trace looks like (a V100 recording, not H200 numbers)
#
# On GPUs, DDP's all-reduce is NCCL: the host records an `nccl:all_reduce` annotation when it launches
# the collective, and the GPU runs an NCCL kernel that moves the data. The cross-rank view matches the
# **kernels** across ranks (their skew and transfer are GPU time), where on a CPU it matches gloo's host
# ops. The shipped `v100_nccl_rank0` trace is rank 0 of a **world-size-1** NCCL group on a Tesla V100:
# the host annotations are there, but with a single rank there is nothing to exchange and no NCCL kernel
# ran. It shows the shape of the data, not a multi-GPU measurement.

# %% tags=["nbval-check-output"]
from workbench import load_trace
from workbench.analysis.trace.tables import is_communication_kernel

v100 = load_trace(samples.path("v100_nccl_rank0"))
info = v100.metadata["distributedInfo"]
ev = v100.events
nccl = ev[ev["name"].astype(str).str.startswith("nccl:")]
kernels = ev[ev["cat"] == "kernel"]
print(f"{v100.device}: backend {info['backend']}, world size {info['world_size']}, NCCL {info['nccl_version']}")
print("host-side NCCL calls:", nccl.groupby("name").size().to_dict())
print(f"kernels: {len(kernels)}, of them NCCL: {int(is_communication_kernel(kernels['name']).sum())}")
H200_NCCL = sorted(RESULTS.glob("h200_*nccl*"))
print("recorded H200 multi-GPU NCCL results:", [p.name for p in H200_NCCL] or "none yet (no multi-GPU machine was available)")

# %% [markdown]
# ## 6 · Exercise: move the straggler, change the accumulation
#
# Change the three settings, write down what you expect in `PREDICT`, then run the two cells. The ranks
# start again (a few seconds). Questions: which rank will the view name? How many all-reduces will one
# optimizer step of `EX_MICRO_BATCHES` micro-batches do without `no_sync`, and with it? (Hint: section 3's
# counts and `BUCKETS`.) Then try `EX_DELAY_MS = 2`: is a 2 ms sleep still a straggler by the view's rule
# (the others wait at least `STRAGGLER_MIN_STEP_FRACTION` of a step)?

# %%
EX_STRAGGLER = 0         # which rank sleeps: 0 or 1
EX_DELAY_MS = 30.0       # how long it sleeps before every forward
EX_MICRO_BATCHES = 6     # micro-batches per optimizer step (1 to 32)
PREDICT = {"straggler": None, "sync_all_reduces": None, "no_sync_all_reduces": None}  # your answers

# %% tags=["nbval-ignore-output"]
from workbench.analysis.trace.ranks import STRAGGLER_MIN_STEP_FRACTION

print(f"the view's rule: a straggler makes the others wait at least {STRAGGLER_MIN_STEP_FRACTION:.0%} of a step")
ex = run_gloo_ddp(world=2, steps=3, straggler_rank=EX_STRAGGLER, delay_ms=EX_DELAY_MS,
                  micro_batches=EX_MICRO_BATCHES)
ex_view = ranks_of(ex.traces)
measured = {"straggler": None if ex_view.straggler is None else ex_view.straggler["rank"],
            **{f"{part}_all_reduces": len(ranks_of(paths).collectives) for part, paths in ex.accumulation.items()}}
for key, value in measured.items():
    guess = PREDICT[key]
    verdict = "(no prediction)" if guess is None else ("right" if guess == value else f"you said {guess}")
    print(f"{key:>20}: {value}  {verdict}")
# the solution
ex_buckets = int(ex_view.collectives.groupby("step").size().median())
assert measured["sync_all_reduces"] == EX_MICRO_BATCHES * ex_buckets
assert measured["no_sync_all_reduces"] == ex_buckets
if EX_DELAY_MS >= 20:  # 20 ms or more: well above 10% of this loop's step (section 2's table)
    assert measured["straggler"] == EX_STRAGGLER

# %% [markdown]
# ## Takeaways
#
# - A distributed step is as fast as its slowest rank: the others wait inside the collective, and that
#   wait shows up as *their* communication time. Look across ranks (`load_ranks`, `RanksPanel`,
#   `workbench ranks`): the straggler is the rank that arrives last and waits for no one.
# - Skew is waiting, transfer is the collective itself: a straggler raises the skew; a big all-reduce
#   raises the transfer for everyone.
# - Under gradient accumulation, `ddp.no_sync()` for all but the last micro-batch: one all-reduce per
#   bucket per optimizer step instead of one per micro-batch, with the same gradients.
# - A rank that never joins a collective turns into an error only after the process group's timeout;
#   set one that a hung job cannot sit out for long.
# - Not here yet: H200 multi-GPU NCCL numbers (none recorded: no multi-GPU machine was available).

# %%
assert view.straggler["rank"] == truth["straggler_rank"] and healthy.straggler is None
assert (view.collectives["last_rank"] == truth["straggler_rank"]).all()
waits = view.ranks.set_index("rank")["wait_us"]
assert waits.idxmin() == truth["straggler_rank"] and waits.drop(truth["straggler_rank"]).min() > 10 * waits.min()
late = truth["straggler_rank"]
r = view.ranks.set_index("rank")
punctual = r.drop(late)
assert r["step_ms"].max() < 1.15 * r["step_ms"].min()                  # step times about equal
assert (punctual["communication_us"] > 0.5 * punctual["window_us"]).all()   # punctual: mostly communication,
assert (punctual["wait_us"] > 0.5 * punctual["communication_us"]).all()     # ... mostly waiting
assert r["communication_us"].idxmin() == late and r["idle_us"].idxmax() == late
assert 0.8 < idle / sum(slept) < 1.3                                   # the straggler's idle time is its sleep
assert healthy.collectives["last_rank"].value_counts().max() <= len(healthy.collectives) / 2  # no majority
assert view.collectives["skew_us"].median() > 2 * healthy.collectives["skew_us"].median()
extra, buckets_sc = sc[sc["seq"] == 2], sc[sc["seq"] < 2]
assert slow.straggler is None and (extra["transfer_us"] > extra["skew_us"]).all()   # slow for all, no one late
assert extra["transfer_us"].median() > 2 * buckets_sc["transfer_us"].median()
assert lv.straggler["rank"] == 1                                       # live: the planted rank is named
assert counts == {"sync": MICRO_BATCHES * BUCKETS, "no_sync": BUCKETS} and diff < 1e-5
assert live.timeout["waited_s"] >= 0.95 * TIMEOUT_S and live.timeout["error"] is not None
assert int(is_communication_kernel(kernels["name"]).sum()) == 0 and info["world_size"] == 1  # V100: one rank
print(f"recorded: rank {view.straggler['rank']} makes the others wait {view.straggler['wait_ms_per_step']:.1f} ms "
      f"per step; live: rank {lv.straggler['rank']}, {lv.straggler['wait_ms_per_step']:.1f} ms; no_sync: "
      f"{counts['sync']} -> {counts['no_sync']} all-reduces; timeout after {live.timeout['waited_s']:.2f} s")

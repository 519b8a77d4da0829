# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 21 · An OOM post-mortem
#
# `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB` says *that* it failed, not
# *why*. Was the memory really full (**capacity**), or was there enough free memory but cut into holes
# too small for the request (**fragmentation**)? The two have different fixes, and an allocator snapshot
# taken at the moment of failure tells them apart.
#
# The snapshot here is real: an 8-layer transformer (d=1024, 16 heads, FFN 4096) training with
# batch 64 x 1024 tokens on an H200 under a 4.19 GiB per-process cap
# (`torch.cuda.set_per_process_memory_fraction`), written from inside torch's out-of-memory observer.
# torch's own message was: *"4.19 GiB allowed; 3.94 GiB allocated by PyTorch, 255.59 MiB reserved but
# unallocated"*.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup
setup()
import os, sys, warnings
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# %%
from workbench import samples
from workbench import load_snapshot
from workbench.analysis.memory.oom import analyze_snapshot, oom_postmortem
from workbench import format_bytes

# a relative path keeps machine paths out of what the panels print
oom_snap = load_snapshot(os.path.relpath(samples.path("h200_oom_snapshot")))
analysis = analyze_snapshot(oom_snap)
report = oom_postmortem(oom_snap, analysis)

# %% [markdown]
# ## 1 · What failed, in numbers
#
# `oom_postmortem` rebuilds the allocator's state just before the failed request: what was allocated
# to tensors, what was reserved from CUDA, how much of the reserved memory was free, and the largest
# single free block in the pool the request goes to (requests above 1 MiB use the *large* pool).

# %% tags=["nbval-check-output"]
fb = format_bytes
print(f"requested           {fb(report.requested_bytes):>11}  ({report.pool} pool)")
print(f"allocated (live)    {fb(report.allocated_bytes):>11}")
print(f"reserved            {fb(report.reserved_bytes):>11}")
print(f"free in reserved    {fb(report.free_in_reserved_bytes):>11}")
print(f"largest free block  {fb(report.largest_free_block_bytes):>11}")
print(f"cause: {report.cause}; at least {fb(report.shortfall_bytes)} of live tensors must go")

# %% [markdown]
# ## 2 · Capacity or fragmentation?
#
# The rule (`workbench.analysis.memory.oom`):
#
# * **fragmentation**: the free memory inside reserved segments *would* cover the request, but no single
#   hole is big enough. The allocator needs a new segment, the cap refuses it. Fix: the allocator's
#   settings (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`), or the order of allocations.
# * **capacity**: even all the free reserved memory together is smaller than the request. Only fewer or
#   smaller live tensors help: a smaller batch, activation checkpointing, lower precision.
#
# Here 255.6 MiB was free but the request was 1 GiB: **capacity**. The OOM figure puts the request next
# to what was available, and what was live by category:

# %% tags=["nbval-ignore-output"]
from workbench.figures.memory import oom_figure
oom_figure(report)

# %% tags=["nbval-check-output"]
for cat, v in sorted(report.by_category.items(), key=lambda kv: -kv[1]["bytes"]):
    print(f"{cat:<12} {fb(v['bytes']):>11}  (category confidence {v['confidence']})")
print()
for row in report.top_live[:3]:
    print(f"{fb(row['bytes']):>11}  {row['category']:<12} {row['stack'].splitlines()[0]}")

# %% [markdown]
# The live memory at the failure is almost all activations of the **first forward pass** (no optimizer
# state exists yet: the run died before its first `optimizer.step()`). The largest live tensor is a
# 1 GiB output of a `Linear` (64 x 1024 tokens x 4096 features x 4 bytes: the feed-forward expansion),
# and the failed request is the next one like it. (The 256 MiB marked `unknown` was allocated by the recording
# script itself, outside the model: its stack is the script's top level.)
#
# **What would fix it?** The snapshot alone gives a *lower bound*: at least the shortfall of live tensors
# must go. If all of it came out of the activations, and they scale with the batch, the batch would have
# to shrink by at least shortfall / activations. But the run died in its **first forward pass**, long
# before the step's peak (the end of the forward and the backward, when gradients and AdamW's state
# exist too), so a batch cut by that bound only moves the failure later. And the allocator's settings
# cannot help a capacity OOM: `expandable_segments:True` lets free holes merge into larger blocks, but all
# the free reserved memory together is smaller than the request. The whole step has to be estimated
# (section 3 below does).

# %% tags=["nbval-check-output"]
bound = report.shortfall_bytes / report.by_category["activations"]["bytes"]
print(f"lower bound from the snapshot: the batch at least {bound:.0%} smaller (shortfall {fb(report.shortfall_bytes)} "
      f"of {fb(report.by_category['activations']['bytes'])} activations live at the failure)")
print(f"expandable segments: all free reserved memory, {fb(report.free_in_reserved_bytes)}, "
      f"{'covers' if report.free_in_reserved_bytes >= report.requested_bytes else 'cannot cover'} "
      f"the {fb(report.requested_bytes)} request")

# %% [markdown]
# ### What fragmentation looks like, for contrast
#
# The training snapshot of notebook 20 (6-layer model, batch 16) never ran out of memory. The
# `AllocatorState` at any event gives two different numbers about its free memory: **how much** of the
# reserved memory is free (the waste: the usual rule of thumb is to worry above a quarter of it), and
# **how scattered** that free memory is (`fragmentation` = 1 - largest free block / all free memory).

# %% tags=["nbval-check-output"]
from workbench.analysis.memory.segments import allocator_state

train = analyze_snapshot(load_snapshot(os.path.relpath(samples.path("h200_train_snapshot"))))
st = allocator_state(train.snap, train.allocs, train.peak["index"])
print(f"at the training peak: {fb(st.free_in_reserved_bytes)} free of {fb(st.reserved_bytes)} reserved "
      f"({st.free_in_reserved_bytes / st.reserved_bytes:.0%}: {'above' if st.free_in_reserved_bytes > st.reserved_bytes / 4 else 'below'} "
      f"the 25% line), in {st.free_blocks} holes, largest {fb(st.largest_free_block_bytes)}, "
      f"fragmentation {st.fragmentation:.2f}")
print("a 16 MiB request there, under a cap, would fail by", "fragmentation" if
      st.large_pool_free_bytes >= 16 * 2**20 > st.large_pool_largest_free_bytes else "capacity")

# %% [markdown]
# Both are true at once: little memory is wasted (a healthy step), and what little is free is scattered
# into small holes, so the fragmentation index is high. The index alone says nothing about harm; it matters
# when the free memory is a large share of the cap *and* a request needs a block bigger than the largest
# hole. That is when `expandable_segments:True` (or a different allocation order) is the fix.

# %% [markdown]
# The `MemoryPanel` opens on the **OOM** tab for a snapshot that holds one; the timeline tab shows the
# activations piling up layer by layer until the failure, and the segment map shows the holes.

# %% tags=["nbval-ignore-output"]
from workbench import MemoryPanel
MemoryPanel(analysis)

# %% [markdown]
# From a terminal (or a cluster job's log), the same post-mortem:

# %% tags=["nbval-ignore-output"]
import subprocess
f = samples.path("h200_oom_snapshot")
out = subprocess.run([sys.executable, "-m", "workbench", "memory", f.name], capture_output=True, text=True, cwd=f.parent)
print(out.stdout or out.stderr)

# %% [markdown]
# ## 3 · The fix: what would fit?
#
# A capacity OOM needs the step's peak to come down by more than the shortfall. Instead of trying batch
# sizes on the GPU until one survives, ask the **estimator** (`workbench.estimate`): it runs the training
# step on *fake* tensors on the CPU, replays every allocation through a model of the CUDA caching
# allocator, and predicts the peak, per category, in a few seconds. Same model, same optimizer:

# %%
from torch import nn
from workbench import estimate, largest_batch_that_fits

def model_fn():
    return nn.Sequential(*[nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True) for _ in range(8)])

def inputs_fn(batch_size):
    return torch.randn(batch_size, 1024, 1024)

def optimizer_fn(params):
    return torch.optim.AdamW(params)

CAP = int(4.19 * 2**30)  # the per-process cap of the failed run

# %% tags=["nbval-check-output"]
at64 = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=64, steps=1)
print(f"batch 64, fp32: predicted peak {at64.peak_reserved_bytes / 2**30:.1f} GiB reserved "
      f"({at64.peak_reserved_bytes / CAP:.0f}x the cap); activations {at64.by_category['activations'] / 2**30:.1f} GiB")

# %% [markdown]
# Far over the cap: it failed in the first forward pass, long before the peak (which comes in the
# backward pass). So the batch has to shrink a lot, or the activations have to go. The largest fp32
# batch that fits, by a search over estimates (starting from 64 / 16 = 4, since 64 needs about 9x the cap),
# on the estimate's own reserved value (`use="reserved_point"`; the default, `use="reserved"`, fits the high
# end of the estimate's reserved interval and may answer a smaller batch, one that surely fits):

# %% tags=["nbval-check-output"]
best, est = largest_batch_that_fits(model_fn, inputs_fn, optimizer_fn, budget_bytes=CAP, low=4, high=8, steps=1,
                                    use="reserved_point")
print(f"largest fp32 batch under {CAP / 2**30:.2f} GiB: {best} "
      f"(predicted {est.peak_reserved_bytes / 2**30:.2f} GiB reserved)")

# %% [markdown]
# So the batch has to come down far more than the snapshot's lower bound said. Or keep a bigger batch and
# cut activation memory: **bf16 autocast** halves most activations, and **activation checkpointing** per
# layer keeps only each layer's input and recomputes the rest during backward (up to one more forward pass
# of compute). On the H200, the harness measured it on a 12-layer d=1024 transformer (ledger of notebook 30):

# %% tags=["nbval-check-output"]
from workbench.io import load_ledger
from workbench.lessons import RESULTS

ledger = load_ledger(RESULTS / "h200_harness.ledger.json").set_index("configuration")
f32, ck = ledger.loc["fp32"], ledger.loc["checkpoint(Block)"]
print(f"fp32 {f32.step_ms_median:.0f} ms, {f32.peak_allocated_bytes / 2**30:.2f} GiB -> checkpointing every block "
      f"{ck.step_ms_median:.0f} ms, {ck.peak_allocated_bytes / 2**30:.2f} GiB")
print(f"the estimate's batch: {best} of 64 ({1 - best / 64:.0%} smaller) vs the snapshot's lower bound {bound:.0%}")

# %% tags=["nbval-check-output"]
both = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=32, precision="bf16", checkpointing=True, steps=1)
print(f"batch 32, bf16 + checkpointing: predicted {both.peak_reserved_bytes / 2**30:.2f} GiB reserved -> "
      + ("fits" if both.peak_reserved_bytes <= CAP else "does not fit"))

# %% [markdown]
# ## 4 · The post-mortem's own advice, checked against what ran
#
# The estimator needs the model's code. The post-mortem has only the snapshot, yet it can size the
# whole step too: identical blocks allocate the same sequence of (stack, size) pairs, so the forward's
# allocations so far say **which block** the OOM fell in and what one block keeps; the parameter tensor
# sizes say how many blocks there are. The step's peak comes early in the backward: parameters + AdamW
# state (assumed 2 x the parameters before the first `optimizer.step()`) + other fixed memory +
# the *full* forward (all blocks) + one block's backward. The optimizer step itself is a second peak
# that does not grow with the batch (parameters, every gradient, the state and its temporaries).
#
# Checked on a recording from the H200 (`benchmarks/record_oom_h200.py`, `h200_lesson21.json`): the
# 16-block decoder LM of `examples/estimate_families.py` (d=1024, seq 512, AdamW, fp32) at batch 19
# under a 6 GiB cap, dying in the first forward. Forward hooks noted the block it died in, and then
# the recorder searched, on real runs under the same cap, for the largest batch whose two full AdamW
# steps run: that is the truth the advice must match.

# %%
import json
from workbench.lessons import RESULTS

truth = json.loads((RESULTS / "h200_lesson21.json").read_text())
mid_snap = load_snapshot(os.path.relpath(RESULTS / "h200_lesson21_midforward.snapshot.pickle.gz"))
mid = oom_postmortem(mid_snap, batch_size=truth["batch"])

# %% tags=["nbval-check-output"]
print(f"torch at the OOM: {fb(mid_snap.extra['oom']['memory_stats']['allocated_bytes.all.current'])} allocated, "
      f"cap {fb(truth['cap_bytes'])}, request {fb(truth['request_bytes'])}")
print(f"hooks: died in blocks.{truth['oom_block_index']} (0-based) of {truth['blocks']}, phase {truth['oom_phase']}")
print(f"post-mortem: {mid.cause}; {mid.position['text']}")
print()
from workbench.analysis.memory.whatif import advice_mark

# each advice item is a fix applied to a model of the step and replayed through the allocator model
for item in mid.advice[:3]:
    print(f"[{advice_mark(item)}] {item['text']}")

# %% tags=["nbval-check-output"]
need = mid.step_need
print(f"static {fb(need['static_bytes'])} + scaling {fb(need['scaling_bytes'])} at batch {truth['batch']} "
      f"(forward {fb(need['forward_bytes'])}, one block's backward {fb(need['backward_transient_bytes'])}); "
      f"optimizer peak {fb(need['optimizer_peak_bytes'])}")
print("the batch search on the H200, two full AdamW steps under the cap:")
for row in sorted(truth["largest_batch_search"], key=lambda r: r["batch"]):
    pred = need["static_bytes"] + need["scaling_bytes"] * row["batch"] / truth["batch"]
    peak = fb(row["max_memory_allocated"]) if row["fits"] else "OOM"
    print(f"  batch {row['batch']:>2}: {'runs' if row['fits'] else 'fails':<5}  torch's peak {peak:>10}  "
          f"post-mortem's {fb(max(pred, need['optimizer_peak_bytes'])):>10}")
batch = next(x for x in mid.advice if x["id"] == "batch")
print(f"advised: {batch['largest_batch']} (replayed peak {fb(batch['what_if']['peak_if_fixed_bytes'])}); "
      f"largest that ran: {truth['largest_batch_that_fits']}")

# %% [markdown]
# The advised batch is the largest one that ran, and the next one up failed. The advice the
# post-mortem gave before it counted the whole step (the live memory at the OOM scaled to all
# blocks: no optimizer state, no backward) was run by the recorder too, and failed:

# %% tags=["nbval-check-output"]
print(f"earlier advice: batch {truth['advised_batch']} -> "
      + ("ran" if truth["advised_run"]["fits"] else "OOM: " + truth["advised_run"]["message"][:46]))

# %% tags=["nbval-check-output"]
ran = {r["batch"]: r["fits"] for r in truth["largest_batch_search"]}
assert mid.position["layer"] == truth["oom_block_index"] + 1 and mid.position["step"] == 1
assert batch["largest_batch"] == truth["largest_batch_that_fits"] and ran[batch["largest_batch"]]
assert not ran[truth["largest_batch_that_fits"] + 1]          # one more did not run
assert truth["advised_run"]["fits"] is False                    # the forward-only advice did not
assert mid.cause == "capacity" and not any(x["id"] == "expandable_segments" for x in mid.advice)
print("checked: the block, the step, the advised batch runs, one more does not, no allocator-setting advice")

# %% [markdown]
# **Which batch to run, then.** The batch the post-mortem advised is the largest that ran two steps, and
# its peak fills nearly the whole cap. That is what a largest-batch answer always looks like, and it says
# nothing about the margin a long run needs. The workbench states one rule for that, in
# `docs/memory.md` ("Headroom: which batch to run"), and lessons 34 and 35 apply the same function to
# their own searches: for a long run whose shapes change, expandable segments and at most 99 % of the
# largest batch (lesson 35 measured why).

# %% tags=["nbval-check-output"]
from workbench.lessons import HEADROOM_PCT, headroom_rule

ran_at = {r["batch"]: r for r in truth["largest_batch_search"]}[truth["largest_batch_that_fits"]]
rule = headroom_rule(truth["largest_batch_that_fits"], ran_at["max_memory_allocated"], truth["cap_bytes"])
print(rule["text"])
assert rule["fill"] > 0.9 and rule["batch"] == truth["largest_batch_that_fits"] * HEADROOM_PCT // 100

# %% [markdown]
# ## 5 · Reproduce it live (GPU only)
#
# On a GPU, `workbench.capture.memory.capture_oom` arms an observer that writes the snapshot (and a JSON
# sidecar with the cap and torch's message) the moment an allocation fails, and lets the
# `OutOfMemoryError` propagate unchanged. The cell caps this process at 4.19 GiB like the recorded run,
# fails, and runs the same post-mortem on the fresh snapshot.

# %% tags=["nbval-skip"]
if GPU:
    import tempfile, pathlib
    from workbench import capture_oom

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP / total)
    model = model_fn().cuda()
    x = inputs_fn(64).cuda()
    folder = pathlib.Path(tempfile.mkdtemp())
    try:
        with capture_oom(folder) as oom:
            model(x).square().mean().backward()
    except torch.OutOfMemoryError as exc:
        print("OOM, as expected:", str(exc).splitlines()[0][:120])
    live_report = oom_postmortem(load_snapshot(oom.dumps[-1]))
    print(f"live: cause {live_report.cause}, requested {fb(live_report.requested_bytes)}, "
          f"allocated {fb(live_report.allocated_bytes)}, cap {fb(live_report.cap_bytes)}")
    assert live_report.cause == "capacity" and live_report.allocated_bytes < live_report.cap_bytes   # as recorded
    del model, x
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)

# %% [markdown]
# ## Exercise
#
# Turn the batch size, precision and checkpointing until the prediction fits under the 4.19 GiB budget
# line. (Each change re-runs the estimate: a few seconds on a CPU.)

# %% tags=["nbval-ignore-output"]
from workbench import EstimatePanel
EstimatePanel.from_factories(model_fn, inputs_fn, optimizer_fn, batch_size=4, max_batch_size=64, budget_gib=4.19)

# %% [markdown]
# Your answer, then the check (the estimator, on the panel's rule for "fits": the reserved peak's high end
# under the budget): the largest batch that fits with bf16 autocast and checkpointing both on?

# %%
MY_BATCH = 16       # the largest batch under 4.19 GiB with bf16 + checkpointing

# %% tags=["nbval-check-output"]
both_fit = largest_batch_that_fits(model_fn, inputs_fn, optimizer_fn, budget_bytes=CAP, low=16, high=64, steps=1,
                                   precision="bf16", checkpointing=True)
fp32_fit = largest_batch_that_fits(model_fn, inputs_fn, optimizer_fn, budget_bytes=CAP, low=1, high=8, steps=1)
print(f"fp32 alone: {fp32_fit.batch_size}; bf16 + checkpointing: {both_fit.batch_size} "
      f"(reserved up to {both_fit.estimate.peak_reserved_range[1] / 2**30:.2f} GiB):",
      "right" if MY_BATCH == both_fit.batch_size else "look again")
# the solution: together they fit several times the fp32 batch, still short of the failed run's 64
assert both_fit.batch_size >= 4 * max(fp32_fit.batch_size, 1) and both_fit.batch_size < 64
assert both_fit.estimate.peak_reserved_range[1] <= CAP

# %% [markdown]
# ## Takeaways

# %% tags=["nbval-check-output"]
assert report.cause == "capacity" and report.free_in_reserved_bytes < report.requested_bytes
assert at64.peak_reserved_bytes > CAP and 1 <= best < 64
assert best < 64 * (1 - bound)                     # the snapshot's bound is not enough: the whole step decides
assert report.free_in_reserved_bytes < report.requested_bytes   # so no allocator setting can fix it
assert need["largest_batch"] == truth["largest_batch_that_fits"]  # the post-mortem's batch is the one that ran
print(f"cause: {report.cause} ({fb(report.free_in_reserved_bytes)} free < {fb(report.requested_bytes)} requested)")
print(f"fix: batch {best} in fp32, or batch 32 with bf16 + checkpointing "
      f"({both.peak_reserved_bytes / 2**30:.1f} GiB)")
print(f"on the H200 recording: advised batch {need['largest_batch']} of {truth['batch']}, "
      f"largest that ran {truth['largest_batch_that_fits']}")

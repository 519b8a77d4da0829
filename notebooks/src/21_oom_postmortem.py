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
#
# Then the fix: the post-mortem sizes the whole training step from the snapshot, replays each candidate fix
# through a model of the allocator, and says the peak it would leave and whether the step then fits. Sections
# 4 and 5 check that advice against fixes that were actually run on a GPU under the same cap.

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
# ## 5 · Every fix, replayed, and what its run did
#
# Section 4 checked one number, the batch. The post-mortem gives one advice item per candidate fix, and each
# carries a **what-if**: the fix applied to the post-mortem's model of the step (static memory, what each
# block keeps, the optimizer's state, what leaks), two steps of it replayed through the caching-allocator
# model under the cap. The item's `what_if` says `peak_bytes` (the step as it is, no cap),
# `peak_if_fixed_bytes` (with the fix), `cap_bytes`, `fits` and `margin_bytes` (cap − peak with the fix);
# a leak's items say `oom_returns_at_step`, the batch item `batch_fraction`, and each item has a `fix_code`
# line to paste. The `MemoryPanel`'s OOM tab draws them as a card: a bar per fix against the cap, and the
# cheapest fix that fits as code to copy (`advice_html`, the same card, is shown below).
#
# A prediction is worth what it was checked against. The sample `h100_oom_whatif` holds three OOMs recorded
# under a cap on an H100 80GB (`benchmarks/record_oom_whatif_h200.py`; `workbench/samples/README.md` says
# how), and for each one **every candidate fix was run** in a fresh process under the same cap: whether it
# ran all its steps or at which step it died, and torch's `max_memory_reserved`. Each scenario is three files:
# the snapshot from the OOM observer, the `.oom.json` sidecar (the cap, torch's message, `memory_stats()`)
# and `<scenario>.json` (the scenario, and `fixes`: what was run).

# %%
from IPython.display import HTML, display
from workbench.io.snapshot import load_oom_sidecar
from workbench.analysis.memory.whatif import recorder_fix_advice
from workbench.analysis.memory.whatif_model import Change, step_memory_model
from workbench.analysis.memory.whatif_replay import replay_change
from workbench.figures.text import advice_html

WHATIF = samples.path("h100_oom_whatif")
env = json.loads((WHATIF / "env.json").read_text())
GiB = 2**30


def load_whatif(name):
    """One recorded scenario: its JSON (the fixes that were run), the snapshot with its sidecar, the post-mortem."""
    rec = json.loads((WHATIF / f"{name}.json").read_text())
    snap = load_snapshot(os.path.relpath(WHATIF / rec["snapshot"]))
    # the recorder names the sidecar <scenario>.oom.json; load_snapshot looks for <file name>.oom.json, so
    # read it here: without it the cap is unknown and the post-mortem takes what was reserved at the OOM
    oom, problem = load_oom_sidecar(WHATIF / rec["sidecar"])
    assert oom is not None and problem is None, problem
    snap.extra["oom"] = oom
    a = analyze_snapshot(snap)
    return rec, a, oom_postmortem(snap, a, batch_size=rec["batch_size"])


def fix_rows(rec, a, rep):
    """Each fix that was run: what the advice predicted for it, next to what its run did."""
    items = {x["id"]: x for x in rep.advice}
    model = step_memory_model(a, rep, rec["batch_size"])
    exp = bool(rep.allocator_settings.get("expandable_segments"))
    rows = []
    for fix in rec["fixes"]:
        if fix.get("ran") is None or fix.get("skipped"):
            continue
        aid = recorder_fix_advice(fix["change"])           # the advice item this fix checks (None: not modelled)
        item = items.get(aid)
        if aid in ("expandable_segments", "max_split_size") and item is None:
            item = items.get("allocator_settings")          # a capacity OOM: "allocator settings cannot help"
        predicted, peak = None, None                       # predicted: will the run get through all its steps?
        if item is not None and item.get("oom_returns_at_step") is not None:
            if aid != "batch" or fix["change"].get("batch_fraction") == "1/2":  # a leak's batch item: half the batch
                predicted = item["oom_returns_at_step"] > rec["steps"]
                said = f"OOM returns at step {item['oom_returns_at_step']}"
        elif aid == "batch":                               # the batch that was run, replayed
            r = replay_change(model, Change(batch_fraction=fix["change"]["batch_size"] / rec["batch_size"]), exp)
            predicted, peak = r["fits"], r["peak_bytes"]
            said = "fits" if r["fits"] else "does not fit"
        elif item is not None:
            predicted, peak = item["what_if"]["fits"], item["what_if"]["peak_if_fixed_bytes"]
            said = "fits" if predicted else ("cannot help" if "cannot help" in advice_mark(item) else "does not fit")
        if predicted is None:                              # no advice models it / the advice was not offered
            said = "not modelled" if aid is None else "not advised" if item is None else "-"
        measured = fix.get("max_memory_reserved") if fix["ran"] else None
        grows = bool(rec.get("leak")) and aid in ("batch", "bigger_gpu")  # the leak's runs grow every step
        rows.append({
            "fix": fix["id"], "advice": item["id"] if item else (aid or "-"), "predicted": said,
            "pred GiB": round(peak / GiB, 2) if peak else None,
            "run": "ran" if fix["ran"] else f"OOM at step {fix['oom_step'] + 1}",   # 1-based, as the advice counts
            "reserved GiB": round(measured / GiB, 2) if measured else None,
            "error": round(peak / measured - 1, 3) if peak and measured and not grows else None,
            "agree": None if predicted is None else predicted == bool(fix["ran"]),
        })
    return pd.DataFrame(rows)


def show(name, rec, rep, rows):
    print(f"{name}: {rec['description']}")
    print(f"batch {rec['batch_size']}, cap {fb(rec['cap_bytes'])}, {rec['steps']} steps planned; "
          f"the OOM: {rep.cause}, {rep.position['phase']} of step {rec['oom']['step'] + 1}")
    print(rows.assign(agree=rows["agree"].map({True: "yes", False: "NO", None: ""})).to_string(index=False, na_rep=""))


SCENARIOS = ("leak", "optimizer_first_step", "activations")
whatif = {n: load_whatif(n) for n in SCENARIOS}
tables = {n: fix_rows(*whatif[n]) for n in SCENARIOS}

# %% tags=["nbval-check-output"]
print(f"recorded on {env['device']} (torch {env['torch']}), {env['date'][:10]}")
assert "H100" in env["device"]

# %% [markdown]
# ### A leak: remove it; every other fix only delays it
#
# A 4-block d=512 language model, batch 8, under a 5 GiB cap, 60 steps planned; every step appends its
# logits to a list "for metrics later". It died in the backward of step 30. The advice card:

# %% tags=["nbval-ignore-output"]
rec, a_leak, leak = whatif["leak"]
display(HTML(advice_html(leak.advice, headline=f"Out of memory: {leak.cause} (leak)")))

# %% tags=["nbval-check-output"]
show("leak", rec, leak, tables["leak"])
cfg = rec["model_config"]
assert (cfg["layers"], cfg["d_model"], rec["batch_size"], rec["cap_bytes"] / GiB, rec["steps"]) == (4, 512, 8, 5, 60)
assert leak.position["phase"] == "backward" and rec["oom"]["step"] + 1 == 30

# %% [markdown]
# The first advice is to stop keeping the tensors, and it names the line that keeps them. Its run
# (`no_leak`) got through all 60 steps. Without the leak the step still makes the tensors it used to keep
# (here its logits), and lets them go at the step's end: the predicted peak is within a few percent of what
# that run reserved, and with almost 4 GiB of margin the answer does not depend on it. Every other fix **leaves
# the leak**, so the advice does not say "fits": it says at which step the OOM comes back. Half the batch
# halves what leaks each step, and the predicted step lies after the 60 that were run, so that run finished.
# Its peak still grew every step, by half of what the full batch leaked, and that measured growth,
# extrapolated to the cap, lands within a few steps of the model's. Checkpointing leaves the full leak: the
# OOM is predicted back a few steps after the original one, and its run died within a few steps of that.

# %% tags=["nbval-check-output"]
t = tables["leak"].set_index("fix")
first = leak.advice[0]
assert first["id"] == "remove_leak" and first["what_if"]["fits"] and "oom_whatif_models.py:" in first["text"]
assert t.loc["no_leak", "run"] == "ran" and abs(t.loc["no_leak", "error"]) < 0.10       # within 10%
assert first["what_if"]["margin_bytes"] > 3.5 * GiB
half = next(x for x in leak.advice if x["id"] == "batch")
assert not half["what_if"]["fits"] and half["batch_fraction"] is None and "cannot fix a leak" in half["text"]
run = next(f for f in rec["fixes"] if f["id"] == "batch_1_of_2")
growth = int(np.median(np.diff(run["step_max_allocated"])))        # bytes a step, measured
back_at = len(run["step_max_allocated"]) + (rec["cap_bytes"] - run["step_max_allocated"][-1]) / growth
print(f"half the batch: ran {run['steps_done']} steps; its peak grew {fb(growth)} a step; extrapolated to the cap "
      f"the OOM returns near step {back_at:.0f}, predicted {half['oom_returns_at_step']}")
full = next(f for f in rec["fixes"] if f["id"] == "no_cap")               # the full batch, leaking, no cap
assert 2 * growth == int(np.median(np.diff(full["step_max_allocated"])))
ck = next(x for x in leak.advice if x["id"] == "checkpointing")
ck_run = next(f for f in rec["fixes"] if f["id"] == "checkpointing")
assert run["ran"] and half["oom_returns_at_step"] > rec["steps"] and abs(back_at - half["oom_returns_at_step"]) <= 3
assert not ck_run["ran"] and abs(ck["oom_returns_at_step"] - (ck_run["oom_step"] + 1)) <= 3
assert 0 < ck["oom_returns_at_step"] - (rec["oom"]["step"] + 1) <= 6
print(f"checkpointing: predicted back at step {ck['oom_returns_at_step']}, {t.loc['checkpointing', 'run']}")

# %% [markdown]
# Two rows need reading with care. `bigger_gpu` "fits" is the need of the step *at the OOM*: the run with no cap
# went on leaking, to the reserved peak in the table's last row, so a bigger GPU is a delay too. And the
# batch rows other than half the batch have no prediction: the advice speaks of half the batch only.

# %% [markdown]
# ### AdamW's first step: no batch is small enough
#
# A 10-block d=2048 model (2 GiB of fp32 parameters), batch 4 x 128 tokens, under a 6 GiB cap. The forward
# and backward fit; AdamW makes its two states (2 x the parameters) lazily in its first `step()`, and that is
# where it died.

# %% tags=["nbval-ignore-output"]
rec_opt, a_opt, opt = whatif["optimizer_first_step"]
display(HTML(advice_html(opt.advice, headline=f"Out of memory: {opt.cause} (optimizer step)")))

# %% tags=["nbval-check-output"]
show("optimizer_first_step", rec_opt, opt, tables["optimizer_first_step"])
cfg = rec_opt["model_config"]
assert (cfg["layers"], cfg["d_model"], rec_opt["batch_size"], rec_opt["seq_len"], rec_opt["cap_bytes"] / GiB) == \
    (10, 2048, 4, 128, 6)
assert abs(rec_opt["parameter_bytes"] / GiB - 2) < 0.01 and rec_opt["oom"]["phase"] == "optimizer"

# %% [markdown]
# Parameters, gradients and two AdamW states are 4 x 2 GiB, more than the cap before a single activation, so
# the batch advice has `batch_fraction` 0: a smaller batch cannot fix it, and batch 1 died in the same
# place. (`zero_grad(set_to_none=True)` right after the step was run too and died: the advice does not offer
# it, since no gradient was alive in the forward.) Plain SGD keeps no state: predicted to fit, it ran, and
# its predicted peak is within 10% of its run's. SGD with momentum (one state), the fused AdamW and
# `foreach=False` (fewer temporaries, the same two states) are each predicted not to fit, and each died in
# the first step. The first item on the card, 8-bit Adam, could not be checked: the recorder does not
# install bitsandbytes. Adafactor (factored state) ran, but no advice models it.

# %% tags=["nbval-check-output"]
t = tables["optimizer_first_step"].set_index("fix")
items = {x["id"]: x for x in opt.advice}
assert opt.position["phase"] == "optimizer" and 4 * rec_opt["parameter_bytes"] > rec_opt["cap_bytes"]
assert items["batch"]["batch_fraction"] == 0.0 and "cannot fix this" in items["batch"]["text"]
assert t.loc["batch_1_of_4", "run"] == "OOM at step 1" and rec_opt["batch_search"]["smallest_failed"] == 1
assert next(f for f in rec_opt["fixes"] if f["id"] == "batch_1_of_4")["oom"]["phase"] == "optimizer"
assert "zero_grad_set_to_none" not in items and t.loc["zero_grad_none", "run"] == "OOM at step 1"
t_sgd_ran = t.loc["sgd", "run"] == "ran"
assert items["optimizer_sgd"]["what_if"]["fits"] and t_sgd_ran and abs(t.loc["sgd", "error"]) < 0.10
for fix in ("sgd_momentum", "adamw_fused", "adamw_foreach_off"):   # predicted not to fit, and each died
    assert t.loc[fix, "predicted"] != "fits" and t.loc[fix, "run"].startswith("OOM") and t.loc[fix, "agree"]
assert opt.advice[0]["id"] == "optimizer_adam8bit" and "optimizer_adam8bit" not in set(t["advice"])  # not run
assert t.loc["adafactor", "predicted"] == "not modelled" and t.loc["adafactor", "run"] == "ran"
print(f"parameters + gradients + 2 states: {fb(4 * rec_opt['parameter_bytes'])} > cap {fb(rec_opt['cap_bytes'])}; "
      f"SGD: predicted {fb(items['optimizer_sgd']['what_if']['peak_if_fixed_bytes'])}, ran at "
      f"{fb(next(f for f in rec_opt['fixes'] if f['id'] == 'sgd')['max_memory_reserved'])} reserved")

# %% [markdown]
# ### Activations in the first forward: the part after the blocks was never seen
#
# An 8-block d=1024 model, batch 24 x 512 tokens, AdamW, under a 6 GiB cap: it died in the 8th block of its
# first forward, so the post-mortem never saw a backward or an optimizer step and extrapolates both.

# %% tags=["nbval-ignore-output"]
rec_act, a_act, act = whatif["activations"]
display(HTML(advice_html(act.advice, headline=f"Out of memory: {act.cause} (activations)")))

# %% tags=["nbval-check-output"]
show("activations", rec_act, act, tables["activations"])
cfg = rec_act["model_config"]
assert (cfg["layers"], cfg["d_model"], rec_act["batch_size"], rec_act["seq_len"], rec_act["cap_bytes"] / GiB) == \
    (8, 1024, 24, 512, 6)
assert rec_act["oom"]["detail"] == "blocks.7" and rec_act["oom"]["step"] == 0     # the 8th block, first forward

# %% [markdown]
# Checkpointing each block, the first advice, fits with gigabytes to spare, ran, and its predicted peak is
# within 10% of the run's. The batch is the harder question. The OOM hit in the last block of the first
# forward, so what comes after the blocks (the final norm, the logits and the loss, where the real step
# peaks) is not in the history. The model does not leave it out: it reads its shapes from the parameters
# built after the blocks (a norm as wide as the blocks' norms, a 32 MiB head weight) and the blocks' output,
# and adds the norm, the logits, a copy of them in the loss and the log-softmax. The estimate and how it was
# made are in the JSON (`step_model.unseen_after_blocks`) and in every item's evidence. With it, the memory
# each sample adds is within a few percent of the runs' (below: the replay's peak allocated per sample
# against the runs' `max_memory_allocated`), and the batch advice is the batch the recorder's search found.

# %% tags=["nbval-check-output"]
t = tables["activations"].set_index("fix")
batch_item = next(x for x in act.advice if x["id"] == "batch")
search = rec_act["batch_search"]
cap = rec_act["cap_bytes"]
unseen = act.step_model["unseen_after_blocks"]
print(f"after the blocks (not in the history): {fb(unseen['bytes'])} at batch {rec_act['batch_size']}")
assert act.advice[0]["id"] == "checkpointing" and t.loc["checkpointing", "run"] == "ran"
assert abs(t.loc["checkpointing", "error"]) < 0.10 and act.advice[0]["what_if"]["margin_bytes"] > 2 * GiB
assert unseen["bytes"] > 1 * GiB and "head" in unseen["how"]
print(f"batch advice {batch_item['largest_batch']} (fraction {batch_item['batch_fraction']:.3f}), margin "
      f"{fb(batch_item['what_if']['margin_bytes'])} = {batch_item['what_if']['margin_bytes'] / cap:.1%} of the cap; "
      f"the runs: {search['largest_ran']} ran, {search['smallest_failed']} failed")
assert batch_item["largest_batch"] == search["largest_ran"] and search["smallest_failed"] == search["largest_ran"] + 1

model_act = step_memory_model(a_act, act, rec_act["batch_size"])
exp_act = bool(act.allocator_settings.get("expandable_segments"))
lo, hi = (next(f for f in rec_act["fixes"] if f["id"] == i) for i in ("batch_1_of_4", "batch_14"))
b_lo, b_hi = lo["change"]["batch_size"], hi["change"]["batch_size"]
pa = {b: replay_change(model_act, Change(batch_fraction=b / rec_act["batch_size"]), exp_act)["peak_allocated_bytes"]
      for b in (b_lo, b_hi)}
slope_pred = (pa[b_hi] - pa[b_lo]) / (b_hi - b_lo)
slope_run = (hi["max_memory_allocated"] - lo["max_memory_allocated"]) / (b_hi - b_lo)
print(f"per sample, batch {b_lo} to {b_hi}: replayed {fb(slope_pred)}, runs {fb(slope_run)} "
      f"({slope_pred / slope_run - 1:+.1%})")
assert abs(slope_pred / slope_run - 1) < 0.05                              # within a few percent

ran_at = {f["change"]["batch_size"]: f["ran"] for f in rec_act["fixes"] if recorder_fix_advice(f["change"]) == "batch"}
print("batch  predicted peak  fits  run")
for b in range(12, 18):
    r = replay_change(model_act, Change(batch_fraction=b / rec_act["batch_size"]), exp_act)
    print(f"{b:>5}  {fb(r['peak_bytes']):>14}  {'yes' if r['fits'] else 'no':>4}  "
          + {True: "ran", False: "OOM", None: ""}[ran_at.get(b)])
    if ran_at.get(b) is not None:
        assert r["fits"] == ran_at[b], b                                  # every batch that was run

# %% [markdown]
# The advised batch ran, with a margin of a few percent of the cap. `docs/memory.md` states the rule: treat
# a fix predicted to fit with a margin under about 5% of the cap as borderline. The estimate of the unseen
# part is a model too: a language model's head and loss, read from tensor sizes. When the parameters do not
# give those shapes (no norm as wide as the blocks', no square weight in the blocks), the part after the
# blocks is not counted, `unseen_after_blocks.bytes` is null and the evidence says so: then a `fits` with a
# small margin is a guess.

# %% [markdown]
# ### What the three recordings say about the what-if
#
# Every fix that was run, with a prediction, across the three scenarios:

# %% tags=["nbval-check-output"]
allrows = pd.concat([tables[n].assign(scenario=n) for n in SCENARIOS])
judged = allrows[allrows["agree"].notna()]
wrong = judged[~judged["agree"].astype(bool)]
errs = allrows.dropna(subset=["error"])
print(f"{len(judged)} fixes run with a prediction; the prediction matched the run in {int(judged['agree'].sum())}; "
      f"wrong: {', '.join(wrong['scenario'] + '/' + wrong['fix'])}")
print(f"predicted peak vs max_memory_reserved of the runs: {len(errs)} compared, errors "
      f"{errs['error'].min():+.1%} .. {errs['error'].max():+.1%}")
assert len(judged) >= 20 and wrong.empty                                         # every prediction as it ran
assert (errs["error"].abs() < 0.10).all()                                        # every one within 10%

# %% [markdown]
# In the three recordings every fix that was run did what its advice item said (fits, or the step at which
# a leak's OOM returns), and the predicted peaks of the runs that got through are within 10% of torch's
# `max_memory_reserved`, some above and some below. Still read `fits` together with `margin_bytes`: a fix
# with a few percent of the cap to spare is a prediction the runs bore out; one that squeezes under the cap
# is a guess. The other three scenarios of the recording (fragmentation, parameters made before the history
# began, expandable segments) are in the repository's test data and in `benchmarks/RESULTS.md` ("Memory
# what-if against fixes that ran"), with how each held.

# %% [markdown]
# ### Two models, checked apart: the allocator, then the step
#
# A what-if is two models in a row: the step model writes the fixed step's allocations and frees, and the
# allocator model (segments, rounding, the cache, the cap) turns them into a peak. When a prediction is off,
# which one is it? The checkpointing fix's run kept its own allocator history
# (`activations.fix_checkpointing.snapshot.pickle.gz`): replay those events, the ones torch really saw,
# through the allocator model under the same cap (`replay_recorded`). What is left between that and the
# what-if is the step model's.

# %% tags=["nbval-check-output"]
from workbench.analysis.memory.whatif_replay import replay_recorded

act_rec, _, act_rep = whatif["activations"]
ck_run = next(f for f in act_rec["fixes"] if f["id"] == "checkpointing")
own = analyze_snapshot(load_snapshot(os.path.relpath(WHATIF / ck_run["history"])))
real = replay_recorded(own, cap_bytes=act_rec["cap_bytes"])           # the run's events, the allocator model
ck_item = next(x for x in act_rep.advice if x["id"] == "checkpointing")  # the step model's events, the same allocator
ck_peak = ck_run["max_memory_reserved"]
print(f"torch's max_memory_reserved of the checkpointing run: {fb(ck_peak)}")
print(f"its own {len(own.allocs)} allocations replayed:            {fb(real.peak_reserved_bytes)} "
      f"({real.peak_reserved_bytes / ck_peak - 1:+.1%})")
print(f"the what-if, from the OOM's recording:       {fb(ck_item['what_if']['peak_if_fixed_bytes'])} "
      f"({ck_item['what_if']['peak_if_fixed_bytes'] / ck_peak - 1:+.1%})")
allocator_err = real.peak_reserved_bytes / ck_peak - 1
whatif_err = ck_item["what_if"]["peak_if_fixed_bytes"] / ck_peak - 1
assert real.fits and -0.06 < allocator_err < 0 and whatif_err < allocator_err < 0         # most of the miss: the allocator

# %% [markdown]
# Fed the events torch recorded, the allocator model is already 5% under torch's peak here, so most of the
# what-if's miss is the allocator's, and the step model's own share is the rest. What the allocator model
# does not know is where the CUDA driver put each segment: among free blocks of the same size torch takes
# the one at the lowest address, and which block that is decides whether a later tensor finds room. Across
# the fix runs most replay to the byte and the largest miss is this one. (Under a cap with
# `max_split_size`, matching torch also took its own release order: only enough large cached segments
# first, then every free one.)
# The repository's test replays each of the 29 fix runs that kept a history this way, within 6%.

# %% [markdown]
# ## 6 · Reproduce it live (GPU only)
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
# ## Exercise 2: the fix to try first, from the advice alone
#
# Before running anything: for each of the three recorded scenarios of section 5, which fix would you try
# first? The advice list is ordered cheapest change first. Take the first item that fits with at least 5%
# of the cap to spare (`what_if["margin_bytes"]`), leaving out 8-bit Adam (no bitsandbytes here). Write its
# advice `id`; the check then reads what the runs did.

# %%
MY_PICKS = {"leak": "remove_leak", "optimizer_first_step": "optimizer_sgd", "activations": "checkpointing"}

# %% tags=["nbval-check-output"]
for name in SCENARIOS:
    rec_n, _, rep_n = whatif[name]
    pick = next(x for x in rep_n.advice if x["what_if"]["fits"] and x["id"] != "optimizer_adam8bit"
                and x["what_if"]["margin_bytes"] >= 0.05 * x["what_if"]["cap_bytes"])
    runs = [f for f in rec_n["fixes"] if recorder_fix_advice(f["change"]) == pick["id"]]
    print(f"{name:<21} {pick['id']:<14} margin {fb(pick['what_if']['margin_bytes']):>10}  "
          f"runs: {', '.join(f['id'] + (' ran' if f['ran'] else ' OOM') for f in runs)}  "
          + ("right" if MY_PICKS.get(name) == pick["id"] else "look again"))
    # the solution: the first item with a 5% margin is a fix whose run got through every step
    assert runs and all(f["ran"] for f in runs), name

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
assert leak.advice[0]["id"] == "remove_leak" and half["oom_returns_at_step"] > rec["steps"]  # a leak: remove it
assert items["batch"]["batch_fraction"] == 0.0 and t_sgd_ran                               # state: a lighter optimizer
assert batch_item["largest_batch"] == search["largest_ran"] and unseen["bytes"]            # the unseen head, estimated
print(f"on the H100 recordings: {int(judged['agree'].sum())} of {len(judged)} fixes ran as predicted; an OOM in "
      f"the first forward counts the part after the blocks it never saw ({fb(unseen['bytes'])})")

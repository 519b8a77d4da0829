# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 34 · Batch size, headroom and gradient accumulation
#
# Three questions every training run meets:
#
# 1. **How do memory and throughput grow with the batch?** Weights, gradients and optimizer state are
#    fixed; activations grow linearly with the batch. Throughput grows while the device is not yet
#    full, then flattens.
# 2. **What is the largest batch that fits?** The workbench answers it two ways: by running steps
#    until one does not fit (`find_max_batch_size`, the harness), or without running anything, from
#    the estimator's model of the CUDA caching allocator (`largest_batch_that_fits`).
# 3. **What if the batch I want does not fit?** *Gradient accumulation*: run `k` micro-batches of
#    `B/k` samples, add up their gradients, step once. The update is the same as for batch `B` (up
#    to rounding); the activations are those of one micro-batch; the price is `k` smaller, less
#    efficient passes.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import os, warnings
from pathlib import Path
import numpy as np
import pandas as pd
import torch
from workbench import samples
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# %%
import torch.nn.functional as F
from workbench.capture.models import Block, EvenBlock, OddBlock, LM  # the H200 runs' transformer, sizes as arguments


from workbench import Configuration, Workload
from workbench.capture.configurations import batch_size_sweep
from workbench import run_experiment
from workbench.capture.runner import find_max_batch_size

VOCAB, SEQ = 128, 32


def batch(n, device):
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(model, b):
    x, y = b
    return F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))


small_lm = lambda: LM(layers=4, d=64, heads=4, vocab=VOCAB)
work = Workload(model=small_lm, batch=batch, loss=lm_loss, batch_size=8, tokens_per_sample=SEQ)

# %% [markdown]
# ## 1 · Memory and throughput against the batch size (measured)
#
# `batch_size_sweep` makes one configuration per batch size; the harness builds each from the same
# weights and measures step time and peak memory. On a CPU the peak comes from `torch.profiler`'s
# allocation records, split into what stays resident and the step's own peak (`resident_bytes`,
# `step_peak_bytes`); on a GPU from the CUDA caching allocator's counters (`peak_allocated_bytes`,
# `peak_reserved_bytes`). The table shows the columns of the mode this notebook runs in.

# %%
from workbench.analysis import baseline_ratios

sweep = run_experiment(work, batch_size_sweep([4, 8, 16, 32]), steps=3, warmup=1, check_steps=0,
                       energy=False, progress=False, name="batch sweep")
s = baseline_ratios(sweep.ledger, baseline="bs=4").set_index("configuration")
mem = ({"peak_mib": "peak_allocated_bytes", "reserved_mib": "peak_reserved_bytes"} if GPU else
       {"peak_mib": "peak_allocated_bytes", "resident_mib": "resident_bytes", "step_peak_mib": "step_peak_bytes"})
s.assign(**{k: s[v] / MIB for k, v in mem.items()})[["batch_size", "step_ms_median", "samples_per_s", *mem]]

# %% [markdown]
# `resident_mib` (weights, gradients' buffers and AdamW's two moments) does not move; the step's own
# peak (`step_peak_mib`, mostly activations) doubles with the batch. (On a GPU, `peak_mib` also holds
# cuBLAS's workspaces, a fixed 64 MiB or so on an H200, and `reserved_mib` what the allocator kept
# from the driver.) A straight line through the points gives the **cost of one more sample**:

# %%
per_sample = np.polyfit(s["batch_size"].astype(float), s["peak_allocated_bytes"].astype(float), 1)
fixed_mib, per_sample_kib = per_sample[1] / MIB, per_sample[0] / 2**10
print(f"peak ≈ {fixed_mib:.1f} MiB + {per_sample_kib:.0f} KiB per sample (fit over batch 4..32)")

# %% tags=["nbval-ignore-output"]
from workbench import ComparePanel

ComparePanel(sweep, baseline="bs=4")

# %% [markdown]
# ## 2 · The largest batch that fits
#
# **Measured**: `find_max_batch_size` doubles the batch until a try does not fit, then bisects. On a
# GPU a try fails with a real out-of-memory error (caught, memory freed); on a CPU, where memory
# only runs out when the machine swaps, it needs a budget. Here: 20 MiB (on a GPU, 96 MiB: there the
# peak also holds cuBLAS's workspaces, which alone exceed 20 MiB).

# %%
BUDGET = (96 if GPU else 20) * MIB
room = find_max_batch_size(work, memory_budget_bytes=BUDGET, start=8, progress=False)
print(room)
room.tries.assign(peak_mib=room.tries["peak_allocated_bytes"] / MIB)[["batch_size", "fits", "peak_mib", "reason"]]

# %% [markdown]
# The largest batch's peak fills nearly all of the budget: a search always stops at the last batch that
# ran. How much of that batch a long run can use is a separate question, with one rule across the lessons
# (`docs/memory.md`, "Headroom: which batch to run"; lesson 35 has the measurements behind it), applied by
# the same function in lessons 21, 34 and 35:

# %%
from workbench.lessons import HEADROOM_PCT, headroom_rule

rule = headroom_rule(room.batch_size, room.peak_allocated_bytes, BUDGET)
print(rule["text"])
assert 0.8 < rule["fill"] <= 1.0 and rule["batch"] == room.batch_size * HEADROOM_PCT // 100

# %% [markdown]
# **Estimated for CUDA**: `largest_batch_that_fits` asks the estimator instead (fake tensors: no memory
# is used, nothing runs on a device), with the caching allocator's rounding and the cuBLAS workspace
# that a real GPU would add (two of 32 MiB: the forward's and the backward's). Reserved memory is an
# interval (`peak_reserved_range`: what the estimate could not measure, such as the caching allocator's
# segment reuse, widens it), and a batch "fits" when the interval's high end is under the budget. For the
# same model under a 128 MiB budget (searching batch sizes 32 to 128):

# %%
import gc
from workbench import largest_batch_that_fits

gc.freeze()  # each estimate runs gc.collect(); keep this notebook's long-lived objects out of those scans (~2x faster)

adamw = lambda params: torch.optim.AdamW(params, lr=1e-3)
inputs = lambda n: torch.randint(0, VOCAB, (n, SEQ))
fit, fit_est = largest_batch_that_fits(small_lm, inputs, adamw, budget_bytes=128 * MIB, low=32, high=128)
print(f"largest batch in 128 MiB of a GPU: {fit} (reserved {fit_est.peak_reserved_bytes / MIB:.0f} MiB, at most "
      f"{fit_est.peak_reserved_range[1] / MIB:.0f} MiB: "
      f"{fit_est.by_category['activations'] / MIB:.0f} MiB activations, "
      f"{fit_est.by_category['workspace'] / MIB:.0f} MiB cuBLAS workspace)")

# %% [markdown]
# ## 3 · Gradient accumulation
#
# The harness runs one `loss.backward()` and one optimizer step per training step. To accumulate, the
# loss function below runs the first `k-1` micro-batches' backward itself and returns the last one's
# loss (plus the earlier micro-batches' loss as a constant, so that the reported value is the loss
# of the whole batch); the harness's `backward()` then adds the last micro-batch's gradients, and the
# optimizer steps once. A `Configuration` whose `transform` sets `k` on the model picks the micro-batch
# count, so all of them run in one experiment, from the same weights on the same batches, and the
# numerical check compares their gradients with the single big batch.

# %%
EFFECTIVE = 32


def accumulating_loss(model, b):
    x, y = b
    k = getattr(model, "accumulation_steps", 1)
    done = 0.0
    chunks = list(zip(x.chunk(k), y.chunk(k)))
    for xs, ys in chunks[:-1]:
        micro = lm_loss(model, (xs, ys)) / k
        micro.backward()                        # gradients add up in .grad; activations are freed here
        done += micro.detach()
    xs, ys = chunks[-1]
    return lm_loss(model, (xs, ys)) / k + done  # value: the whole batch's loss; gradient: the last micro-batch


def accumulate(k: int) -> Configuration:
    def transform(model, device):
        model.accumulation_steps = k
        return model
    name = f"batch {EFFECTIVE}" if k == 1 else f"{EFFECTIVE // k} x {k} accumulated"
    return Configuration(name, transform=transform, description=f"{k} micro-batches of {EFFECTIVE // k}")


accum_work = Workload(model=small_lm, batch=batch, loss=accumulating_loss, batch_size=EFFECTIVE, tokens_per_sample=SEQ)


def accumulation_experiment(ks=(1, 2, 8)):
    configs = [accumulate(k) for k in ks]
    return run_experiment(accum_work, configs, reference=configs[0], steps=3, warmup=1, check_steps=1,
                          energy=False, progress=False, name="accumulation")


acc = accumulation_experiment()
a = baseline_ratios(acc.ledger, baseline=f"batch {EFFECTIVE}").set_index("configuration")
a.assign(peak_mib=a["peak_allocated_bytes"] / MIB)[
    ["step_ms_median", "step_time_ratio", "peak_mib", "peak_allocated_ratio", "check_verdict", "check_grad_max_rel_err"]]

# %% [markdown]
# The gradients agree with the big batch to float32 rounding (`check_verdict` ok), the peak falls
# towards the fixed part as `k` grows, and the step takes longer: each micro-batch pays the per-call
# overheads again on matrices a `k`-th the size. On a GPU that price is higher still: a small
# micro-batch can leave most of the SMs idle.
#
# ### Exercise: pick the micro-batch
#
# Choose the number of micro-batches; the experiment re-runs (against one batch of 32) and the
# `ComparePanel` shows step time and peak memory with their ratios. Where does the memory stop
# falling? What does the last halving of memory cost in time?

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets

k_pick = widgets.SelectionSlider(options=[2, 4, 8, 16, 32], value=8, description="micro-batches",
                                 continuous_update=False)
acc_view = widgets.VBox([ComparePanel(acc, baseline=f"batch {EFFECTIVE}")])
k_pick.observe(lambda ch: setattr(acc_view, "children",
                                  [ComparePanel(accumulation_experiment((1, ch["new"])), baseline=f"batch {EFFECTIVE}")]),
               names="value")
widgets.VBox([k_pick, acc_view])

# %% [markdown]
# Your answer, then the check (it runs 1, 2, 4, 8, 16 and 32 micro-batches in one experiment and reads the
# peaks): from how many micro-batches on does one more doubling save less than a quarter of the peak?

# %%
MY_FLAT_FROM = 8             # micro-batches: the first count whose doubling from the last saved < 25 % of the peak

# %% tags=["nbval-check-output"]
ks = (1, 2, 4, 8, 16, 32)
more = baseline_ratios(accumulation_experiment(ks).ledger, baseline=f"batch {EFFECTIVE}").set_index("configuration")
peaks = pd.Series([more.loc[accumulate(k).name, "peak_allocated_bytes"] for k in ks], index=ks, dtype=float)
saved = 1 - peaks / peaks.shift(1)                          # what each doubling saves
flat_from = next((k for k in ks[1:] if saved[k] < 0.25), None)
print(pd.DataFrame({"peak MiB": (peaks / MIB).round(2), "saved by the doubling": saved.round(2)}).to_string())
print(f"a doubling saves less than 25% from {flat_from} micro-batches on:",
      "right" if MY_FLAT_FROM == flat_from else "look again")
# the solution: each doubling saves less than the one before; the peak falls towards the fixed part
# (weights, gradients, AdamW state) and stays above it
assert peaks.is_monotonic_decreasing and flat_from is not None
assert list(more["check_verdict"]) == ["ok"] * len(ks)
if not GPU:                                                 # the CPU ledger has the fixed part on its own
    assert saved.dropna().is_monotonic_decreasing and peaks[32] > s["resident_bytes"].iloc[0]

# %% [markdown]
# ## 4 · At H200 scale: estimates, and a live search on a GPU
#
# The H200 transformer of notebooks 30 and 31 (12 layers, d=1024, batch 32×512, fp32, AdamW): its peak
# is in the harness's H200 ledger. The estimator predicts that peak, and the one of the same effective batch run
# as 4 micro-batches of 8, without a GPU (each estimate takes a few seconds here):

# %% tags=["nbval-check-output"]
from workbench import estimate
from workbench.io import load_ledger

h200 = load_ledger(RESULTS / "h200_harness.ledger.json").set_index("configuration")
recorded = int(h200.loc["fp32", "peak_allocated_bytes"])
big_lm = lambda: LM(layers=12, d=1024, heads=16, vocab=2048)
big_inputs = lambda n: torch.randint(0, 2048, (n, 512))
fused_adamw = lambda params: torch.optim.AdamW(params, lr=1e-4, fused=True)
h200_est = {n: estimate(big_lm, big_inputs, fused_adamw, batch_size=n) for n in (32, 8)}
print(f"batch 32: estimated {h200_est[32].peak_allocated_bytes / GIB:.2f} GiB allocated "
      f"(recorded on the H200: {recorded / GIB:.2f} GiB)")
print(f"4 x 8 accumulated: estimated {h200_est[8].peak_allocated_bytes / GIB:.2f} GiB "
      f"(activations {h200_est[32].by_category['activations'] / GIB:.2f} -> {h200_est[8].by_category['activations'] / GIB:.2f} GiB)")

# %% [markdown]
# With a CUDA device, the harness searches the real largest batch of that model (a real out-of-memory
# error ends each failed try; a few minutes on an H200), in fp32 and with bf16 autocast. Skipped on a CPU.

# %% tags=["nbval-skip"]
if GPU:
    big = Workload(model=big_lm, batch=lambda n, device: (lambda t: (t[:, :-1], t[:, 1:]))(torch.randint(0, 2048, (n, 513), device=device)),
                   loss=lambda m, b: F.cross_entropy(m(b[0]).float().reshape(-1, 2048), b[1].reshape(-1)),
                   optimizer=fused_adamw, batch_size=32, tokens_per_sample=512)
    from workbench.capture.configurations import amp_bf16
    for config in (None, amp_bf16()):
        found = find_max_batch_size(big, config, start=32, progress=False)
        print(found)
        print("   ", headroom_rule(found.batch_size, found.peak_allocated_bytes, found.limit_bytes)["text"])
        assert found.batch_size >= 32 and found.peak_allocated_bytes <= found.limit_bytes   # batch 32 ran on the H200

# %% [markdown]
# ## Takeaways
#
# - Peak memory is a fixed part plus a per-sample part; fit a line to two or three batch sizes and
#   you know the largest batch. `find_max_batch_size` (measured) and `largest_batch_that_fits` (estimated,
#   no GPU needed) find it for you. Which share of it to run is `docs/memory.md`'s headroom rule.
# - Gradient accumulation buys the big batch's update at the small batch's activation memory, and
#   costs time: more, smaller passes.

# %%
pk = s["peak_allocated_bytes"].astype(float)
assert pk.is_monotonic_increasing and per_sample[0] > 0
if not GPU:                                        # the CPU ledger splits the peak: the resident part is fixed
    assert s["resident_bytes"].nunique() == 1
assert room.peak_allocated_bytes <= BUDGET and (~room.tries["fits"]).any()
assert room.tries.loc[room.tries["batch_size"] == room.batch_size + 1, "fits"].eq(False).all()
assert 32 <= fit < 128 and fit_est.peak_reserved_range[1] <= 128 * MIB
ap = a["peak_allocated_bytes"].astype(float)
assert ap.is_monotonic_decreasing and list(a["check_verdict"]) == ["ok"] * len(a)
assert abs(h200_est[32].peak_allocated_bytes / recorded - 1) < 0.1       # the estimator against the H200
assert h200_est[8].peak_allocated_bytes < 0.5 * h200_est[32].peak_allocated_bytes
print(f"largest batch under {BUDGET // MIB} MiB on this {'GPU' if GPU else 'CPU'}: {room.batch_size}; "
      f"4 x 8 accumulated: peak x{a.loc['4 x 8 accumulated', 'peak_allocated_ratio']:.2f}")

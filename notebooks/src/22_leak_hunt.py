# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 22 · A leak hunt
#
# Python frees a tensor when nothing refers to it any more. A "leak" in PyTorch is almost always
# something that *still refers to it*: a list, a dict of metrics, a running total. The classic one:
#
# ```python
# val_losses.append(criterion(model(x_val), y_val))   # for a plot at the end of the epoch
# ```
#
# Outside `torch.no_grad()`, that loss carries its **autograd graph**, and the graph holds every
# activation the forward pass saved for a backward pass that never comes. Each step adds a forward
# pass's worth of activations; after a few thousand steps: out of memory, long after the line that
# caused it. The signature is memory that grows **step by step** and never comes back down.

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
from torch import nn
from workbench.capture.environment import measure_cpu_peak_bytes
from workbench import format_bytes as fb

# with its index: torch.profiler's memory timeline matches devices exactly ('cuda' != 'cuda:0')
DEVICE = torch.device("cuda", torch.cuda.current_device()) if GPU else torch.device("cpu")
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10)).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 256, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE)
x_val, y_val = torch.randn(256, 256, device=DEVICE), torch.randint(0, 10, (256,), device=DEVICE)
criterion = nn.CrossEntropyLoss()

def train_step(val_losses, keep="graph"):
    loss = criterion(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if keep == "graph":          # the bug: the loss keeps its graph and the graph its activations
        val_losses.append(criterion(model(x_val), y_val))
    else:                        # the fix: no graph for evaluation, keep a plain number
        with torch.no_grad():
            val_losses.append(criterion(model(x_val), y_val).item())


# %% [markdown]
# ## 1 · Does memory grow with the number of steps?
#
# The first question of any leak hunt. `measure_cpu_peak_bytes` (from the workbench's experiment harness)
# runs a block under torch.profiler's memory accounting (`profile_memory=True`) and returns the peak
# above what was live when it started. On a GPU the CUDA caching allocator keeps that number itself:
# reset its peak counter, run, read `max_memory_allocated` minus what was allocated before.
# Without a leak, the peak of 10 steps equals the peak of 2.
#
# Every measurement starts from the same state, with no gradients live: the profiler cannot see the free
# of a tensor allocated before it started, so gradients left over from an earlier step would count their
# re-creation but not their release, and the first measurement would read a few MiB more than the rest.

# %%
def peak_of(steps, keep):
    opt.zero_grad(set_to_none=True)   # the same start for every measurement: no gradients live
    def run():
        kept = []
        for _ in range(steps):
            train_step(kept, keep)
        return kept          # returned, so nothing is freed before the block ends
    if GPU:                  # the CUDA allocator's own peak counter, above what was allocated before
        torch.cuda.synchronize(DEVICE)
        before = torch.cuda.memory_allocated(DEVICE)
        torch.cuda.reset_peak_memory_stats(DEVICE)
        kept = run()
        torch.cuda.synchronize(DEVICE)
        peak = torch.cuda.max_memory_allocated(DEVICE) - before
        del kept
        return peak
    return measure_cpu_peak_bytes(run)

train_step([], "number")     # warm-up: lazy initialisation is not the leak
leaky = {n: peak_of(n, "graph") for n in (2, 6, 10)}
for n, b in leaky.items():
    print(f"{n:>2} steps: peak {fb(b)}")

# %% [markdown]
# ## 2 · What grows? The timeline by category
#
# torch.profiler tracks every tensor through autograd and can export a **memory timeline by category**
# (parameters, gradients, optimizer state, activations, temporaries...); `workbench.io.profiler_memory.load_memory_timeline`
# reads the export into a DataFrame. We record 6 leaky steps and look at the categories at the end of each.
# The timeline's clock is the Unix clock in microseconds, so a `time.time_ns()` read in a short pause after
# each step marks where the step ended; the last sample before each mark is the state at that step's end.

# %% tags=["nbval-ignore-output"]
import tempfile, time
from pathlib import Path
from torch.profiler import ProfilerActivity, profile
from workbench.io.profiler_memory import load_memory_timeline

def record_timeline(keep, steps=6):
    """The memory timeline of `steps` steps, and the categories at the end of each step."""
    kept, step_ends_us = [], []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])
    with profile(activities=activities, profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        for _ in range(steps):
            train_step(kept, keep)
            if GPU:
                torch.cuda.synchronize(DEVICE)
            time.sleep(0.002)        # a pause with no allocation on either side of the mark
            step_ends_us.append(time.time_ns() // 1000)
            time.sleep(0.002)
    path = Path(tempfile.mkdtemp()) / "timeline.json"
    with warnings.catch_warnings():  # torch marks this export deprecated in favour of CUDA-only snapshots
        warnings.simplefilter("ignore", FutureWarning)
        prof.export_memory_timeline(str(path), device=str(DEVICE))  # 'cuda:0' or 'cpu'
    timeline = load_memory_timeline(path)
    cols = [c for c in timeline.columns if c.endswith("_bytes") and timeline[c].max() > 0]
    at_step_end = pd.DataFrame([timeline.loc[timeline["time_us"] <= t, cols].iloc[-1] for t in step_ends_us],
                               index=pd.RangeIndex(1, steps + 1, name="step"))
    return timeline, at_step_end, kept

timeline, at_step_end, kept = record_timeline("graph")
(at_step_end / 2**20).round(2).rename(columns=lambda c: c.replace("_bytes", "_MiB"))

# %% tags=["nbval-check-output"]
grow = at_step_end.iloc[-1] - at_step_end.iloc[0]
growth = grow["activations_bytes"] / 5
print("grows across the steps:", ", ".join(f"{c.replace('_bytes', '')} +{fb(v)}" for c, v in grow.items() if v > 2**20))
print("flat:", ", ".join(c.replace("_bytes", "") for c, v in grow.items() if v == 0))
print(f"activations kept per step: {fb(growth)}")

# %% [markdown]
# **Activations** climb every step while parameters stay flat: something keeps forward passes alive.
# 2 MiB a step is exactly what this MLP saves for backward on a validation batch: the two ReLU outputs,
# 256 x 1024 floats each. The peaks of section 1 grow by the same amount per step:

# %% tags=["nbval-check-output"]
per_step_peak = {(a, b): (leaky[b] - leaky[a]) / (b - a) for a, b in ((2, 6), (6, 10))}
print(", ".join(f"steps {a}->{b}: +{fb(v)} a step" for (a, b), v in per_step_peak.items()))
assert abs(growth - 256 * 1024 * 4 * 2) < 0.01 * growth                  # two ReLU outputs of 256 x 1024 floats
assert all(abs(v / growth - 1) < 0.05 for v in per_step_peak.values()), per_step_peak

# %% [markdown]
# What refers to them? Every kept loss has a `grad_fn`, the entry to a graph that still holds its saved
# tensors:

# %% tags=["nbval-check-output"]
print(len(kept), "kept losses; first one:", type(kept[0]).__name__, "with grad_fn", type(kept[0].grad_fn).__name__)

# %% [markdown]
# ## 3 · The fix, measured
#
# Evaluate under `torch.no_grad()` (no graph is built) and keep a plain number (`.item()`; or
# `.detach()` to keep a tensor without a graph; on a GPU, `.item()` every step is also a sync, see
# notebook 10: accumulate on the device and read every N steps).

# %%
fixed = {n: peak_of(n, "number") for n in (2, 6, 10)}
for n in (2, 6, 10):
    print(f"{n:>2} steps: leaky {fb(leaky[n]):>11}   fixed {fb(fixed[n]):>11}")
fixed_timeline, _, _ = record_timeline("number")
print("activations at the end, fixed:", fb(fixed_timeline["activations_bytes"].iloc[-1]))

# %% [markdown]
# ## 4 · On a GPU: the allocator's history finds the line
#
# On a CUDA device, `record_memory_history` records every allocation **with its Python stack**. The
# workbench's `memory_summary` groups the allocations that were made during the window and are still
# alive at its end by the line that made them; many survivors from one line, spread across the window,
# are a leak (`growing_allocations`), while parameters and optimizer state (made once and kept) are not.

# %% tags=["nbval-skip"]
if GPU:
    from workbench import record_memory_history
    from workbench.analysis.memory.oom import memory_summary
    from workbench import MemoryPanel

    folder = Path(tempfile.mkdtemp())
    kept_gpu = []
    with record_memory_history(folder / "leak.snapshot.pickle.gz") as rec:
        for _ in range(20):
            train_step(kept_gpu, "graph")
        torch.cuda.synchronize()
    leak_snap = rec.load()
    leak_findings = memory_summary(leak_snap)["findings"]
    for f in leak_findings:
        print(f"[{f['severity']}] {f['id']}: {f['message']}")
    assert "growing_allocations" in {f["id"] for f in leak_findings}   # the 20 kept graphs are found
    display(MemoryPanel(leak_snap, by="frame"))

# %% [markdown]
# On the shipped H200 training snapshot (a healthy run, three steps), the same check finds nothing to
# worry about: what survives the window is parameters and AdamW's state, created once.

# %% tags=["nbval-check-output"]
from workbench import samples
from workbench import load_snapshot
from workbench.analysis.memory.oom import analyze_snapshot
from workbench.analysis.memory.allocations import surviving_allocations

healthy = analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))
surv = surviving_allocations(healthy.allocs, healthy.labels)
print(surv[["frame", "count", "category", "leak_like"]].assign(MiB=(surv["bytes"] / 2**20).round(1)).to_string(index=False))

# %% [markdown]
# ## Exercise
#
# Choose how the loop keeps the validation loss, and how many steps to run: the workbench measures the
# peak each time. Which choices keep the peak flat as the steps grow?

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets

how = widgets.Dropdown(options=[("the loss, with its graph", "graph"), ("loss.item() under no_grad", "number")],
                       value="graph", description="keep")
steps = widgets.IntSlider(value=4, min=1, max=16, description="steps", continuous_update=False)
result = widgets.HTML()

def remeasure(change=None):
    b = peak_of(steps.value, how.value)
    result.value = f"peak over {steps.value} steps: <b>{fb(b)}</b>"

how.observe(remeasure, names="value")
steps.observe(remeasure, names="value")
remeasure()
widgets.VBox([widgets.HBox([how, steps]), result])

# %% [markdown]
# Your answer, then the check: which `keep` keeps the peak flat, and by how much does the other one grow
# from 4 steps to 12 (in MiB)?

# %%
MY_FLAT = "number"            # "graph" or "number"
MY_GROWTH_MIB = 16.0          # the other one's growth from 4 to 12 steps

# %% tags=["nbval-check-output"]
p4 = {k: peak_of(4, k) for k in ("graph", "number")}
p12 = {k: peak_of(12, k) for k in ("graph", "number")}
flat = min(p4, key=lambda k: p12[k] - p4[k])
grew = (p12["graph" if flat == "number" else "number"] - p4["graph" if flat == "number" else "number"]) / 2**20
print(f"flat: {flat} ({fb(p4[flat])} -> {fb(p12[flat])}); the other grew {grew:.2f} MiB:",
      "right" if MY_FLAT == flat and abs(MY_GROWTH_MIB - grew) < 0.1 * grew else "look again")
# the solution: a plain number keeps nothing; the kept graph adds its 2 MiB of activations every step
assert flat == "number" and p12["number"] <= 1.05 * p4["number"]
assert abs(grew / (8 * growth / 2**20) - 1) < 0.05

# %% [markdown]
# ## Takeaways

# %% tags=["nbval-check-output"]
assert leaky[10] > leaky[6] > leaky[2] and growth > 0        # the leak grows every step
assert fixed[10] <= fixed[2] * 1.05                          # fixed: flat
assert not surv["leak_like"].any()                           # the healthy H200 run: no leak
print(f"leak: +{growth / 2**20:.1f} MiB per step of kept activations; fixed: flat")

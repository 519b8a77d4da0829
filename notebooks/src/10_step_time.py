# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Where does the step's time go?
#
# A training step is slow for one of a handful of reasons, and a profile tells them apart, once the
# profiler itself is out of the way:
#
# 0. **the profiler**: every recorded op costs host time, more at higher detail (shapes, memory, Python
#    stacks). A step that launches many ops can run at half speed under the profiler, and its trace then
#    shows a GPU waiting for the *profiler* (notebook 00's H200 trace is such a case). So: time the step
#    without the profiler first, and profile at `detail="light"`;
# 1. **input-bound**: the model waits for the next batch (data loading, decoding, augmentation);
# 2. **launch-bound**: many tiny operations, each paying a fixed dispatch/launch cost;
# 3. **sync-bound**: the host stops to wait for the GPU (`.item()`, `.cpu()`, `print(loss)`) and the GPU
#    then waits for the host;
# 4. **compute-bound**: the good case; then precision and kernels matter (notebook 00's `fp32_matmul`).
#
# We profile a small training loop **for real** with `workbench.capture.profile_steps` (torch.profiler
# under the hood) on whatever device is here, read the tables from `workbench.analysis`, fix the
# problem, and compare before and after with the compare tools.

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
import itertools, tempfile, time
from pathlib import Path
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench import profile_steps
from workbench.analysis import op_summary, step_summary, findings, trace_diff, diagnose

DEVICE = "cuda" if GPU else "cpu"
TRACES = Path(tempfile.mkdtemp())  # traces go to a temporary folder, not into the repository


def sync():
    if GPU:
        torch.cuda.synchronize()


def median_ms(fn, n=200, warm=10):
    """The step timed without the profiler: median of n calls, the device synchronised after each."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


# %% [markdown]
# ## 0 · Time it before you profile it
#
# A small MLP and one fixed batch already on the device: a step with **no input pipeline**. Timed on its
# own (median of 200 steps), then profiled at light and at full detail (20 steps each); three rounds of
# the three in turn, so that load from elsewhere on the machine hits all three alike, and each setting's
# quietest round is the one reported (load only ever adds time):

# %%
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x0, y0 = torch.randn(16, 256, device=DEVICE), torch.randint(0, 10, (16,), device=DEVICE)

def step_no_input():
    loss = nn.functional.cross_entropy(model(x0), y0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()

rounds = {"none": [], "light": [], "full": []}
for i in range(3):
    rounds["none"].append(median_ms(step_no_input))
    for d in ("light", "full"):
        rounds[d].append(profile_steps(step_no_input, steps=20, detail=d, device=DEVICE, measure_cost=False,
                                       path=TRACES / f"no_input.{i}.{d}.pt.trace.json.gz", verbose=False,
                                       progress=False))
unprofiled_ms = min(rounds["none"])
profiled = {d: min(rounds[d], key=lambda r: r.step_ms_median) for d in ("light", "full")}
print(f"no profiler: {unprofiled_ms:.3f} ms/step")
for d, r in profiled.items():
    print(f"{d:>5} detail: {r.step_ms_median:.3f} ms/step ({r.step_ms_median / unprofiled_ms:.1f}x)")

# %% [markdown]
# The step did not change; only the recording did. Every recorded op costs host time, even at light
# detail; full detail adds each op's shapes, its memory events and the Python stack that called it, and
# costs more. On a step made of small ops that is comparable to the ops themselves. On a GPU the same host
# cost delays every launch, and the trace shows the GPU idle for no reason the program has. Two habits
# follow:
#
# - time the step unprofiled first (as above, or with CUDA events on a GPU). `profile_steps` times a few
#   steps before it records and writes the figure into the trace (`workbench_unprofiled_step_ms`), so
#   `diagnose` measures the profiler's cost instead of estimating it;
# - profile at `detail="light"` to find where the time goes; keep `"full"` for memory and stacks.
#
# Every profile in the rest of this notebook is light.

# %% [markdown]
# ## 1 · An input-pipeline stall
#
# A dataset whose `__getitem__` takes 2 ms per sample (a stand-in for reading and decoding a file), a
# small MLP, batches of 16. With `num_workers=0` the main process loads every sample itself, between
# steps.

# %%
class SlowDataset(Dataset):
    def __init__(self, n=2048, work_ms=2.0):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.work_ms = work_ms

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.work_ms / 1e3)  # reading + decoding one sample
        return self.x[i], self.y[i]

def make_step(num_workers, batch_size=16, pin_memory=False):
    loader = DataLoader(SlowDataset(), batch_size=batch_size, shuffle=True, num_workers=num_workers,
                        persistent_workers=num_workers > 0, pin_memory=pin_memory and GPU)
    batches = itertools.cycle(loader) if num_workers == 0 else iter(loader)

    def step():
        x, y = next(batches)
        x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step

def profile_loader(num_workers, name, **kw):
    return profile_steps(make_step(num_workers, **kw), steps=8, wait=2, warmup=1, detail="light",
                         device=DEVICE, path=TRACES / name, verbose=False, progress=False)

before = profile_loader(0, "loader_before.pt.trace.json.gz")
before_trace = before.load()
print(f"num_workers=0: median step {before.step_ms_median:.1f} ms")


# %% [markdown]
# The op table (`op_summary`) ranks what the host spent its time in. The DataLoader's `__next__` shows
# up as an annotated range of its own:

# %% tags=["nbval-ignore-output"]
def loader_share(trace):
    ops = op_summary(trace)
    loader_us = ops.loc[ops["name"].str.contains("DataLoader"), "cpu_total_us"].sum()
    return loader_us / step_summary(trace)["dur_us"].sum()

op_summary(before_trace).head(6)[["name", "count", "cpu_total_us", "cpu_self_us"]].round(0)

# %%
share0 = loader_share(before_trace)
print(f"time inside DataLoader.__next__: {share0:.0%} of the step")

# %% [markdown]
# On a GPU the same stall shows as **GPU idle time between steps** with the DataLoader's `__next__` on the
# host in those gaps; `diagnose` replays the step with the loading overlapped (what workers do) and calls
# the step `input` bound when that saves the most. The H200 recorded it (a dataset of 1 ms of CPU work per
# sample, batch 16; unprofiled CUDA-event medians, `benchmarks/record_diagnosis_h200.py`):

# %% tags=["nbval-check-output"]
from workbench.lessons import h200_pair

loader = h200_pair("loader")["measured"]
print(f"H200, 0 workers: {loader['workers0']['median_ms']:.2f} ms/step; 8 workers + pin_memory: "
      f"{loader['workers8_pinned']['median_ms']:.2f} ms/step; batch already on the GPU: "
      f"{loader['on_device']['median_ms']:.2f} ms/step")

# %% [markdown]
# Idle GPU time alone is **not** an input stall, though. The shipped H200 trace of notebook 00 is idle for
# half its window, and its step has no DataLoader at all (one tensor made on the GPU once). Its idle gaps
# are *host* gaps, and the host was busy with the profiler: the trace was recorded at full detail. The
# diagnosis says so, and what each fix would save:

# %% tags=["nbval-check-output"]
from workbench import samples
from workbench import load_trace
from workbench.analysis import idle_gaps

h200 = load_trace(samples.path("h200_train_step"))
gaps = idle_gaps(h200)
print(gaps.groupby("cause")["dur_us"].agg(["count", "sum"]).round(0))
h200_ops = op_summary(h200)
n_loader = int(h200_ops.loc[h200_ops["name"].str.contains("DataLoader"), "count"].sum())
h200_diag = diagnose(h200)
print(f"\nDataLoader spans in the trace: {n_loader}; recorded at {h200_diag.detail!r} detail; "
      f"bound: {h200_diag.bound!r}")
for w in h200_diag.what_ifs:
    print(f"  what if {w.cause:<8} were fixed: {w.saved_fraction:4.0%} of the step saved")

# %% [markdown]
# **The fix**: load in background worker processes (`num_workers > 0`, `persistent_workers=True` so they
# survive between epochs), and on a GPU also `pin_memory=True` + `.to(device, non_blocking=True)` so the
# host-to-device copy overlaps compute. With 2 workers, two batches are prepared at once:

# %%
after = profile_loader(2, "loader_after.pt.trace.json.gz", pin_memory=True)
after_trace = after.load()
share2 = loader_share(after_trace)
print(f"num_workers=2: median step {after.step_ms_median:.1f} ms "
      f"({before.step_ms_median / after.step_ms_median:.1f}x faster); DataLoader share {share2:.0%}")

# %% [markdown]
# Faster, and still input-bound: the loader still takes most of the step, because two workers produce
# a batch every 16 x 2 ms / 2 = 16 ms while the model's own step takes a fraction of that (section 0
# timed it). The exercise at the end lets you add workers. (With
# real decoding, which needs CPU rather than sleep, workers also compete for cores: more than the
# machine has helps no further.)
#
# ### Before / after with the compare tools
#
# `trace_diff` lines up two traces op by op (and kernel by kernel on a GPU): what appeared, what
# disappeared, what got faster. The single-process loader's `__next__` disappeared; the multi-process one
# appeared, much cheaper:

# %% tags=["nbval-ignore-output"]
d = trace_diff(before_trace, after_trace)
cols = ["name", "base_count", "test_count", "base_cpu_total_us", "test_cpu_total_us", "status"]
d.ops.sort_values("base_cpu_total_us", ascending=False).head(5)[cols].round(0)

# %% tags=["nbval-ignore-output"]
from workbench import ComparePanel
ComparePanel.from_traces(before.path, after.path)

# %% [markdown]
# The same diff from a terminal, `workbench diff BASE TEST`:

# %% tags=["nbval-ignore-output"]
import subprocess
out = subprocess.run([sys.executable, "-m", "workbench", "diff", "loader_before.pt.trace.json.gz",
                      "loader_after.pt.trace.json.gz"], capture_output=True, text=True, cwd=TRACES)
print("\n".join((out.stdout or out.stderr).splitlines()[:14]))

# %% [markdown]
# ## 2 · A launch-bound loop
#
# 64 small matrix products done one at a time in a Python loop, against the same work as **one** batched
# call (`torch.bmm`). Each call pays a fixed cost (Python, the dispatcher; on a GPU also a kernel launch of
# a few microseconds) that the tiny matmul cannot hide.

# %%
A = torch.randn(64, 32, 32, device=DEVICE)
B = torch.randn(64, 32, 32, device=DEVICE)

def looped():
    return torch.stack([A[i] @ B[i] for i in range(64)])

def batched():
    return torch.bmm(A, B)

assert torch.allclose(looped(), batched(), atol=1e-5)
loop_run = profile_steps(looped, steps=20, detail="light", device=DEVICE, path=TRACES / "loop.pt.trace.json.gz",
                         verbose=False, progress=False)
bmm_run = profile_steps(batched, steps=20, detail="light", device=DEVICE, path=TRACES / "bmm.pt.trace.json.gz",
                        verbose=False, progress=False)
loop_trace, bmm_trace = loop_run.load(), bmm_run.load()
print(f"loop: {loop_run.step_ms_median * 1e3:.0f} us/step   bmm: {bmm_run.step_ms_median * 1e3:.0f} us/step")


# %% tags=["nbval-check-output"]
def calls_per_step(trace, name):
    ops = op_summary(trace)
    return int(ops.loc[ops["name"] == name, "count"].sum()) // len(step_summary(trace))

print("aten::mm calls per step, loop:", calls_per_step(loop_trace, "aten::mm"))
print("aten::bmm calls per step, batched:", calls_per_step(bmm_trace, "aten::bmm"))

# %% [markdown]
# On a GPU the trace of the loop shows hundreds of kernels of a few microseconds with the GPU idle in
# between, and the workbench says `launch_bound` (the gaps are classified as *launch* gaps: the host was
# busy launching). Fixes: batch the work (`bmm`, `torch.vmap`, foreach/fused optimizers), `torch.compile`,
# CUDA graphs.

# %% tags=["nbval-skip"]
if GPU:
    print("loop findings:", [(x.id, x.severity) for x in findings(loop_trace)])
    print("bmm findings: ", [(x.id, x.severity) for x in findings(bmm_trace)])
    print(idle_gaps(loop_trace).groupby("cause")["dur_us"].agg(["count", "sum"]).round(0))
    assert "launch_bound" in {x.id for x in findings(loop_trace)}   # what the paragraph above says

# %% [markdown]
# ## 3 · A hidden sync
#
# `loss.item()` inside the loop copies one number to the host, and to do so the host **waits until the
# GPU has finished everything queued so far**. The GPU then idles while the host prepares the next step.
# On a CPU nothing is queued, so there is nothing to see: this is a GPU-only effect.
#
# **How much does it cost?** Without the sync the host prepares step n+1 while the GPU still runs step n,
# so a step takes about max(host, GPU). With it the two take turns: host + GPU. The sync costs about the
# *smaller* of the two, so it matters when host and GPU work per step are comparable, and hardly when one
# side dominates. The H200 measured three balances (a fixed amount of CPU work plus a chain of fp32
# 2048x2048 matmuls; unprofiled CUDA-event medians of 40 steps):

# %% tags=["nbval-check-output"]
rec = h200_pair("sync")
print(f"{'host ms':>8} {'GPU ms':>7} | {'with .item()':>12} {'without':>8} {'cost':>6} | {'host+GPU':>8} {'max':>6}")
for with_item, without_item, _ in rec["pairs"]:
    v = next(x for x in rec["variants"] if with_item.startswith(x["tag"] + "_"))
    host, gpu = v["host_ms"], v["matmuls"] * v["matmul_ms"]
    b, a = rec["measured"][with_item]["median_ms"], rec["measured"][without_item]["median_ms"]
    print(f"{host:8.1f} {gpu:7.2f} | {b:12.2f} {a:8.2f} {b / a - 1:+6.0%} | {host + gpu:8.2f} {max(host, gpu):6.2f}")
    # the model, on each measured pair: with the sync ~ host + GPU, without ~ max, the cost ~ the smaller side
    assert abs(b / (host + gpu) - 1) < 0.1 and abs(a / max(host, gpu) - 1) < 0.15, (host, gpu, b, a)
    assert abs((b - a) / min(host, gpu) - 1) < 0.15, (host, gpu, b, a)

# %% [markdown]
# A trap when reading traces: `aten::item` is not always a sync. The shipped H200 trace holds many of
# them, yet not one idle gap is caused by a synchronisation: they are AdamW reading its *CPU-side* step
# counters.

# %% tags=["nbval-check-output"]
n_item = int(h200_ops.loc[h200_ops["name"] == "aten::item", "count"].sum())
print(f"aten::item calls: {n_item}; idle gaps caused by a sync: {int((gaps['cause'] == 'sync').sum())}")

# %% [markdown]
# On a GPU, the cell below profiles (light detail) a step that calls `.item()` every step against one that
# keeps the running loss on the GPU and reads it once, and prints what the diagnosis finds in each.

# %% tags=["nbval-skip"]
if GPU:
    big = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    bopt = torch.optim.SGD(big.parameters(), lr=1e-3)
    xb = torch.randn(256, 2048, device="cuda")
    running = torch.zeros((), device="cuda")

    def step_item():
        loss = big(xb).square().mean()
        bopt.zero_grad(set_to_none=True); loss.backward(); bopt.step()
        float(loss.item())  # host waits for the GPU every step

    def step_no_item():
        global running
        loss = big(xb).square().mean()
        bopt.zero_grad(set_to_none=True); loss.backward(); bopt.step()
        running = running + loss.detach()  # stays on the GPU

    sync_run = profile_steps(step_item, steps=10, detail="light", device="cuda",
                             path=TRACES / "sync.pt.trace.json.gz", verbose=False)
    free_run = profile_steps(step_no_item, steps=10, detail="light", device="cuda",
                             path=TRACES / "nosync.pt.trace.json.gz", verbose=False)
    for name, r in (("with .item()", sync_run), ("on the GPU", free_run)):
        t = r.load()
        print(f"{name}: {r.step_ms_median:.2f} ms/step;", [(x.id, x.severity) for x in findings(t)])
        print(idle_gaps(t).groupby("cause")["dur_us"].agg(["count", "sum"]).round(0))
    # one host read of the loss per step in the first trace, none in the second
    assert calls_per_step(sync_run.load(), "aten::item") == 1 and calls_per_step(free_run.load(), "aten::item") == 0

# %% [markdown]
# ## Exercise
#
# Turn the number of DataLoader workers (and the batch size) and watch the step time and the
# DataLoader's share of it. The `ProfilerPanel` below shows the new profile each time.

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets
from workbench import ProfilerPanel

workers = widgets.IntSlider(value=0, min=0, max=4, description="num_workers", continuous_update=False)
batch = widgets.Dropdown(options=[8, 16, 32], value=16, description="batch size")
box = widgets.VBox()

def rerun(change=None):
    r = profile_steps(make_step(workers.value, batch_size=batch.value), steps=6, wait=2, warmup=1,
                      detail="light", device=DEVICE, path=TRACES / "exercise.pt.trace.json.gz",
                      verbose=False, progress=False)
    t = r.load()
    line = widgets.HTML(f"<b>num_workers={workers.value}, batch {batch.value}</b>: median step "
                        f"{r.step_ms_median:.1f} ms, DataLoader {loader_share(t):.0%} of it")
    box.children = [widgets.HBox([workers, batch]), line, ProfilerPanel(t, top=8)]

workers.observe(rerun, names="value")
batch.observe(rerun, names="value")
rerun()
box

# %% [markdown]
# Your answers, then the check (it reads section 1's two measured runs, batch 16): with 2 workers instead
# of 0, about how many times faster is the step, and does the DataLoader still take most of it?

# %%
MY_SPEEDUP = 2.0            # step time with 0 workers / with 2 workers
MY_LOADER_STILL_MOST = True  # True: the DataLoader still takes more than half of the step with 2 workers

# %%
speedup = before.step_ms_median / after.step_ms_median
print(f"speed-up {speedup:.1f}x:", "right" if abs(MY_SPEEDUP / speedup - 1) < 0.25 else "look again",
      f"| DataLoader share with 2 workers {share2:.0%}:", "right" if MY_LOADER_STILL_MOST == (share2 > 0.5) else "look again")
# the solution: two workers help (they load two batches at once), and the step is still input-bound
# (a batch every 16 x 2 ms / 2 workers, against a model step of a fraction of that)
assert speedup > 1.3 and share2 > 0.5

# %% [markdown]
# ## Takeaways

# %% tags=["nbval-check-output"]
assert profiled["full"].step_ms_median > unprofiled_ms       # the profiler's own cost: full detail slows the step
if not GPU:                                                   # the recorded H200 trace: the profiler, not the input
    assert n_loader == 0 and h200_diag.bound == "profiler" and "input_bound" not in {f.id for f in findings(h200)}
assert share0 > 0.5, share0                                   # the stall: most of the step is loading
assert after.step_ms_median < before.step_ms_median / 1.3       # two workers: clearly faster
assert calls_per_step(loop_trace, "aten::mm") == 64 and calls_per_step(bmm_trace, "aten::bmm") == 1
print("profiler: time the step unprofiled first, profile at detail='light'")
print("input-bound: fixed with DataLoader workers (+ pin_memory / non_blocking on a GPU)")
print("launch-bound: 64 calls -> 1 batched call")
print("sync-bound: costs about min(host, GPU) per step; keep metrics on the GPU, read them every N steps")

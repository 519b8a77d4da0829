# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · A tour of the workbench
#
# The workbench looks at a PyTorch program through **three data sources**:
#
# | source | question it answers | panel |
# |---|---|---|
# | a **profile** (torch.profiler / Kineto trace) | where does the step's time go? | `ProfilerPanel` |
# | an **allocator snapshot** (CUDA caching allocator history) | where does the memory go, why did it OOM? | `MemoryPanel` |
# | **NVML** samples (the driver's counters) | is the GPU busy, hot, throttled right now? | `LiveGpuPanel` |
#
# On a machine with a CUDA GPU this notebook records each of them live, from a few training steps of
# a small transformer. Everywhere else (a laptop, Binder, CI) it opens the **real recordings from an
# NVIDIA H200** that ship with the package in `workbench.samples`, so every number below comes from a real
# recording. Most are measured (kernel times, the allocator's bytes, NVML's counters, a step timed with CUDA
# events); a few are the workbench's **estimates** from those recordings, and say so where they appear: the
# step "without the profiler" the diagnosis works out from a profiled trace, and each finding's "what if".

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup
setup()
import os, sys, warnings
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# %% [markdown]
# ## The shipped recordings
#
# `workbench.samples` lists them; `samples.path(name)` finds the file. Where each came from is written
# in `workbench/samples/README.md`.

# %%
from workbench import samples
print(samples.describe())

# %% [markdown]
# On a GPU, the live cells below train the same kind of model the H200 recordings came from: a stack
# of 6 transformer encoder layers (d=512, 8 heads), batch 16 x 256 tokens, fp32, AdamW.
# (Cells tagged `nbval-skip` run only where `GPU` is true; on a CPU you can still read them.)

# %% tags=["nbval-skip"]
if GPU:
    from torch import nn
    model = nn.Sequential(*[nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
                            for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 256, 512, device="cuda")

    def train_step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # right after step(): no gradients live during the next forward

# %% [markdown]
# ## 1 · A profile: where does the time go?
#
# `workbench.io.load_trace` reads any Kineto trace (`.json` or `.json.gz`: ours, or one copied off a
# cluster) into columns; the functions of `workbench.analysis` turn it into tables. Here: the shipped
# H200 trace of three training steps.

# %%
from workbench import load_trace
from workbench.analysis import kernel_summary, gpu_busy, findings

trace = load_trace(samples.path("h200_train_step"))

# %% [markdown]
# On a GPU, profile three live steps instead (`workbench.capture.profile_steps`; the trace is written to a
# temporary folder). `profile_steps` first times a few steps **without** the profiler and writes that time
# into the trace, so the diagnosis below can tell the profiler's cost from the step's own:

# %% tags=["nbval-skip"]
if GPU:
    from workbench import profile_steps
    result = profile_steps(train_step, steps=3, detail="light", verbose=False)
    trace = result.load()
    print(f"live profile: {result.steps} steps, median {result.step_ms_median:.1f} ms/step; {result.cost}")

# %% [markdown]
# The top GPU kernels, as a DataFrame:

# %%
kernels = kernel_summary(trace)
kernels.head(8)[["name", "count", "total_us", "mean_us", "percent"]].round(1)

# %% tags=["nbval-check-output"]
from workbench.analysis import diagnose

busy = gpu_busy(trace)
diag = diagnose(trace)
found = {f.id: f for f in findings(trace)}
print(f"{trace.device}: {busy.kernel_count} kernels, GPU busy {busy.busy_us / 1e3:.1f} ms "
      f"of a {busy.window_us / 1e3:.1f} ms window (idle {busy.idle_fraction:.0%})")
print(f"diagnosis: bound = {diag.bound!r}; {diag.steps} steps recorded at {diag.detail!r} detail, "
      f"{diag.step_ms:.1f} ms a step under the profiler, about {diag.step_ms_unprofiled:.1f} ms without it "
      f"(GPU busy {diag.gpu_busy_ms:.1f} ms a step)")
print("findings:", list(found))
if "fp32_matmul" in found:
    print(f"fp32 matrix multiply without tensor cores: {found['fp32_matmul'].evidence['fp32_gemm_fraction']:.0%} "
          "of the GPU's kernel time")

# %% [markdown]
# ### Read the diagnosis before the idle time
#
# Half the window the GPU waits. That is **not** an input stall: this step has no input pipeline at all
# (`x` is one tensor made on the GPU once, see the cell above; nothing is loaded between steps). The first
# finding, `profiler_overhead`, names the cause: the trace was recorded at **full** detail (shapes, memory
# events and Python stacks for every op), and the profiler's own host work for each recorded event delays
# the next launch, so the GPU waits for the *profiler*. The diagnosis takes that work out and replays the
# step: without the profiler the step is about as long as the GPU's busy time, so the GPU is the limit.
#
# A recorded check: the same shape of step (6 encoder layers, d=512, batch 16 x 256, fp32 AdamW), timed on
# that H200 with CUDA events and no profiler (`benchmarks/record_diagnosis_h200.py`, case `overhead_fp32`):

# %% tags=["nbval-check-output"]
from workbench.lessons import h200_pair

truth = h200_pair("overhead_fp32")
unprofiled = truth["measured"]["unprofiled"]
print(f"{truth['env']['gpu']}, no profiler: median {unprofiled['median_ms']:.2f} ms a step over "
      f"{unprofiled['steps']} steps (p10 {unprofiled['p10_ms']:.2f}, p90 {unprofiled['p90_ms']:.2f})")
print(f"the shipped trace: {diag.step_ms:.1f} ms a step under the profiler, "
      f"{diag.step_ms / unprofiled['median_ms']:.1f}x the unprofiled step")

# %% [markdown]
# The profiled step is not the step. Even at **light** detail (ops and kernels only) this step's profiled
# host time was about twice the real one on that H200 (the same recording, the light trace's step):

# %% tags=["nbval-check-output"]
light = truth["traces"]["light"]
print(f"light detail: {light['host_ms_per_step_profiled_median']:.2f} ms a profiled step against "
      f"{unprofiled['median_ms']:.2f} ms without the profiler "
      f"({light['host_ms_per_step_profiled_median'] / unprofiled['median_ms']:.1f}x)")

# %% [markdown]
# ### Does the fix the finding names pay?
#
# In the H200 recording the second finding, `fp32_matmul`, says most of the GPU's time is fp32 matrix multiply without tensor
# cores, and its what-if says how much of the step that is worth: the step model replays the step with
# those kernels faster and keeps everything else, the host's work included.

# %% tags=["nbval-check-output"]
from workbench import TraceAnalysis
recorded = {f.id: f for f in TraceAnalysis(samples.path("h200_train_step")).findings}  # the H200 recording
w = recorded["fp32_matmul"].what_if
print(f"fp32_matmul what-if: {w['step_ms']:.2f} -> {w['step_ms_if_fixed']:.2f} ms a step "
      f"(saves {w['saved_fraction']:.0%})")

# %% [markdown]
# Only a few percent, although TF32 makes those kernels several times faster. The same model was run with
# TF32 matmuls and with bf16 autocast, each timed without the profiler (twice) and traced at light detail
# (`benchmarks/record_diagnosis_h200.py --case tour_fixes`; on an H100, the GPU lent that day, so the times
# differ a little from the H200's). What the workbench reads in each trace, beside the measured steps:

# %%
from workbench.lessons import RESULTS
import json
tour_fixes = json.loads((RESULTS / "h100_tour_fixes.json").read_text())
rows = []
for v in ("fp32", "tf32", "bf16"):
    m, t = tour_fixes["truth"]["measured"], tour_fixes["traces"][v]
    rows.append({"variant": v, "GPU busy a step (ms)": t["gpu_busy_ms"],
                 "step, no profiler (ms)": f"{m[v]['median_ms']:.2f} / {m[v + '_again']['median_ms']:.2f}",
                 "bound (light trace)": t["bound"], "next finding": next(
                     (i for i in t["findings"] if i != "profiler_overhead"), "none")})
print(tour_fixes["truth"]["env"]["gpu"])
pd.DataFrame(rows).set_index("variant")

# %% [markdown]
# TF32 halves the GPU's work a step and bf16 cuts it to about a quarter, yet neither step got faster:
# the host already needs about as long as the fp32 GPU work to issue the step (the Python of six encoder
# layers and a `foreach` AdamW), so once the GPU is quicker the host is the limit, and the trace of the fixed
# step names `host_bound` and `launch_bound` next. The what-if said as much before anything was run.

# %% tags=["nbval-check-output"]
fx = tour_fixes["traces"]
m = tour_fixes["truth"]["measured"]
assert fx["tf32"]["gpu_busy_ms"] < 0.6 * fx["fp32"]["gpu_busy_ms"] and fx["bf16"]["gpu_busy_ms"] < 0.3 * fx["fp32"]["gpu_busy_ms"]
assert min(m["tf32"]["median_ms"], m["tf32_again"]["median_ms"]) > 0.9 * min(m["fp32"]["median_ms"], m["fp32_again"]["median_ms"])
assert fx["tf32"]["bound"] == fx["bf16"]["bound"] == "host" and "host_bound" in fx["tf32"]["findings"]
print(f"GPU busy a step: fp32 {fx['fp32']['gpu_busy_ms']:.1f} ms, TF32 {fx['tf32']['gpu_busy_ms']:.1f} ms, "
      f"bf16 {fx['bf16']['gpu_busy_ms']:.1f} ms; fastest step without the profiler: fp32 "
      f"{min(m['fp32']['median_ms'], m['fp32_again']['median_ms']):.1f} ms, TF32 "
      f"{min(m['tf32']['median_ms'], m['tf32_again']['median_ms']):.1f} ms, bf16 "
      f"{min(m['bf16']['median_ms'], m['bf16_again']['median_ms']):.1f} ms")

# %% [markdown]
# So, in this order:
#
# 1. **time the step without the profiler** first (CUDA events; `profile_steps` does it for you and writes
#    the figure into the trace, where the diagnosis reads it instead of estimating);
# 2. profile at `detail="light"` (ops and kernels, no shapes, memory or stacks) to see where the time goes,
#    and read the diagnosis' unprofiled step, not the profiled one: even light detail doubled this step;
# 3. then take the finding **whose what-if saves most**, not the first one listed. Here `fp32_matmul`'s
#    what-if was a few percent and the runs agree: TF32 (or bf16, notebook **31**) only pays once the host's
#    work is cut too (fewer launches: a fused optimizer, CUDA graphs or `torch.compile`, notebooks **10**
#    and **15**). Note that cuDNN's convolutions already run in TF32 by default
#    (`torch.backends.cudnn.allow_tf32` is True); matmuls do not (`torch.backends.cuda.matmul.allow_tf32`).
#
# Notebook **10** takes the host-side limits (input, launch, sync) one at a time on real CPU profiles. The
# `ProfilerPanel` holds the same tables, the diagnosis, the findings and a stream timeline behind a few
# controls (top N, name filter, one step at a time):

# %% tags=["nbval-ignore-output"]
from workbench import ProfilerPanel
ProfilerPanel(trace)

# %% [markdown]
# ## 2 · An allocator snapshot: where does the memory go?
#
# `workbench.io.snapshot.load_snapshot` opens a `torch.cuda.memory._snapshot()` pickle **safely** (a
# restricted unpickler: a snapshot from someone else cannot run code). `memory_summary` is what
# `workbench memory --json` prints: the peak, what was live there by category, the allocator state.

# %%
from workbench import load_snapshot
from workbench.analysis.memory.oom import memory_summary
from workbench import format_bytes

# a relative path keeps machine paths out of what the panel prints
snapshot = load_snapshot(os.path.relpath(samples.path("h200_train_snapshot")))

# %% [markdown]
# On a GPU, record the allocator's history over three live steps instead (`workbench.capture.memory.record_memory_history`).
# A fresh AdamW first: the optimizer makes its state in its first step, and memory made before the
# history starts has no stack to say what it is (it would be counted with the parameters).

# %% tags=["nbval-skip"]
if GPU:
    import tempfile, pathlib
    from workbench import record_memory_history
    folder = pathlib.Path(tempfile.mkdtemp())
    opt = torch.optim.AdamW(model.parameters())  # train_step uses this one: its state is made in the history
    with record_memory_history(folder / "tour.snapshot.pickle.gz") as rec:
        for _ in range(3):
            train_step()
        torch.cuda.synchronize()
    snapshot = rec.load()

# %% tags=["nbval-check-output"]
summary = memory_summary(snapshot)
peak = summary["peak"]
print(f"peak allocated {format_bytes(peak['allocated_bytes'])}, "
      f"reserved {format_bytes(peak['reserved_bytes'])} at that moment")
for row in peak["by_category"]:
    print(f"  {row['category']:<16} {format_bytes(row['bytes']):>11}")

# %% [markdown]
# At the peak (the end of the forward pass) activations dominate; parameters, gradients and AdamW's
# two moment buffers are the steady part. Notebook **20** takes this apart. The `MemoryPanel` shows the
# timeline stacked by category, what was live at any moment (with stacks), and the segment map:

# %% tags=["nbval-ignore-output"]
from workbench import MemoryPanel
MemoryPanel(snapshot)

# %% [markdown]
# ## 3 · NVML: what is the GPU doing right now?
#
# The driver's counters (utilization, memory, power, temperature, clocks, throttle reasons), sampled in
# a background thread. Recorded sessions load with `workbench.io.load_nvml_session`; here 25 s of an
# H200 going from idle through CNN and transformer training back to idle:

# %% tags=["nbval-check-output"]
from workbench import load_nvml_session
from workbench.analysis import gpu_summary

session = load_nvml_session(samples.path("h200_nvml_session"))
s = gpu_summary(session).iloc[0]
print(f"{int(s['samples'])} samples over {s['duration_s']:.1f} s: mean utilization {s['util_gpu_mean_pct']:.0f}%, "
      f"peak power {s['power_peak_w']:.0f} W, peak memory {s['mem_used_peak_bytes'] / 2**30:.1f} GiB, "
      f"peak {s['temp_peak_c']:.0f} C")

# %% [markdown]
# The `LiveGpuPanel` samples NVML on every GPU where there is one; where NVML is missing (this machine,
# Binder) it replays the shipped session in a loop, and its status line says so. It never blocks the
# kernel: sampling and redrawing run in background threads.

# %% tags=["nbval-ignore-output"]
from workbench import LiveGpuPanel
live = LiveGpuPanel(window_s=30)
live

# %% [markdown]
# On a GPU, run a few hundred training steps while the panel is open and watch utilization and power
# climb (press **Mark** to label the moment):

# %% tags=["nbval-skip"]
if GPU:
    live.mark("training")
    for _ in range(200):
        train_step()
    torch.cuda.synchronize()
    live.mark("done")

# %% [markdown]
# ## The same from a terminal
#
# Every panel has a command-line twin over the same functions, for clusters and CI logs:
# `workbench trace FILE`, `workbench memory FILE`, `workbench monitor --replay FILE`, `workbench diff A B`.

# %% tags=["nbval-ignore-output"]
import subprocess, sys
f = samples.path("h200_train_step")  # run next to the file so the report names it, not a machine path
out = subprocess.run([sys.executable, "-m", "workbench", "trace", "--top", "3", f.name],
                     capture_output=True, text=True, cwd=f.parent)
print(out.stdout or out.stderr)

# %% [markdown]
# ## Exercise
#
# Pick another shipped trace (an A100 AlexNet run, a V100 NCCL rank, an AMD MI250, a CPU-only trace)
# and see what the findings say. The panel redraws when you choose.

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets
from workbench.analysis import trace_summary

choice = widgets.Dropdown(options=samples.names("trace"), value="a100_alexnet", description="trace")
box = widgets.VBox()

def show(change=None):
    t = load_trace(samples.path(choice.value))
    ids = ", ".join(f["id"] for f in trace_summary(t)["findings"]) or "no findings"
    box.children = [choice, widgets.HTML(f"<b>{t.device}</b>: {ids}"), ProfilerPanel(t, top=10)]

choice.observe(show, names="value")
show()
box

# %% [markdown]
# Now predict, then let the check read the traces: of the three traces from other machines
# (`a100_alexnet`, `v100_nccl_rank0`, `mi250_rocm`), which one does the diagnosis call **launch**-bound,
# and which one has **no** `fp32_matmul` finding?

# %%
MY_LAUNCH_BOUND = "v100_nccl_rank0"     # one of the three names
MY_NO_FP32 = "a100_alexnet"             # one of the three names

# %% tags=["nbval-check-output"]
others = ("a100_alexnet", "v100_nccl_rank0", "mi250_rocm")
loaded = {n: load_trace(samples.path(n)) for n in others}
bound_of = {n: diagnose(t).bound for n, t in loaded.items()}
ids_of = {n: [f["id"] for f in trace_summary(t)["findings"]] for n, t in loaded.items()}
launch_bound = [n for n in others if bound_of[n] == "launch"]
no_fp32 = [n for n in others if "fp32_matmul" not in ids_of[n]]
for n in others:
    print(f"{n:<16} bound={bound_of[n]!r:<9} findings: {', '.join(ids_of[n])}")
print("launch-bound:", "right" if [MY_LAUNCH_BOUND] == launch_bound else "look again",
      "| no fp32_matmul:", "right" if [MY_NO_FP32] == no_fp32 else "look again")
# the solution, from the traces: the A100 AlexNet trace is the launch-bound one; the AMD trace has no fp32_matmul finding
assert launch_bound == ["a100_alexnet"] and no_fp32 == ["mi250_rocm"]

# %% [markdown]
# ## Takeaways

# %% tags=["nbval-check-output"]
if not GPU:  # the recorded H200 numbers
    ids = [f.id for f in findings(trace)]
    assert 0.5 < busy.idle_fraction < 0.56 and diag.bound == "profiler"
    assert ids[0] == "profiler_overhead" and "fp32_matmul" in ids and "input_bound" not in ids
    # the diagnosis' unprofiled estimate lands near the step timed without the profiler
    assert abs(diag.step_ms_unprofiled / unprofiled["median_ms"] - 1) < 0.25
    assert peak["allocated_bytes"] == 1_222_204_928
else:  # the live run on this GPU: three steps profiled, the allocator's history of three more
    assert result.steps == 3 and diag.steps >= 1 and diag.step_ms_unprofiled > 0 and busy.kernel_count > 0
    cats = {r["category"] for r in peak["by_category"]}
    assert {"parameters", "optimizer_state", "activations"} <= cats and peak["allocated_bytes"] > 0
lever = next((i for i in found if i != "profiler_overhead"), "none")
print(f"profile   -> where the time goes:   bound={diag.bound!r} (time it unprofiled first), next: {lever}")
print("snapshot  -> where the memory goes: peak", format_bytes(peak["allocated_bytes"]))
print("NVML      -> what the GPU does now: peak power", f"{s['power_peak_w']:.0f} W")

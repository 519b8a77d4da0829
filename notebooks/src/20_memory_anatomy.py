# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 20 · Memory anatomy of a training step
#
# A training step's GPU memory has five parts:
#
# | part | lives | size (fp32, AdamW) |
# |---|---|---|
# | **parameters** | always | 4 bytes x P |
# | **gradients** | from backward until `zero_grad(set_to_none=True)` (where in the loop matters: section 5) | 4 bytes x P |
# | **optimizer state** | from the first `step()` on | AdamW: 8 bytes x P (two moments) |
# | **activations** | saved in forward, freed in backward | grows with batch x sequence x width x layers |
# | **temporaries** | inside one op or one phase | workspaces, intermediate results |
#
# The back-of-envelope sum is easy to write down and usually wrong by a wide margin. Here we put it
# next to what the **CUDA caching allocator measured** on an H200 for a real model, and next to the
# workbench's **estimator**, and find where the difference goes.
#
# The model: 6 `nn.TransformerEncoderLayer`s (d=512, 8 heads, FFN 2048), batch 16 x 256 tokens, fp32,
# AdamW: the model of the shipped H200 recordings.

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
from workbench import samples
from workbench.analysis.memory.oom import analyze_snapshot, memory_summary
from workbench import format_bytes as fb

LAYERS, D, HEADS, FFN, BATCH, SEQ = 6, 512, 8, 2048, 16, 256

def model_fn():
    return nn.Sequential(*[nn.TransformerEncoderLayer(D, HEADS, FFN, batch_first=True) for _ in range(LAYERS)])

def inputs_fn(batch_size):
    return torch.randn(batch_size, SEQ, D)

def optimizer_fn(params):
    return torch.optim.AdamW(params)

P = sum(p.numel() for p in model_fn().parameters())
print(f"{P / 1e6:.2f} M parameters")

# %% [markdown]
# ## 1 · The back-of-envelope
#
# Parameters, gradients and AdamW state are 4 + 4 + 8 bytes per parameter. For activations, a common
# rule for a transformer layer (Korthikanti et al., 2022) is about 34 bytes per token per unit of width
# in 16-bit precision, so **68 x s x b x d** bytes in fp32, per layer (attention scores not stored, as
# with PyTorch's fused attention).

# %% tags=["nbval-check-output"]
MiB = 2**20
envelope = {
    "parameters": 4 * P,
    "gradients": 4 * P,
    "optimizer_state": 8 * P,
    "activations": 68 * SEQ * BATCH * D * LAYERS,
}
params_plus_acts = envelope["parameters"] + envelope["activations"]
for k, v in envelope.items():
    print(f"{k:<16} {v / MiB:8.1f} MiB")
print(f"{'all four':<16} {sum(envelope.values()) / MiB:8.1f} MiB")
print(f"params + activations: {params_plus_acts / MiB:.1f} MiB")

# %% [markdown]
# ## 2 · What the allocator measured
#
# The shipped snapshot recorded every allocation of three training steps of this model on an H200
# (`torch.cuda.memory._record_memory_history`). The workbench rebuilds the timeline, finds the peak,
# and sorts every live allocation into a category from its stack (who allocated it, who freed it).

# %% tags=["nbval-check-output"]
from workbench import load_snapshot

snap = load_snapshot(os.path.relpath(samples.path("h200_train_snapshot")))
analysis = analyze_snapshot(snap)
summary = memory_summary(snap, analysis=analysis)
measured = {r["category"]: r["bytes"] for r in summary["peak"]["by_category"]}
peak_alloc, peak_res = summary["peak"]["allocated_bytes"], summary["peak"]["reserved_bytes"]
for k, v in measured.items():
    print(f"{k:<16} {v / MiB:8.1f} MiB")
print(f"peak allocated {peak_alloc / MiB:.1f} MiB, reserved {peak_res / MiB:.1f} MiB")

# %% [markdown]
# torch.profiler classifies memory its own way (it tracks every tensor through autograd, so its
# categories are exact); the shipped `export_memory_timeline` of the same steps agrees:

# %% tags=["nbval-check-output"]
from workbench.io.profiler_memory import load_memory_timeline
from workbench.analysis.memory.allocations import profiler_category_peak

prof_peak = profiler_category_peak(load_memory_timeline(samples.path("h200_memory_timeline")))
for k, v in sorted(prof_peak["by_category"].items(), key=lambda kv: -kv[1]):
    print(f"{k:<16} {v / MiB:8.1f} MiB")

# %% [markdown]
# ## 3 · Where the difference goes

# %% tags=["nbval-check-output"]
print(f"params + activations (arithmetic) {params_plus_acts / MiB:7.0f} MiB   1.00x")
print(f"peak allocated (tensors)          {peak_alloc / MiB:7.0f} MiB   {peak_alloc / params_plus_acts:.2f}x")
print(f"peak reserved (the allocator)     {peak_res / MiB:7.0f} MiB   {peak_res / params_plus_acts:.2f}x")
print("+ the CUDA context (kernels, cuBLAS/cuDNN handles): outside the allocator, not in the snapshot; "
      "measured by NVML on a GPU (cell below)")

# %% [markdown]
# On a GPU, the driver sees what the allocator cannot: the device's used memory minus what PyTorch reserved
# is the CUDA context and everything else outside PyTorch's allocator (exact when this process is alone on
# the GPU). Which "used" you read matters. NVML's classic call (`nvmlDeviceGetMemoryInfo`, v1, what
# `nvidia-smi` showed for years) counts memory the **driver reserves for itself** as used, and its total
# includes it; CUDA's `cudaMemGetInfo` (`torch.cuda.mem_get_info`) leaves it out of both. The lesson 13
# recording on an H200 measured that reserve, NVML's total minus CUDA's:

# %% tags=["nbval-check-output"]
import json
from workbench.lessons import RESULTS

rec13 = json.loads((RESULTS / "h200_lesson13.json").read_text())
mf = rec13["memory_full"]
driver_reserve = rec13["power"]["memory_total_bytes"] - mf["total_bytes"]
cuda_used = mf["total_bytes"] - mf["free_before_bytes"]
print(f"{rec13['env']['gpu']}: NVML v1 total {rec13['power']['memory_total_bytes'] / MiB:.0f} MiB, "
      f"CUDA total {mf['total_bytes'] / MiB:.0f} MiB -> the driver keeps {driver_reserve / MiB:.0f} MiB")
print(f"its tensors released, cache emptied: NVML v1 used {mf['nvml_used_before_bytes'] / MiB:.0f} MiB = "
      f"CUDA's used {cuda_used / MiB:.0f} MiB + that reserve")
assert mf["nvml_used_before_bytes"] == cuda_used + driver_reserve and 0 < driver_reserve < 1024 * MiB
# the H200 run of this notebook (docs/h200_notebooks/20_memory_anatomy.ipynb) printed, from NVML's v1 used:
H200_RUN_OUTSIDE_MIB = 1300
print(f"this notebook on an H200 printed {H200_RUN_OUTSIDE_MIB} MiB 'outside the allocator' from v1 used; "
      f"less the driver's reserve, about {H200_RUN_OUTSIDE_MIB - driver_reserve / MiB:.0f} MiB was the context")

# %% [markdown]
# So of the 1300 MiB the H200 run of this notebook printed with the v1 call, about half was the driver's
# reserve, which no process can allocate and which is there with or without PyTorch; the context proper
# (kernels, cuBLAS/cuDNN handles) was the rest. The size of both depends on the driver, the GPU and which
# libraries have loaded their kernels, so measure them rather than assume a figure. The cell below takes
# the context from CUDA's own count and the driver's reserve from NVML's v2 call
# (`nvmlDeviceGetMemoryInfo_v2`, whose `used` leaves it out and reports it as `reserved`):

# %% tags=["nbval-skip"]
if GPU:
    import pynvml
    torch.zeros(1, device="cuda") @ torch.zeros(1, 1, device="cuda")   # load cuBLAS like a training step would
    torch.cuda.synchronize()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    free, total = torch.cuda.mem_get_info()
    torch_reserved = torch.cuda.memory_reserved()
    outside = (total - free) - torch_reserved                 # context + anything else not PyTorch's
    try:
        kept = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved
        how = "NVML v2 reserved"
    except (pynvml.NVMLError, AttributeError):               # an older driver: NVML's total minus CUDA's
        kept, how = v1.total - total, "NVML v1 total - CUDA total"
    print(f"NVML v1 used {v1.used / MiB:.0f} MiB = PyTorch reserved {torch_reserved / MiB:.0f} MiB "
          f"+ outside the allocator {outside / MiB:.0f} MiB + the driver's reserve {kept / MiB:.0f} MiB ({how})")
    assert outside > 0 and kept >= 0 and v1.used >= total - free

# %% [markdown]
# Reading the rows above and the measured categories:
#
# * **Activations** match the rule closely (~809 MiB measured, ~816 MiB by the rule): the rule is not what
#   goes wrong.
# * **Optimizer state** (149 MiB, twice the parameters) is live at the peak from the second step on, and the
#   "params + activations" arithmetic forgets it.
# * **Gradients** are *not* at the peak: only 4 MiB. The recorded loop (like the estimator's) calls
#   `zero_grad(set_to_none=True)` right after `optimizer.step()`, so the previous step's gradients are
#   gone before the next forward, and the peak comes at the end of forward, before backward recreates
#   them. Summing all four parts double-counts. Called between forward and backward instead (a common
#   placement), `zero_grad` frees them only *after* the forward, and the peak holds them too: section 5
#   measures the difference.
# * **Temporaries and unknown** (~130 MiB): cuBLAS workspaces (the estimator models 64 MiB of them), attention's log-sum-exp buffers, the loss's
#   intermediates.
# * **The allocator's cache**: reserved minus allocated (~100 MiB) is memory held in segments, in holes
#   between live blocks (notebook 21 shows how scattered they are).
# * **The CUDA context** is outside PyTorch's allocator altogether: only the driver's counts (CUDA's free
#   memory, NVML) see it, and NVML's v1 *used* adds the driver's own reserve on top (the cells above).
#
# Against a plain params + activations sum, the allocator alone holds the ratio printed above, and the
# context comes on top; for smaller models the fixed parts (context, workspaces) weigh even more.
#
# ## 4 · The estimator gets it without a GPU
#
# `estimate` (`workbench.capture.estimate`) runs the training step on *fake* tensors on the CPU, records every storage's
# birth and death, and replays them through a model of the caching allocator:

# %% tags=["nbval-check-output"]
from workbench import estimate

est = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=BATCH)
print(f"estimated peak allocated {est.peak_allocated_bytes / MiB:.0f} MiB "
      f"(measured {peak_alloc / MiB:.0f}, {est.peak_allocated_bytes / peak_alloc - 1:+.1%}); "
      f"reserved {est.peak_reserved_bytes / MiB:.0f} MiB (measured {peak_res / MiB:.0f})")
table = pd.DataFrame({"envelope_MiB": pd.Series(envelope) / MiB,
                      "measured_MiB": pd.Series(measured) / MiB,
                      "estimated_MiB": pd.Series(est.by_category) / MiB}).round(1)
print(table.to_string(na_rep="-"))

# %% [markdown]
# ## 5 · Live: activations scale with the batch
#
# On a CPU the profiler's memory accounting (`profile_memory=True`) sees every allocation too.
# `workbench.capture.environment.measure_cpu_peak_bytes` runs one step under it and returns the peak above
# what was live before (parameters and optimizer state already exist). Two batch sizes give the bytes
# of activation per sample, to compare with the rule (68 x s x d x layers per sample):

# %%
from workbench.capture.environment import measure_cpu_peak_bytes

cpu_model = model_fn()
cpu_opt = optimizer_fn(cpu_model.parameters())

def step(x):
    loss = cpu_model(x).square().mean()
    loss.backward()
    cpu_opt.step()
    cpu_opt.zero_grad(set_to_none=True)   # right after step(): no gradients live during the next forward

step(inputs_fn(1))  # creates AdamW's state, so it is not counted below
cpu_peak = {b: measure_cpu_peak_bytes(lambda b=b: step(inputs_fn(b))) for b in (1, 2)}
per_sample = cpu_peak[2] - cpu_peak[1]
rule = 68 * SEQ * D * LAYERS
print(f"CPU peak above baseline: batch 1 {cpu_peak[1] / MiB:.0f} MiB, batch 2 {cpu_peak[2] / MiB:.0f} MiB")
print(f"per sample {per_sample / MiB:.1f} MiB; the rule says {rule / MiB:.1f} MiB, "
      f"the estimator (CUDA kernels) {est.by_category['activations'] / BATCH / MiB:.1f} MiB")

# %% [markdown]
# **Where `zero_grad` goes.** The same step with `zero_grad(set_to_none=True)` between forward and backward
# (as many training loops write it): the previous step's gradients are still alive through the forward.
# To see that in a measurement, both loops run two steps under the profiler from the same start
# (parameters and AdamW state, no gradients), so every gradient is allocated and freed inside the window
# and counted.

# %%
def step_zero_grad_between(x):
    loss = cpu_model(x).square().mean()
    cpu_opt.zero_grad(set_to_none=True)   # after the forward: last step's gradients lived through it
    loss.backward()
    cpu_opt.step()

def two_steps_peak(one_step):
    """Peak bytes of two steps above a start with no gradients live (measured, not added up)."""
    cpu_opt.zero_grad(set_to_none=True)
    return measure_cpu_peak_bytes(lambda: (one_step(inputs_fn(1)), one_step(inputs_fn(1))))

at_end = two_steps_peak(step)
between = two_steps_peak(step_zero_grad_between)
print(f"batch 1, peak above parameters + AdamW state: zero_grad after step() {at_end / MiB:.1f} MiB, "
      f"between forward and backward {between / MiB:.1f} MiB")

# %% tags=["nbval-check-output"]
print(f"difference {(between - at_end) / MiB:.2f} MiB, {(between - at_end) / (4 * P):.0%} of the gradients "
      f"(4 bytes x P = {4 * P / MiB:.2f} MiB)")
assert 0.85 * 4 * P < between - at_end <= 4 * P

# %% [markdown]
# The second loop's peak is higher by most of the gradients, measured: it comes at the end of the second
# forward, with last step's gradients still live. It is not higher by *all* of them because the first
# loop's own peak is a little later, in backward, where the new gradients already count; the difference
# is the gradients minus that.

# %% [markdown]
# The growth is linear in the batch, as the rule says, but on the CPU each sample costs about **twice**
# what the rule (and the GPU) says. The kernels differ: on a CPU, attention runs through a path that keeps
# the 256 x 256 attention probabilities of every head for backward, where the GPU's fused attention keeps
# only a small log-sum-exp per row. Same model, same batch, different memory: measure on the device you
# will run on, or estimate with its kernels.

# %% [markdown]
# On a GPU, the same step with `torch.cuda.max_memory_allocated()`, next to the estimate:

# %% tags=["nbval-skip"]
if GPU:
    gmodel = model_fn().cuda()
    gopt = optimizer_fn(gmodel.parameters())
    xg = inputs_fn(BATCH).cuda()
    for _ in range(3):
        loss = gmodel(xg).square().mean()
        loss.backward(); gopt.step(); gopt.zero_grad(set_to_none=True)   # the estimator's order
    torch.cuda.synchronize()
    print(f"live: max allocated {torch.cuda.max_memory_allocated() / MiB:.0f} MiB, "
          f"max reserved {torch.cuda.max_memory_reserved() / MiB:.0f} MiB; "
          f"estimate {est.peak_allocated_bytes / MiB:.0f} / {est.peak_reserved_bytes / MiB:.0f} MiB")
    # within 10 %, as against the recording (section 4; the H200 run of this cell: 1247 MiB live, 1220 estimated)
    assert abs(est.peak_allocated_bytes / torch.cuda.max_memory_allocated() - 1) < 0.10

# %% [markdown]
# The `MemoryPanel` stacks the measured timeline by category: watch activations climb through forward
# and fall through backward, with parameters and optimizer state as the floor.

# %% tags=["nbval-ignore-output"]
from workbench import MemoryPanel
MemoryPanel(analysis, by="category")

# %% [markdown]
# ## 6 · Convolutions: a workspace the estimate cannot predict, measured instead
#
# Everything above is tensors the step creates, which fake tensors see. A cuDNN convolution also borrows
# scratch memory from the caching allocator for the call (its *workspace*), and how much depends on the
# algorithm cuDNN's heuristics pick for that layer: in fp32 without TF32, for some layers none, for others
# an FFT of hundreds of MiB or more (1190 MiB for one call below), with no rule on the shapes an estimate
# could apply. The choice *is* fixed per call, so measuring each distinct convolution once on the GPU,
# alone, gives what the whole step will see.
# The workbench ships such a table, measured on an H200 (`workbench estimate --calibrate` made it), and
# torch's real peaks of the same U-Net at a batch size the table and the rules never saw:

# %% tags=["nbval-check-output"]
import json
from workbench.analysis.memory.cudnn_model import ConvWorkspaces
from workbench.capture.models import UNet
from workbench.lessons import RESULTS

from workbench.capture.estimate.convolution import SHIPPED_TABLES  # the tables the package ships
table = ConvWorkspaces.load(SHIPPED_TABLES / "nvidia-h200_torch-2.11.0+cu130_cudnn-91900.json")
truth = next(r for r in json.loads((RESULTS / "h200_conv_families.json").read_text())["rows"]
             if r["family"] == "unet" and r["batch_size"] == 16 and r["precision"] == "fp32")
unet_inputs = lambda n: (torch.randn(n, 3, 128, 128),)
unet_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-3)
# as measured: cuBLAS warmed up first, and strict fp32 (TF32 off; an untouched script runs convolutions in TF32)
kw = dict(precision="fp32", strict_fp32=True, batch_size=16, cublas_workspace_bytes=0)
unet_rules = estimate(UNet, unet_inputs, unet_opt, conv_workspaces=False, **kw)  # False: rules only, no table
unet_table = estimate(UNet, unet_inputs, unet_opt, conv_workspaces=table, **kw)
real_res = truth["max_reserved_bytes"] - truth["base_reserved_bytes"]
real_alloc = truth["max_allocated_bytes"] - truth["base_allocated_bytes"]
print(f"U-Net, batch 16, fp32, two AdamW steps on the {table.meta['device']}:")
print(f"  torch's peaks:            allocated {real_alloc / MiB:6.0f} MiB, reserved {real_res / MiB:6.0f} MiB")
print(f"  estimate, rules only:     allocated {unet_rules.peak_allocated_bytes / MiB:6.0f} MiB, reserved "
      f"{unet_rules.peak_reserved_bytes / MiB:6.0f} MiB (up to {unet_rules.peak_reserved_upper_bytes / MiB:.0f} MiB)")
print(f"  estimate, measured table: allocated {unet_table.peak_allocated_bytes / MiB:6.0f} MiB, reserved "
      f"{unet_table.peak_reserved_bytes / MiB:6.0f} MiB "
      f"({unet_table.meta['conv_workspaces']['measured']} of {unet_table.meta['conv_workspaces']['calls']} calls measured)")
assert unet_rules.peak_reserved_bytes < 0.5 * real_res and unet_rules.peak_reserved_upper_bytes > 2 * real_res
assert abs(unet_table.peak_reserved_bytes / real_res - 1) < 0.05 and abs(unet_table.peak_allocated_bytes / real_alloc - 1) < 0.05

# %% [markdown]
# Without the table the estimate misses more than half of the reserved peak and can only bracket it (its
# upper bound, every fp32 convolution at its largest algorithm's workspace, is more than twice the real
# peak); with it, it lands within 5% of torch's numbers. Which calls took the most? The table says:

# %% tags=["nbval-check-output"]
rows = [(k.split("|")[0], k.split("|")[1][1:], k.split("|")[2][1:], v) for k, v in table.entries.items()
        if k.endswith("|fp32|fp32|nchw") and k.split("|")[1].startswith("x16x") and v >= 64 * MiB]
biggest = pd.DataFrame(rows, columns=["direction", "input", "weight", "bytes"]).sort_values("bytes", ascending=False)
biggest["MiB"] = (biggest.pop("bytes") / MiB).round(0)
print(biggest.head(6).to_string(index=False))
none_taken = sum(1 for k, v in table.entries.items() if k.endswith("|fp32|fp32|nchw") and k.split("|")[1].startswith("x16x") and v == 0)
print(f"... and {none_taken} fp32 calls of this step took no workspace at all")

# %% [markdown]
# To measure your own model, on the GPU you will train on (seconds: one layer's tensors at a time):
#
#     workbench estimate model.py --batch-size 16 --calibrate --workspaces ws.json
#
# then `workbench estimate model.py --batch-size 16 --workspaces ws.json` anywhere, or
# `EstimatePanel("model.py", workspaces="ws.json")`. A table holds for the GPU, torch and cuDNN it names; bf16 and
# TF32 convolutions follow a rule the estimator knows better (NHWC copies), but measuring helps them too.

# %% tags=["nbval-skip"]
if GPU:
    from workbench.capture.cudnn_calibration import calibrate
    mine = calibrate(UNet, unet_inputs, unet_opt, precision="fp32", batch_size=16)
    print(f"{len(mine)} calls measured on {mine.meta['device']}")
    assert len(mine) > 0 and mine.meta["device"] == torch.cuda.get_device_name()

# %% [markdown]
# ## Exercise
#
# Turn batch size, precision and checkpointing in the estimator and watch which category moves.
# Which parts do not change with the batch? What does bf16 do to the parameters (nothing: autocast keeps
# fp32 weights) and to the activations?

# %% tags=["nbval-ignore-output"]
from workbench import EstimatePanel
EstimatePanel.from_factories(model_fn, inputs_fn, optimizer_fn, batch_size=BATCH, max_batch_size=128, budget_gib=2.0)

# %% [markdown]
# Write your answers down before the check runs the estimator for you (batch 8 against batch 16, and bf16
# autocast against fp32, both at batch 16):

# %%
MY_FIXED = {"parameters", "optimizer_state"}   # the categories that do not change when the batch halves
MY_BF16_PARAMETERS = "same"                     # "same", "half" or "double": bf16's parameters against fp32's
MY_BF16_ACTIVATIONS = "smaller"                 # "same", "smaller" or "larger"

# %% tags=["nbval-check-output"]
half = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=BATCH // 2).by_category
bf16 = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=BATCH, precision="bf16").by_category
full = est.by_category
fixed = {k for k, v in full.items() if v > 0 and half.get(k) == v}
p_ratio = bf16["parameters"] / full["parameters"]
answer_params = {0.5: "half", 1.0: "same", 2.0: "double"}.get(round(p_ratio, 2))
answer_acts = "smaller" if bf16["activations"] < full["activations"] else "larger" if bf16["activations"] > full["activations"] else "same"
print("unchanged when the batch halves:", sorted(fixed), "-", "right" if MY_FIXED <= fixed and
      not MY_FIXED & {"activations", "temporaries"} else "look again")
print(f"bf16 parameters {p_ratio:.2f}x fp32's -> {answer_params}:", "right" if MY_BF16_PARAMETERS == answer_params else "look again")
print(f"bf16 activations {bf16['activations'] / full['activations']:.2f}x fp32's -> {answer_acts}:",
      "right" if MY_BF16_ACTIVATIONS == answer_acts else "look again")
# the solution, from the estimates: weights and AdamW state ignore the batch; activations follow it;
# autocast keeps fp32 weights and stores many activations in bf16
assert {"parameters", "optimizer_state"} <= fixed and not fixed & {"activations", "temporaries"}
assert abs(half["activations"] / full["activations"] - 0.5) < 0.05
assert answer_params == "same" and answer_acts == "smaller" and bf16["activations"] > 0.5 * full["activations"]

# %% [markdown]
# ## Takeaways

# %% tags=["nbval-check-output"]
assert abs(measured["activations"] / envelope["activations"] - 1) < 0.05   # the rule holds for activations
assert measured["gradients"] < 0.1 * envelope["gradients"]                 # grads are not live at the peak
assert 1.2 < peak_alloc / params_plus_acts < 1.5                           # tensors alone: ~1.3x
assert abs(est.peak_allocated_bytes / peak_alloc - 1) < 0.10               # the estimator: within 10 %
assert 1.0 < per_sample / rule < 3.0                                       # CPU kernels keep more
assert 0.85 * 4 * P < between - at_end <= 4 * P                            # zero_grad's place: ~ + the gradients
assert abs(unet_table.peak_reserved_bytes / real_res - 1) < 0.05           # fp32 convolutions: measure the workspaces
print(f"measured / (params + activations): {peak_alloc / params_plus_acts:.2f}x allocated, "
      f"{peak_res / params_plus_acts:.2f}x reserved by the allocator, plus the CUDA context outside it")

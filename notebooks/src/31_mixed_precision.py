# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 31 · Mixed precision: what each float format buys, and what it costs in accuracy
#
# A training step can do its math in four ways on an NVIDIA GPU:
#
# | configuration | weights | matmul inputs | what changes |
# |---|---|---|---|
# | `fp32` | float32 (23 stored mantissa bits) | float32 | the reference; on an H200, matmuls run on CUDA cores (no tensor cores) |
# | `tf32` | float32 | TF32 (10 stored mantissa bits, fp32's 8-bit exponent) inside cuBLAS | a flag: matmuls move to tensor cores |
# | `amp_bf16` | float32 | bfloat16 (7 stored mantissa bits, 8-bit exponent; `torch.autocast`) | activations are half the size; same exponent range as fp32 |
# | `amp_fp16` + `GradScaler` | float32 | float16 (10 stored mantissa bits, 5-bit exponent; `torch.autocast`) | like bf16, but a 5-bit exponent: small gradients underflow unless the loss is scaled |
#
# (Mantissa bits are counted as stored, without the implicit leading 1; a format's `torch.finfo(...).eps`
# is 2 to the minus that number.)
#
# **What "fp32" means in an untouched script.** PyTorch has two TF32 switches, and their defaults differ:
# matrix multiplies (cuBLAS) default to full fp32 (`torch.get_float32_matmul_precision()` is `"highest"`,
# `torch.backends.cuda.matmul.allow_tf32` is False), while **cuDNN convolutions default to TF32**
# (`torch.backends.cudnn.allow_tf32` is True). So on an Ampere or newer GPU a plain fp32 CNN already runs
# its convolutions in TF32, and a plain fp32 transformer does not. The workbench's `fp32` configuration
# sets both switches off (strict fp32, the reference); `tf32` sets both on. The defaults, read in a fresh
# interpreter of this torch:
#
# **Speed and memory** are a GPU effect (tensor cores, HBM traffic): a CPU cannot show them, so they
# come from a real H200 run. **Accuracy** is plain arithmetic, and this notebook checks it for real on
# the CPU with the workbench's experiment harness: loss curves against fp32, gradients that underflow
# in fp16 without loss scaling, and parameter updates that vanish when the weights themselves are
# fp16.

# %% tags=["nbval-check-output"]
import subprocess, sys
probe = ("import torch; print(torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, "
         "torch.backends.cudnn.allow_tf32)")
matmul_precision, matmul_tf32, cudnn_tf32 = subprocess.run([sys.executable, "-W", "ignore", "-c", probe],
                                                           capture_output=True, text=True, check=True).stdout.split()
print(f"matmul precision {matmul_precision!r}, matmul TF32 {matmul_tf32}, cuDNN TF32 {cudnn_tf32}")
assert (matmul_precision, matmul_tf32, cudnn_tf32) == ("highest", "False", "True")

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

# %% [markdown]
# ## 1 · Speed and memory on the H200
#
# A 12-layer transformer (d=1024, 16 heads, batch 32×512 tokens, AdamW) was run under each
# configuration by the workbench's experiment harness on one H200 (`benchmarks/record_harness_h200.py`).
# Its ledger ships with the package (`workbench.io.load_ledger`); `baseline_ratios` puts every row
# against the fp32 one. (The ledger also has an energy column; see below why it is left out here.)

# %%
from workbench.io import load_ledger
from workbench.analysis import baseline_ratios

h200 = load_ledger(RESULTS / "h200_harness.ledger.json")
precision = h200[h200["configuration"].isin(["fp32", "tf32", "amp_bf16", "amp_fp16"])].reset_index(drop=True)
ratios = baseline_ratios(precision, baseline="fp32")
ratios.assign(peak_gib=ratios["peak_allocated_bytes"] / GIB)[
    ["configuration", "step_ms_median", "speedup", "peak_gib", "peak_allocated_ratio", "tokens_per_s"]]

# %% tags=["nbval-check-output"]
r = ratios.set_index("configuration")
for name in r.index:
    mem = "" if pd.isna(r.loc[name, "peak_allocated_bytes"]) else f", peak {r.loc[name, 'peak_allocated_bytes'] / GIB:.2f} GiB"
    print(f"{name:9s} {r.loc[name, 'step_ms_median']:6.1f} ms/step  x{r.loc[name, 'speedup']:.2f} vs fp32{mem}")

# %% [markdown]
# TF32 alone gives more than ×3: on Hopper, fp32 matmuls without tensor cores are the bottleneck. bf16
# gives more than ×2 on top and cuts the peak by about a third (activations are stored in 16 bits;
# weights, gradients and AdamW's state stay fp32). fp16 is about as fast as bf16.
#
# **Why no energy column?** The harness read NVML's energy counter around each configuration's timed
# steps, and those windows were short (steps × step time below). Divided by the time, some rows come out
# above the board's power limit, the average its power management holds it to: a counter read over a second or less
# is too coarse for energy per step. Energy needs windows of many seconds (notebook 13's subject).

# %% tags=["nbval-check-output"]
from workbench.lessons import h200_pair

limit_w = h200_pair("sync")["env"]["power_limit_w"]   # NVML's power limit on that H200 (same machine, same day)
for _, row in precision.iterrows():
    window_s = row["steps"] * row["step_ms_median"] / 1e3
    implied_w = row["energy_j_per_step"] / (row["step_ms_median"] / 1e3)
    print(f"{row['configuration']:9s} window {window_s:.2f} s, implied {implied_w:4.0f} W"
          + ("  <- above the board's limit" if implied_w > limit_w else ""))
print(f"power limit: {limit_w:.0f} W")

# %% [markdown]
# The same rows in the workbench's `ComparePanel` (bars per metric with the ratio to the baseline; pick
# another baseline in the dropdown), energy dropped:

# %% tags=["nbval-ignore-output"]
from workbench import ComparePanel

ComparePanel(precision.drop(columns=["energy_j_per_step", "power_w"]), baseline="fp32")

# %% [markdown]
# ## 2 · The numerical check, for real on this CPU
#
# The harness runs the first steps of every configuration from the **same weights on the same batches**
# (same seed) and compares loss, outputs and gradients with the fp32 reference (`check_*` columns of the
# ledger, verdict in `check_verdict`). A small model of the same family as the H200 one:

# %%
import torch.nn.functional as F
from workbench.capture.models import Block, EvenBlock, OddBlock, LM  # the H200 runs' transformer, sizes as arguments


from workbench import Workload
from workbench.capture.configurations import amp_bf16, amp_fp16, fp32, pure_fp16, tf32
from workbench import run_experiment

VOCAB, SEQ = 128, 32


def batch(n, device):
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(scale=1.0):
    def loss(model, b):
        x, y = b
        logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1)) * scale, logits
    return loss


def workload(optimizer, scale=1.0):
    return Workload(model=lambda: LM(layers=2, d=64, heads=4, vocab=VOCAB), batch=batch, loss=lm_loss(scale),
                    optimizer=optimizer, batch_size=8, tokens_per_sample=SEQ)


# %% [markdown]
# Four configurations, six checked steps each, plain SGD with momentum (an optimizer whose update is
# proportional to the gradient, so that the size of an update is easy to reason about). TF32 needs a
# CUDA device: the harness skips it here and says why. `pure_fp16` is the mistake autocast exists to
# prevent: the *weights* in fp16, no fp32 master copy.

# %%
sgd = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)
exp = run_experiment(workload(sgd), [fp32(), tf32(), amp_bf16(), amp_fp16(), pure_fp16()],
                     steps=2, warmup=0, check_steps=6, energy=False, progress=False, name="precision-cpu")
led = exp.ledger
led[["configuration", "status", "error", "peak_allocated_bytes", "check_verdict"]]

# %% [markdown]
# **Loss curves against fp32.** `exp.checks()` holds the per-step numbers of the check; the loss of each
# step, side by side (the same weights and batches, so the columns should agree to the precision of
# the format):

# %%
checks = exp.checks()
curves = checks.pivot(index="step", columns="configuration", values="loss")[["fp32", "amp_bf16", "amp_fp16", "pure_fp16"]]
rel = (curves.drop(columns="fp32").sub(curves["fp32"], axis=0)).abs().div(curves["fp32"].abs(), axis=0)
print("largest relative deviation of the loss from fp32 over", len(curves), "steps:")
print(rel.max().map("{:.1e}".format).to_string())
curves.round(5)

# %% [markdown]
# bf16 stores 7 mantissa bits, fp16 10 (printed below from `torch.finfo`): bf16's loss strays further
# from fp32 than fp16's, and both stay within 1e-4 of it here.
#
# **The loss is a weak check**, though: `pure_fp16` (weights stored in fp16) follows fp32 just as closely
# over these six steps, yet most of its updates never reach the weights (next section). Compare gradients
# and updates, not only the loss. The verdicts and their evidence, from `workbench.analysis.check_verdicts`:

# %% tags=["nbval-check-output"]
for dt in (torch.float32, torch.bfloat16, torch.float16):
    fi = torch.finfo(dt)
    print(f"{str(dt):15s} eps 2^{int(np.log2(fi.eps))} = {fi.eps:.1e}, smallest normal {fi.tiny:.1e}")

# %%
from workbench.analysis import check_verdicts

verdicts = check_verdicts(led)
verdicts[["configuration", "check_verdict", "check_loss_rel_err", "check_grad_max_rel_err",
          "check_update_underflow_fraction"]]

# %% [markdown]
# ### Updates that vanish when the weights are fp16
#
# float16 stores 10 mantissa bits: next to a weight `w`, the closest other fp16 number is about
# `2**-10 · |w|` away (`torch.finfo(torch.float16).eps` = 9.8e-4). An SGD update `lr · grad` smaller
# than half of that rounds back to `w`: the step happens in the arithmetic but not in the model. The
# harness counts, for each parameter element whose gradient is nonzero, whether its update was
# below `eps · |w|` (`check_update_underflow_fraction`). autocast avoids it by keeping the weights
# (the *master copy*) in fp32 and casting to 16 bits only for the matmuls.

# %%
u = verdicts.set_index("configuration")["check_update_underflow_fraction"]
print(f"updates below the weight's resolution: fp32 {u['fp32']:.1%}, autocast fp16 {u['amp_fp16']:.1%}, "
      f"pure fp16 {u['pure_fp16']:.0%}")
print("pure_fp16:", exp.result("pure_fp16").check.message)

# %% [markdown]
# ### Gradients that underflow in fp16 without loss scaling
#
# fp16's smallest normal number is 6.1e-5 (subnormals go down to 6e-8; bf16 reaches 1e-38 like fp32).
# Under autocast the backward pass computes activation gradients in fp16: when the loss is small (a
# mean over many tokens, a weighted auxiliary loss), they round to zero and the weights stop learning.
# `GradScaler` multiplies the loss by a large factor (2^16 at first) before `backward()` and divides
# the gradients by it before the step, skipping steps whose gradients overflowed.
#
# Below, the same model with the loss multiplied by `2**-20`, with **AdamW**: fp16 without a scaler loses
# its gradients, with a scaler it matches fp32 (each compared with fp32 at the same scaled loss).
#
# AdamW is often called scale-invariant; it is only while the gradients are much larger than its `eps`
# (1e-8 by default). Its update is `m / (sqrt(v) + eps)`: at loss × 2^-20 the gradients here are of the
# order of `eps`, and even in fp32 the first update shrinks:

# %% tags=["nbval-check-output"]
def first_update_size(scale):
    """Mean |change| of the weights after one fp32 AdamW step (weight decay off) at loss x scale."""
    torch.manual_seed(0)
    m = LM(layers=2, d=64, heads=4, vocab=VOCAB)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0)
    before = [p.detach().clone() for p in m.parameters()]
    torch.manual_seed(1)
    lm_loss(scale)(m, batch(8, "cpu"))[0].backward()
    opt.step()
    return torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(m.parameters(), before)]).mean().item()

update_ratio = first_update_size(2.0 ** -20) / first_update_size(1.0)
print(f"fp32 AdamW, first update at loss x 2^-20 vs x 1: x{update_ratio:.2f}")

# %%
from workbench.analysis import baseline_ratios

adamw = lambda params: torch.optim.AdamW(params, lr=1e-3)


def underflow_experiment(exponent: int, scaler: bool = True):
    configs = [fp32(), amp_fp16(grad_scaler=False)] + ([amp_fp16()] if scaler else [])
    return run_experiment(workload(adamw, scale=2.0 ** -exponent), configs, steps=1, warmup=0, check_steps=3,
                          energy=False, progress=False, name=f"loss x 2^-{exponent}")


small = underflow_experiment(20)
v = check_verdicts(small.ledger).set_index("configuration")
v[["check_verdict", "check_grad_underflow_fraction", "check_grad_max_rel_err"]]

# %% [markdown]
# ### Exercise: how small can the loss get?
#
# Move the slider (the loss is multiplied by `2**-k`) and untick the scaler. Each change runs the three
# configurations for three steps and shows them in a `ComparePanel` (verdicts at the bottom). Where does
# fp16 without a scaler start to lose gradients? At what `k` does even the scaled run lose some?
# (Hint: the scaler starts at 2^16 and fp16's smallest subnormal is 2^-24.)

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets
from workbench import ComparePanel

k = widgets.IntSlider(value=20, min=0, max=40, step=2, description="loss × 2^-k", continuous_update=False)
use_scaler = widgets.Checkbox(value=True, description="run with GradScaler too")
shown = widgets.VBox([ComparePanel(small, baseline="fp32")])


def show(_change=None):
    shown.children = [ComparePanel(underflow_experiment(k.value, use_scaler.value), baseline="fp32")]


k.observe(show, names="value")
use_scaler.observe(show, names="value")
widgets.VBox([widgets.HBox([k, use_scaler]), shown])

# %% [markdown]
# Your answers (slider steps of 2), then the check finds both thresholds by bisection over `k`, running
# the harness at each step it needs:

# %%
MY_NOSCALER_K = 20    # the smallest k at which fp16 without a scaler is called grad_underflow
MY_SCALED_K = 36      # the smallest k at which the GradScaler run is

# %% tags=["nbval-check-output"]
def underflows(exponent, scaled):
    config = amp_fp16() if scaled else amp_fp16(grad_scaler=False)
    e = run_experiment(workload(adamw, scale=2.0 ** -exponent), [fp32(), config], steps=1, warmup=0,
                       check_steps=3, energy=False, progress=False, name=f"loss x 2^-{exponent}")
    return check_verdicts(e.ledger).set_index("configuration").loc[config.name, "check_verdict"] == "grad_underflow"


def first_k(scaled, lo=0, hi=40):
    """Smallest even k in (lo, hi] that underflows, given that lo does not and hi does."""
    assert not underflows(lo, scaled) and underflows(hi, scaled)
    while hi - lo > 2:
        mid = (lo + hi) // 4 * 2
        lo, hi = (lo, mid) if underflows(mid, scaled) else (mid, hi)
    return hi


k_plain, k_scaled = first_k(False), first_k(True)
print(f"without a scaler from k = {k_plain}:", "right" if MY_NOSCALER_K == k_plain else "look again")
print(f"with the GradScaler from k = {k_scaled}:", "right" if MY_SCALED_K == k_scaled else "look again")
# the solution: the scaler multiplies the loss by 2^16 before backward, so it moves the threshold by 16
assert k_scaled - k_plain == 16 and 0 < k_plain < 24

# %% [markdown]
# ## 3 · On a GPU: the whole comparison, live
#
# With a CUDA device this cell runs the H200 experiment of section 1 (12 layers, d=1024, batch 32×512)
# and shows it in the same panel; it takes about a minute on an H200. On a CPU it is skipped.

# %% tags=["nbval-skip"]
if GPU:
    big = Workload(model=lambda: LM(layers=12, d=1024, heads=16, vocab=2048),
                   batch=lambda n, device: (lambda t: (t[:, :-1], t[:, 1:]))(torch.randint(0, 2048, (n, 513), device=device)),
                   loss=lambda m, b: (F.cross_entropy(m(b[0]).float().reshape(-1, 2048), b[1].reshape(-1)),),
                   optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, fused=True), batch_size=32, tokens_per_sample=512)
    live = run_experiment(big, [fp32(), tf32(), amp_bf16(), amp_fp16()], steps=6, warmup=2, check_steps=2)
    print(live.ledger[["configuration", "step_ms_median", "peak_allocated_bytes", "check_verdict"]].to_string())
    lv = live.ledger.set_index("configuration")
    assert lv.loc["amp_bf16", "step_ms_median"] < lv.loc["fp32", "step_ms_median"]   # any GPU with bf16 tensor cores
    assert lv.loc["amp_bf16", "check_verdict"] == "ok" and lv.loc["amp_fp16", "check_verdict"] == "ok"
    if torch.cuda.get_device_capability()[0] >= 8:                                   # TF32 exists from Ampere on
        assert lv.loc["tf32", "step_ms_median"] < lv.loc["fp32", "step_ms_median"]
    display(ComparePanel(live, baseline="fp32"))

# %% [markdown]
# ## Takeaways
#
# - On an H200, **TF32 is the first switch to flip** (more than ×3 for a flag); **bf16 autocast** gives
#   about ×8 over fp32 and a third less peak memory; fp16 is about as fast, but needs a `GradScaler`.
# - autocast keeps fp32 master weights: loss curves follow fp32 within 1e-4 here. Weights *stored* in
#   fp16 lose most small updates while their loss curve still looks right: check updates, not the loss.
#   Small fp16 losses lose their gradients unless scaled.
# - AdamW is not scale-invariant once gradients approach its `eps`.
# - Energy per step needs measuring windows of seconds, not a fraction of one.

# %%
# the H200 rows (recorded) and this CPU's numerical check (computed above)
assert r.loc["tf32", "speedup"] > 2.5 and r.loc["amp_bf16", "speedup"] > 7
assert r.loc["amp_bf16", "peak_allocated_ratio"] < 0.7
assert rel[["amp_bf16", "amp_fp16"]].max().max() < 1e-3              # autocast loss curves follow fp32
assert rel["pure_fp16"].max() < 1e-3 and u["pure_fp16"] > 0.25         # ...and so does pure fp16's, updates lost
assert update_ratio < 0.9                                             # AdamW: eps dominates at tiny gradients
assert u["pure_fp16"] > 0.25 > 0.01 > u["amp_fp16"]                  # fp16 weights drop updates, autocast does not
assert (precision["power_w"] > limit_w).any()                         # the recorded energy: too short a window
assert v.loc["amp_fp16_noscaler", "check_verdict"] == "grad_underflow"
assert v.loc["amp_fp16", "check_verdict"] == "ok"
assert led.set_index("configuration").loc["amp_bf16", "peak_allocated_bytes"] < \
    led.set_index("configuration").loc["fp32", "peak_allocated_bytes"]   # 16-bit activations, even on a CPU
print("takeaways hold")

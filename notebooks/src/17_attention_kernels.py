# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 17 · Attention kernels: which SDPA backend ran, and what it cost
#
# **One idea:** `torch.nn.functional.scaled_dot_product_attention` (SDPA) is one call with several kernels
# behind it. The fused ones (*flash*, *memory-efficient*, *cuDNN*) never write the S x S matrix of scores to
# memory, so what they need grows with the sequence length S; the *math* backend and a hand-written
# `softmax(Q K^T / sqrt(d)) V` do write it, so theirs grows with S². Which kernel runs is decided call by
# call, from the dtype, the head size and the mask, and on a GPU an explicit mask tensor (even a causal one)
# takes flash out of the choice.
#
# The numbers come from a GPU recording, `benchmarks/record_lesson17_h200.py`, run on an **NVIDIA H100 80GB
# HBM3** on 2026-12-05 (`results/h100_lesson17.json`; section 2 prints the machine from the file): bf16,
# batch 4, 16 heads, head sizes 64 and 128, sequences 1024 to 16384; each backend forced with
# `torch.nn.attention.sdpa_kernel`, forward alone (`fwd`) and forward + backward (`fwd_bwd`); median of CUDA
# events, the peak memory above what the inputs already held, and which backend the dispatcher picks when
# nobody forces one. Section 1 runs the same comparison small and live on this machine's CPU.

# %%
from workbench.lessons import setup, recording, recorded_table, RESULTS, GIB, MIB
setup(recorded_on="H100")
import json, math, time
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
GPU = torch.cuda.is_available()

from workbench import load_trace, profile_steps, TraceAnalysis

REC = recording("h100_lesson17.json")
ENV = REC["env"]
ON_GPU = bool(ENV["cuda_available"]) and not REC["smoke"]     # a GPU recording (the shipped one); --smoke is CPU
SWEEPS = ("sweep_d128", "sweep_d64")
runs = pd.concat([recorded_table(REC[p]) for p in SWEEPS], ignore_index=True)
picks = pd.concat([recorded_table(REC[p], "default") for p in SWEEPS], ignore_index=True)
B, HEADS = REC["sweep_d128"]["batch"], REC["sweep_d128"]["heads"]
SEQS = REC["sweep_d128"]["seqs"]
S_MAX = max(SEQS)

# %% [markdown]
# ## 1 · Live, on this CPU: the math backend against the CPU's flash kernel
#
# One causal attention (batch 1, 4 heads, 1024 tokens, head size 64, fp32), each backend forced, profiled for
# three calls by `workbench.profile_steps`; `TraceAnalysis(...).ops` is the op table of each trace (on a CPU
# trace: CPU time by op). First, the two give the same answer:

# %%
x = torch.randn(3, 1, 4, 1024, 64)
q, k, v = x[0], x[1], x[2]


def attend(backend, **kw):
    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return call


out_math, out_flash = attend(SDPBackend.MATH, is_causal=True)(), attend(SDPBackend.FLASH_ATTENTION, is_causal=True)()
diff = (out_math - out_flash).abs().max().item()
print(f"largest difference between the two outputs: {diff:.1e}")
assert diff < 1e-4

# %% tags=["nbval-ignore-output"]
live = {}
for name, backend in (("math", SDPBackend.MATH), ("flash", SDPBackend.FLASH_ATTENTION)):
    r = profile_steps(attend(backend, is_causal=True), steps=3, detail="standard", progress=False, verbose=False)
    live[name] = TraceAnalysis(load_trace(r.path))

cols = ["name", "count", "cpu_self_us"]
for name, a in live.items():
    print(f"--- {name}: the ops of 3 calls, by CPU self time")
    print(a.ops[cols].head(6).round(0).to_string(index=False))

# %% [markdown]
# The math backend is the attention formula written in aten ops: a batched matmul for the scores (`bmm`), a
# softmax, and a second `bmm` with V, plus the ops that build and apply the causal mask. Each of those writes
# a tensor of 1024 x 1024 scores per head. The flash backend is one op, `_scaled_dot_product_flash_attention_for_cpu`,
# which walks the keys in blocks and keeps a running softmax, so no score matrix is ever whole.

# %% tags=["nbval-check-output"]
names = {n: set(a.ops["name"]) for n, a in live.items()}
print("math uses bmm and _softmax:", {"aten::bmm", "aten::_softmax"} <= names["math"])
print("flash uses one fused op and no bmm:", "aten::_scaled_dot_product_flash_attention_for_cpu" in names["flash"]
      and "aten::bmm" not in names["flash"])

# %% tags=["nbval-ignore-output"]
ms = {n: a.ops.loc[a.ops["name"] == "aten::scaled_dot_product_attention", "cpu_total_us"].sum() / 3e3
      for n, a in live.items()}
print({n: round(float(v), 2) for n, v in ms.items()}, "ms a call (profiled, this CPU)")

# %% [markdown]
# On a CPU, flash also takes an explicit mask tensor. Remember this one: on a GPU it does not (section 4).

# %% tags=["nbval-check-output"]
causal_mask = torch.ones(1024, 1024, dtype=torch.bool).tril()
with_mask = attend(SDPBackend.FLASH_ATTENTION, attn_mask=causal_mask)()
print("CPU flash with an explicit causal mask: same output as is_causal=True:",
      torch.allclose(with_mask, out_flash, atol=1e-5))

# %% [markdown]
# ## 2 · What the H100 measured
#
# The recording's machine, and forward + backward at head size 128 with no mask: time per call and
# achieved TFLOP/s by backend (FLOPs: the count attention benchmarks use, `4·B·H·S²·D` forward, half of it
# causal, backward 2.5x the forward, so `fwd_bwd` is 3.5x). A blank is a run that did not happen; the
# skipped and refused ones are listed after.

# %% tags=["nbval-check-output"]
print("recorded on:", ENV["gpu"], ENV["date_utc"][:10], "| torch", ENV["torch"], "| CUDA", ENV["cuda"], "| cuDNN", ENV["cudnn"])
print(f"batch {B}, {HEADS} heads, bf16, sequences {SEQS}; FLOPs: {REC['flops']}")

# %%
ok = runs[runs["status"] == "ok"]


def pivot(value, head_dim=128, mode="fwd_bwd", mask="none", backends=("flash", "efficient", "cudnn", "math", "naive")):
    sel = ok[(ok["head_dim"] == head_dim) & (ok["mode"] == mode) & (ok["mask"] == mask)]
    return sel.pivot(index="seq", columns="backend", values=value).reindex(index=SEQS, columns=list(backends)).astype(float)


print("ms a call:")
print(pivot("median_ms").round(3).to_string())
print("\nTFLOP/s:")
print(pivot("tflops").round(1).to_string())

# %% tags=["nbval-check-output"]
not_run = runs[(runs["status"] != "ok") & (runs["head_dim"] == 128) & (runs["mode"] == "fwd_bwd")]
print(not_run.groupby(["backend", "mask", "status"])["seq"].apply(list).to_string())

# %% [markdown]
# The fused backends run every length; math and the hand-written one stop where their score matrices would
# have needed more than the recorder's limit (`max_gib`), which is the subject of the next section. How much
# faster fused is, at the longest length math ran:

# %% tags=["nbval-check-output"]
t = pivot("median_ms")
s_both = int(t["math"].dropna().index.max())
speedup = {b: t.loc[s_both, "math"] / t.loc[s_both, b] for b in ("flash", "efficient", "cudnn", "naive")}
print(f"S={s_both}, fwd_bwd, head size 128: math / backend time =", {b: round(float(v), 2) for b, v in speedup.items()})

# %% [markdown]
# ## 3 · Memory: S against S²
#
# `peak_extra_bytes` is `torch.cuda.max_memory_allocated()` during one call minus what was allocated before
# it: the output, what the backward keeps (and, in `fwd_bwd`, the three input gradients), and any score
# matrix. If a backend's extra memory grows like S^p, doubling S multiplies it by 2^p; the fit over the
# lengths each backend ran gives p:

# %% tags=["nbval-check-output"]
def growth(backend, head_dim=128, mode="fwd_bwd", mask="none"):
    sel = ok[(ok["backend"] == backend) & (ok["head_dim"] == head_dim) & (ok["mode"] == mode) & (ok["mask"] == mask)]
    sel = sel.dropna(subset=["peak_extra_bytes"])
    if len(sel) < 2:
        return float("nan")
    return float(np.polyfit(np.log(sel["seq"].astype(float)), np.log(sel["peak_extra_bytes"].astype(float)), 1)[0])


exponents = pd.DataFrame({mode: {b: growth(b, mode=mode) for b in ("flash", "efficient", "cudnn", "math", "naive")}
                          for mode in ("fwd", "fwd_bwd")})
print("p in peak extra memory ~ S^p (head size 128, no mask):")
print(exponents.round(2).to_string())

# %%
mem = pivot("peak_extra_bytes") / MIB
print("peak extra memory, MiB (fwd_bwd, head size 128):")
print(mem.round(0).to_string())

# %% [markdown]
# The figure shows the same on log-log axes: a line of slope 1 is linear, slope 2 quadratic. What a fused
# backend adds is the output and, with the backward, the three gradients (B·H·S·D elements each) and the
# saved log-sum-exp (B·H·S); math and the hand-written attention add the S x S scores of every head, and stop
# early.

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go
from plotly.subplots import make_subplots

fig = make_subplots(rows=1, cols=2, subplot_titles=("peak extra memory (GiB)", "time a call (ms)"))
colors = {"flash": "#0072B2", "efficient": "#009E73", "cudnn": "#56B4E9", "math": "#D55E00", "naive": "#CC79A7"}
for b, c in colors.items():
    m, tt = pivot("peak_extra_bytes")[b].dropna() / GIB, pivot("median_ms")[b].dropna()
    fig.add_trace(go.Scatter(x=m.index, y=m.values, mode="lines+markers", name=b, line={"color": c}), 1, 1)
    fig.add_trace(go.Scatter(x=tt.index, y=tt.values, mode="lines+markers", name=b, line={"color": c},
                             showlegend=False), 1, 2)
fig.update_xaxes(type="log", title_text="sequence length S")
fig.update_yaxes(type="log")
fig.update_layout(height=360, title=f"SDPA backends on the {ENV['gpu'] or 'CPU (smoke recording)'}: bf16, "
                                    f"fwd + bwd, head size 128, no mask", template="plotly_white")
fig

# %% [markdown]
# ## 4 · Who decides which kernel runs
#
# With no `sdpa_kernel` around the call, the dispatcher takes the first backend (in its order of preference)
# whose conditions the call meets. The recorder saw which one by the aten op in a profile. By mask, for a
# training call (inputs that need gradients) at head size 128:

# %% tags=["nbval-check-output"]
chosen = picks[(picks["head_dim"] == 128) & (picks["mode"] == "fwd_bwd")].pivot(index="seq", columns="mask", values="picked")
print(chosen.reindex(columns=["none", "causal", "mask"]).to_string())

# %% [markdown]
# The `mask` column is the same causal pattern as `is_causal=True`, given as a boolean tensor. The error
# lines say why a forced backend refused it (torch's message, then the reason its warnings gave):

# %% tags=["nbval-check-output"]
refused = runs[(runs["status"] == "error") & (runs["head_dim"] == 128)]
for (b, m), e in refused.groupby(["backend", "mask"])["error"].first().items():
    print(f"{b} with mask={m}: {e}")

# %% [markdown]
# The `support` part asked each backend for every dtype and head size at one length (no mask, forward +
# backward): `ok`, `error` (refused) or `skipped`, and the dispatcher's pick. On the H100 run the part's time
# budget ran out after bf16 and fp16 at head sizes 64 and 128: the forced runs of fp16 at 256 and 512 and of
# every fp32 row were skipped, not refused. The dispatcher's picks were recorded for every row, and they
# still say something: for fp32 it picked the memory-efficient backend, not flash or cuDNN.

# %% tags=["nbval-check-output"]
sup = recorded_table(REC["support"])
print(f"S={REC['support']['seq']}, batch {REC['support']['batch']}, {REC['support']['heads']} heads, no mask, fwd_bwd")
sup_picks = recorded_table(REC["support"], "default")
grid = sup[sup["mode"] == "fwd_bwd"].pivot_table(index=["dtype", "head_dim"], columns="backend", values="status",
                                                 aggfunc="first")
grid["default picks"] = sup_picks[sup_picks["mode"] == "fwd_bwd"].set_index(["dtype", "head_dim"])["picked"]
print(grid.reindex(columns=["flash", "efficient", "cudnn", "math", "default picks"]).to_string())
print()
for (st, b, e), g in sup[(sup["status"] != "ok") & (sup["mode"] == "fwd_bwd")].groupby(["status", "backend", "error"]):
    print(f"{b} {'refused' if st == 'error' else 'not run'} {', '.join(f'{dt}/{d}' for dt, d in zip(g['dtype'], g['head_dim']))}:"
          f"\n    {e}")

# %% [markdown]
# So before reading a step's time, look at the kernel that ran. The recorder also profiled one forward +
# backward of each backend (head size 128, no mask) and kept the kernels' names, which is what you will find
# in the kernel table of your own trace:

# %% tags=["nbval-check-output"]
K = REC["kernels"]
print(f"S={K['seq']}, head size {K['head_dim']}, bf16, one fwd_bwd")
for b, r in K["masks"]["none"].items():
    if "top" in r:
        top = pd.DataFrame(r["top"], columns=r["top_columns"])
        print(f"{b:>9}: {len(r['top'])} largest of {r['total_us']:.0f} us ({K['what']}):",
              "; ".join(f"{n[:60]} x{c}" for n, c in zip(top["name"], top["calls"])))
    else:
        print(f"{b:>9}: {r['error'][:120]}")

# %% [markdown]
# ## 5 · Causal: `is_causal=True` against the same mask as a tensor
#
# A causal mask removes half the score matrix. With `is_causal=True` a fused kernel knows the shape of what is
# masked and skips the blocks above the diagonal, so it does half the work. Given the same mask as a tensor,
# the kernel must read it and cannot skip a block without looking; and flash, which takes no mask tensor on a
# GPU, drops out of the choice. The default dispatcher's time for each (the time of the backend it picks, in
# the sweep), forward + backward at the longest length. On the recording's H100 (torch 2.11) the dispatcher
# picked cuDNN for all three (section 4), so flash dropping out changed nothing there: what the tensor costs
# is cuDNN reading the mask instead of skipping blocks.

# %% tags=["nbval-check-output"]
def default_ms(mask, s=S_MAX, head_dim=128, mode="fwd_bwd"):
    p = picks[(picks["seq"] == s) & (picks["head_dim"] == head_dim) & (picks["mode"] == mode) & (picks["mask"] == mask)]
    b = p["picked"].iloc[0]
    r = ok[(ok["backend"] == b) & (ok["seq"] == s) & (ok["head_dim"] == head_dim) & (ok["mode"] == mode) & (ok["mask"] == mask)]
    return b, (float(r["median_ms"].iloc[0]) if len(r) else float("nan"))


dflt = {m: default_ms(m) for m in ("none", "causal", "mask")}
for m, (b, t_ms) in dflt.items():
    print(f"S={S_MAX} mask={m:<6}: default picks {b:<9} {t_ms:8.2f} ms")
causal_vs_none = dflt["none"][1] / dflt["causal"][1]
mask_vs_causal = dflt["mask"][1] / dflt["causal"][1]
print(f"is_causal is {causal_vs_none:.2f}x faster than no mask; the tensor mask is {mask_vs_causal:.2f}x slower than is_causal")

# %% [markdown]
# ## 6 · On the roofline
#
# The workbench counts an SDPA op's FLOPs and bytes from its shapes (`workbench.analysis.trace.flops.op_cost`,
# the count behind `TraceAnalysis.roofline`; `docs/roofline.md`). For a forward it is the recorder's count
# exactly; the bytes are what a fused kernel must move at least, Q, K and V in and the output out. So each
# recorded fused forward can be put on the roofline of the recording's GPU (`workbench.figures.roofline_figure`,
# the datasheet row `peak_for` finds for it; the figure draws the runs without a mask, marker area by time).
# For a measured compute ceiling the lesson has only lesson 16's, measured on the H200 (`h200_ceilings.json`):
# the H200 has the H100's tensor cores (the same datasheet bf16 peak) and more memory bandwidth, so its matmul
# ceiling is quoted below as the H200's, and its measured bandwidth is drawn only when the recording is the
# H200's.

# %%
from workbench.analysis.trace.flops import op_cost
from workbench.analysis.trace.peaks import peak_for, peak_from_ceilings
from workbench.analysis.trace.roofline import attainable_tflops
from workbench.figures import roofline_figure

PEAK = peak_for(ENV["gpu"] or "NVIDIA H200")
CEILINGS = json.loads((RESULTS / "h200_ceilings.json").read_text())
MEASURED = peak_from_ceilings(CEILINGS)                     # measured on the H200 (lesson 16)
SAME_GPU = CEILINGS["device"] == ENV["gpu"]                 # False for the shipped H100 recording


def sdpa_cost(s, d, causal):
    shape = [B, HEADS, s, d]
    return op_cost("aten::scaled_dot_product_attention", json.dumps([shape] * 3 + [[], [], []]),
                   json.dumps(["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar"]),
                   json.dumps(["", "", "", "", "0.", str(causal)]))


fwd = ok[(ok["mode"] == "fwd") & (ok["mask"].isin(["none", "causal"])) & ok["backend"].isin(["flash", "efficient", "cudnn"])
         & (ok["head_dim"] == 128)]
rows = []
for r in fwd.itertuples():
    c = sdpa_cost(int(r.seq), int(r.head_dim), r.mask == "causal")
    us = r.median_ms * 1e3
    rows.append({"name": f"{r.backend} S={r.seq}{' causal' if r.mask == 'causal' else ''}", "count": 1,
                 "dtype": c.dtype, "kind": c.kind, "flops": c.flops, "bytes": c.bytes, "recorded_flops": r.flops,
                 "total_us": us, "costed_us": us, "tflops": c.flops / us / 1e6, "gbps": c.bytes / us / 1e3,
                 "intensity": c.flops / c.bytes})
roof_ops = pd.DataFrame(rows)
roof_ops["roofline_fraction"] = roof_ops["tflops"] / attainable_tflops(PEAK, "bf16", roof_ops["intensity"])
roof_ops["bound"] = np.where(roof_ops["intensity"] * PEAK.gbps / 1e3 >= PEAK.compute("bf16"), "compute", "memory")
assert (roof_ops["flops"] == roof_ops["recorded_flops"]).all()     # one count: the workbench's = the recorder's

# %% tags=["nbval-check-output"]
roof_ops["backend"] = roof_ops["name"].str.split().str[0]
RIDGE = PEAK.compute("bf16") * 1e3 / PEAK.gbps
print(f"{PEAK.name} ({PEAK.source}): {PEAK.compute('bf16'):.0f} TFLOP/s bf16, {PEAK.gbps:.0f} GB/s; the ridge: "
      f"{RIDGE:.0f} FLOP/byte")
memory_side = roof_ops[roof_ops["bound"] == "memory"]
print(f"lowest intensity: {roof_ops['intensity'].min():.0f} FLOP/byte; left of the ridge (memory side):",
      ", ".join(memory_side["name"]) or "none")
for _, r in roof_ops.loc[roof_ops.groupby("backend")["tflops"].idxmax()].iterrows():
    print(f"{r['backend']:>9} at its best, {r['name']}: {r['tflops']:.0f} TFLOP/s = {r['roofline_fraction']:.0%} of the "
          f"datasheet's {PEAK.compute('bf16'):.0f}, {r['tflops'] / MEASURED.compute('bf16'):.0%} of the matmul "
          f"ceiling measured on the {CEILINGS['device']} ({MEASURED.compute('bf16'):.0f})")

# %% tags=["nbval-ignore-output"]
no_mask = roof_ops[~roof_ops["name"].str.endswith("causal")].copy()
no_mask["name"] = [f"{n.split()[0]} {n.split('=')[1]}" for n in no_mask["name"]]      # "flash 16384"
roofline_figure(no_mask, PEAK, measured=MEASURED if SAME_GPU else None, top=40,
                title=f"Fused SDPA forwards on the {ENV['gpu'] or 'CPU (smoke recording)'}: bf16, head size 128, no mask")

# %% [markdown]
# Attention's intensity is S/2 FLOPs per byte (`4·S²·D` FLOPs over `8·S·D` bytes per head; S/4 causal). On
# the H100 the ridge is at 295 FLOP/byte, so every run is right of it but the shortest causal one (S=1024,
# 256 FLOP/byte, just left): a fused attention kernel is limited by its arithmetic, and the distance to the
# roof is how well the kernel keeps the tensor cores fed. On this card cuDNN's kernels came closest (64% of
# the datasheet at S=8192), flash's reached 36%, the memory-efficient ones 18%. In the workbench's MFU count (lesson 16) the backward is 2x the forward: model FLOPs, without
# the kernel's recomputation of the scores; the recorder counts 2.5x, the work a flash backward does.
# Divide a `fwd_bwd` TFLOP/s here by 3.5 / 3 to compare it with an MFU.
#
# ## 7 · Exercise: how much would math have needed?
#
# The recorder skipped math at the longer lengths, where its score matrices would have needed too much
# memory. From the math backend's measured peak extra memory (forward alone, head size 128, no mask, in
# `pivot("peak_extra_bytes", mode="fwd")`) and the way it grows (section 3), predict its peak extra memory at
# the longest length of the sweep, in GiB. Put your number below; the check accepts 10%.

# %% tags=["nbval-check-output"]
MY_GIB = 100.0          # your prediction, GiB

# %% tags=["nbval-check-output"]
math_fwd = pivot("peak_extra_bytes", mode="fwd")["math"].dropna()       # empty in a --smoke recording (a CPU's)
s_last = int(math_fwd.index.max()) if len(math_fwd) else S_MAX
answer_gib = float(math_fwd.loc[s_last]) * (S_MAX / s_last) ** 2 / GIB if len(math_fwd) else float("nan")
print("you said", MY_GIB, "->", "right" if abs(MY_GIB / answer_gib - 1) < 0.10 else "look again")

# %% [markdown]
# **Solution check.** The scores are S² per head: from the longest length math ran to the sweep's longest,
# the memory grows by the square of the ratio of lengths. Compare it with the GPU's memory:

# %%
total = ENV["total_memory_bytes"]
print(f"math at S={s_last}: {math_fwd.get(s_last, float('nan')) / GIB:.2f} GiB -> x ({S_MAX}/{s_last})^2 = {answer_gib:.1f} GiB "
      f"at S={S_MAX}" + (f"; the GPU holds {total / GIB:.0f} GiB" if total else ""))
flash_fwd = pivot("peak_extra_bytes", mode="fwd")["flash"]
print(f"flash at S={S_MAX}: {flash_fwd.loc[S_MAX] / GIB:.3f} GiB")

# %% [markdown]
# ## 8 · Takeaways, asserted on the recording
#
# These hold for a GPU recording (`ON_GPU`); a `--smoke` recording (CPU, tiny sizes, no memory numbers) only
# checks that the recorder's code runs, and the lesson shows its numbers without asserting them.

# %% tags=["nbval-check-output"]
flash_errors = refused[(refused["backend"] == "flash") & (refused["mask"] == "mask")]
if ON_GPU:
    # 1. fused backends' memory grows linearly in S, math's and the hand-written one's quadratically
    assert all(0.8 < exponents.loc[b, m] < 1.2 for b in ("flash", "efficient") for m in ("fwd", "fwd_bwd")), exponents
    assert all(exponents.loc[b, m] > 1.7 for b in ("math", "naive") for m in ("fwd", "fwd_bwd")), exponents
    # 2. an explicit mask tensor disables flash: flash refuses it, and the dispatcher picks another backend
    #    (on the H100, cuDNN, which it picked for every mask: the tensor mask runs fused, but reads the mask)
    assert len(flash_errors) == 2 * len(SEQS) and (chosen["mask"] != "flash").all()
    assert chosen["causal"].isin(["flash", "efficient", "cudnn"]).all()        # is_causal keeps a fused kernel
    # 3. ... and costs time against is_causal=True, which also beats no mask (half the blocks skipped)
    assert mask_vs_causal > 1.2 and causal_vs_none > 1.3, (mask_vs_causal, causal_vs_none)
    # 4. head size: flash and cuDNN refuse 512 (bf16), memory-efficient and math take it; for fp32 the
    #    dispatcher passes over flash and cuDNN (the forced fp32 runs were skipped: out of time budget)
    bf = grid.loc["bfloat16"]
    assert (bf.loc[512, ["flash", "cudnn"]] == "error").all() and (bf.loc[512, ["efficient", "math"]] == "ok").all()
    assert (bf.loc[[64, 128, 256], ["flash", "efficient", "cudnn", "math"]] == "ok").all().all()
    assert (grid.loc["float32", "default picks"] == "efficient").all()
    # 5. fused beats math where both ran; no fused forward passes the datasheet's bf16 peak of the recording's GPU
    assert speedup["flash"] > 2 and speedup["cudnn"] > speedup["flash"]
    assert roof_ops["tflops"].max() < PEAK.compute("bf16")
    # 6. on this GPU and build, cuDNN is the dispatcher's first choice and the fastest fused backend
    assert (chosen == "cudnn").all().all() and t.loc[S_MAX, "flash"] / t.loc[S_MAX, "cudnn"] > 1.5
print(f"memory ~ S^p: flash p={exponents.loc['flash', 'fwd_bwd']:.2f}, math p={exponents.loc['math', 'fwd_bwd']:.2f}; "
      f"flash refused the mask tensor at {len(flash_errors)} of {2 * len(SEQS)} lengths x modes; at S={S_MAX} is_causal "
      f"{causal_vs_none:.2f}x faster than no mask, mask tensor {mask_vs_causal:.2f}x slower than is_causal; "
      f"flash {speedup['flash']:.1f}x, cudnn {speedup['cudnn']:.1f}x math at S={s_both}; cudnn "
      f"{t.loc[S_MAX, 'flash'] / t.loc[S_MAX, 'cudnn']:.2f}x flash at S={S_MAX}")

# %% [markdown]
# - **Fused attention needs memory in proportion to S, math and hand-written attention to S².** At long
#   sequences that decides, before speed does, whether attention fits at all.
# - **An explicit mask tensor turns flash off**, even when it is exactly the causal mask: say `is_causal=True`.
#   On the H100 the dispatcher chose cuDNN anyway, for every mask, and cuDNN takes the tensor; it still ran
#   3.6x slower than with `is_causal=True` at 16384 tokens (and 1.9x slower than no mask at all).
# - **Causal is half the work only when the kernel knows it is causal.**
# - **The fastest fused kernel depends on the GPU and the torch build**: on this H100 (torch 2.11, cuDNN 9.19)
#   cuDNN ran forward + backward 1.7x faster than flash at 16384 tokens and the dispatcher picked it first.
# - **Which backend ran is a property of the call** (dtype, head size, mask, whether gradients are needed):
#   check it in a trace (the kernel names of section 4) before comparing timings.
#
# ## 9 · On a GPU: what your dispatcher picks
#
# This cell runs only where a CUDA device is present (CI has none): one bf16 training call at 4096 tokens with
# `is_causal=True` and with the same mask as a tensor, each profiled for its aten op and timed. Re-record the
# whole sweep on your GPU with `python benchmarks/record_lesson17_h200.py --out DIR` from a checkout.

# %% tags=["nbval-skip"]
if GPU:
    from torch.profiler import ProfilerActivity, profile

    qkv = [torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    tril = torch.ones(4096, 4096, device="cuda", dtype=torch.bool).tril()
    for label, kw in (("is_causal=True", {"is_causal": True}), ("mask tensor", {"attn_mask": tril})):
        step = lambda: F.scaled_dot_product_attention(*qkv, **kw).sum().backward()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        ops = sorted({e.name for e in prof.events() if "_scaled_dot_product" in e.name and "backward" not in e.name})
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        print(f"{label:>15}: {ops} {(time.perf_counter() - t0) * 100:.2f} ms a call")

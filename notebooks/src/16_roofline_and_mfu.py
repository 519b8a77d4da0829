# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 16 · Reading a roofline, and what MFU does and does not say
#
# **One idea:** a GPU has two ceilings, how many FLOPs it can do a second and how many bytes it can move
# a second. Each kernel sits under one of them (the *roofline*), and a whole step's *MFU* (model FLOPs
# utilisation) is its useful FLOPs per second over the compute ceiling of the format it ran in. Both are
# only as good as the FLOPs counted, the step time they are divided by and the ceiling they are held
# against, so this lesson checks each of the three against a measurement.
#
# Everything here is an H200 recording (`benchmarks/record_diagnosis_h200.py`, case `gpt`, 2026-12-02, and
# `benchmarks/record_ceilings_h200.py`, 2026-12-03; `workbench/samples/README.md`):
#
# - one training step of a 12-layer decoder-only transformer (d=1024, 16 heads, batch 8 x 1024 tokens,
#   vocabulary 32768, untied head, causal attention, AdamW) in **fp32**, **TF32** and **bf16 autocast**: three
#   profiled steps each with the ops' input shapes (the samples `h200_gpt_<format>`), the step timed **without**
#   the profiler by CUDA events, and its FLOPs counted by hand (`h200_pair("gpt")`);
# - the GPU's ceilings as measured that day (`results/h200_ceilings.json`: the best `torch.mm` rate per
#   format, a 1 GiB device copy's bandwidth), and a trace of a step whose FLOPs are known exactly (four bf16
#   8192³ matmuls and one causal attention, sample `h200_gemm_sdpa`).
#
# The workbench's `TraceAnalysis` computes everything once per trace: `.roofline` (FLOPs, rates, MFU, the
# per-op table) and `.precision` (what TF32 or bf16 would do to an fp32 step).

# %%
from workbench.lessons import setup, RESULTS, h200_pair
setup()
import json
import pandas as pd
import torch
GPU = torch.cuda.is_available()

from workbench import samples, TraceAnalysis
from workbench.analysis.trace.peaks import peak_from_ceilings

GPT = h200_pair("gpt")                                       # hand count, unprofiled step times, sizes
CEIL = json.loads((RESULTS / "h200_ceilings.json").read_text())
FORMATS = ("fp32", "tf32", "bf16")
measured_ms = {f: GPT["measured"][f]["median_ms"] for f in FORMATS}
# One analysis per trace, told the step time measured without the profiler (MFU is computed on it) and
# the measured ceilings (reported beside the datasheet's).
A = {f: TraceAnalysis(samples.path(f"h200_gpt_{f}"), step_ms=measured_ms[f], measured=CEIL) for f in FORMATS}
RL = {f: a.roofline for f, a in A.items()}

# %% tags=["nbval-check-output"]
print("recorded on:", GPT["env"]["gpu"], GPT["env"]["date"], "torch", GPT["env"]["torch"])
print("model:", GPT["params"])
print("unprofiled step (ms, median of CUDA events):", {f: round(v, 2) for f, v in measured_ms.items()})

# %% [markdown]
# ## 1 · The FLOPs: counted by hand, and found in the trace
#
# The hand count is the usual one for a transformer: **6 · N · tokens** for the weights (a multiply and an
# add per weight and token in the forward pass, twice that in the backward; N = the 184.7 M parameters the
# tokens go through, head included, embeddings not), plus attention's two matrix products, which no weight
# counts: 4·B·T²·d a layer forward, x3 with the backward, halved because a causal mask skips the upper
# triangle.
#
# The trace knows nothing about the model: the workbench reads each op's shapes (`aten::mm`, `aten::addmm`,
# the attention ops) and counts its FLOPs (`docs/roofline.md`). Both counts, for the three recorded formats:

# %% tags=["nbval-check-output"]
hand = GPT["hand_count"]
B, T, d, L = (GPT["params"][k] for k in ("batch", "seq", "d", "layers"))
dense = 6 * hand["non_embedding_params"] * hand["tokens"]
attention = 6 * B * T * T * d * L          # (4·B·T²·d forward) x 3 with backward, / 2 causal
assert dense == hand["dense_flops"] and attention == hand["attention_flops_causal"]
print(f"hand count: {dense / 1e12:.3f} TFLOP weights + {attention / 1e12:.3f} TFLOP attention "
      f"= {hand['total_flops'] / 1e12:.3f} TFLOP a step")
for f in FORMATS:
    mf = RL[f].step["model_flops"]
    print(f"{f}: the trace counts {mf / 1e12:.3f} TFLOP a step ({mf / hand['total_flops'] - 1:+.2%} vs the hand count)")

# %%
flops_err = {f: RL[f].step["model_flops"] / hand["total_flops"] - 1 for f in FORMATS}
assert all(abs(e) < 0.02 for e in flops_err.values()), flops_err        # within 2% of the hand count
assert len({round(RL[f].step["model_flops"]) for f in FORMATS}) == 1    # the same model in each format

# %% [markdown]
# Within a tenth of a percent, and the same count in the three formats: the format changes how fast the
# FLOPs go, not how many there are.
#
# ## 2 · Achieved TFLOP/s and MFU, against two ceilings
#
# *Achieved TFLOP/s* = model FLOPs / step time. *MFU* = that / the peak of the step's format. Which peak?
# The **datasheet** (`H200 SXM`: 66.9 fp32, 494.7 TF32, 989.4 bf16 dense TFLOP/s) is what papers quote;
# the **measured** ceiling is the best a large `torch.mm` reached on this very GPU. A second
# `TraceAnalysis` per trace, with the measured ceilings as its peak, gives the MFU against those:

# %%
MEASURED_PEAK = peak_from_ceilings(CEIL)
A_meas = {f: TraceAnalysis(samples.path(f"h200_gpt_{f}"), peak=MEASURED_PEAK, step_ms=measured_ms[f]) for f in FORMATS}

mfu = pd.DataFrame({f: {
    "step ms (unprofiled)": RL[f].step["step_ms"],
    "achieved TFLOP/s": RL[f].step["achieved_tflops"],
    "format": RL[f].step["dtype"],
    "datasheet TFLOP/s": RL[f].step["peak_tflops_dtype"],
    "MFU (datasheet)": RL[f].step["mfu"],
    "measured TFLOP/s": A_meas[f].roofline.step["peak_tflops_dtype"],
    "MFU (measured)": A_meas[f].roofline.step["mfu"],
    "profiled step ms": RL[f].step["step_ms_trace"],
    "MFU on the profiled step": RL[f].step["mfu_trace"],
} for f in FORMATS}).T

# %% tags=["nbval-check-output"]
mfu.round(3)

# %% [markdown]
# Read it column by column:
#
# - **fp32 has the highest MFU and the slowest step.** 66% of its datasheet peak (87% of what fp32 matmuls
#   measured on this GPU), yet it is 6.8x slower than bf16 at 31%. MFU says how close a run comes to the
#   ceiling *of its format*; to choose between formats, compare step times (or tokens per second).
# - **The measured ceiling is below the datasheet**, for every format: the datasheet is a clock-and-units
#   product, the measured one is what a real kernel reached. Against it, bf16's MFU is 38% rather than 31%.
#   Say which ceiling an MFU is against.
# - **The step time matters as much as the FLOPs.** On the profiled bf16 step (46.4 ms: the profiler's own
#   host work makes this fast step wait) the MFU would read 21%; on the fp32 step, which the GPU bounds, the
#   profiler changes almost nothing. Divide by a step timed without the profiler (lesson 11).

# %%
m = mfu.astype({c: float for c in mfu.columns if c != "format"})
assert m.loc["fp32", "MFU (datasheet)"] == m["MFU (datasheet)"].max() and m["step ms (unprofiled)"].idxmax() == "fp32"
assert m.loc["fp32", "step ms (unprofiled)"] / m.loc["bf16", "step ms (unprofiled)"] > 6.5
assert all(m["MFU (measured)"] > m["MFU (datasheet)"])                        # measured ceilings are lower
assert abs(m.loc["bf16", "MFU (datasheet)"] - 0.307) < 0.005 and abs(m.loc["bf16", "MFU (measured)"] - 0.382) < 0.005
assert abs(m.loc["fp32", "MFU (datasheet)"] - 0.664) < 0.005 and abs(m.loc["fp32", "MFU (measured)"] - 0.873) < 0.005
assert m.loc["bf16", "MFU on the profiled step"] < 0.75 * m.loc["bf16", "MFU (datasheet)"]
assert abs(m.loc["fp32", "MFU on the profiled step"] / m.loc["fp32", "MFU (datasheet)"] - 1) < 0.01
# the trace's achieved rate against the recorder's own (hand count / the same unprofiled time)
assert all(abs(m.loc[f, "achieved TFLOP/s"] / GPT["measured"][f]["achieved_tflops_hand"] - 1) < 0.02 for f in FORMATS)

# %% [markdown]
# ## 3 · The ceilings themselves, and a step whose FLOPs are known exactly
#
# The recorder timed square `torch.mm` at 4096 and 8192 in each format and kept the best (and a 1 GiB
# device-to-device copy for the bandwidth), three rounds:

# %% tags=["nbval-check-output"]
ceilings = pd.DataFrame({f: {"datasheet": CEIL["datasheet"]["peak_tflops"][f], "measured": CEIL["matmul"][f]["tflops"],
                             "fraction": CEIL["fraction_of_datasheet"][f],
                             "rounds": [r["matmul"][f] for r in CEIL["rounds"]]} for f in ("fp32", "tf32", "bf16")}).T
print(ceilings.to_string())
print(f"bandwidth: datasheet {CEIL['datasheet']['peak_gbps']:.0f} GB/s, measured {CEIL['copy']['gbps']:.1f} GB/s "
      f"({CEIL['fraction_of_datasheet']['copy']:.0%})")

# %% [markdown]
# TF32's rounds moved (410.9, 347.7, 348.9 TFLOP/s): a measured ceiling is itself a measurement, and the
# recorder keeps the best round. The known-FLOPs step checks the counting end to end: its matmuls should
# run at the ceiling just measured, and its model FLOPs are exact numbers the recorder wrote down.

# %% tags=["nbval-check-output"]
known = CEIL["gemm_sdpa"]
K = TraceAnalysis(samples.path("h200_gemm_sdpa"), measured=CEIL).roofline
print(f"FLOPs a step: the trace {K.step['model_flops']:.6e}, the recorder {known['gemm_flops_per_step'] + known['attention_flops_per_step']:.6e}")
print(f"MFU {K.step['mfu']:.1%} on the {K.step['step_ms']:.2f} ms step ({K.step['step_ms_source']})")
K.ops[["name", "count", "dtype", "kind", "tflops", "intensity", "bound", "roofline_fraction"]].round(3)

# %%
mm = K.ops.set_index("name").loc["aten::mm"]
assert K.step["model_flops"] == known["gemm_flops_per_step"] + known["attention_flops_per_step"]
assert abs(mm["tflops"] / CEIL["matmul"]["bf16"]["tflops"] - 1) < 0.01   # the 8192³ bf16 matmul at the measured ceiling
assert mm["tflops"] < 0.81 * CEIL["datasheet"]["peak_tflops"]["bf16"]    # ... which is 80% of the datasheet

# %% [markdown]
# The trace's `aten::mm` ran at 793 TFLOP/s, the measured ceiling to within a percent: a big bf16 matmul on
# this H200 gets 80% of the datasheet and no more. So an MFU of 100% against the datasheet is not a target
# any real step reaches; the attention kernels in the same step reach a quarter (backward) to two fifths
# (forward) of the roof.
#
# ## 4 · The roofline: which kernels are compute-bound, which memory-bound
#
# Each op group is a point: x = its *arithmetic intensity* (FLOPs per byte it moves), y = its achieved
# TFLOP/s. The roof is `min(peak TFLOP/s, intensity x GB/s)`; the corner, the *ridge point*, is at
# peak / bandwidth FLOP/byte. Left of it a kernel cannot be faster than the bytes it moves (**memory-bound**),
# right of it than the FLOPs it does (**compute-bound**). Solid roofs: the datasheet; dashed: measured.
# Marker area follows GPU time. The bf16 step:

# %% tags=["nbval-ignore-output"]
from workbench.figures import roofline_figure

roofline_figure(RL["bf16"].ops, RL["bf16"].peak, measured=RL["bf16"].measured, top=20,
                title="bf16 step of the GPT on the H200: achieved TFLOP/s by op")

# %% [markdown]
# The matmuls sit at the top right, near the roof; the layer norms, GELU, softmax and sums sit far to the
# left, at well under one FLOP per byte, under the slanted bandwidth roof (the orange ones ran in fp32:
# autocast keeps norms and softmax in fp32). The casts do no FLOPs at all, so they cannot be drawn; the note
# under the figure counts the op groups left out. How the step's GPU time splits between the two sides, per
# format (ridge points from the datasheet row; the table's `bound` compares each op with its format's ridge):

# %% tags=["nbval-check-output"]
def ms_by_bound(rl):
    ops = rl.ops
    return (ops.groupby("bound")["total_us"].sum() / rl.costs.n_steps / 1e3).reindex(["compute", "memory"]).fillna(0.0)

split = pd.DataFrame({f: ms_by_bound(RL[f]) for f in FORMATS}).T.rename(columns=lambda c: f"{c}-bound ms")
split["memory-bound share"] = split["memory-bound ms"] / split.sum(axis=1)
split["ridge FLOP/B"] = [RL[f].peak.compute(f) * 1e3 / RL[f].peak.gbps for f in FORMATS]
split.round(3)

# %%
assert split.loc["fp32", "memory-bound share"] < 0.06 and split.loc["bf16", "memory-bound share"] > 0.4
# the memory-bound work hardly changed (bf16 stores activations in half the bytes, but adds the casts)
assert abs(split.loc["bf16", "memory-bound ms"] / split.loc["fp32", "memory-bound ms"] - 1) < 0.2
assert split.loc["fp32", "compute-bound ms"] / split.loc["bf16", "compute-bound ms"] > 10

# %% [markdown]
# In fp32 the memory-bound ops are 5% of the GPU time; the step is matmuls. bf16 made the compute-bound
# part 13x faster and left the memory-bound part about where it was (11.4 -> 13.2 ms a step), so in bf16
# they are 47% of it. That is the next thing to work on, and no faster arithmetic helps it: only fewer
# bytes do (fused kernels, e.g. `torch.compile`, fewer casts). The same table, and the figure, live in the
# workbench's `ProfilerPanel` on its *Roofline* tab (its diagnosis at the top is about this *profiled* trace:
# the profiler's own host work, lesson 11's subject):

# %% tags=["nbval-ignore-output"]
from workbench import ProfilerPanel

panel = ProfilerPanel(A["bf16"], top=12)
panel.tabs.selected_index = list(panel.tabs.titles).index("Roofline")
panel

# %% [markdown]
# ## 5 · What the precision what-ifs predict, against what was measured
#
# From the **fp32** trace alone, `TraceAnalysis.precision` predicts the step in TF32 and in bf16: each fp32
# matmul (and, for bf16, each attention kernel) is assumed to reach the same fraction of its new roof as it
# reached of the old one (bf16 also halves the bytes, doubling the FLOPs per byte), everything else stays as
# it is, and the step model replays the step with those times. The H200 then measured both:

# %% tags=["nbval-check-output"]
P = A["fp32"].precision
pred = pd.DataFrame({f: {"predicted ms": P[f].step_ms_if_fixed, "measured ms": measured_ms[f],
                         "error": P[f].step_ms_if_fixed / measured_ms[f] - 1} for f in ("tf32", "bf16")}).T
pred

# %%
err = pred["error"].to_dict()
assert abs(err["tf32"] - (-0.089)) < 0.005 and abs(err["bf16"] - (-0.112)) < 0.005      # as measured
assert measured_ms["bf16"] < measured_ms["tf32"] < measured_ms["fp32"]
assert P["bf16"].step_ms_if_fixed < P["tf32"].step_ms_if_fixed < measured_ms["fp32"]    # the order is right

# %% [markdown]
# Both predictions are **optimistic**: TF32 by 8.9%, bf16 by 11.2%. They get the order and the size of the
# win right (a 3x and a 7x faster step) but not the last 10%. The TF32 and bf16 traces say where the
# difference went, part by part (GPU ms a step):

# %% tags=["nbval-check-output"]
def ms_by_kind(rl):
    return rl.ops.groupby("kind")["total_us"].sum() / rl.costs.n_steps / 1e3

kinds = pd.DataFrame({f: ms_by_kind(RL[f]) for f in FORMATS}).fillna(0.0)
kinds.loc["everything else"] = kinds.drop(["gemm", "attention"]).sum()
parts = kinds.loc[["gemm", "attention", "everything else"]].copy()
parts["tf32 predicted"] = [P["tf32"].evidence["predicted_gemm_ms_per_step"], parts.loc["attention", "fp32"],
                           parts.loc["everything else", "fp32"]]
mm_frac = {f: float(RL[f].ops.set_index("name").loc["aten::mm", "roofline_fraction"]) for f in FORMATS}
print(f"bf16 what-if, GEMMs + attention: predicted {P['bf16'].evidence['predicted_ms_per_step']:.2f} ms, "
      f"the bf16 trace {parts.loc[['gemm', 'attention'], 'bf16'].sum():.2f} ms")
print("aten::mm's share of its roof:", {f: round(v, 3) for f, v in mm_frac.items()})
parts.round(2)

# %%
tf32_gemm_pred, tf32_gemm = P["tf32"].evidence["predicted_gemm_ms_per_step"], parts.loc["gemm", "tf32"]
assert tf32_gemm / tf32_gemm_pred > 1.15                                     # TF32 GEMMs slower than predicted...
assert mm_frac["tf32"] < mm_frac["fp32"] - 0.15                              # ... a smaller share of their roof
bf16_pred = P["bf16"].evidence["predicted_ms_per_step"]
bf16_meas = parts.loc[["gemm", "attention"], "bf16"].sum()
assert 0.05 < bf16_meas / bf16_pred - 1 < 0.15                               # bf16 GEMMs + attention ~9% slower
assert parts.loc["everything else", "bf16"] > 1.1 * parts.loc["everything else", "fp32"]   # and the rest grew
assert kinds.loc["copy", "bf16"] > 2.5 * kinds.loc["copy", "fp32"]           # autocast's casts

# %% [markdown]
# - **TF32:** the what-if gives the matmuls 24.2 ms a step; they took 29.2. The fp32 `aten::mm` reached
#   77% of the fp32 roof; in TF32 it reached 58% of the TF32 roof, and the what-if had assumed 77% again.
#   Attention and the rest did not change, as predicted (the attention kernel runs in fp32 either way).
# - **bf16:** the matmuls plus attention took 9% longer than predicted, and the work the what-if leaves
#   alone grew: autocast's casts (the `copy` kernels, 1.7 ms a step in fp32, 4.9 in bf16) more than made up
#   for the elementwise ops and sums that got cheaper on 16-bit activations.
#
# So treat a precision what-if as the size of the prize with a 10% error bar, here on the hopeful side;
# the measurement after the switch is the number to keep.
#
# ## 6 · Exercise: the biggest memory-bound op of the bf16 step
#
# Using `RL["bf16"].ops` (columns `name`, `total_us`, `bound`, ...): which op group that is **memory-bound**
# holds the most GPU time in the bf16 step? Put its name below and run the cell; the check after it says
# whether you are right.

# %% tags=["nbval-check-output"]
MY_OP = "aten::native_layer_norm_backward"      # an op name from the table

# %% tags=["nbval-check-output"]
bf16_ops = RL["bf16"].ops
memory_ops = bf16_ops[bf16_ops["bound"] == "memory"].sort_values("total_us", ascending=False)
answer = memory_ops["name"].iloc[0]
print("you said", MY_OP, "->", "right" if MY_OP == answer else "look again")

# %% [markdown]
# **Solution check.** It is the casts: `aten::copy_`, which autocast runs to turn fp32 weights and
# activations into bf16, at zero FLOPs per byte: more GPU time than any other memory-bound op, about a sixth
# of the GPU time the step's ops hold:

# %%
share = memory_ops["total_us"].iloc[0] / bf16_ops["total_us"].sum()
assert answer == "aten::copy_" and memory_ops["kind"].iloc[0] == "copy" and 0.14 < share < 0.19
print(f"answer: {answer}, {memory_ops['total_us'].iloc[0] / RL['bf16'].costs.n_steps / 1e3:.2f} ms a step, "
      f"{share:.0%} of the GPU time")

# %% [markdown]
# ## 7 · Takeaways, asserted on the recording

# %% tags=["nbval-check-output"]
assert "H200" in GPT["env"]["gpu"] and CEIL["device"] == "NVIDIA H200"
# 1. the trace's FLOPs agree with the hand count (and the exactly known step's to the FLOP)
assert max(abs(e) for e in flops_err.values()) < 0.02
# 2. MFU is per format: fp32 has the highest and is the slowest; the ceiling it is held against changes it
assert m["MFU (datasheet)"].idxmax() == "fp32" and m["step ms (unprofiled)"].idxmin() == "bf16"
# 3. the measured bf16 ceiling is ~80% of the datasheet, and a large matmul reaches it
assert 0.75 < CEIL["fraction_of_datasheet"]["bf16"] < 0.85 and abs(mm["tflops"] / CEIL["matmul"]["bf16"]["tflops"] - 1) < 0.01
# 4. bf16 leaves the memory-bound ops as the bigger remaining share of the step
assert split.loc["bf16", "memory-bound share"] > 0.4 > split.loc["fp32", "memory-bound share"]
# 5. the precision what-ifs are optimistic by 9% (TF32) and 11% (bf16) on this step
assert -0.12 < err["bf16"] < err["tf32"] < -0.08
print(f"FLOPs {flops_err['bf16']:+.2%} vs hand; MFU fp32 {m.loc['fp32', 'MFU (datasheet)']:.1%} / bf16 "
      f"{m.loc['bf16', 'MFU (datasheet)']:.1%} of the datasheet ({m.loc['bf16', 'MFU (measured)']:.1%} measured); "
      f"memory-bound share fp32 {split.loc['fp32', 'memory-bound share']:.0%} -> bf16 {split.loc['bf16', 'memory-bound share']:.0%}; "
      f"what-if errors TF32 {err['tf32']:+.1%}, bf16 {err['bf16']:+.1%}")

# %% [markdown]
# ## 8 · On a GPU: your own ceilings
#
# This cell runs only where a CUDA device is present (CI has none): it measures your GPU's matmul ceilings
# and copy bandwidth (about ten seconds) and prints them beside its datasheet row. Pass the result as
# `measured=` to `TraceAnalysis` (or `workbench trace --ceilings FILE`) to read your own traces against them.

# %% tags=["nbval-skip"]
if GPU:
    from workbench.capture.ceilings import measure_ceilings

    mine = measure_ceilings()
    sheet = mine.get("datasheet") or {}
    for f, r in mine["matmul"].items():
        print(f"{f:>5}: {r['tflops']:8.1f} TFLOP/s measured, datasheet {sheet.get('peak_tflops', {}).get(f)}")
    print(f" copy: {mine['copy']['gbps']:8.1f} GB/s measured, datasheet {sheet.get('peak_gbps')}")

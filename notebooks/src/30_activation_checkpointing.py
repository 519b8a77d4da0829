# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 30 · Activation checkpointing: memory for time
#
# In a training step, the forward pass keeps every intermediate tensor that the backward pass will
# need: layer norms' inputs, the attention output, the MLP's 4×-wide hidden layer... For a
# transformer these **activations** grow with batch × sequence × width × depth and are usually the
# largest part of the peak.
#
# **Activation checkpointing** (`torch.utils.checkpoint`) keeps only the *input* of a checkpointed
# block and recomputes the block's forward during backward. Memory falls; time rises by up to one
# extra forward pass (about a third of a step). The knob is the **granularity**: which blocks are
# checkpointed. This notebook measures the curve over three settings (none, every other block,
# every block) with the workbench's experiment harness, estimates what the CUDA caching allocator
# would hold, and shows what the same switch did on an H200.

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
# ## 1 · On the H200
#
# A 12-layer transformer (d=1024, batch 32×512 tokens, AdamW) run through the workbench's experiment
# harness on one H200 (`benchmarks/record_harness_h200.py`), with and without checkpointing every
# block, in fp32 and with bf16 autocast. Its ledger ships with the package; `baseline_ratios` compares
# each row with fp32.

# %%
from workbench.io import load_ledger
from workbench.analysis import baseline_ratios

h200 = load_ledger(RESULTS / "h200_harness.ledger.json")
ckpt_rows = h200[h200["configuration"].isin(["fp32", "checkpoint(Block)", "amp_bf16", "amp_bf16+checkpoint(Block)"])]
h = baseline_ratios(ckpt_rows.reset_index(drop=True), baseline="fp32").set_index("configuration")
h.assign(peak_gib=h["peak_allocated_bytes"] / GIB)[["step_ms_median", "step_time_ratio", "peak_gib", "peak_allocated_ratio"]]

# %% tags=["nbval-check-output"]
f, c = h.loc["fp32"], h.loc["checkpoint(Block)"]
print(f"fp32: {f.peak_allocated_bytes / GIB:.2f} GiB -> {c.peak_allocated_bytes / GIB:.2f} GiB with checkpointing "
      f"(x{c.peak_allocated_ratio:.2f}), step {f.step_ms_median:.0f} -> {c.step_ms_median:.0f} ms "
      f"(+{c.step_time_ratio - 1:.0%})")
b, bc = h.loc["amp_bf16"], h.loc["amp_bf16+checkpoint(Block)"]
print(f"bf16: {b.peak_allocated_bytes / GIB:.2f} GiB -> {bc.peak_allocated_bytes / GIB:.2f} GiB, "
      f"step {b.step_ms_median:.1f} -> {bc.step_ms_median:.1f} ms (+{bc.step_ms_median / b.step_ms_median - 1:.0%})")

# %% [markdown]
# In fp32, about a quarter of the memory for about a quarter more time: the recomputed forward is cheap
# next to the whole step. With bf16 the peak that is left after checkpointing is mostly weights,
# gradients and AdamW's state, which checkpointing does not touch.
#
# This model is **GPU-bound** on the H200: switching the matrix multiplies to TF32, a flag that changes
# only the GPU's arithmetic, cut its step several times over (the ledger, checked below), which a step
# waiting on the host could not do. So recomputing a forward costs about what the GPU's forward costs.
#
# On a step that is launch- or host-bound (small layers, where the GPU waits for the host to launch each
# kernel; notebook 10) the trade looks worse: what checkpointing repeats is *operators* (section 2 counts
# them, nearly twice the blocks' forward operators per step), and there each operator costs about its
# launch whatever its size, while the activations saved are small. None of the shipped recordings is a
# launch-bound step with checkpointing, so this lesson does not put a number on that cost: check the
# diagnosis first, and measure the configuration with the harness on your own step before adopting it.

# %% tags=["nbval-check-output"]
tf32_speedup = h.loc["fp32", "step_ms_median"] / h200.set_index("configuration").loc["tf32", "step_ms_median"]
print(f"H200, same model: fp32 -> TF32 cut the step {tf32_speedup:.1f}x")
assert tf32_speedup > 3                      # the GPU's arithmetic sets this step's pace

# %% [markdown]
# ## 2 · The curve on this CPU, with the experiment harness
#
# The same family of model, small enough for a CPU. Its blocks alternate between two (identical)
# classes, `EvenBlock` and `OddBlock`, so that the harness's `checkpointing(...)` configuration can
# select *every block* (`Block`, their common class) or *every other block* (`EvenBlock`) by type.

# %%
import torch.nn.functional as F
from workbench.capture.models import Block, EvenBlock, OddBlock, LM  # the H200 runs' transformer, sizes as arguments


from workbench import Workload
from workbench.capture.configurations import checkpointing, fp32
from workbench import run_experiment

VOCAB, SEQ, LAYERS = 128, 64, 6


def batch(n, device):
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(model, b):
    x, y = b
    logits = model(x)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1)), logits


small_lm = lambda: LM(layers=LAYERS, d=64, heads=4, vocab=VOCAB)
work = Workload(model=small_lm, batch=batch, loss=lm_loss, batch_size=16, tokens_per_sample=SEQ)
GRANULARITIES = {"none": fp32().replace(name="none"),
                 "every other block": checkpointing(EvenBlock, name="every other block"),
                 "every block": checkpointing(Block, name="every block")}

# %% [markdown]
# Each configuration starts from the same weights and sees the same batches. On a CPU the harness
# measures peak memory from `torch.profiler`'s allocation records (live tensors + the step's own
# peak); the first step doubles as a numerical check against the run without checkpointing
# (recomputation must give the same gradients), and `trace=True` records a light profile of two more
# steps per configuration.

# %%
exp = run_experiment(work, list(GRANULARITIES.values()), steps=15, warmup=2, check_steps=1, trace=True,
                     reference="none", energy=False, progress=False, name="checkpoint granularity")
curve = baseline_ratios(exp.ledger, baseline="none").set_index("configuration")
curve.assign(peak_mib=curve["peak_allocated_bytes"] / MIB)[
    ["step_ms_median", "step_time_ratio", "peak_mib", "peak_allocated_ratio", "check_verdict", "check_grad_max_rel_err"]]

# %% [markdown]
# The memory–time curve, in the workbench's `ComparePanel` (one bar per granularity; the ratios are
# against no checkpointing; the diff view below the bars compares the traces of any two rows).

# %% tags=["nbval-ignore-output"]
from workbench import ComparePanel

ComparePanel(exp, baseline="none")

# %% [markdown]
# Step times on a shared 2-core machine are noisy (medians of 15 steps above, and still the order of
# the three can change from run to run); do not read the time column of this table too closely. The
# **work** is exact: `trace_diff` of the light profiles counts, per step, how often each operator ran.
# With every block checkpointed, every forward operator of the blocks runs twice (once in the forward,
# once recomputed in the backward); the head's `linear` and the last norm run once. Every other block
# recomputes half of them.

# %% tags=["nbval-check-output"]
from workbench import load_trace
from workbench.analysis import trace_diff

FORWARD_OPS = ["aten::linear", "aten::layer_norm", "aten::scaled_dot_product_attention", "aten::gelu"]
base_trace = load_trace(exp.result("none").trace_path)
counts = {}
for name in ("every other block", "every block"):
    d = trace_diff(base_trace, load_trace(exp.result(name).trace_path), normalize="per_step")
    ops = d.ops[d.ops["name"].isin(FORWARD_OPS)].set_index("name").loc[FORWARD_OPS]
    counts.setdefault("none", ops["base_count"])
    counts[name] = ops["test_count"]
recomputed = pd.DataFrame(counts).astype(int)
recomputed

# %%
op_growth = recomputed.sum() / recomputed["none"].sum()
assert op_growth["every block"] > 1.9 and 1.4 < op_growth["every other block"] < 1.6, op_growth

# %% [markdown]
# ## 3 · What the CUDA caching allocator would hold: the estimator
#
# `estimate` (`workbench.capture.estimate`) runs the same training step on *fake* tensors (no memory, no GPU) and
# replays every allocation and free through a model of CUDA's caching allocator. It predicted the
# H200 peaks above to within a few percent (`benchmarks/RESULTS.md`). Here it gives the CUDA-side
# picture of the small model at a GPU-sized batch (128×64 tokens), for each granularity (the same
# `EvenBlock` / `Block` selection):

# %%
from workbench import estimate
from workbench.analysis.memory.estimate import estimate_table

adamw = lambda params: torch.optim.AdamW(params, lr=1e-3)
inputs = lambda n: torch.randint(0, VOCAB, (n, SEQ))
SPECS = {"none": False, "every other block": EvenBlock, "every block": Block}
estimates = {name: estimate(small_lm, inputs, adamw, batch_size=128, checkpointing=spec) for name, spec in SPECS.items()}
est = estimate_table(estimates.values()).assign(granularity=list(SPECS))
est["peak_mib"] = est["peak_allocated_bytes"] / MIB
est["activations_mib"] = est["activations_bytes"] / MIB
est[["granularity", "peak_mib", "activations_mib", "peak_phase"]]

# %% [markdown]
# ### The allocator timeline before and after
#
# Allocated memory after every allocation and free of two training steps (forward shaded blue,
# backward orange, optimizer green). Without checkpointing, the forward pass climbs block after block
# and the backward pass releases it; with every block checkpointed, the forward stays almost flat and
# each block's activations come back, one block at a time, during backward.

# %% tags=["nbval-ignore-output"]
from workbench.figures import estimate_timeline_figure
from workbench.panels import PlotWidget

import ipywidgets as widgets

top = estimates["none"].peak_allocated_bytes / GIB * 1.1          # one y scale for both
before = estimate_timeline_figure(estimates["none"], max_points=2_000,
                                  title="before: no checkpointing (estimated CUDA allocator)")
after = estimate_timeline_figure(estimates["every block"], max_points=2_000, title="after: every block checkpointed")
for fig in (before, after):
    fig.update_yaxes(range=[0, top])
widgets.VBox([PlotWidget(before), PlotWidget(after)])

# %% [markdown]
# ### Exercise: where is the break-even?
#
# The workbench's `EstimatePanel` re-runs the estimate on every change. Tick *activation checkpointing*
# (every block) and move the batch size: how much larger a batch fits under the 0.25 GiB budget with
# checkpointing than without? Then raise the sequence length: which grows faster, the activations or
# the rest?

# %% tags=["nbval-ignore-output"]
from workbench import EstimatePanel

EstimatePanel.from_factories(lambda: LM(layers=LAYERS, d=64, heads=4, vocab=VOCAB),
                             lambda n, seq: torch.randint(0, VOCAB, (n, seq)), adamw,
                             batch_size=16, max_batch_size=256, seq_len=SEQ, max_seq_len=512, budget_gib=0.25)

# %% [markdown]
# Your answers, then the check runs the same estimator: `largest_batch_that_fits` searches the batch with
# the panel's rule for "fits" (the reserved peak's high end under the budget), and two estimates compare
# sequence 64 with 128:

# %%
MY_BATCH_RATIO = 2.0         # largest batch under 0.25 GiB, every block checkpointed / none
MY_FASTER_WITH_SEQ = "activations"   # "activations" or "the rest": which grows when the sequence doubles

# %% tags=["nbval-check-output"]
from workbench import largest_batch_that_fits

BUDGET = int(0.25 * GIB)
fit_none = largest_batch_that_fits(small_lm, inputs, adamw, BUDGET, high=1024).batch_size
fit_ckpt = largest_batch_that_fits(small_lm, inputs, adamw, BUDGET, high=1024, checkpointing=Block).batch_size
ratio = fit_ckpt / fit_none
by_seq = {seq: estimate(small_lm, lambda n, seq=seq: torch.randint(0, VOCAB, (n, seq)), adamw, batch_size=16).by_category
          for seq in (SEQ, 2 * SEQ)}
act_growth = by_seq[2 * SEQ]["activations"] / by_seq[SEQ]["activations"]
rest = lambda c: c["parameters"] + c["optimizer_state"]
print(f"largest batch under 0.25 GiB: {fit_none} without, {fit_ckpt} with every block checkpointed "
      f"({ratio:.1f}x):", "right" if abs(MY_BATCH_RATIO / ratio - 1) < 0.25 else "look again")
print(f"sequence {SEQ} -> {2 * SEQ}: activations x{act_growth:.2f}, parameters + optimizer state "
      f"x{rest(by_seq[2 * SEQ]) / rest(by_seq[SEQ]):.2f}:", "right" if MY_FASTER_WITH_SEQ == "activations" else "look again")
# the solution: checkpointing fits a larger batch; the sequence grows the activations only
assert 1024 > fit_ckpt > fit_none > 0 and act_growth > 1.9 and rest(by_seq[2 * SEQ]) == rest(by_seq[SEQ])

# %% [markdown]
# ## 4 · On a GPU: the allocator timeline, recorded
#
# With a CUDA device, this cell records the real allocator history of two steps of the H200-sized
# model with and without checkpointing (`record_memory_history`) and opens both in the workbench's
# `MemoryPanel`; it also runs the three granularities through the harness. Skipped on a CPU.

# %% tags=["nbval-skip"]
if GPU:
    import tempfile
    from workbench import record_memory_history
    from workbench import MemoryPanel

    big_work = Workload(model=lambda: LM(layers=12, d=1024, heads=16, vocab=2048),
                        batch=lambda n, device: (lambda t: (t[:, :-1], t[:, 1:]))(torch.randint(0, 2048, (n, 513), device=device)),
                        loss=lambda m, b: F.cross_entropy(m(b[0]).float().reshape(-1, 2048), b[1].reshape(-1)),
                        optimizer=lambda p: torch.optim.AdamW(p, fused=True), batch_size=32, tokens_per_sample=512)
    live = run_experiment(big_work, list(GRANULARITIES.values()), steps=4, warmup=2, check_steps=1, reference="none")
    live_ratios = baseline_ratios(live.ledger, baseline="none")
    print(live_ratios[["configuration", "step_ms_median", "step_time_ratio",
                       "peak_allocated_bytes", "peak_allocated_ratio"]].to_string())
    lp = live_ratios.set_index("configuration")["peak_allocated_bytes"]
    assert lp["every block"] < lp["every other block"] < lp["none"]          # on this GPU too
    assert (live_ratios.set_index("configuration").loc[["every other block", "every block"], "check_verdict"] == "ok").all()
    panels, out_dir = [], Path(tempfile.mkdtemp(prefix="ckpt-snapshots-"))
    for name, spec in (("none", None), ("every block", Block)):
        torch.manual_seed(0)
        model = LM(layers=12, d=1024, heads=16, vocab=2048).cuda()
        if spec is not None:
            model = checkpointing(spec).transform(model, torch.device("cuda"))
        opt = torch.optim.AdamW(model.parameters(), fused=True)
        tokens = torch.randint(0, 2048, (32, 513), device="cuda")
        with record_memory_history(out_dir / f"ckpt_{name.replace(' ', '_')}.snapshot.pickle.gz") as rec:
            for _ in range(2):
                F.cross_entropy(model(tokens[:, :-1]).float().reshape(-1, 2048), tokens[:, 1:].reshape(-1)).backward()
                opt.step(); opt.zero_grad(set_to_none=True)
        panels.append(MemoryPanel(rec.path))
        del model, opt
        torch.cuda.empty_cache()
    display(widgets.VBox(panels))

# %% [markdown]
# ## Takeaways
#
# - Checkpointing trades a recomputed forward for the activations: on the H200, **every block** cut the
#   fp32 peak to about a quarter for about a quarter more step time (printed below from the ledger).
# - Granularity is a dial: **every other block** lands between the two in memory and in recomputed work
#   (half the blocks' forward operators run twice); step times on a busy CPU are too noisy to rank it.
# - It only shrinks activations: weights, gradients and optimizer state stay, so after bf16 there is
#   less left to gain in absolute terms.
# - It costs operators, so it suits a GPU-bound step whose batch is limited by memory, not a launch-bound one.

# %%
m = curve["peak_allocated_bytes"].astype(float)
assert m["every block"] < m["every other block"] < m["none"]                 # measured on this CPU
e = est.set_index("granularity")["peak_allocated_bytes"]
assert e["every block"] < e["every other block"] < e["none"]                   # estimated for CUDA
assert list(curve.loc[["every other block", "every block"], "check_verdict"]) == ["ok", "ok"]   # same gradients
blocks_linear = 4 * LAYERS                                                    # qkv, proj, fc1, fc2 per block
lin = recomputed.loc["aten::linear"]
assert lin["every block"] == lin["none"] + blocks_linear and lin["every other block"] == lin["none"] + blocks_linear // 2
assert h.loc["checkpoint(Block)", "peak_allocated_ratio"] < 0.3 and 1.1 < h.loc["checkpoint(Block)", "step_time_ratio"] < 1.4
print(f"H200 fp32: peak x{c.peak_allocated_ratio:.2f} for step time x{c.step_time_ratio:.2f}; "
      f"bf16: {b.peak_allocated_bytes / GIB:.1f} -> {bc.peak_allocated_bytes / GIB:.1f} GiB")
print(f"this CPU: peak x{curve.loc['every other block', 'peak_allocated_ratio']:.2f} (every other block), "
      f"x{curve.loc['every block', 'peak_allocated_ratio']:.2f} (every block); recomputed linear ops per step "
      f"+{lin['every other block'] - lin['none']} / +{lin['every block'] - lin['none']}")

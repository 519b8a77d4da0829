# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 36 · The flags people copy: measure a flag before you copy it
#
# Some lines get copied from one script to the next because they look like free speed or free memory:
# `torch.backends.cudnn.benchmark = True`, `torch.cuda.empty_cache()`, `torch.nn.utils.prune`, and
# "quantize it". Each one does something real, and each one does something other than what the copied
# comment says. This lesson takes them one at a time and measures each: on this CPU where a CPU can
# show it, and from a recording on an H200 (`benchmarks/record_lesson36_h200.py`,
# `workbench/samples/results/h200_lesson36.json`) where it takes a GPU.
#
# The one idea: **a flag is a hypothesis, and the measurement decides.** Several of the outcomes
# below run against the copied comment. Every claim about the H200 is checked by an `assert` on the
# recording, so if the data changes, the lesson fails rather than going quietly wrong.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json, os
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

rec = json.loads((RESULTS / "h200_lesson36.json").read_text())
e = rec["env"]
assert rec["smoke"] is False and "H200" in e["gpu"]
print(f"H200 recording: {e['gpu']}, driver {e['driver']}, torch {e['torch']}, CUDA {e['cuda']}, "
      f"cuDNN {e['cudnn']}, torchao {e['torchao']}, {e['date_utc'][:10]}")
print("parts with an error:", [p for p in ("cudnn", "empty_cache", "prune", "torchao") if "error" in rec[p]] or "none",
      f"| the whole recording took {rec['total_wall_s']:.0f} s")

# %% [markdown]
# ## 1 · `prune` makes the layer bigger
#
# `torch.nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)` zeroes the half of the weights
# with the smallest magnitude. It does this by *re-parametrising* the layer: the original weight is
# kept as a parameter `weight_orig`, a 0/1 buffer `weight_mask` is added, and a forward pre-hook
# computes `weight = weight_orig * weight_mask` before every call. The tensor stays dense, and the
# layer now holds two weight-sized tensors. `prune.remove` folds the mask in and leaves one dense
# tensor that has zeros in it. Counted live, on this CPU:

# %% tags=["nbval-check-output"]
from torch.nn.utils import prune


def layer_bytes(m):
    p = {n: t.numel() * t.element_size() for n, t in m.named_parameters()}
    b = {n: t.numel() * t.element_size() for n, t in m.named_buffers()}
    return p, b, sum(p.values()) + sum(b.values())


lin = torch.nn.Linear(512, 512)
stages = {}
stages["dense"] = layer_bytes(lin)
prune.l1_unstructured(lin, "weight", amount=0.5)
stages["after l1_unstructured(0.5)"] = layer_bytes(lin)
zero_share = float((lin.weight == 0).float().mean())
prune.remove(lin, "weight")
stages["after prune.remove"] = layer_bytes(lin)
prune_table = pd.DataFrame({k: {"parameters": ", ".join(p), "buffers": ", ".join(b) or "-", "bytes": tot}
                            for k, (p, b, tot) in stages.items()}).T
print(prune_table.to_string())
print(f"share of zeros in the weight: {zero_share:.2f}; pruned / dense bytes: "
      f"{prune_table['bytes'].iloc[1] / prune_table['bytes'].iloc[0]:.3f}")

# %% [markdown]
# The H200 ran the same three stages on a bf16 `Linear(4096, 4096)` and timed the forward pass at
# batch 256 (medians of repeated calls, timed with CUDA events):

# %% tags=["nbval-check-output"]
pr = rec["prune"]["prune"]
fwd = pr["forward_median_ms"]
h200_prune = pd.DataFrame({
    "bytes (MiB)": {"dense": pr["before"]["total_bytes"] / MIB, "pruned": pr["after_prune"]["total_bytes"] / MIB,
                    "after_remove": pr["after_remove"]["total_bytes"] / MIB},
    "forward ms (median)": fwd,
})
print(f"H200 {pr['layer']}, batch {pr['batch']}, zeros after pruning: {pr['zero_fraction']:.2f}")
print(h200_prune.round(4).to_string())
print(f"pruned / dense forward time: {fwd['pruned'] / fwd['dense']:.2f}; "
      f"after_remove / dense: {fwd['after_remove'] / fwd['dense']:.2f}")

# %% [markdown]
# What the recording shows:
#
# - The pruned layer holds twice the bytes, and half-zero weights buy it **no speed**: it runs the same
#   dense matmul as before, plus the mask multiply, and it timed within a few percent of the dense layer
#   (the ratio printed above; in this recording a little below it, a difference these short timings do
#   not resolve, see the next point). It timed above the layer after `prune.remove`, which no longer runs
#   the multiply.
# - After `prune.remove` the forward timed lower than the dense layer's (ratio printed above). The
#   recording cannot say why. It is the same dense `addmm` on the same shapes, and dense matmul
#   kernels do not skip zeros. The only differences are the values (half of them are zero) and the
#   order (the dense layer was timed first, after two warm-up calls). Each of these times is a few
#   hundredths of a millisecond. Settling it would take a rerun with the order swapped; this
#   recording does not have one.
#
# To skip work, the kernels need a sparse *format*. On Hopper that format is **2:4 semi-structured
# sparsity**: two of every four consecutive weights are zero, and `torch.sparse.to_sparse_semi_structured`
# stores the kept half plus a small index for the sparse tensor cores. There are two backends,
# cuSPARSELt (the default) and CUTLASS. The recording made an 8192 x 8192 bf16 weight 2:4 (the two
# largest of every four kept) and timed `F.linear` with the sparse weight against the dense matmul
# of the *same* weight:

# %% tags=["nbval-check-output"]
semi = rec["prune"]["semi_structured"]
dense_bytes = semi["weight"]["dense_bytes"]
rows = []
for backend in ("default", "cutlass"):
    b = semi[backend]
    for key in sorted((k for k in b if k.startswith("batch_")), key=lambda k: int(k[6:])):
        v = b[key]
        row = {"backend": backend, "class": b["class"], "batch": int(key[6:]),
               "bytes / dense": b["bytes"] / dense_bytes}
        if "error" in v:
            row["error"] = v["error"]
        else:
            row.update({"dense ms": v["dense_median_ms"], "2:4 ms": v["sparse_median_ms"], "speedup": v["speedup"],
                        "max |err|": v["max_abs_err_vs_dense"], "max |y|": v["max_abs_dense"]})
        rows.append(row)
semi_table = pd.DataFrame(rows)
print(f"weight {semi['weight']['shape']} {semi['weight']['dtype']}, zeros {semi['weight']['zero_fraction']:.2f}, "
      f"dense {dense_bytes / MIB:.0f} MiB")
print(semi_table.drop(columns="error", errors="ignore").round(4).to_string(index=False))
for r in rows:
    if "error" in r:
        print(f"{r['backend']} batch {r['batch']}: {r['error']}")


def bf16_step(x):
    """The spacing of bf16 numbers at |x| (8 significant bits): one rounding step."""
    return 2.0 ** (np.floor(np.log2(x)) - 7)


ok24 = semi_table[semi_table["speedup"].notna()] if "speedup" in semi_table else semi_table.iloc[:0]
print("2:4 error / one bf16 step at max |y|:",
      [round(float(r["max |err|"] / bf16_step(r["max |y|"])), 2) for _, r in ok24.iterrows()])

# %% [markdown]
# On this H200, with torch 2.11 and bf16:
#
# - **Memory:** the 2:4 weight takes a little over half the dense bytes (the kept values plus the index).
# - **Time:** cuSPARSELt was *slower* than the dense matmul at both batch sizes (speedup < 1 in the
#   table). At batch 64 it took many times the dense time; at batch 8192 it came closer but still did
#   not win. A 2:4 speedup has to be measured at your shapes, not assumed.
# - **CUTLASS** does not run at all: torch's CUTLASS 2:4 kernel supports only compute capability 8.x,
#   and the H200 is 9.0 (the error above).
# - **Numerics:** the 2:4 result matches the dense matmul of the same weight to within one bf16
#   rounding step (the ratios printed are at most 1).

# %% [markdown]
# ## 2 · `empty_cache()` gives back whole free segments, nothing else
#
# PyTorch's caching allocator keeps freed blocks inside the segments it got from `cudaMalloc`, so it
# can hand them out again without asking CUDA. `torch.cuda.empty_cache()` returns to CUDA every
# segment that is **entirely** free. A segment with even one live tensor in it keeps all its holes:
# fragmentation inside live segments is left as it is, and the next step needs the same memory as
# before, so its peak does not drop. The cost is that the next step has to `cudaMalloc` again.
#
# The workbench's allocator model (`workbench.analysis.memory.allocator_model`, the rules of
# `CUDACachingAllocator.cpp`) replays this on a CPU. The pattern: one 512 MiB block is cached and
# carved into 64 pieces of 8 MiB, every other piece is freed (32 holes inside a live segment), then
# four 64 MiB tensors that fit in no hole are allocated (four new segments) and freed. It reports the
# two numbers from docs/memory.md: the **cached-unused share** = (reserved − allocated) / reserved, and
# **external fragmentation** = 1 − largest free block / free in reserved.

# %% tags=["nbval-check-output"]
from workbench.analysis.memory.allocator_model import CachingAllocatorModel


def state(m):
    free = m.free_in_reserved_bytes
    return {"reserved MiB": m.reserved_bytes / MIB, "allocated MiB": m.allocated_bytes / MIB,
            "largest free MiB": m.largest_free_block() / MIB, "segments": m.segment_count,
            "cached-unused share": free / m.reserved_bytes if m.reserved_bytes else 0.0,
            "external fragmentation": 1 - m.largest_free_block() / free if free else 0.0}


model = CachingAllocatorModel()
model.free(model.malloc(512 * MIB))
pieces = [model.malloc(8 * MIB) for _ in range(64)]
for h in pieces[::2]:
    model.free(h)
for h in [model.malloc(64 * MIB) for _ in range(4)]:
    model.free(h)
before = state(model)
released = model.empty_cache()
after = state(model)
model_table = pd.DataFrame({"model before": before, "model after": after})
print(model_table.round(4).to_string())
print(f"released: {released / MIB:.0f} MiB")

# %% [markdown]
# Reserved memory drops by the four whole segments, but the 32 holes stay. The largest free block is
# now a single 8 MiB hole, so external fragmentation goes **up**. The H200 ran the same pattern on the
# real allocator. Its numbers are read two ways: from `torch.cuda.memory_snapshot()` at the moment (in
# the JSON), and from the allocator history the recorder kept
# (`h200_lesson36_empty_cache.snapshot.pickle.gz`), replayed by the workbench's own
# `allocator_state`, just before the first `segment_free` event and at the end:

# %% tags=["nbval-check-output"]
from workbench import load_snapshot
from workbench.analysis.memory.allocations import allocations, device_events
from workbench.analysis.memory.segments import allocator_state

EC = rec["empty_cache"]
snap = load_snapshot(os.path.relpath(RESULTS / "h200_lesson36_empty_cache.snapshot.pickle.gz"))
allocs = allocations(snap)
actions = device_events(snap)["action"].astype(str).tolist()
first_release = actions.index("segment_free")
snap_states = {"snapshot before": allocator_state(snap, allocs, first_release - 1),
               "snapshot after": allocator_state(snap, allocs)}
print(f"allocator events: {len(actions)}; segment_alloc {actions.count('segment_alloc')}, "
      f"segment_free {actions.count('segment_free')} (all after event {first_release - 1})")

KEYS = {"reserved MiB": "reserved_bytes", "allocated MiB": "allocated_bytes",
        "largest free MiB": "largest_free_block_bytes", "segments": "segments",
        "cached-unused share": "cached_unused_share", "external fragmentation": "external_fragmentation"}


def in_mib(k, v):
    return v / MIB if k.endswith("MiB") else v


h200_alloc = pd.DataFrame({
    "H200 before": {k: in_mib(k, EC["before"][j]) for k, j in KEYS.items()},
    "H200 after": {k: in_mib(k, EC["after"][j]) for k, j in KEYS.items()},
    **{name: {k: in_mib(k, getattr(s, j)) for k, j in KEYS.items()} for name, s in snap_states.items()},
})
alloc_table = h200_alloc.join(model_table)
print(alloc_table.round(4).to_string())
print(f"empty_cache() call on the H200: {EC['empty_cache_call_ms']:.2f} ms wall")

# %% [markdown]
# Three sources agree on every row: the live numbers on the H200, the workbench reading the H200's
# allocator history, and the CPU model. The takeaways cell asserts it.
#
# With the same snapshot, the workbench's `MemoryPanel` shows the reserved line stepping down four
# times at the end while allocated stays flat. On its Segments tab, the one surviving 512 MiB segment
# still has its 32 holes.

# %% tags=["nbval-ignore-output"]
from workbench.analysis.memory.oom import analyze_snapshot
from workbench import MemoryPanel

MemoryPanel(analyze_snapshot(snap))

# %% [markdown]
# **Calling it between steps.** The recorder then ran one bf16 training step of an MLP 20 times (its
# gradients dropped each step, so all of its memory is transient). It ran once with the cache kept
# and once with `empty_cache()` before every step:

# %% tags=["nbval-check-output"]
modes = EC["steps"]["modes"]
steps_table = pd.DataFrame({
    m: {"step ms (median)": v["step_median_ms"], "empty_cache() ms (median)": v["empty_cache_median_ms"],
        "peak allocated MiB": v["max_memory_allocated_bytes"] / MIB,
        "peak reserved MiB": v["max_memory_reserved_bytes"] / MIB,
        f"cudaMalloc calls in {EC['steps']['steps']} steps": v["device_allocs"]}
    for m, v in modes.items()}).T
print(EC["steps"]["model"])
print(steps_table.round(3).to_string())
keep, emptied = modes["keep_cache"], modes["empty_cache_between_steps"]
print(f"step time with empty_cache() between steps / kept cache: "
      f"{emptied['step_median_ms'] / keep['step_median_ms']:.2f}x "
      f"({(emptied['step_median_ms'] + emptied['empty_cache_median_ms']) / keep['step_median_ms']:.2f}x "
      f"counting the empty_cache() call)")

# %% [markdown]
# With the cache kept, the 20 steps called `cudaMalloc` zero times: every block came from the cache.
# With `empty_cache()` between steps, every step had to fetch its memory from CUDA again, the step
# itself got slower, and the call to `empty_cache()` added its own time on top (ratios printed above).
# The peak allocated memory is byte-for-byte the same, and the peak *reserved* memory is not lower
# either (here it was higher). `empty_cache()` is for handing memory to *another* process (or to a
# monitoring tool that reads `nvidia-smi`). It is not a fix for an OOM inside your own step: that
# needs less live memory, or fewer holes (`expandable_segments`, lesson 21).

# %% [markdown]
# ## 3 · `cudnn.benchmark`: a price paid once per new shape, for a gain that must be measured
#
# With `benchmark = True`, the first convolution of each new input shape tries several cuDNN
# algorithms and keeps the fastest one for that shape, in a per-process cache. With fixed shapes the
# search happens once, and the steps after it may or may not be faster. Shapes that keep changing pay
# the search again and again. The recording runs a small fp32 CNN training step (4 conv layers,
# batch 32) in a fresh process for each setting: a fixed 128 x 128 input (3 first calls, wall time,
# then 30 steps by CUDA events), then 10 resolutions cycled 3 times (wall time per step).

# %% tags=["nbval-check-output"]
CU = rec["cudnn"]
cud = {}
for flag in (False, True):
    r = CU[f"benchmark_{flag}"]
    cud[f"benchmark={flag}"] = {
        "first call ms (fixed shape)": r["fixed"]["first_calls_wall_ms"][0],
        "steady ms (fixed shape, median)": r["fixed"]["steady_median_ms"],
        "first visit of a new shape ms (median)": r["variable"]["first_visit_median_ms"],
        "revisit ms (median)": r["variable"]["revisit_median_ms"],
        f"total ms, {r['variable']['steps']} variable-shape steps": r["variable"]["total_wall_ms"]}
cudnn_table = pd.DataFrame(cud)
on, off = CU["benchmark_True"], CU["benchmark_False"]
print(f"dtype {on['dtype']}, cudnn.allow_tf32={on['cudnn_allow_tf32']}, sizes {on['variable']['sizes']}")
print(cudnn_table.round(3).to_string())
extra_first = on["fixed"]["first_calls_wall_ms"][0] - off["fixed"]["first_calls_wall_ms"][0]
saved_per_step = off["fixed"]["steady_median_ms"] - on["fixed"]["steady_median_ms"]
print(f"autotuning cost on the first fixed-shape call: {extra_first:.0f} ms; steady time saved per step: "
      f"{saved_per_step:+.3f} ms ->",
      f"pays back after {extra_first / saved_per_step:.0f} steps" if saved_per_step > 0 else "never pays back")
print(f"variable shapes: benchmark=True total / benchmark=False total = "
      f"{on['variable']['total_wall_ms'] / off['variable']['total_wall_ms']:.1f}x")

# %% [markdown]
# On this model, on this H200 with this cuDNN, the flag bought **nothing**. The fixed-shape steady
# step was no faster with autotuning than with cuDNN's default heuristics (it was slightly slower), so
# the seconds spent on the first call never pay back. With variable shapes every new resolution paid
# the search again, and 30 steps took many times longer in total (ratio printed). Revisits of shapes
# that were already tuned cost about the same with either setting. Other models, dtypes and cuDNN
# versions can come out differently, and this recording measured one of each. The point is that the
# gain has to be measured, while the cost is certain.

# %% [markdown]
# ## 4 · Quantization on the GPU: torchao `quantize_`
#
# Lesson 32 showed how to quantize (`torchao.quantization.quantize_`, and why `torch.ao.quantization`
# is CPU-only). Here are the recorded H200 numbers for a bf16 MLP (4096 → 14336 → 4096), **eager,
# without `torch.compile`** (the recorder did not measure compiled models). For each config: weight
# bytes, latency at batch 16 and 4096 (medians, CUDA events), and error against the bf16 output.

# %% tags=["nbval-check-output"]
TA = rec["torchao"]
CONFIGS = ("bf16", "int8_weight_only", "int8_dynamic", "float8_weight_only", "float8_dynamic")
base = TA["bf16"]
quant = {}
for name in CONFIGS:
    r = TA[name]
    quant[name] = {"api": r.get("api", "-"), "weight MiB": r["weight_bytes"] / MIB,
                   "ms @16": r["batch_16_median_ms"], "ms @4096": r["batch_4096_median_ms"],
                   "x bf16 time @16": r["batch_16_median_ms"] / base["batch_16_median_ms"],
                   "x bf16 time @4096": r["batch_4096_median_ms"] / base["batch_4096_median_ms"],
                   "rel L2 err @4096": r.get("batch_4096_rel_l2_err", 0.0)}
quant_table = pd.DataFrame(quant).T
print(TA["model"])
print(quant_table.round(4).to_string())

# %% [markdown]
# On the H200, **every config was slower than plain bf16, at both batch sizes**. Each one halved the
# weight bytes, but none turned that into time in eager mode. The worst was int8 dynamic
# (activations quantized on every call), at about ten times the bf16 time at batch 4096 (asserted
# below). The errors rise in the order int8 weight-only < int8 dynamic < float8 weight-only < float8
# dynamic.
#
# Where is bf16 on the roofline? The workbench's datasheet row for the H200 (`peak_for`) and its
# roof (`attainable_tflops`) turn the times into achieved TFLOP/s and a fraction of the roof of the
# dtype each config computes in. The FLOPs are the two matmuls, 2 · batch · 2 · 4096 · 14336. The
# bytes are a lower bound: the weights once, plus the bf16 input, hidden and output activations.

# %% tags=["nbval-check-output"]
from workbench.analysis.trace.peaks import peak_for
from workbench.analysis.trace.roofline import attainable_tflops

peak = peak_for(e["gpu"])
D, H = 4096, 14336
COMPUTE_DTYPE = {"bf16": "bf16", "int8_weight_only": "bf16", "float8_weight_only": "bf16",
                 "int8_dynamic": "int8", "float8_dynamic": "fp8"}
roof_rows = []
for name in CONFIGS:
    for m in (16, 4096):
        flops = 2 * m * 2 * D * H
        nbytes = TA[name]["weight_bytes"] + 2 * m * (D + 2 * H + D)
        t_us = TA[name][f"batch_{m}_median_ms"] * 1e3
        tflops, inten = flops / t_us / 1e6, flops / nbytes
        roof = float(attainable_tflops(peak, COMPUTE_DTYPE[name], inten))
        roof_rows.append({"name": f"{name} @{m}", "config": name, "batch": m, "dtype": COMPUTE_DTYPE[name],
                          "flops": flops, "bytes": nbytes, "costed_us": t_us, "tflops": tflops,
                          "gbps": nbytes / t_us / 1e3, "intensity": inten, "roof TFLOP/s": roof,
                          "roofline_fraction": tflops / roof})
roof_table = pd.DataFrame(roof_rows).set_index("name")
print(f"peaks: {peak.name} ({peak.source}): bf16 {peak.compute('bf16')}, fp8 {peak.compute('fp8')}, "
      f"int8 {peak.compute('int8')} TFLOP/s, {peak.gbps:.0f} GB/s")
print(roof_table[["dtype", "intensity", "tflops", "roof TFLOP/s", "roofline_fraction"]].round(3).to_string())

# %% [markdown]
# At batch 4096, bf16 reaches the largest fraction of its roof of all the rows. The float8 and int8
# dynamic configs run on units with twice the bf16 peak (their roof is higher), yet they reached fewer
# TFLOP/s than bf16 did. The recording holds times, not a trace, so it cannot show where their time
# went. To find out, profile one config (lesson 10's `ProfilerPanel`). These are eager numbers: each
# quantized weight is a tensor subclass whose every call is dispatched in Python, and at batch 16 bf16's
# whole call took under 0.1 ms, so a per-call overhead of that order can decide the row; the eager times
# cannot tell it from the weights. `torch.compile` is torchao's supported path; lesson 32
# (section 3) reads the same MLP measured eager and compiled, at batch 1, 16 and 4096
# (`benchmarks/record_lesson37_h200.py`). At batch 16 every row is
# left of the ridge point (peak TFLOP/s / bandwidth), where the roof is set by memory bandwidth. The
# workbench's roofline figure shows them:

# %% tags=["nbval-ignore-output"]
from workbench.figures.roofline import roofline_figure
from workbench.panels import PlotWidget

PlotWidget(roofline_figure(roof_table.reset_index(), peak, title="torchao configs on the H200 (eager)"))

# %% [markdown]
# ## 5 · Exercise: which flag helps here?
#
# For each situation, write the flag you would reach for (`"cudnn.benchmark"`, `"empty_cache"`,
# `"prune"`, `"2:4"`, `"int8_weight_only"`), or `"none"` when no flag in this lesson helped on the
# H200. Then run the check. The check does not hard-code the answers: it derives them from the
# recording, so they are what *this* H200 data supports.

# %%
answers = {
    "the lesson's CNN, trained for hours on fixed 128x128 inputs, must get faster": "?",
    "an OOM inside a step whose reserved memory is mostly holes in live segments": "?",
    "an 8192x8192 bf16 weight, half of it pruned, must take less GPU memory with its values unchanged": "?",
    "the lesson's bf16 MLP, served at batch 16, must answer faster (eager)": "?",
    "training has ended and another process on the GPU needs the memory": "?",
}

# %%
def derived_solution():
    """Each answer follows from the recorded numbers (sections 1-4), not from the flag's reputation."""
    c_on, c_off = rec["cudnn"]["benchmark_True"], rec["cudnn"]["benchmark_False"]
    cnn = "cudnn.benchmark" if c_on["fixed"]["steady_median_ms"] < c_off["fixed"]["steady_median_ms"] else "none"
    b, a = rec["empty_cache"]["before"], rec["empty_cache"]["after"]
    holes = "empty_cache" if a["largest_free_block_bytes"] > b["largest_free_block_bytes"] else "none"
    s = rec["prune"]["semi_structured"]
    p = rec["prune"]["prune"]
    memory = ("2:4" if s["default"]["bytes"] < s["weight"]["dense_bytes"] else
              "prune" if p["after_remove"]["total_bytes"] < p["before"]["total_bytes"] else "none")
    fastest = min(CONFIGS, key=lambda n: rec["torchao"][n]["batch_16_median_ms"])
    serve = "none" if fastest == "bf16" else fastest
    handover = "empty_cache" if a["reserved_bytes"] < b["reserved_bytes"] else "none"
    return dict(zip(answers, [cnn, holes, memory, serve, handover]))


solution = derived_solution()
wrong = {k: (v, solution[k]) for k, v in answers.items() if v != solution[k]}
print("all right" if not wrong else
      "\n".join(f"- {k}: you said {a!r}, the data says {s!r}" for k, (a, s) in wrong.items()))

# %% [markdown]
# ## Takeaways (asserted on the data)
#
# - `prune.l1_unstructured` zeroes half of the weight and **grows** the layer (`weight_orig` +
#   `weight_mask`). Its forward is not twice as fast, and it is slower than the same layer after
#   `prune.remove`, which only brings the size back to dense.
# - 2:4 sparsity shrinks the weight to a little over half. On this H200, cuSPARSELt was slower than
#   the dense matmul at both batch sizes, and CUTLASS's 2:4 kernel does not run on compute
#   capability 9.0.
# - `empty_cache()` releases whole free segments only. Holes in live segments stay, the largest free
#   block does not grow, and between steps it adds `cudaMalloc` calls and time without lowering the
#   peak. The allocator model, the live H200 numbers and the H200 snapshot agree exactly.
# - `cudnn.benchmark = True` cost about a second for each new shape and gave no steady-state gain on
#   this CNN.
# - torchao `quantize_` (eager) halved the weight bytes and was slower than bf16 for every config at
#   both batch sizes; int8 dynamic was about ten times slower at batch 4096. Eager is not torchao's
#   supported path: judge it compiled (lesson 32, section 3), not from this row.

# %%
# 1 · prune and 2:4
dense_b, pruned_b, removed_b = prune_table["bytes"]
assert zero_share == 0.5 and pruned_b > 1.9 * dense_b and removed_b == dense_b
assert pr["after_prune"]["total_bytes"] > 1.9 * pr["before"]["total_bytes"]
assert pr["after_remove"]["total_bytes"] == pr["before"]["total_bytes"]
assert 0.9 < fwd["pruned"] / fwd["dense"] < 1.1 and fwd["pruned"] > fwd["after_remove"]   # no speed from the zeros
d24 = semi["default"]
assert 0.5 < d24["bytes"] / dense_bytes < 0.75
assert all(d24[k]["speedup"] < 1 for k in d24 if k.startswith("batch_"))
assert d24["batch_64"]["speedup"] < 0.25                          # batch 64: many times the dense time
assert d24["batch_8192"]["speedup"] > d24["batch_64"]["speedup"]  # batch 8192: closer, still below 1
assert all("compute capability 8.x" in semi["cutlass"][k]["error"] for k in semi["cutlass"] if k.startswith("batch_"))
assert all(r["max |err|"] <= bf16_step(r["max |y|"]) for _, r in ok24.iterrows())
# 2 · empty_cache: model, live H200 numbers and H200 snapshot agree; holes stay; no lower peak
for when in ("before", "after"):
    for k in ("reserved MiB", "allocated MiB", "largest free MiB", "segments"):
        row = alloc_table.loc[k]
        assert row[f"H200 {when}"] == row[f"snapshot {when}"] == row[f"model {when}"], (k, when)
assert after["reserved MiB"] < before["reserved MiB"] and after["allocated MiB"] == before["allocated MiB"]
assert after["largest free MiB"] < before["largest free MiB"]
assert after["external fragmentation"] > before["external fragmentation"]
assert EC["after"]["free_in_reserved_bytes"] > 0 and EC["after"]["whole_free_segments"] == 0
assert keep["device_allocs"] == 0 < emptied["device_allocs"]
assert emptied["step_median_ms"] > keep["step_median_ms"]
assert emptied["max_memory_allocated_bytes"] == keep["max_memory_allocated_bytes"]
assert emptied["max_memory_reserved_bytes"] > keep["max_memory_reserved_bytes"]
# 3 · cudnn.benchmark: a search per new shape, no steady gain here
for r in (on, off):  # the protocol the prose describes
    assert r["batch"] == 32 and len(r["fixed"]["first_calls_wall_ms"]) == 3 and len(r["fixed"]["steady_ms"]) == 30
    assert len(r["variable"]["sizes"]) == 10 and r["variable"]["cycles"] == 3 and r["fixed"]["shape"][2:] == [128, 128]
assert on["fixed"]["steady_median_ms"] >= off["fixed"]["steady_median_ms"]
assert on["fixed"]["first_calls_wall_ms"][0] > off["fixed"]["first_calls_wall_ms"][0] + 1000  # "about a second" or more
assert 0.5 < on["variable"]["first_visit_median_ms"] / 1e3 < 2                           # about a second per new shape
assert on["variable"]["first_visit_median_ms"] > 10 * off["variable"]["first_visit_median_ms"]
assert on["variable"]["total_wall_ms"] > 10 * off["variable"]["total_wall_ms"]
# 4 · torchao (eager): half the weight bytes, slower than bf16 everywhere, int8 dynamic about 10x at 4096
for name in CONFIGS[1:]:
    assert quant_table.loc[name, "weight MiB"] < 0.51 * quant_table.loc["bf16", "weight MiB"]
    assert quant_table.loc[name, "x bf16 time @16"] > 1 and quant_table.loc[name, "x bf16 time @4096"] > 1
assert round(quant_table.loc["int8_dynamic", "x bf16 time @4096"]) == 10
errs = quant_table["rel L2 err @4096"]
assert errs["int8_weight_only"] < errs["int8_dynamic"] < errs["float8_weight_only"] < errs["float8_dynamic"]
assert roof_table["roofline_fraction"].idxmax() == "bf16 @4096"
fast_units = roof_table[(roof_table["batch"] == 4096) & roof_table["dtype"].isin(["fp8", "int8"])]
assert (fast_units["roof TFLOP/s"] > roof_table.loc["bf16 @4096", "roof TFLOP/s"]).all()
assert (fast_units["tflops"] < roof_table.loc["bf16 @4096", "tflops"]).all()
ridge = peak.compute("bf16") * 1e3 / peak.gbps                                          # FLOP/byte
assert (roof_table.loc[roof_table["batch"] == 16, "intensity"] < ridge).all()
print("takeaways hold on this data")

# %% [markdown]
# ## Rerun it live (GPU only)
#
# On a CUDA machine, this runs the recorder into a temporary folder (its time on the H200 is printed in
# the first cell) and prints where the JSON went. Load it in place of `RESULTS / "h200_lesson36.json"`
# above to compare your GPU with the recording. It needs torchao for section 4.

# %% tags=["nbval-skip"]
from pathlib import Path

from workbench.lessons import checkout_recorder

recorder = checkout_recorder("record_lesson36_h200.py", "your own numbers") if GPU else None
if GPU and recorder is not None:
    import subprocess, sys, tempfile

    out = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, str(recorder), "--out", str(out)], check=True)
    print("live recording:", os.path.relpath(out / "h200_lesson36.json"))
    mine = json.loads((out / "h200_lesson36.json").read_text())
    mp = mine["prune"]["prune"]
    # what does not depend on the GPU: pruning doubles the layer's bytes, prune.remove gives them back
    assert mp["after_prune"]["total_bytes"] > 1.9 * mp["before"]["total_bytes"]
    assert mp["after_remove"]["total_bytes"] == mp["before"]["total_bytes"] and mp["zero_fraction"] == 0.5

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
# Some lines travel from script to script because they look like free speed or free memory:
# `torch.backends.cudnn.benchmark = True`, `torch.cuda.empty_cache()`, `torch.nn.utils.prune`, and
# "quantize it". Each does something real, and each does something other than what the copied comment
# says. This lesson takes them one at a time and measures: on this CPU where a CPU can show it, and
# from a recording on an H200 (`benchmarks/record_lesson36_h200.py`) where it takes a GPU.
#
# The one idea: **a flag is a hypothesis; the measurement decides.**

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

REC_PATH = RESULTS / "h200_lesson36.json"
RECORDED = REC_PATH.exists()
rec = json.loads(REC_PATH.read_text()) if RECORDED else {}
if RECORDED:
    e = rec["env"]
    print(f"H200 recording: {e.get('gpu')}, torch {e.get('torch')}, CUDA {e.get('cuda')}, cuDNN {e.get('cudnn')}, "
          f"torchao {e.get('torchao')}, {e.get('date_utc', '')[:10]}")
else:
    print("The H200 recording is pending: run `python benchmarks/record_lesson36_h200.py --out DIR` on a GPU "
          "and copy DIR/h200_lesson36.json to workbench/samples/results/. The CPU parts below run anyway.")

# %% [markdown]
# ## 1 · `prune` makes the model bigger
#
# `torch.nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)` zeroes the half of the weights
# with the smallest magnitude. It does so by *re-parametrising* the layer: the original weight is kept
# as a parameter `weight_orig`, a 0/1 buffer `weight_mask` is added, and a forward pre-hook recomputes
# `weight = weight_orig * weight_mask` before every call. The tensor stays dense, so nothing is
# faster, and the layer now holds two weight-sized tensors. `prune.remove` folds the mask in and
# gives back one dense tensor, with zeros in it. Counted live, on this CPU:

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
# Real sparsity needs a format the kernels can skip. On Hopper, **2:4 semi-structured sparsity**
# (two of every four consecutive weights zero, `torch.sparse.to_sparse_semi_structured`) stores the
# kept half plus a small index, and runs on the sparse tensor cores (cuSPARSELt or CUTLASS). The H200
# recording compares both on a bf16 layer: pruned `Linear(4096, 4096)` (forward time, bytes) and an
# 8192 x 8192 2:4 weight against the dense matmul of the *same* weight.

# %% tags=["nbval-check-output"]
def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


if RECORDED:
    pr = rec["prune"].get("prune", {})
    if "error" in pr:
        print("prune part failed on the H200:", pr["error"])
    else:
        print(f"H200 {pr['layer']}, batch {pr['batch']}: bytes dense {pr['before']['total_bytes'] / MIB:.1f} MiB, "
              f"pruned {pr['after_prune']['total_bytes'] / MIB:.1f} MiB, after remove "
              f"{pr['after_remove']['total_bytes'] / MIB:.1f} MiB")
        print("forward median ms:", {k: round(v, 3) for k, v in pr["forward_median_ms"].items()})
    semi = rec["prune"].get("semi_structured", {})
    rows = []
    for backend in ("default", "cutlass"):
        b = semi.get(backend, {})
        if "error" in b:
            rows.append({"backend": backend, "error": b["error"]})
            continue
        for key, v in b.items():
            if key.startswith("batch_"):
                rows.append({"backend": f"{backend} ({b.get('class')})", "batch": int(key[6:]),
                             "sparse bytes / dense": b["bytes"] / semi["weight"]["dense_bytes"],
                             **({"error": v["error"]} if "error" in v else
                                {"dense ms": v["dense_median_ms"], "2:4 ms": v["sparse_median_ms"],
                                 "speedup": v["speedup"],
                                 "max err / max |y|": v["max_abs_err_vs_dense"] / v["max_abs_dense"]})})
    semi_table = pd.DataFrame(rows)
    display(semi_table.round(3))

# %% [markdown]
# ## 2 · `empty_cache()` gives back whole free segments, nothing else
#
# PyTorch's caching allocator keeps freed blocks in the segments it got from `cudaMalloc`, to hand them
# out again without asking CUDA. `torch.cuda.empty_cache()` returns to CUDA every segment that is
# **entirely** free. A segment with one live tensor in it keeps all its holes: fragmentation inside
# live segments is untouched, and the next step needs the same memory as before, so its peak does
# not drop. What it costs: the next step has to `cudaMalloc` again.
#
# The workbench's allocator model (`workbench.analysis.allocator_model`, the rules of
# `CUDACachingAllocator.cpp`) replays that on a CPU. The pattern: one 512 MiB block cached and carved
# into 64 pieces of 8 MiB, every other piece freed (32 holes inside a live segment), then four 64 MiB
# tensors that fit in no hole (four new segments) freed. The two numbers of docs/memory.md:
# **cached-unused share** = (reserved − allocated) / reserved and **external fragmentation** =
# 1 − largest free block / free in reserved.

# %% tags=["nbval-check-output"]
from workbench.analysis.allocator_model import CachingAllocatorModel


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
model_table = pd.DataFrame({"before empty_cache": before, "after": after})
print(model_table.round(3).to_string())
print(f"released: {released / MIB:.0f} MiB")

# %% [markdown]
# Reserved drops by the four whole segments; the 32 holes stay; the largest free block is now one
# 8 MiB hole, so external fragmentation goes **up**. The H200 ran the same pattern on the real
# allocator (numbers from `torch.cuda.memory_snapshot()`), then one bf16 training step 20 times
# with and without `empty_cache()` between steps:

# %% tags=["nbval-check-output"]
EC = rec.get("empty_cache", {}) if RECORDED else {}
if RECORDED and "error" in EC:
    print("empty_cache part failed on the H200:", EC["error"])
elif RECORDED:
    cols = ["reserved_bytes", "allocated_bytes", "largest_free_block_bytes", "segments",
            "cached_unused_share", "external_fragmentation"]
    real = pd.DataFrame({"H200 before": {c: EC["before"][c] for c in cols},
                         "H200 after": {c: EC["after"][c] for c in cols}})
    for c in ("reserved_bytes", "allocated_bytes", "largest_free_block_bytes"):
        real.loc[c] = real.loc[c] / MIB
    real.index = ["reserved MiB", "allocated MiB", "largest free MiB", "segments", "cached-unused share",
                  "external fragmentation"]
    print(real.join(model_table.set_axis(["model before", "model after"], axis=1)).round(3).to_string())
    steps = pd.DataFrame(EC["steps"]["modes"]).T
    steps = steps[["step_median_ms", "empty_cache_median_ms", "max_memory_allocated_bytes",
                   "max_memory_reserved_bytes", "device_allocs"]]
    print(EC["steps"]["model"])
    display(steps)

# %% [markdown]
# With the snapshot the recorder kept of that pattern, the workbench's `MemoryPanel` shows the
# segments (Segments tab) before and after the release: the 512 MiB segment with its 32 holes
# survives.

# %% tags=["nbval-ignore-output"]
SNAP = RESULTS / "h200_lesson36_empty_cache.snapshot.pickle.gz"
if SNAP.exists():
    from workbench.io.snapshot import load_snapshot
    from workbench.analysis.memory_oom import analyze_snapshot
    from workbench.panels import MemoryPanel

    display(MemoryPanel(analyze_snapshot(load_snapshot(str(SNAP)))))

# %% [markdown]
# ## 3 · `cudnn.benchmark`: a price paid once per new shape
#
# With `benchmark = True`, the first convolution of every new input shape tries several cuDNN
# algorithms and keeps the fastest for that shape, in a per-process cache. Fixed shapes pay once and
# may run faster afterwards; shapes that keep changing pay again and again. The recording runs a
# small fp32 CNN training step (4 conv layers, batch 32) in a fresh process per setting: a fixed
# 128 x 128 input, then 10 resolutions cycled 3 times.

# %% tags=["nbval-check-output"]
CU = rec.get("cudnn", {}) if RECORDED else {}
cud = {}
for flag in (False, True):
    r = CU.get(f"benchmark_{flag}", {})
    if "error" in r or not r:
        print(f"benchmark={flag}:", r.get("error", "not recorded"))
        continue
    cud[flag] = {"first call ms": r["fixed"]["first_calls_wall_ms"][0],
                 "steady ms (fixed shape)": r["fixed"]["steady_median_ms"],
                 "first visit of a new shape ms (median)": r["variable"]["first_visit_median_ms"],
                 "revisit ms (median)": r["variable"]["revisit_median_ms"],
                 f"total ms, {r['variable']['steps']} variable-shape steps": r["variable"]["total_wall_ms"]}
if cud:
    cudnn_table = pd.DataFrame(cud).rename(columns={False: "benchmark=False", True: "benchmark=True"})
    print(f"dtype {CU['benchmark_True']['dtype']}, cudnn.allow_tf32={CU['benchmark_True']['cudnn_allow_tf32']}")
    print(cudnn_table.round(2).to_string())

# %% [markdown]
# ## 4 · Quantization on the GPU: torchao
#
# Lesson 32 showed how to quantize (`torchao.quantization.quantize_`, and why `torch.ao.quantization`
# is CPU-only); its GPU cell reruns the harness live. Here are the recorded H200 numbers for a bf16
# MLP (4096 → 14336 → 4096), **eager, without `torch.compile`** (the recorder's choice, to fit its
# budget): weight bytes, latency at batch 16 and 4096, error against bf16.

# %% tags=["nbval-check-output"]
TA = rec.get("torchao", {}) if RECORDED else {}
if RECORDED and "error" in TA:
    print("torchao part failed on the H200:", TA["error"])
elif RECORDED:
    rows = {}
    for name in ("bf16", "int8_weight_only", "int8_dynamic", "float8_weight_only", "float8_dynamic"):
        r = TA.get(name, {})
        if "error" in r:
            rows[name] = {"error": r["error"][:60]}
            continue
        rows[name] = {"weight MiB": r["weight_bytes"] / MIB, "ms @16": r.get("batch_16_median_ms"),
                      "ms @4096": r.get("batch_4096_median_ms"), "rel L2 err @4096": r.get("batch_4096_rel_l2_err")}
    quant_table = pd.DataFrame(rows).T
    display(quant_table)

# %% [markdown]
# ## 5 · Exercise: which flag helps here?
#
# For each situation, write the flag you would try (`"cudnn.benchmark"`, `"empty_cache"`, `"prune"`,
# `"2:4"`, `"int8_weight_only"`) or `"none"`, then run the check. Sections 1-3 hold the evidence for each
# answer.

# %%
answers = {
    "a CNN trained on fixed 224x224 crops for hours": "?",
    "an OOM inside a step whose reserved memory is mostly holes in live segments": "?",
    "a model file that must get smaller on disk after pruning": "?",
    "leaving GPU memory to another process after training ends": "?",
}

# %%
solution = {
    "a CNN trained on fixed 224x224 crops for hours": "cudnn.benchmark",
    "an OOM inside a step whose reserved memory is mostly holes in live segments": "none",  # expandable_segments, not a flag here
    "a model file that must get smaller on disk after pruning": "none",  # prune grows it; a sparse format is needed
    "leaving GPU memory to another process after training ends": "empty_cache",
}
wrong = {k: (v, solution[k]) for k, v in answers.items() if v != solution[k]}
print("all right" if not wrong else "\n".join(f"{k}: you said {a!r}, the data says {s!r}" for k, (a, s) in wrong.items()))

# %% [markdown]
# ## Takeaways (asserted on the data)
#
# - `prune.l1_unstructured` zeroes half of the weight and **grows** the layer (weight_orig + weight_mask);
#   `prune.remove` only brings it back to the dense size.
# - `empty_cache()` releases whole free segments only; holes in live segments stay, and the largest
#   free block does not grow.

# %%
dense_b, pruned_b, removed_b = prune_table["bytes"]
assert zero_share == 0.5 and pruned_b > 1.9 * dense_b and removed_b == dense_b
assert after["reserved MiB"] < before["reserved MiB"] and after["allocated MiB"] == before["allocated MiB"]
assert after["largest free MiB"] < before["largest free MiB"]
assert after["external fragmentation"] > before["external fragmentation"]
if RECORDED and "error" not in EC:
    b, a = EC["before"], EC["after"]
    assert a["reserved_bytes"] < b["reserved_bytes"] and a["allocated_bytes"] == b["allocated_bytes"]
    assert a["largest_free_block_bytes"] <= b["largest_free_block_bytes"]
    assert a["free_in_reserved_bytes"] > 0  # the holes in the live segment stayed
print("takeaways hold on this data")

# %% [markdown]
# ## Rerun it live (GPU only)
#
# On a CUDA machine this runs the recorder into a temporary folder (about two minutes) and prints where
# the JSON went; load it in place of `RESULTS / "h200_lesson36.json"` above to compare.

# %% tags=["nbval-skip"]
if GPU:
    import subprocess, sys, tempfile
    from pathlib import Path

    out = Path(tempfile.mkdtemp())
    root = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
    subprocess.run([sys.executable, str(root / "benchmarks" / "record_lesson36_h200.py"), "--out", str(out)], check=True)
    print("live recording:", out / "h200_lesson36.json")

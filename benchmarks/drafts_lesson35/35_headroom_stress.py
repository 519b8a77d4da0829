# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 35 · Headroom and the 90% stress
#
# Notebook 34 found *the largest batch that fits*: a few training steps at one shape, the longest
# sequence, until a try runs out of memory. A real run is not those few steps. Its sequence lengths
# change from step to step, an evaluation pass with its own shapes runs every so often, and the CUDA
# caching allocator keeps the blocks it has carved for earlier shapes. The segments it holds are cut
# for the shapes it has seen; a later, different request may not fit in any of their holes.
#
# So how close to that largest batch can a long run go? This lesson runs it on an H200: the largest
# batch at the longest sequence (measured, and estimated), then long runs at **90%, 95% and 99%** of
# it with variable sequence lengths and an eval pass, each with `expandable_segments` off and on. It
# counts the out-of-memory errors and reads the allocator's **cached-unused share**
# ((reserved − allocated) / reserved, docs/memory.md) and its segments.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import gc, json, os, sys
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# %% [markdown]
# ## The recording
#
# `benchmarks/record_lesson35_h200.py` ran every configuration in a process of its own, so that
# `PYTORCH_CUDA_ALLOC_CONF` (`expandable_segments:False` or `True`) is set before CUDA starts, under a
# per-process cap (`torch.cuda.set_per_process_memory_fraction`) that makes the runs short and
# independent of the rest of the 141 GB. The model is the workbench's transformer
# (`workbench.capture.models.LM`), trained with AdamW (TF32 matmuls); the per-step sequence lengths
# come from one fixed seed, so every run sees the same shapes in the same order.

# %% tags=["nbval-check-output"]
rec = json.loads((RESULTS / "h200_lesson35.json").read_text())
cfg = rec["config"]
CAP = int(cfg["cap_gib"] * GIB)
env = rec["env"]
print(f"{env['device']}, torch {env['torch']}, CUDA {env['cuda']}, recorded {env['date'][:10]}")
print(f"model LM{cfg['model']}, cap {CAP / GIB:.0f} GiB per process, {cfg['steps']} steps planned per run")
seqs = pd.Series(cfg["seq_lengths"])
print(f"sequence lengths {seqs.min()}..{seqs.max()} in steps of {cfg['seq_step']}: "
      f"{(seqs == cfg['seq_max']).sum()} of {len(seqs)} steps at the longest; eval every {cfg['eval_every']} steps "
      f"({cfg['eval']})")

# %% [markdown]
# ## 1 · The largest batch that fits, two ways
#
# **Measured** on the H200 by the harness's own search (`find_max_batch_size`: double the batch until a
# try runs out of memory, then bisect; each try two full training steps at the longest sequence). The
# search ran once per allocator setting:

# %% tags=["nbval-check-output"]
search = pd.DataFrame({m: {"largest batch": s["batch_size"], "peak allocated GiB": s["peak_allocated_bytes"] / GIB,
                           "peak reserved GiB": s["peak_reserved_bytes"] / GIB, "tries": len(s["tries"])}
                       for m, s in rec["search"].items()}).T.rename_axis("expandable segments")
MAX_BATCH = rec["max_batch"]
print(search.to_string(float_format=lambda v: f"{v:.2f}"))
print(f"\nthe runs below use percentages of the expandable-off answer: {MAX_BATCH}")

# %% [markdown]
# **Estimated** without a GPU: `largest_batch_that_fits` runs the same training step on fake tensors
# with the caching allocator's rounding and cuBLAS's workspaces, and searches the batch whose
# estimated *reserved* peak stays under the cap. It runs here, live on this CPU (searching 64..128 to
# keep it short, about ten seconds); the recorder ran the same search on the H200 machine's CPU over
# 16..2048.

# %%
import torch.nn.functional as F
from workbench.capture.harness import Workload, tf32
from workbench.capture.estimate import largest_batch_that_fits
from workbench.capture.models import LM

gc.freeze()  # each estimate runs gc.collect(); keep this notebook's long-lived objects out of those scans
VOCAB, SEQ_MAX = cfg["model"]["vocab"], cfg["seq_max"]


def lm_batch(n, device, seq=SEQ_MAX):
    t = torch.randint(0, VOCAB, (n, seq + 1), device=device)
    return t[:, :-1], t[:, 1:]


def lm_loss(model, b):
    x, y = b
    return F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))


work = Workload(model=lambda: LM(**cfg["model"]), batch=lm_batch, loss=lm_loss, batch_size=16,
                tokens_per_sample=SEQ_MAX)
est = largest_batch_that_fits(work, tf32(), CAP, low=64, high=128)
print(est)

# %% tags=["nbval-check-output"]
h200_est = rec["estimator"]
print(f"estimated here: {est.batch_size} (reserved {est.peak_reserved_bytes / GIB:.2f} GiB of {CAP / GIB:.0f}); "
      f"estimated on the H200 machine: {h200_est['batch_size']}; measured on the H200: {MAX_BATCH} "
      f"({est.batch_size / MAX_BATCH - 1:+.0%})")
by = est.estimate.by_category
print("the estimate's peak by category (MiB):", {k: round(v / MIB) for k, v in by.items() if v})

# %% [markdown]
# ## 2 · The long runs
#
# Each run trains at a percentage of that batch (rounded down). An out-of-memory error is caught and
# the batch skipped, as a training loop that must survive would do (gradients dropped, references
# released, no `empty_cache()`: the allocator has already released its unused cached segments and
# retried before raising). Peaks are reset every step, so each step has its own peak allocated and
# reserved, and its cached-unused share at the peak.

# %%
from workbench.analysis.allocator_segments import CACHED_UNUSED_ALARM


def share(allocated, reserved):
    """The cached-unused share (docs/memory.md): (reserved - allocated) / reserved."""
    return (reserved - allocated) / reserved if reserved else 0.0


rows = []
for name, r in rec["runs"].items():
    rows.append({"headroom %": r["headroom_pct"], "expandable": r["expandable_segments"], "batch": r["batch"],
                 "steps": r["steps_done"], "OOMs": r["ooms"], "eval OOMs": r["eval_ooms"],
                 "alloc retries": r["stats"]["num_alloc_retries"],
                 "peak alloc GiB": r["max_memory_allocated"] / GIB, "peak reserved GiB": r["max_memory_reserved"] / GIB,
                 "cached-unused at peak (max)": r["cached_unused_share_at_step_peak_max"],
                 "segments (end)": r["stats"]["segment.all.current"], "seconds": r["seconds"]})
runs = pd.DataFrame(rows).set_index(["headroom %", "expandable"]).sort_index()
runs

# %% [markdown]
# TODO: the reading of the table, from the data.

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go

fig = go.Figure()
for name, r in rec["runs"].items():
    st = pd.DataFrame(r["steps"])
    fig.add_scatter(x=st["step"], y=st["peak_reserved"] / GIB, mode="lines",
                    name=f"{r['headroom_pct']}% {'expandable' if r['expandable_segments'] else 'default'}")
    oom = st[st["oom"]]
    fig.add_scatter(x=oom["step"], y=oom["peak_reserved"] / GIB, mode="markers", marker_symbol="x",
                    marker_size=9, showlegend=False)
fig.add_hline(y=CAP / GIB, line_dash="dot", annotation_text="cap")
fig.update_layout(title="peak reserved per step (x: out of memory)", xaxis_title="step", yaxis_title="GiB",
                  height=380)
fig

# %% [markdown]
# ## 3 · The allocator at the end of the 99% run (expandable segments off)
#
# The recorder took an allocator snapshot at the end of the 99% run with the default allocator, with
# the history of its last steps. `analyze_snapshot` and `allocator_state` read the segments and holes at
# the history's allocated peak: both fragmentation numbers of docs/memory.md.

# %% tags=["nbval-check-output"]
from workbench.io.snapshot import load_snapshot
from workbench.analysis.memory_oom import analyze_snapshot
from workbench.analysis.memory import allocator_state

snap_name = rec["runs"]["run_99_off"].get("snapshot", {}).get("file")
snap = analyze_snapshot(load_snapshot(os.path.relpath(RESULTS / snap_name)))
at_peak = allocator_state(snap.snap, snap.allocs, snap.peak["index"])
print(f"at the peak: {at_peak.allocated_bytes / GIB:.2f} GiB allocated of {at_peak.reserved_bytes / GIB:.2f} GiB "
      f"reserved in {at_peak.segments} segments; cached-unused share {at_peak.cached_unused_share:.0%}, "
      f"external fragmentation {at_peak.external_fragmentation:.2f} ({at_peak.free_blocks} holes, "
      f"largest {at_peak.largest_free_block_bytes / MIB:.0f} MiB)")

# %% tags=["nbval-ignore-output"]
from workbench.panels import MemoryPanel
MemoryPanel(snap)

# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 35 · Headroom under stress
#
# Notebook 34 found *the largest batch that fits*: a few training steps at one shape, the longest
# sequence, until a try runs out of memory. A real run is not those few steps. Its sequence lengths
# change from step to step, an evaluation pass with its own shapes runs every so often, and the CUDA
# caching allocator keeps the blocks it has carved for earlier shapes. The segments it holds are cut
# for the shapes it has seen; a later, larger request may not fit in any of their holes, and the cap
# leaves no room for a new segment.
#
# So how close to that largest batch can a long run go? This lesson reads a recording made on an
# H200: the largest batch at the longest sequence (measured, and estimated without a GPU), then long
# runs at **90%, 95% and 99%** of it with variable sequence lengths and an eval pass, each with
# `expandable_segments` off (torch's default) and on. It counts the out-of-memory errors, finds
# the steps that hit them, and checks what the estimator predicted.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import gc, json, os
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
# independent of the rest of the device. The model is the workbench's transformer
# (`workbench.capture.models.LM`), trained with AdamW (TF32 matmuls); the per-step sequence lengths
# come from one fixed seed, so every run sees the same shapes in the same order. This notebook only
# reads the recording (and runs the estimator on the CPU): it needs no GPU.

# %% tags=["nbval-check-output"]
rec = json.loads((RESULTS / "h200_lesson35.json").read_text())
cfg = rec["config"]
CAP = int(cfg["cap_gib"] * GIB)
env = rec["env"]
print(f"{env['device']}, driver {env['driver']}, torch {env['torch']}, recorded {env['date'][:10]}")
print(f"model LM{cfg['model']}, {cfg['optimizer']}, {cfg['precision']}; cap {CAP / GIB:.0f} GiB per process; "
      f"{cfg['steps']} steps per run")
seqs = pd.Series(cfg["seq_lengths"])
LONGEST = cfg["seq_max"]
print(f"sequence lengths {seqs.min()}..{seqs.max()} in steps of {cfg['seq_step']}: "
      f"{(seqs == LONGEST).sum()} of {len(seqs)} steps at the longest, the first at step {seqs.idxmax()}; "
      f"eval every {cfg['eval_every']} steps ({cfg['eval']})")

# %% [markdown]
# ## 1 · The largest batch that fits, two ways
#
# **Measured** on the H200 by the harness's own search (`find_max_batch_size`: double the batch until a
# try runs out of memory, then bisect; each try two full training steps at the longest sequence, in a
# fresh allocator). The search ran once per allocator setting:

# %% tags=["nbval-check-output"]
search = pd.DataFrame.from_dict({m: {"largest batch": s["batch_size"], "peak allocated GiB": s["peak_allocated_bytes"] / GIB,
                                     "peak reserved GiB": s["peak_reserved_bytes"] / GIB, "tries": len(s["tries"])}
                                 for m, s in rec["search"].items()}, orient="index").rename_axis("expandable segments")
MAX_BATCH = rec["max_batch"]
print(search.to_string(float_format=lambda v: f"{v:.2f}"))
print(f"\nthe long runs below use percentages of the expandable-off answer, {MAX_BATCH}: "
      + ", ".join(f"{p}% -> {MAX_BATCH * p // 100}" for p in cfg["headrooms_pct"]))

# %% [markdown]
# **Estimated** without a GPU: `largest_batch_that_fits` runs the same training step on fake tensors,
# with a model of the caching allocator (torch's default settings: no expandable segments) and cuBLAS's
# workspaces, and searches the largest batch whose estimated *reserved* peak stays under the cap. It
# runs here, live on this CPU (searching 64..128 to keep it short, a few seconds); the recorder ran the
# same search on the H200 machine's CPU over 16..2048, on the estimate's point value (`use="reserved_point"`).
# The default, `use="reserved"`, fits the high end of the estimate's reserved interval: a smaller batch that
# surely fits.

# %%
import torch.nn.functional as F
from workbench import Workload
from workbench.capture.configurations import tf32
from workbench import estimate, largest_batch_that_fits
from workbench.capture.models import LM

gc.freeze()  # each estimate runs gc.collect(); keep this notebook's long-lived objects out of those scans
VOCAB = cfg["model"]["vocab"]


def lm_loss(model, b):
    x, y = b
    return F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))


def workload_at(seq):
    """The recorded training step (same model, loss and optimizer) at one sequence length."""
    def lm_batch(n, device):
        t = torch.randint(0, VOCAB, (n, seq + 1), device=device)
        return t[:, :-1], t[:, 1:]
    return Workload(model=lambda: LM(**cfg["model"]), batch=lm_batch, loss=lm_loss, batch_size=16,
                    tokens_per_sample=seq)


est = largest_batch_that_fits(workload_at(LONGEST), tf32(), CAP, low=64, high=128, use="reserved_point")

# %% tags=["nbval-check-output"]
h200_est = rec["estimator"]
search_off = rec["search"]["off"]
at_max = {t["batch_size"]: t for t in h200_est["tries"]}[MAX_BATCH]  # the estimate at the measured largest batch
print(f"estimated here: {est.batch_size} (reserved {est.peak_reserved_bytes / GIB:.3f} GiB of {CAP / GIB:.0f}); "
      f"estimated on the H200 machine: {h200_est['batch_size']}; measured on the H200: {MAX_BATCH} "
      f"({est.batch_size / MAX_BATCH - 1:+.1%})")
print(f"at batch {MAX_BATCH}: peak allocated estimated {at_max['peak_allocated_bytes'] / GIB:.3f} GiB, measured "
      f"{search_off['peak_allocated_bytes'] / GIB:.3f} GiB ({at_max['peak_allocated_bytes'] / search_off['peak_allocated_bytes'] - 1:+.3%}); "
      f"peak reserved estimated {at_max['peak_reserved_bytes'] / GIB:.3f} GiB, measured "
      f"{search_off['peak_reserved_bytes'] / GIB:.3f} GiB ({at_max['peak_reserved_bytes'] / search_off['peak_reserved_bytes'] - 1:+.1%})")
by = est.estimate.by_category
print("the estimate's peak by category (MiB):", {k: round(v / MIB) for k, v in by.items() if v})

# %% [markdown]
# The estimator gets the *allocated* peak nearly exactly and puts the *reserved* peak higher than the
# one-shape search measured: its allocator model leaves more of the cap in partly used segments, so its
# answer is a few samples below the measured one. Which of the two is the right answer for a long run
# is what the rest of the lesson measures. The estimate's own figure shows where its peak comes from
# (`workbench.figures.estimate`):

# %% tags=["nbval-ignore-output"]
from workbench.figures.estimate import estimate_timeline_figure
estimate_timeline_figure(est.estimate, max_points=1_500, title=f"estimate: batch {est.batch_size} x {LONGEST}, two training steps")

# %% [markdown]
# ## 2 · The long runs
#
# Each run trains at a percentage of the measured largest batch (rounded down). An out-of-memory error
# is caught and the batch skipped, as a training loop that must survive would do (gradients dropped,
# references released, no `empty_cache()`: the allocator has already released its unused cached
# segments and retried before raising). Peaks are reset every step, so each step has its own peak
# allocated and reserved.

# %% tags=["nbval-check-output"]
rows = []
for name, r in rec["runs"].items():
    st = pd.DataFrame(r["steps"])
    rows.append({"headroom %": r["headroom_pct"], "expandable": r["expandable_segments"], "batch": r["batch"],
                 "steps": r["steps_done"], "OOMs": r["ooms"], "OOMs at longest": int(st.loc[st["seq"] == LONGEST, "oom"].sum()),
                 "eval OOMs": r["eval_ooms"], "alloc retries": r["stats"]["num_alloc_retries"],
                 "cudaMalloc": r["stats"]["num_device_alloc"], "cudaFree": r["stats"]["num_device_free"],
                 "peak alloc GiB": round(r["max_memory_allocated"] / GIB, 3),
                 "peak reserved GiB": round(r["max_memory_reserved"] / GIB, 3)})
runs = pd.DataFrame(rows).set_index(["headroom %", "expandable"]).sort_index()
print(runs.to_string())

# %% [markdown]
# Read it per setting. Every OOM fell on a step at the longest sequence, the very shape the search
# had run at this batch size and more. The printout below counts them from the per-step records:

# %% tags=["nbval-check-output"]
n_longest = int((seqs == LONGEST).sum())
for name, r in rec["runs"].items():
    st = pd.DataFrame(r["steps"])
    failed = st[st["oom"]]
    print(f"{r['headroom_pct']}%, expandable {'on ' if r['expandable_segments'] else 'off'} (batch {r['batch']}): "
          f"{len(failed)} OOMs in {r['steps_done']} steps; "
          f"{int((failed['seq'] == LONGEST).sum())} of the {n_longest} longest steps failed, "
          f"{int((failed['seq'] < LONGEST).sum())} shorter ones; "
          f"longest step that ran: {int(st.loc[~st['oom'], 'seq'].max())}")

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go

fig = go.Figure()
for name, r in rec["runs"].items():
    st = pd.DataFrame(r["steps"])
    label = f"{r['headroom_pct']}% {'expandable' if r['expandable_segments'] else 'default'}"
    fig.add_scatter(x=st["step"], y=st["peak_allocated"] / GIB, mode="lines", name=label, legendgroup=label)
    oom = st[st["oom"]]
    fig.add_scatter(x=oom["step"], y=oom["peak_allocated"] / GIB, mode="markers", marker_symbol="x",
                    marker_size=9, name=f"{label}: OOM", legendgroup=label, showlegend=len(oom) > 0)
fig.add_hline(y=CAP / GIB, line_dash="dot", annotation_text="cap")
fig.update_layout(title="peak allocated per step (x: out of memory, the step's peak when it failed)",
                  xaxis_title="step", yaxis_title="GiB", height=420)
fig

# %% [markdown]
# ## 3 · Why the default allocator fails where the search succeeded
#
# The search ran its shape in a fresh allocator. A long run reaches the longest shape after shorter
# ones: their blocks were cut from segments that stay reserved, long-lived tensors (weights, AdamW's
# state) sit in some of them, and a segment with one live block in it cannot be given back. torch's message names the failing
# request; notebook 21's rule tells capacity from fragmentation by comparing the request with the free
# memory *inside* the reserved segments. The snapshot of section 5 holds no OOM event, so the recorded
# per-step numbers give that comparison as a bound: after a failed step nothing is given back (no
# `empty_cache()`), so the reserved memory at the failure was at least what stayed reserved after it,
# and the live memory at most the step's peak (the bound counts the small pool's few 2 MiB segments too).

# %% tags=["nbval-check-output"]
import re

lo_hi = lambda v: " to ".join(dict.fromkeys(f"{x / GIB:.2f}" for x in (v.min(), v.max())))  # "a" or "a to b"
bounds = {}
for p in cfg["headrooms_pct"]:
    r = rec["runs"][f"run_{p}_off"]
    fail = pd.DataFrame(r["steps"]).query("oom").copy()
    fail["request"] = [float(re.search(r"Tried to allocate ([\d.]+) MiB", m).group(1)) * MIB for m in fail["oom_message"]]
    fail["free_in_reserved_min"] = fail["reserved"] - fail["peak_allocated"]   # lower bound, per failure
    fail["room_under_cap_max"] = CAP - fail["reserved"]                        # upper bound, per failure
    fail["fragmentation"] = (fail["free_in_reserved_min"] >= fail["request"]) & (fail["room_under_cap_max"] < fail["request"])
    bounds[p] = fail
    print(f"{p}%, default allocator, batch {r['batch']}: request {', '.join(f'{t / MIB:.0f}' for t in sorted(set(fail['request'])))} MiB; "
          f"free inside reserved segments, per failure, at least {lo_hi(fail['free_in_reserved_min'])} GiB, "
          f"room under the cap at most {fail['room_under_cap_max'].max() / MIB:.0f} MiB: "
          f"{int(fail['fragmentation'].sum())} of {len(fail)} failures fragmentation by these bounds")
r99 = rec["runs"]["run_99_off"]
st99 = pd.DataFrame(r99["steps"])
fail = st99[st99["oom"]]
REQUEST = int(bounds[99]["request"].iloc[0])
print(f"the 99% request, {REQUEST / MIB:.0f} MiB, is one float32 tensor of batch x sequence x vocabulary "
      f"({r99['batch']} x {LONGEST} x {VOCAB} x 4 bytes = {r99['batch'] * LONGEST * VOCAB * 4 / MIB:.0f} MiB): the logits' size")

# %% [markdown]
# With expandable segments the allocator maps more memory onto the end of one growing segment instead
# of cutting a new one, and freed pieces of it join up again: the same longest steps ran, with the
# reserved memory only a little above what was live.

# %% tags=["nbval-check-output"]
r99_on = rec["runs"]["run_99_on"]
st_on = pd.DataFrame(r99_on["steps"])
longest_on = st_on[st_on["seq"] == LONGEST]
need = int(longest_on["peak_allocated"].max())
print(f"99%, expandable segments: the longest steps peaked at {need / GIB:.3f} GiB allocated, "
      f"{longest_on['peak_reserved'].max() / GIB:.3f} GiB reserved, of the {CAP / GIB:.0f} GiB cap "
      f"({(CAP - need) / MIB:.0f} MiB to spare); "
      f"{r99_on['stats']['num_alloc_retries']} allocation retries, {r99_on['stats']['num_device_free']} cudaFree calls")
print(f"the default allocator's reserved memory at those failures was at most {fail['peak_reserved'].max() / GIB:.3f} GiB, "
      f"the failing steps had reached {fail['peak_allocated'].max() / GIB:.3f} GiB allocated")

# %% [markdown]
# The cached-unused share, (reserved − allocated) / reserved, read at each step's own peak, does not
# tell the settings apart: its maximum (on the short steps, when the memory reserved for long steps
# sits idle) is about the same in all six runs, and above the 25% alarm line of `docs/memory.md` in all.

# %% tags=["nbval-check-output"]
from workbench.analysis.memory.segments import CACHED_UNUSED_ALARM

shares, share_seq = {}, {}
for name, r in rec["runs"].items():
    ok = pd.DataFrame(r["steps"]).query("not oom")
    share = (ok["peak_reserved"] - ok["peak_allocated"]) / ok["peak_reserved"]
    shares[name], share_seq[name] = r["cached_unused_share_at_step_peak_max"], int(ok.loc[share.idxmax(), "seq"])
    print(f"{name}: {shares[name]:.0%}, at a step of sequence {share_seq[name]}")
print(f"alarm line {CACHED_UNUSED_ALARM:.0%}")

# %% [markdown]
# ## 4 · The eval passes
#
# Every run stopped for an eval pass (no gradients, twice the batch at half the longest sequence) at
# the same steps. Without activations kept for a backward pass its peak is a fraction of a training
# step's:

# %% tags=["nbval-check-output"]
for name, r in rec["runs"].items():
    ev = pd.DataFrame(r["evals"])
    print(f"{name}: {len(ev)} evals of batch {r['eval_batch']} x {cfg['seq_max'] // 2}, {int(ev['oom'].sum())} OOMs, "
          f"peak allocated {ev['peak_allocated'].max() / GIB:.2f} GiB (training: {r['max_memory_allocated'] / GIB:.2f} GiB)")

# %% [markdown]
# ## 5 · The allocator at the end of the 99% run (expandable segments off)
#
# The recorder took an allocator snapshot at the end of the 99% run with the default allocator, with
# the history of its last three steps (which all ran: the last failure was before them). `analyze_snapshot` and
# `allocator_state` read the segments and holes at the history's allocated peak; the `MemoryPanel`
# shows the timeline and, on its segment tab, the map of the segments and their holes.

# %% tags=["nbval-check-output"]
from workbench import load_snapshot
from workbench.analysis.memory.oom import analyze_snapshot, oom_postmortem
from workbench.analysis.memory.segments import allocator_state

snap_name = r99["snapshot"]["file"]
snap = analyze_snapshot(load_snapshot(os.path.relpath(RESULTS / snap_name)))  # relative: no machine path shown
at_peak = allocator_state(snap.snap, snap.allocs, snap.peak["index"])
last = st99.tail(3)                                     # the recorder kept the history of the last three steps
peak_step = last.loc[(last["peak_allocated"] - at_peak.allocated_bytes).abs().idxmin()]
assert abs(peak_step["peak_allocated"] / at_peak.allocated_bytes - 1) < 1e-3
print(f"allocator settings in the snapshot: expandable_segments {snap.snap.allocator_settings.get('expandable_segments')}; "
      f"OOM events in its history: {'none' if oom_postmortem(snap.snap, snap) is None else 'some'}")
print(f"the history's peak is step {peak_step['step']} (sequence {peak_step['seq']}): "
      f"{at_peak.allocated_bytes / GIB:.2f} GiB allocated of {at_peak.reserved_bytes / GIB:.2f} GiB reserved "
      f"in {at_peak.segments} segments")
print(f"free inside them: {at_peak.free_in_reserved_bytes / MIB:.0f} MiB in {at_peak.free_blocks} holes, the largest "
      f"{at_peak.largest_free_block_bytes / MIB:.0f} MiB (external fragmentation {at_peak.external_fragmentation:.2f}); "
      f"under the cap: {(CAP - at_peak.reserved_bytes) / MIB:.0f} MiB more")

# %% [markdown]
# Even on a step that ran, hundreds of MiB sat in holes, each far smaller than the one request that
# failed on the longest steps, and the cap had less than that request left for a new segment.

# %% tags=["nbval-ignore-output"]
from workbench import MemoryPanel
MemoryPanel(snap)

# %% [markdown]
# ## Exercise: cap the sequence length instead
#
# With the default allocator, the 99% batch failed only on the longest sequences. Another way
# to keep the big batch is a shorter longest sequence. What is the longest sequence length (a multiple
# of 64, like the recorded ones) at which the estimator says that batch fits under the cap in *reserved*
# memory? Put your answer in `MY_SEQ` and run the two cells: the check asks the estimator (a second or
# two per length) and then the recording, how the steps at and below that length fared.

# %%
MY_SEQ = 768   # your answer: the longest sequence length at which the 99% batch fits

# %% tags=["nbval-check-output"]
import functools

BATCH_99 = r99["batch"]


@functools.lru_cache(maxsize=None)
def fits(seq):
    return estimate(workload_at(seq), tf32(), batch_size=BATCH_99).peak_reserved_bytes <= CAP


SOLUTION = next(s for s in range(LONGEST, 0, -cfg["seq_step"]) if fits(s))  # from the longest down
print(f"your answer {MY_SEQ}: " + ("right" if MY_SEQ == SOLUTION else
                                  f"{'too short' if MY_SEQ < SOLUTION else 'too long'}; the estimator says {SOLUTION}"))
upto = st99[st99["seq"] <= SOLUTION]
print(f"recorded, 99% with the default allocator: {len(upto)} steps at sequence <= {SOLUTION}, {int(upto['oom'].sum())} OOMs; "
      f"{int((st99['seq'] > SOLUTION).sum())} longer, {int(st99.loc[st99['seq'] > SOLUTION, 'oom'].sum())} OOMs")
assert fits(SOLUTION) and (SOLUTION == LONGEST or not fits(SOLUTION + cfg["seq_step"]))

# %% [markdown]
# ## Takeaways
#
# - The largest batch that fits is an answer for one shape in a fresh allocator. In the long runs with
#   the default allocator, 90%, 95% and 99% of it all ran out of memory, on nearly every step at the
#   longest sequence; with `expandable_segments:True` the same three runs never did.
# - The failures were fragmentation, not capacity (notebook 21's rule, on bounds from the per-step
#   records: all of them at 90% and 95%, nearly all at 99%): the free memory inside the reserved
#   segments was larger than the failing request, and the cap had no room for a new segment.
# - The estimator's answer sits a few samples below the one-shape search, and it gets the allocated peak
#   nearly exactly; but with the default allocator and changing shapes, 90% of the measured maximum, a
#   batch below the estimator's answer, failed too. This recording is where the workbench's one headroom
#   rule comes from (`docs/memory.md`, "Headroom: which batch to run", used by lessons 21 and 34 as well):
#   for a long run with changing shapes, expandable segments on and at most 99% of the largest batch;
#   without them, no share measured here was safe. Try the longest shape after the shorter ones, not in a
#   fresh process.
# - The eval passes (no gradients) were never the problem here, and the cached-unused share at the
#   peak did not predict the failures.

# %% tags=["nbval-check-output"]
from workbench.lessons import HEADROOM_PCT, headroom_rule

rule = headroom_rule(MAX_BATCH, search_off["peak_allocated_bytes"], CAP)
print(rule["text"])
ruled = rec["runs"][f"run_{HEADROOM_PCT}_on"]           # the rule's run: its share, expandable segments on
assert HEADROOM_PCT == max(cfg["headrooms_pct"]) and ruled["batch"] == rule["batch"]
assert ruled["ooms"] == 0 and ruled["steps_done"] == ruled["steps_planned"]
assert rec["runs"][f"run_{min(cfg['headrooms_pct'])}_off"]["ooms"] > 0   # without them, even the lowest share failed

# %% tags=["nbval-check-output"]
off = {p: rec["runs"][f"run_{p}_off"] for p in cfg["headrooms_pct"]}
on = {p: rec["runs"][f"run_{p}_on"] for p in cfg["headrooms_pct"]}
assert rec["search"]["off"]["batch_size"] == MAX_BATCH <= rec["search"]["on"]["batch_size"]
for p in cfg["headrooms_pct"]:
    st = pd.DataFrame(off[p]["steps"])
    assert off[p]["ooms"] > 0 and on[p]["ooms"] == 0 and on[p]["steps_done"] == on[p]["steps_planned"]
    assert (st.loc[st["oom"], "seq"] == LONGEST).all()                       # only the longest shape failed
    assert st.loc[st["seq"] == LONGEST, "oom"].mean() > 0.8                  # nearly every time
    assert off[p]["eval_ooms"] == on[p]["eval_ooms"] == 0
assert bounds[90]["fragmentation"].all() and bounds[95]["fragmentation"].all()   # notebook 21's rule, by the bounds
assert bounds[99]["fragmentation"].mean() > 0.9 and (bounds[99]["room_under_cap_max"] < REQUEST).all()
assert REQUEST == r99["batch"] * LONGEST * VOCAB * 4
assert est.batch_size == h200_est["batch_size"] < MAX_BATCH                  # the estimator: below the measured answer
assert abs(at_max["peak_allocated_bytes"] / search_off["peak_allocated_bytes"] - 1) < 0.01
assert at_max["peak_reserved_bytes"] > search_off["peak_reserved_bytes"]
assert min(r["batch"] for r in off.values()) < est.batch_size              # and even less failed, expandable off
assert max(shares.values()) - min(shares.values()) < 0.05 and min(shares.values()) > CACHED_UNUSED_ALARM
assert max(share_seq.values()) < LONGEST // 2                              # the share peaks on short steps
assert longest_on["peak_reserved"].max() - need < 0.05 * CAP                # expandable: reserved close to live
assert at_peak.free_in_reserved_bytes > 2 * at_peak.largest_free_block_bytes and at_peak.largest_free_block_bytes < REQUEST / 2
assert CAP - at_peak.reserved_bytes < REQUEST and not last["oom"].any()    # the snapshot's steps all ran
for r in rec["runs"].values():                                             # eval: a fraction of training's peak
    assert max(e["peak_allocated"] for e in r["evals"]) < 0.5 * r["max_memory_allocated"]
assert int(upto["oom"].sum()) == 0 and int(st99.loc[st99["seq"] > SOLUTION, "oom"].sum()) == r99["ooms"]
print(f"largest batch {MAX_BATCH} (estimated {est.batch_size}); OOMs in {cfg['steps']} steps, default allocator: "
      + ", ".join(f"{p}% {off[p]['ooms']}" for p in off) + "; expandable segments: "
      + ", ".join(f"{p}% {on[p]['ooms']}" for p in on))

# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · Time it before you profile it
#
# **One idea:** the profiler changes the step it measures, and by how much depends on what bounds the
# step. So the number to compare fixes with is the step's time *without* the profiler; a trace tells you
# *where* the time goes, once its own cost is taken out. Notebook 10 (section 0) showed the habit on a
# CPU step. Here we read a recording made on an H200: what the profiler costs at light and at full
# detail, what the diagnosis says about the same step at both levels, and what happens to the step as it
# climbs a ladder of fixes: fp32 -> TF32 -> bf16 -> `torch.compile` -> one CUDA graph.
#
# The recording: `benchmarks/record_lesson11_h200.py` wrote `workbench/samples/results/h200_lesson11.json`
# and the traces shipped as the samples `lesson11_<rung>_<detail>` (all light traces and the bf16 full
# one).

# %%
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json, statistics, tempfile, time
from pathlib import Path
import pandas as pd
import torch
GPU = torch.cuda.is_available()

from workbench import load_trace, samples
from workbench.analysis import diagnose
from workbench import profile_steps
from workbench import ComparePanel, ProfilerPanel

# %% [markdown]
# ## 1 · Live, on this machine: the profiler is not free, even on a CPU
#
# A tiny transformer step (the shared model of `workbench.capture.models`, two layers, d=64) on the
# CPU. We time it with a plain clock, then let `profile_steps` record it at light and at full detail,
# then time it again unprofiled. The step is the same in all four; only the recording differs.

# %%
from workbench.capture.models import LM
import torch.nn.functional as F

torch.manual_seed(0)
tiny = LM(layers=2, d=64, heads=4, vocab=128, max_seq=32)
tiny_opt = torch.optim.AdamW(tiny.parameters(), lr=1e-3)
tok = torch.randint(0, 128, (4, 32))

def tiny_step():
    loss = F.cross_entropy(tiny(tok).view(-1, 128), torch.roll(tok, -1, 1).view(-1))
    loss.backward()
    tiny_opt.step()
    tiny_opt.zero_grad(set_to_none=True)

def median_ms(fn, n=60, warm=10):
    for _ in range(warm):
        fn()
    t = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); t.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t)

TRACES = Path(tempfile.mkdtemp())  # live traces go to a temporary folder, not into the repository
ROUNDS = 3  # unprofiled, light, full, in turn: a burst of load from elsewhere hits all three alike
rounds = {"unprofiled": [], "light": [], "full": []}
for i in range(ROUNDS):
    rounds["unprofiled"].append(median_ms(tiny_step))
    for detail in ("light", "full"):
        r = profile_steps(tiny_step, steps=20, detail=detail, device="cpu",
                          path=TRACES / f"tiny.{i}.{detail}.pt.trace.json.gz", verbose=False, progress=False)
        rounds[detail].append(r.step_ms_median)
# Each setting's quietest round: load from other processes only ever adds time, so the least of the
# round medians is the best estimate of what the setting itself costs.
live = {k: min(v) for k, v in rounds.items()}

# %% tags=["nbval-ignore-output"]
for k, v in live.items():
    print(f"{k:>11}: {v:6.3f} ms/step  ({v / live['unprofiled']:.2f}x)   rounds: "
          + ", ".join(f"{x:.3f}" for x in rounds[k]))

# %% [markdown]
# Full detail records every op's input shapes, its memory events and the Python stack that called it;
# on a step made of small ops that is a visible share of the step. The assert is loose on purpose (CPU
# timings move, more so on a shared 2-core machine): the quietest full-detail round is slower than the
# quietest unprofiled one.

# %%
assert live["full"] > live["unprofiled"], rounds

# %% [markdown]
# ## 2 · The H200 recording
#
# A 4-layer transformer (d=1024, 16 heads, vocabulary 2048), batch 4 x 512 tokens, cross-entropy and a
# fused, capturable AdamW (the same optimizer on every rung). Each rung is timed **without** the profiler
# by CUDA events (one before each step, no synchronise between steps, so host and GPU overlap as in real
# training: median, p10 and p90 of 40 steps after 10 warm-up steps), and again with a device synchronise
# after each step: that is how `profile_steps` times the steps it records, so profiled and unprofiled
# compare like with like. Then `profile_steps` records 3 steps at light detail, and for fp32 and bf16 also
# at full detail (shapes, memory, Python stacks).

# %% tags=["nbval-check-output"]
REC = json.loads((RESULTS / "h200_lesson11.json").read_text())
env = REC["env"]
L = REC["ladder"]
print(", ".join(f"{k}: {v}" for k, v in env.items()))
print("model:", REC["sizes"])
print("rungs:", REC["rungs"], " errors:", sorted(REC["errors"]), " skipped:", sorted(REC["skipped"]))
print("timing:", REC["timing"])

# %% [markdown]
# ### 2a · What the profiler costs, rung by rung
#
# For every recorded trace: the unprofiled step (pipelined, and synchronised), the profiled step (median of
# the 3 recorded steps, each synchronised), and the cost, profiled over unprofiled-synchronised. The last
# column is the bound `diagnose` found in that trace on the H200.

# %% tags=["nbval-check-output"]
rows = []
for rung in REC["rungs"]:
    r = L[rung]
    syn = r["unprofiled_synced"]["median_ms"]
    for detail in ("light", "full"):
        if detail not in r["traces"]:
            continue
        t = r["traces"][detail]
        rows.append({"rung": rung, "detail": detail, "unprofiled ms": r["unprofiled"]["median_ms"],
                     "unprofiled synced ms": syn, "profiled ms": t["profiled_step_ms_median"],
                     "cost (x)": t["profiled_step_ms_median"] / syn, "bound": t["diagnosis"]["bound"]})
cost = pd.DataFrame(rows).set_index(["rung", "detail"])
cost.round(3)

# %% [markdown]
# Read the `cost` column against the `bound` column. On the host- and launch-bound rungs the host is the
# critical path, so every microsecond the profiler adds per op lands on the step. On the fp32 rung the GPU
# is the critical path and the profiled step is within a few percent of the unprofiled one at light *and*
# at full detail, but not because it is GPU-bound as such: the profiler's extra host work still fit inside
# the GPU's time.
#
# The rule the recordings support is a comparison, not a label: **a profiled step takes about the longer of
# the GPU's time and the host's time *with the profiler's work added*.** The tf32 rung runs the very same
# ops as fp32 (TF32 is a flag on the same kernels' inputs), and it is host-bound, so its profiled step is
# the host's profiled time for this model's ops. fp32's GPU takes longer than that, so fp32 hides it. The
# tour's step (notebook 00: 6 layers, d=512, fp32) is GPU-bound too when unprofiled, yet it more than
# doubled under the profiler even at light detail: its host work under the profiler is longer than its GPU
# time (`benchmarks/record_diagnosis_h200.py`, case `overhead_fp32`):

# %% tags=["nbval-check-output"]
from workbench.lessons import h200_pair

host_profiled = L["tf32"]["traces"]["light"]["profiled_step_ms_median"]     # same ops as fp32, host-bound
fp32_gpu = L["fp32"]["unprofiled_synced"]["median_ms"]
tour = h200_pair("overhead_fp32")
tour_unprof = tour["measured"]["unprofiled"]["median_ms"]
tour_host = tour["traces"]["light"]["host_ms_per_step_profiled_median"]
print(f"this lesson's fp32 step: GPU {fp32_gpu:.2f} ms > host under the profiler {host_profiled:.2f} ms "
      f"-> profiled at light detail {cost.loc[('fp32', 'light'), 'cost (x)']:.2f}x")
print(f"the tour's fp32 step:    unprofiled {tour_unprof:.2f} ms < host under the profiler {tour_host:.2f} ms "
      f"-> {tour_host / tour_unprof:.2f}x at light detail")
assert fp32_gpu > host_profiled and cost.loc[("fp32", "light"), "cost (x)"] < 1.05
assert tour_host > 2 * tour_unprof      # GPU-bound unprofiled, and still twice as slow under the profiler

# %% [markdown]
# So "GPU-bound" does not promise a cheap profile: the margin does. A step whose GPU work is only a little
# longer than its host work, or whose ops are many and small (the tour's), pays for the profiler anyway.
# Whatever the bound, the unprofiled time is the one to compare fixes with.
#
#
# Light versus full on the bf16 rung: in this recording the full-detail steps were **not** slower than the
# light ones. Three steps each are few, and the two sets of steps overlap:

# %% tags=["nbval-check-output"]
bl, bf = (L["bf16"]["traces"][d]["profiled_step_ms"] for d in ("light", "full"))
print("bf16 light steps (ms):", bl, " full steps (ms):", bf)
print("ranges overlap:", max(min(bl), min(bf)) <= min(max(bl), max(bf)))

# %% [markdown]
# ### 2b · The diagnosis, at each detail level
#
# `diagnose` takes the profiler's own host cost out first (`profile_steps` stamps the unprofiled step time
# it measured into the trace, `workbench_unprofiled_step_ms`), then asks what each fix would save. The
# diagnoses made on the H200, for the two rungs traced at both detail levels:

# %% tags=["nbval-check-output"]
def top_fix(d):
    """The fix (other than removing the profiler) that saves the largest share of the unprofiled step."""
    w = {k: v for k, v in d["what_if"].items() if k != "profiler"}
    return max(w, key=lambda k: w[k]["saved_fraction"])

diag_rows = []
for rung in ("fp32", "bf16"):
    for detail in ("light", "full"):
        d = L[rung]["traces"][detail]["diagnosis"]
        diag_rows.append({"rung": rung, "detail": detail, "bound": d["bound"], "step ms (profiled)": d["step_ms"],
                          "step ms without profiler": d["step_ms_unprofiled"],
                          "profiler's share": d["what_if"]["profiler"]["saved_fraction"],
                          "GPU busy ms": d["gpu_busy_ms"], "top fix": top_fix(d),
                          "its share": d["what_if"][top_fix(d)]["saved_fraction"]})
pd.DataFrame(diag_rows).set_index(["rung", "detail"]).round(3)

# %% [markdown]
# The same verdict at both levels: full detail buys shapes, memory and stacks, not a different answer
# about what bounds the step. (The unprofiled time `profile_steps` stamps into each trace is measured
# anew by each capture; on the host-bound bf16 step it moved between the two captures, see the
# `step ms without profiler` column.) The shipped traces give the same diagnosis here, offline, as on the H200
# (`tests/test_lesson11_recording.py` checks every one):

# %% tags=["nbval-check-output"]
def sample_trace(rung, detail="light"):
    return samples.path(f"lesson11_{rung}_{detail}")

OFFLINE = {(r, "light"): diagnose(load_trace(sample_trace(r))) for r in REC["rungs"]}
OFFLINE["bf16", "full"] = diagnose(load_trace(sample_trace("bf16", "full")))
for (r, d), x in OFFLINE.items():
    there = L[r]["traces"][d]["diagnosis"]
    assert x.bound == there["bound"] and abs(x.step_ms_unprofiled - there["step_ms_unprofiled"]) < 1e-3, (r, d)
    print(f"{r:>8} {d:<5}  here: {x.bound:<6}  on the H200: {there['bound']:<6}  "
          f"step {x.step_ms_model:.3f} vs {there['step_ms']:.3f}")

# %% [markdown]
# The workbench's own panel on the bf16 step at full detail: the diagnosis at the top, the op table below.

# %% tags=["nbval-ignore-output"]
ProfilerPanel(sample_trace("bf16", "full"))

# %% [markdown]
# ## 3 · The ladder, timed without the profiler
#
# Per rung: the unprofiled step (CUDA events), its speed-up over fp32 and over the rung before, and from
# the rung's light trace the bound and the GPU's busy time per step.

# %% tags=["nbval-check-output"]
RUNGS = REC["rungs"]
ladder = pd.DataFrame([{"rung": r, "median ms": L[r]["unprofiled"]["median_ms"], "p10 ms": L[r]["unprofiled"]["p10_ms"],
                        "p90 ms": L[r]["unprofiled"]["p90_ms"]} for r in RUNGS]).set_index("rung")
ladder["x vs fp32"] = ladder["median ms"].iloc[0] / ladder["median ms"]
ladder["x vs previous"] = ladder["median ms"].shift(1) / ladder["median ms"]
ladder["bound"] = [OFFLINE[r, "light"].bound for r in RUNGS]
ladder["GPU busy ms"] = [OFFLINE[r, "light"].gpu_busy_ms for r in RUNGS]
ladder["GPU busy / step"] = ladder["GPU busy ms"] / ladder["median ms"]
print("graph rung:", L["graph"]["graph_of"], f"(compiled in {L['compile']['compile_s']} s)")
ladder.round(3)

# %% [markdown]
# What each rung launches per step, from the same light traces (`step_summary` counts the kernels of each
# recorded step; `aten::_to_copy` is the op autocast's casts run as):

# %% tags=["nbval-check-output"]
from workbench.analysis import step_summary

def per_step(rung):
    t = load_trace(sample_trace(rung))
    s = step_summary(t)
    names = t.events["name"].astype(str)
    return {"rung": rung, "kernels / step": float(s["kernel_count"].median()),
            "casts / step": int((names == "aten::_to_copy").sum()) / len(s),
            "host ops / step": int((t.events["cat"].astype(str) == "cpu_op").sum()) / len(s)}

launches = pd.DataFrame([per_step(r) for r in RUNGS]).set_index("rung")
launches

# %% [markdown]
# Read the two tables top to bottom:
#
# - **TF32** shrinks the GPU's work and the step follows it: the first big gain.
# - **bf16** shrinks the GPU's work again (the `GPU busy ms` column), yet the step is *not* faster: once
#   the GPU is done early, the host's launches are the critical path (`bound` says so), and autocast adds
#   host work of its own: the casts, and more kernels per step than TF32's.
# - **`torch.compile`** (default mode, forward and loss; AOTAutograd compiles the backward too) runs far
#   fewer host ops per step, yet the step is not faster: its kernels are still launched one by one, and
#   `diagnose` still finds the step launch-bound. The medians of the two rungs lie inside each other's
#   p10-p90 spread.
# - **One CUDA graph** for the whole step takes the host out of it: the step falls to about the GPU's
#   busy time, and the trace is GPU-bound again.
#
# A profile of the bf16 step would have shown the cast kernels and said nothing about *this* step being
# no faster than TF32's; only the unprofiled clock says that. The diagnosis on the compile rung's trace, though,
# named the next fix before it was made:

# %% tags=["nbval-check-output"]
cd = L["compile"]["traces"]["light"]["diagnosis"]
print("compile rung: top fix", top_fix(cd), "-> estimated", round(cd["what_if"][top_fix(cd)]["step_ms_if_fixed"], 3), "ms;",
      "the CUDA graph rung measured", round(L["graph"]["unprofiled"]["median_ms"], 3), "ms")

# %% [markdown]
# `ComparePanel` lines the compiled step's trace up against the graph's: the host-side runtime calls that
# vanish when one `cudaGraphLaunch` replaces the step's launches.

# %% tags=["nbval-ignore-output"]
ComparePanel.from_traces(sample_trace("compile"), sample_trace("graph"))

# %% [markdown]
# ## 4 · Takeaways, asserted on the recording

# %% tags=["nbval-check-output"]
u = {r: L[r]["unprofiled"] for r in RUNGS}
c = cost["cost (x)"]
# recorded on an H200, every part ran
assert "H200" in env["gpu"] and not REC["smoke"] and REC["errors"] == {} and REC["skipped"] == {}
# 1. the profiler's cost lands where the host is (or becomes) the critical path: on the host/launch-bound
#    rungs it is large even at light detail; the fp32 step, whose GPU time exceeds the host's profiled time,
#    hides it at light AND full detail (the tour's GPU-bound step, whose host under the profiler is longer
#    than its GPU time, does not: section 2a)
gpu_side = [r for r in RUNGS if L[r]["traces"]["light"]["diagnosis"]["bound"] == "gpu"]
assert gpu_side == ["fp32", "graph"] and all(x < 1.05 for r in gpu_side for x in c[r]), c
host_side = [r for r in RUNGS if L[r]["traces"]["light"]["diagnosis"]["bound"] in ("host", "launch")]
assert host_side == ["tf32", "bf16", "compile"], host_side
assert all(c[r, "light"] > 1.2 for r in host_side), c
# 2. light and full detail give the same verdict on the same step
assert all(L[r]["traces"]["light"]["diagnosis"]["bound"] == L[r]["traces"]["full"]["diagnosis"]["bound"]
           for r in ("fp32", "bf16"))
# 3. the ladder as recorded: TF32 beats fp32; bf16 cuts the GPU's work but not the step; compile does not
#    beat bf16 beyond the spread; the CUDA graph is the fastest rung and runs at about the GPU's busy time
assert u["tf32"]["median_ms"] < u["fp32"]["median_ms"] / 2
assert ladder.loc["bf16", "GPU busy ms"] < ladder.loc["tf32", "GPU busy ms"] and u["bf16"]["median_ms"] >= u["tf32"]["median_ms"]
assert u["bf16"]["p10_ms"] <= u["compile"]["median_ms"] <= u["bf16"]["p90_ms"]
assert u["compile"]["p10_ms"] <= u["bf16"]["median_ms"] <= u["compile"]["p90_ms"]
assert launches.loc["compile", "host ops / step"] < launches.loc["bf16", "host ops / step"] / 2
assert ladder["median ms"].idxmin() == "graph" and ladder.loc["graph", "GPU busy / step"] > 0.9
assert ladder.loc["graph", "bound"] == "gpu"
# ... and autocast's casts are host work TF32 did not have: more kernels per step
assert launches.loc["tf32", "casts / step"] == 0 < launches.loc["bf16", "casts / step"]
assert launches.loc["bf16", "kernels / step"] > launches.loc["tf32", "kernels / step"]
# 4. the diagnosis on the compile trace named launches, and the launch fix (one graph) beat its estimate
assert top_fix(cd) == "launch" and u["graph"]["median_ms"] <= cd["what_if"]["launch"]["step_ms_if_fixed"]
print(f"profiler cost: fp32 (gpu-bound) {c['fp32', 'light']:.2f}x light, {c['fp32', 'full']:.2f}x full; "
      + ", ".join(f"{r} ({L[r]['traces']['light']['diagnosis']['bound']}-bound) {c[r, 'light']:.2f}x light" for r in host_side))
print(f"ladder: fp32 {u['fp32']['median_ms']:.2f} -> tf32 {u['tf32']['median_ms']:.2f} -> bf16 {u['bf16']['median_ms']:.2f}"
      f" -> compile {u['compile']['median_ms']:.2f} -> graph {u['graph']['median_ms']:.2f} ms/step"
      f" ({ladder.loc['graph', 'x vs fp32']:.2f}x fp32)")

# %% [markdown]
# ## 5 · Exercise: which rung pays the most for being profiled?
#
# Without scrolling up to the `cost` table: which rung's light trace was slowed down most by the profiler,
# and which bound did `diagnose` give it? Change the two lines and run the cell; the check after it says
# whether you are right.

# %% tags=["nbval-check-output"]
MY_RUNG = "fp32"            # one of: fp32, tf32, bf16, compile, graph
MY_BOUND = "gpu"            # one of: gpu, host, launch, sync, input

# %% tags=["nbval-check-output"]
light_cost = c.xs("light", level="detail")
answer_rung = light_cost.idxmax()
answer_bound = L[answer_rung]["traces"]["light"]["diagnosis"]["bound"]
print("you said", (MY_RUNG, MY_BOUND), "->", "right" if (MY_RUNG, MY_BOUND) == (answer_rung, answer_bound) else "look again")

# %% [markdown]
# **Solution check.** The rung that pays most is one whose host is its critical path, and it is not the
# GPU-bound fp32 rung nor the CUDA-graph rung (the rungs where the host has little on the critical path):

# %%
assert answer_bound in ("host", "launch") and answer_rung not in ("fp32", "graph")
assert light_cost[answer_rung] == max(light_cost) > light_cost["fp32"]
print(f"answer: {answer_rung} ({answer_bound}-bound), {light_cost[answer_rung]:.2f}x when profiled at light detail")

# %% [markdown]
# ## 6 · On a GPU: the ladder again, live
#
# This cell runs only where a CUDA device is present (CI has none): it runs the recorder itself (about a
# minute, most of it the compile) into a temporary folder and prints your ladder beside the H200's. Your
# numbers will differ with the GPU, the host and the versions; load the printed JSON in place of
# `RESULTS / "h200_lesson11.json"` to read the whole notebook on your own recording.

# %% tags=["nbval-skip"]
from workbench.lessons import checkout_recorder

recorder = checkout_recorder("record_lesson11_h200.py", "your own ladder") if GPU else None
if GPU and recorder is not None:
    import subprocess, sys
    out = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, str(recorder), "--out", str(out)], check=True)
    mine = json.loads((out / "h200_lesson11.json").read_text())
    yours = pd.DataFrame({"yours ms": {r: v["unprofiled"]["median_ms"] for r, v in mine["ladder"].items() if "unprofiled" in v},
                          "H200 ms": ladder["median ms"]}).round(3)
    print(yours)
    # what holds on any CUDA GPU: every rung ran, and the CUDA-graph rung beats plain fp32
    assert not mine["errors"] and set(RUNGS) <= set(yours.dropna().index), (mine["errors"], yours)
    assert yours.loc["graph", "yours ms"] < yours.loc["fp32", "yours ms"]
    print("live recording:", out / "h200_lesson11.json")
    display(ProfilerPanel(out / "lesson11_bf16.light.trace.json.gz"))

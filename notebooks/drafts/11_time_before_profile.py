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
# **One idea:** the profiler changes the step it measures. The step's time *without* the profiler is the
# number to compare fixes with; a trace tells you *where* the time goes, and only once its own cost is
# taken out. Notebook 10 (section 0) showed the habit on a CPU step; here we measure what the profiler
# costs on an H200 at each detail level, how the diagnosis reads the same step at light and at full
# detail, and what happens to the step as it gets faster rung by rung: fp32 -> TF32 -> bf16 ->
# `torch.compile` -> one CUDA graph.
#
# Everything below the live CPU part reads a recording made on an H200
# (`benchmarks/record_lesson11_h200.py`): `workbench/samples/results/h200_lesson11.json` and the traces
# `workbench/samples/lesson11_*.trace.json.gz`.

# %%
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json, statistics, tempfile, time
from pathlib import Path
import numpy as np
import pandas as pd
import torch
GPU = torch.cuda.is_available()

from workbench import ProfilerPanel, load_trace, samples
from workbench.analysis import diagnose
from workbench.capture import profile_steps

# %% [markdown]
# ## 1 · Live, on this machine: the profiler is not free, even on a CPU
#
# A tiny transformer step (the shared block of `workbench.capture.models`, two layers, d=64) on the
# CPU. We time it with a plain clock, then let `profile_steps` record it at light and at full detail.
# The step is the same in all three; only the recording differs.

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

TRACES = Path(tempfile.mkdtemp())  # live traces go to a temporary folder
live = {"unprofiled": median_ms(tiny_step)}
for detail in ("light", "full"):
    r = profile_steps(tiny_step, steps=20, detail=detail, device="cpu", path=TRACES / f"tiny.{detail}.pt.trace.json.gz",
                      verbose=False, progress=False)
    live[detail] = r.step_ms_median
live["unprofiled_again"] = median_ms(tiny_step)

# %% tags=["nbval-ignore-output"]
for k, v in live.items():
    print(f"{k:>16}: {v:6.3f} ms/step  ({v / live['unprofiled']:.2f}x)")

# %% [markdown]
# Full detail records every op's input shapes, its memory events and the Python stack that called it;
# on a step of small ops that is a visible share of the step. The assert is deliberately loose (CPU
# timings move): full detail is slower than the unprofiled step, measured before and after it.

# %%
assert live["full"] > max(live["unprofiled"], live["unprofiled_again"]), live

# %% [markdown]
# ## 2 · The H200 recording
#
# A 4-layer transformer (d=1024, 16 heads, vocabulary 2048), batch 4 x 512 tokens, cross-entropy and a
# fused AdamW. Each rung of the ladder is timed **without** the profiler with CUDA events (one before
# each step, no synchronise between steps: the GPU and the host overlap as in real training; median,
# p10, p90 of 40 steps after warm-up), and again with a device synchronise after each step (that is how
# `profile_steps` times the steps it records, so profiled and unprofiled compare like with like). Then 3
# steps are recorded by `profile_steps` at light detail, and for fp32 and bf16 also at full detail.

# %% tags=["nbval-check-output"]
REC = json.loads((RESULTS / "h200_lesson11.json").read_text())
env = REC["env"]
print(f"{env['gpu']}, driver {env.get('driver')}, torch {env['torch']}, CUDA {env['cuda']}, recorded {env['date']}")
print("model:", REC["sizes"])
print("errors:", sorted(REC["errors"]), " skipped:", sorted(REC["skipped"]))

# %% [markdown]
# ### 2a · What the profiler costs
#
# For the fp32 step and the bf16 step: the unprofiled step (pipelined and synchronised), the profiled
# step at light and at full detail (median of the recorded steps, each synchronised), and the cost:
# profiled over unprofiled-synchronised.

# %% tags=["nbval-check-output"]
L = REC["ladder"]
rows = []
for rung in ("fp32", "bf16"):
    r = L[rung]
    syn = r["unprofiled_synced"]["median_ms"]
    row = {"rung": rung, "unprofiled ms": r["unprofiled"]["median_ms"], "unprofiled synced ms": syn}
    for d in ("light", "full"):
        row[f"{d} ms"] = r["traces"][d]["profiled_step_ms_median"]
        row[f"{d} cost"] = row[f"{d} ms"] / syn
    rows.append(row)
cost = pd.DataFrame(rows).set_index("rung")
cost.round(3)

# %% [markdown]
# ### 2b · The diagnosis, at each detail level
#
# `diagnose` reads each trace the same way: it takes the profiler's own host cost out first (these
# traces carry the unprofiled step time `profile_steps` measured, `workbench_unprofiled_step_ms`), then
# asks what each fix would save. The same step at two detail levels:

# %% tags=["nbval-check-output"]
def sample_trace(rung, detail):
    return samples.path(f"lesson11_{rung}_{detail}")

DIAG = {}
for rung, detail in (("fp32", "light"), ("fp32", "full"), ("bf16", "light"), ("bf16", "full")):
    DIAG[rung, detail] = diagnose(load_trace(sample_trace(rung, detail)))
pd.DataFrame([{"rung": r, "detail": d, "bound": x.bound, "step ms (as recorded)": x.step_ms,
               "step ms without profiler": x.step_ms_unprofiled,
               "profiler's share": x.what_if("profiler").saved_fraction,
               "top fix": next((w.cause for w in x.what_ifs if w.cause != "profiler"), None)}
              for (r, d), x in DIAG.items()]).round(3)

# %% [markdown]
# The workbench's own panel on one of them (the bf16 step at full detail): the diagnosis sits at the top,
# the op table below it.

# %% tags=["nbval-ignore-output"]
ProfilerPanel(sample_trace("bf16", "full"))

# %% [markdown]
# ## 3 · The ladder: each rung makes the GPU's part smaller
#
# Per rung, the unprofiled step (CUDA events), its speed-up over fp32 and over the rung before, and the
# bound `diagnose` finds in the rung's light trace.

# %% tags=["nbval-check-output"]
RUNGS = [r for r in REC["rungs"] if r in L and "unprofiled" in L[r]]
ladder = pd.DataFrame([{"rung": r, "median ms": L[r]["unprofiled"]["median_ms"], "p10 ms": L[r]["unprofiled"]["p10_ms"],
                        "p90 ms": L[r]["unprofiled"]["p90_ms"]} for r in RUNGS]).set_index("rung")
ladder["x vs fp32"] = ladder["median ms"].iloc[0] / ladder["median ms"]
ladder["x vs previous"] = ladder["median ms"].shift(1) / ladder["median ms"]
LADDER_DIAG = {r: diagnose(load_trace(sample_trace(r, "light"))) for r in RUNGS}
ladder["bound"] = [LADDER_DIAG[r].bound for r in RUNGS]
ladder["GPU busy ms"] = [LADDER_DIAG[r].gpu_busy_ms for r in RUNGS]
print("graph rung:", L.get("graph", {}).get("graph_of"))
ladder.round(3)

# %% [markdown]
# ## 4 · Takeaways, asserted on the recording

# %%
# TAKEAWAYS

# %% [markdown]
# ## 5 · Exercise: predict before you look
#
# Pick a rung and say which bound `diagnose` will report for its light trace, and whether the step
# there is faster or slower than the rung before. Change the two lines, run the cell.

# %% tags=["nbval-check-output"]
MY_RUNG = "bf16"            # one of: fp32, tf32, bf16, compile, graph
MY_BOUND = "gpu"            # one of: gpu, host, launch, sync, input, memcpy, profiler
actual = LADDER_DIAG[MY_RUNG].bound
print(f"{MY_RUNG}: you said {MY_BOUND!r}, diagnose says {actual!r}:", "right" if MY_BOUND == actual else "look again")

# %% [markdown]
# **Solution check.** The answer is in the ladder table; this cell only confirms that the table and the
# trace agree (the same `diagnose`, run again on the same file).

# %%
for r in RUNGS:
    assert diagnose(load_trace(sample_trace(r, "light"))).bound == ladder.loc[r, "bound"]

# %% [markdown]
# ## 6 · On a GPU: the ladder again, live
#
# These cells run only where a CUDA device is present (CI has none). They use the recorder's own step
# functions, with the same sizes.

# %% tags=["nbval-skip"]
if GPU:
    import sys
    sys.path.insert(0, str(Path.cwd().parent / "benchmarks"))
    import record_lesson11_h200 as rec11
    live_ladder = {}
    for rung in ("fp32", "tf32", "bf16", "compile", "graph"):
        info = {}
        step = rec11.make_step(rung, rec11.SIZES, "cuda", info)
        live_ladder[rung] = rec11.time_pipelined(step, "cuda", 40, 10)["median_ms"]
        print(f"{rung:>8}: {live_ladder[rung]:.3f} ms/step", info)

# %% tags=["nbval-skip"]
if GPU:
    res = profile_steps(step, steps=3, detail="light", verbose=False, progress=False)
    print(diagnose(res.load()).bound)
    ProfilerPanel(res)

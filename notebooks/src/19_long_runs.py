# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 19 · Long runs: a flight recorder in the training loop
#
# **One idea:** a training job that runs for a day slows down at hour 7, or dies of an out-of-memory error
# at hour 11, and by then nobody is profiling. So keep the step that went wrong: leave a recorder in the
# loop for the whole run, cheap enough to forget (a few microseconds a step), that profiles the next few
# steps when something asks for it (a signal, a file, a step much slower than the others) and writes
# down, at an OOM, what the allocator held. Then compare the bad window with a normal one taken earlier
# in the same run.
#
# The recorder is `workbench.watch` (docs/long-runs.md):
#
# ```python
# from workbench import watch
# w = watch("runs/exp1", capture_steps=3, slow_factor=3.0)
# for batch in loader:
#     with w.step():
#         train_step(batch)
# ```
#
# and `workbench watch runs/exp1` lists what it took. This lesson replays a folder it wrote on a 2-core
# CPU (`benchmarks/record_watch_cpu.py`, sample `watch_cpu_slow_data`, `workbench/samples/README.md`): 110
# steps of a small MLP fed by a `DataLoader` in the training process, whose data **slows down at step 90**
# (from there every sample waits 1.5 ms instead of 0.05 ms, as if the run had reached a shard on slow
# storage). On the way, the script wrote a `CAPTURE` file into the folder after step 40 and sent itself
# `SIGUSR2` after step 60, as an operator would. The "hours" are compressed into a second; what the
# recorder does at step 90 is what it does at hour 7.

# %%
from workbench.lessons import setup, RESULTS
setup()
import json, os, statistics, tempfile, time
from pathlib import Path
import pandas as pd
import torch
GPU = torch.cuda.is_available()

from workbench import samples, watch, TraceAnalysis, ComparePanel, MemoryPanel, format_bytes
from workbench.io.watch import load_watch_index
from workbench.analysis.watch import watch_summary, normal_capture
from workbench.analysis.trace.diff import trace_diff

RUN = samples.path("watch_cpu_slow_data")
REC = json.loads((RUN / "recording.json").read_text())     # what the recording script injected and timed
INJ = REC["injected"]

# %% tags=["nbval-check-output"]
print("recorded on:", REC["env"], "| watch options:", REC["watch_options"])
print("injected:", INJ)
assert (INJ["steps"], INJ["slow_from_step"], INJ["sample_fast_ms"], INJ["sample_slow_ms"], INJ["capture_file_after_step"],
        INJ["sigusr2_after_step"]) == (110, 90, 0.05, 1.5, 40, 60)

# %% [markdown]
# ## 1 · The run, step by step
#
# What the recorder keeps all the time is small: the last 200 step times (`w.recent_steps()`; captured
# steps are kept apart), plus on a GPU the allocator's history ring and NVML samples. The recording script
# saved the step times at the end of the run (`recording.json`): every step the profiler was not on.

# %% tags=["nbval-check-output"]
steps = pd.DataFrame(REC["unprofiled_steps"], columns=["step", "ms"])
before = steps[(steps["step"] >= 1) & (steps["step"] < INJ["slow_from_step"])]["ms"]
after = steps[steps["step"] >= INJ["slow_from_step"]]["ms"]
print(f"{len(steps)} unprofiled steps of {INJ['steps']}; median step {before.median():.2f} ms before step "
      f"{INJ['slow_from_step']}, {after.median():.2f} ms from it on ({after.median() / before.median():.1f}x); "
      f"slowest step before it {before.max():.2f} ms")

# %%
assert len(steps) == INJ["steps"] - 4 * 3            # four captures of 3 steps are not in the ring
assert after.min() > 3 * before.max()                # every slow step took over 3x the slowest step before
assert round(before.median(), 1) == 3.2 and round(after.median()) == 27 and round(after.median() / before.median(), 1) == 8.5

# %% [markdown]
# Each step took about 3.2 ms until step 90, then about 27 ms (8.5x): 16 samples a batch, each waiting
# 1.45 ms more. The recorder's slow trigger fires on a step that took more than `slow_factor` (3) times the
# rolling median of the last 200 unprofiled steps, once 20 steps have been seen.

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go

index = load_watch_index(RUN)
fig = go.Figure(go.Scatter(x=steps["step"], y=steps["ms"], mode="markers", name="unprofiled step"))
for c in index.captures:
    fig.add_vrect(x0=c.first_step - 0.5, x1=c.last_step + 0.5, fillcolor="orange", opacity=0.3, line_width=0,
                  annotation_text=c.reason, annotation_position="top left")
fig.update_layout(title="step time over the run; shaded: the steps each capture profiled",
                  xaxis_title="step", yaxis_title="ms", height=360)
fig

# %% [markdown]
# ## 2 · What the folder holds: `workbench watch DIR`
#
# The folder has one line per capture in `index.jsonl` and the captures' files (here the traces: on a CPU
# there is no allocator snapshot and no NVML). `workbench watch DIR` lists them, with why each was taken and
# the command that opens each file; `load_watch_index` and `watch_summary` are the same listing as data
# (the `--json` document, keys in docs/json.md):

# %% tags=["nbval-check-output"]
doc = watch_summary(index)
cols = ["reason", "first_step", "last_step", "trigger_step", "trigger_ms", "median_ms", "captured_median_ms",
        "note", "compare_with"]
listing = pd.DataFrame([{k: c[k] for k in cols} for c in doc["captures"]])
listing

# %%
cap = {c.reason: c for c in index.captures}
n = REC["watch_options"]["capture_steps"]
assert list(listing["reason"]) == ["baseline", "file", "signal", "slow"] and doc["problems"] == []
assert cap["baseline"].first_step == REC["watch_options"]["warmup"]                  # right after the warm-up
# a CAPTURE file or SIGUSR2 during step N: the capture holds steps N+1 .. N+n, within n + 1 steps of it
for reason, asked in (("file", INJ["capture_file_after_step"]), ("signal", INJ["sigusr2_after_step"])):
    assert cap[reason].first_step == asked + 1 and cap[reason].last_step <= asked + n + 1, reason
s = cap["slow"].extra
assert s["trigger_step"] == INJ["slow_from_step"] and cap["slow"].first_step == INJ["slow_from_step"] + 1
assert s["trigger_ms"] > REC["watch_options"]["slow_factor"] * s["median_ms"]
assert f"{s['trigger_ms']:.2f} {s['median_ms']:.2f}" == "26.70 3.19"
assert normal_capture(index, cap["slow"]) is cap["baseline"] and not (RUN / "CAPTURE").exists()  # the file was taken
assert list(listing["compare_with"][1:]) == [cap["baseline"].trace] * 3   # each compared with the baseline

# %% [markdown]
# Four captures: the **baseline** of steps 20-22 (taken once, right after the warm-up: the normal window
# the others are compared with); the **file** capture of steps 41-43 (the `CAPTURE` file appeared during
# step 40; its text is the note, and the file was removed once taken); the **signal** capture of steps
# 61-63; and the **slow** capture of steps 91-93: step 90 took 26.70 ms against a median of 3.19 ms. A
# slow step is only known to be slow when it ends, so its capture holds **the steps after it**: a
# slowdown that lasts is in the trace; the one step that tripped it is in the index line (`trigger_step`,
# `trigger_ms`, `median_ms`). Every capture of a fault names the normal capture to compare it with.
#
# The same listing as the command prints it (here with this machine's path to the shipped folder):

# %% tags=["nbval-ignore-output"]
from workbench.cli import main as workbench_cli

rc = workbench_cli(["watch", os.path.relpath(RUN)])

# %% [markdown]
# ## 3 · Open the slow window and the normal one
#
# Each trace opens where any trace opens (`workbench trace FILE`, `ProfilerPanel(FILE)`, `TraceAnalysis`).
# Its steps are the loop's own step numbers, and the recorder stamped it with a step's time *without* the
# profiler (for a slow capture, the slow step's own time; for the others, the run's median), so a diagnosis
# does not blame the slowness on the profiler.

# %% tags=["nbval-check-output"]
A = {r: TraceAnalysis(index.path(cap[r].trace)) for r in ("baseline", "signal", "slow")}
for r, a in A.items():
    st = a.steps
    print(f"{r:<8} steps {list(st['step'])}: median {a.numbers.step_median_us / 1e3:.2f} ms profiled; "
          f"stamped unprofiled {a.trace.metadata.get('workbench_unprofiled_step_ms')} ms")

# %%
assert list(A["slow"].steps["step"]) == [91, 92, 93] and list(A["baseline"].steps["step"]) == [20, 21, 22]
assert A["slow"].trace.metadata["workbench_unprofiled_step_ms"] == s["trigger_ms"]
assert A["slow"].numbers.step_median_us > 7 * A["baseline"].numbers.step_median_us

# %% [markdown]
# ## 4 · The diff says what changed
#
# `trace_diff(normal, slow)` (the numbers of `workbench diff` and of `ComparePanel`) puts the two windows
# side by side, op by op; per step here, since each trace holds 3 steps. The ops whose time changed most
# come first.

# %% tags=["nbval-check-output"]
d = trace_diff(A["baseline"], A["slow"], normalize="per_step")
print(d.headline)
ops = d.ops.head(5)[["name", "base_count", "test_count", "base_cpu_total_us", "test_cpu_total_us", "delta_cpu_us"]]
(ops.set_index("name")[["base_cpu_total_us", "test_cpu_total_us", "delta_cpu_us"]] / 1e3).round(3).rename(
    columns=lambda c: c.replace("_us", "_ms"))

# %%
top = d.ops.iloc[0]
loader_grew_ms = top["delta_cpu_us"] / 1e3
assert top["name"].startswith("enumerate(DataLoader)") and top["base_count"] == top["test_count"] == 1
assert top["delta_cpu_us"] > 0.95 * d.step_delta_us                       # the loader is the slowdown
assert (d.ops["delta_cpu_us"].iloc[1:].abs() < 0.01 * d.step_delta_us).all()  # nothing else moved by 1%
assert [round(x / 1e3, 2) for x in (top["base_cpu_total_us"], top["test_cpu_total_us"], top["delta_cpu_us"], d.step_delta_us)] == [
    2.28, 25.80, 23.52, 23.70]

# %% [markdown]
# One op moved: the `DataLoader`'s `__next__` on the training process, from 2.28 to 25.80 ms a step,
# 23.52 ms of the 23.70 ms the step grew; no other op moved by more than 1% of that. The model's forward,
# backward and AdamW step are what they were. The cause is upstream of the model: the data got slower
# (here, as injected, every sample's wait). The cure is lesson 18's (workers, so that loading overlaps
# the step), or the storage itself.
#
# The same diff between two **normal** windows says so: nothing to see.

# %% tags=["nbval-check-output"]
d_normal = trace_diff(A["baseline"], A["signal"], normalize="per_step")
print(d_normal.headline)
print(f"largest op change: {d_normal.ops.iloc[0]['name'][:40]} {d_normal.ops.iloc[0]['delta_cpu_us'] / 1e3:+.3f} ms a step")

# %%
assert abs(d_normal.step_ratio - 1) < 0.10 and d_normal.ops["delta_cpu_us"].abs().max() < 0.02 * d.step_delta_us

# %% [markdown]
# `ComparePanel(normal, slow)` shows the same diff in the notebook (the base and test traces can be
# switched in its drop-downs); `workbench diff NORMAL SLOW` in a terminal; `workbench watch` printed that
# command for the slow capture above.

# %% tags=["nbval-ignore-output"]
ComparePanel(A["baseline"].trace, A["slow"].trace)

# %% [markdown]
# ## 5 · Live, on this machine: a slow step and a CAPTURE file
#
# A tiny loop under `watch` into a temporary folder: every step waits 4 ms (standing in for the work of a
# step), step 30 waits 80 ms once, and after step 45 a `CAPTURE` file appears in the folder. `poll_s=0`
# makes the recorder look for the file at every step (by default it looks at most every 0.05 s: cheaper on a
# shared file system, and the capture may start a few steps later).

# %%
folder = Path(tempfile.mkdtemp()) / "run"
model = torch.nn.Linear(32, 32)
SLOW_AT, FILE_AT, STEPS = 30, 45, 60
w = watch(folder, capture_steps=3, slow_factor=8.0, warmup=10, baseline=False, poll_s=0, slow_cooldown=0,
          handle_signal=False)
for i in range(STEPS):
    with w.step():
        model(torch.randn(8, 32)).sum().backward()
        time.sleep(0.080 if i == SLOW_AT else 0.004)
    if i == FILE_AT:
        (folder / "CAPTURE").write_text("live: asked after step %d" % i)
w.close()
live = {c["reason"]: c for c in w.captures}

# %% tags=["nbval-ignore-output"]
pd.DataFrame(w.captures)[["reason", "first_step", "steps", "trigger_step", "trigger_ms", "median_ms", "step_ms", "note"]]

# %%
assert live["slow"]["trigger_step"] == SLOW_AT and live["slow"]["trigger_ms"] >= 80
assert live["file"]["first_step"] == FILE_AT + 1 and live["file"]["first_step"] + live["file"]["steps"] - 1 <= FILE_AT + 3 + 1
assert not (folder / "CAPTURE").exists() and w.problems == []
# the one slow step is not in its capture (the next steps are, and they were normal); its time is in the line
assert live["slow"]["first_step"] == SLOW_AT + 1 and max(live["slow"]["step_ms"]) < 40
print(f"slow step {SLOW_AT} ({live['slow']['trigger_ms']:.0f} ms) -> capture of steps "
      f"{live['slow']['first_step']}-{live['slow']['first_step'] + 2}; CAPTURE after step {FILE_AT} -> steps "
      f"{live['file']['first_step']}-{live['file']['first_step'] + 2}")

# %% [markdown]
# A single slow step is therefore not in a trace: its capture profiled the normal steps after it. What
# the index line keeps (the step, its time, the median) says it happened; on a GPU the capture's allocator
# snapshot (the history ring) and its NVML window (the 30 s before the capture) reach back over it. A
# slowdown that **lasts**, as in the recording, is in the trace.
#
# ## 6 · An OOM: the allocator's state at the failure
#
# On a GPU, an out-of-memory error inside `w.step()` makes the recorder write the allocator snapshot at
# that moment, `cap-<step>-rank<r>-oom.snapshot.pickle.gz`, with what the allocator said beside it in
# `cap-<step>-rank<r>-oom.snapshot.oom.json` (the request, the cap, the bytes free, torch's message,
# `memory_stats()`), and an index line of reason `oom`; then the original exception reaches the training
# script unchanged. A CPU has no allocator to snapshot, and **no watch folder with an OOM was recorded** for
# this lesson. What follows
# is a snapshot + sidecar pair written at a real OOM on an H200 by `capture_oom`
# (`benchmarks/record_oom_h200.py`, lesson 21's recording; separately from `watch`): the same two kinds
# of file, with the same sidecar fields, that the watch's `oom` capture holds.

# %% tags=["nbval-check-output"]
from workbench import load_snapshot
from workbench.analysis.memory.oom import oom_postmortem

oom_snap = load_snapshot(os.path.relpath(RESULTS / "h200_lesson21_midforward.snapshot.pickle.gz"))
side = oom_snap.extra["oom"]
# the fields the watch writes in its .oom.json (workbench/capture/watch.py)
WATCH_OOM_FIELDS = {"device", "requested_bytes", "limit_bytes", "device_free_bytes", "time_unix_s", "torch_version",
                    "torch_message", "memory_stats"}
report = oom_postmortem(oom_snap)
print("sidecar fields:", sorted(side))
print(f"request {format_bytes(side['requested_bytes'])} under a cap of {format_bytes(side['limit_bytes'])}; "
      f"post-mortem: {report.cause}, shortfall {format_bytes(report.shortfall_bytes)}")

# %%
assert set(side) == WATCH_OOM_FIELDS and report.cause == "capacity"
assert side["requested_bytes"] == report.requested_bytes == 152 * 2**20 and side["limit_bytes"] == 6 * 2**30

# %% [markdown]
# A 152 MiB request under a 6 GiB cap, and not enough memory for it however the free blocks were
# arranged (capacity, not fragmentation). `MemoryPanel` opens such a snapshot on its OOM tab; lesson 21
# reads this same file down to the block the model died in and the batch that fits. In a watch folder,
# `workbench watch DIR` lists the capture with torch's message as its reason and the `workbench memory`
# command that opens it.

# %% tags=["nbval-ignore-output"]
MemoryPanel(oom_snap)

# %% [markdown]
# On a GPU, the cell below makes the recorder catch one: a per-process cap just above what is in use, then
# an allocation far beyond it inside `w.step()` (it does not run on a machine without CUDA).

# %% tags=["nbval-skip"]
if GPU:
    gpu_folder = Path(tempfile.mkdtemp()) / "run"
    gm = torch.nn.Linear(1024, 1024, device="cuda")
    wg = watch(gpu_folder, capture_steps=2, warmup=5, handle_signal=False, nvml=False)
    for i in range(8):
        with wg.step():
            gm(torch.randn(64, 1024, device="cuda")).sum().backward()
    torch.cuda.synchronize()
    total = torch.cuda.mem_get_info()[1]
    torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + 256 * 2**20) / total))
    try:
        with wg.step():
            too_big = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError as e:
        print("the training script still gets:", type(e).__name__)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        wg.close()
    (oom_cap,) = [c for c in load_watch_index(gpu_folder).captures if c.reason == "oom"]
    live_oom = load_snapshot(gpu_folder / oom_cap.snapshot)
    print("oom capture at step", oom_cap.first_step, "| files:", oom_cap.files(), "| sidecar:", sorted(live_oom.extra["oom"]))
    print(oom_postmortem(live_oom).cause, format_bytes(live_oom.extra["oom"]["requested_bytes"]))

# %% [markdown]
# ## 7 · Exercise: how much slower did each sample get?
#
# The diff of section 4 gives how much the `DataLoader`'s `__next__` grew in a step (`loader_grew_ms`), and
# the recording's batch is `INJ["batch"]` samples. Work out, from those two numbers only, how many
# milliseconds more each sample took to load from step 90 on, and put it below.

# %% tags=["nbval-check-output"]
MY_EXTRA_MS_PER_SAMPLE = 0.0          # your answer

# %% tags=["nbval-check-output"]
answer = loader_grew_ms / INJ["batch"]
print("you said", MY_EXTRA_MS_PER_SAMPLE, "->", "right" if abs(MY_EXTRA_MS_PER_SAMPLE - answer) < 0.05 else "look again")

# %% [markdown]
# **Solution check.** 23.52 ms over 16 samples is 1.47 ms a sample; the recording script made each wait
# 1.5 ms instead of 0.05 ms, 1.45 ms more. The diff found the injected wait within 2%:

# %%
injected = INJ["sample_slow_ms"] - INJ["sample_fast_ms"]
assert abs(answer / injected - 1) < 0.02 and round(answer, 2) == 1.47
print(f"from the diff: {answer:.3f} ms a sample; injected: {injected:.2f} ms ({answer / injected - 1:+.1%})")

# %% [markdown]
# ## 8 · What it costs
#
# Measured by `benchmarks/bench_watch.py`, not in this notebook: first on the 2-core CPU VM, with other
# jobs running (load average 3-3.5; `benchmarks/RESULTS.md`, its second run, copied as
# `results/watch_cpu.json`); the GPU numbers (CUDA events, the allocator history, NVML) follow below.

# %% tags=["nbval-check-output"]
B = json.loads((RESULTS / "watch_cpu.json").read_text())
light, capt = B["results"]["small cpu"]["light"], B["results"]["small cpu"]["capture"]
print(f"{B['date']}, {B['cores']} cores, torch {B['torch']}")
print(f"the recorder's own work per step (an empty step): {B['bookkeeping_us']} us")
print(f"a {light['plain_ms']:.1f} ms step, watched vs not: {light['overhead_pct']:+.1f}% "
      f"(the rounds' ratios spread over {light['round_ratio_spread_pct']:.0f}%)")
print(f"a captured step under the light profiler: {capt['captured_ms']:.1f} vs {capt['plain_ms']:.1f} ms "
      f"({capt['captured_overhead_pct']:+.1f}%); the capture's last step, which writes the files: {capt['capture_end_ms']:.0f} ms")

# %%
assert B["bookkeeping_us"] == 1.54 and light["overhead_pct"] == -0.22 and round(light["round_ratio_spread_pct"]) == 68
assert capt["captured_overhead_pct"] == 5.5 and capt["capture_end_ms"] == 70.0 and round(light["plain_ms"]) == round(capt["plain_ms"]) == 44
assert 1e3 * B["bookkeeping_us"] / 1e6 / before.median() < 0.001   # under 0.1% of this recording's 3.2 ms step

# %% [markdown]
# 1.54 us a step is under 0.1% of the recording's 3.2 ms step. Whether a 44 ms step runs slower with the
# recorder on could not be seen on that machine: the watched-vs-not medians differ by -0.2%, well inside
# the 68% spread between rounds. A captured step costs more (+5.5% under the light profiler, and the last
# one writes the trace: 70 ms instead of 44), but only during the few steps of a capture.
#
# On a GPU the recorder adds two CUDA events a step, the allocator's history ring and an NVML thread. Two
# runs of the same benchmark on an NVIDIA H100 80GB HBM3 (2026-12-05; no H200 was lent that day), copied as
# `results/h100_watch_1505.json` (`--device cuda --rounds 4 --steps 4 --captures 2`: a GPU-bound fp32 step
# and a host-bound bf16 step of many small ops) and `results/h100_watch_hostbound_1514.json` (`--kinds
# "cpu-bound bf16" --rounds 16`: the host-bound step alone, 16 rounds, with each part of the recorder
# turned off in turn):

# %% tags=["nbval-check-output"]
G = json.loads((RESULTS / "h100_watch_1505.json").read_text())
H = json.loads((RESULTS / "h100_watch_hostbound_1514.json").read_text())
gpu_bound, host_bound = G["results"]["gpu-bound fp32"], H["results"]["cpu-bound bf16"]
print(G["gpu"], G["date"], "| torch", G["torch"])
print(f"GPU-bound step ({gpu_bound['light']['plain_ms']:.1f} ms): watched vs not {gpu_bound['light']['overhead_pct']:+.2f}% "
      f"(the rounds' spread {gpu_bound['light']['round_ratio_spread_pct']:.1f}%); a captured step "
      f"{gpu_bound['capture']['captured_ms']:.2f} vs {gpu_bound['capture']['plain_ms']:.2f} ms, the capture's end "
      f"{gpu_bound['capture']['capture_end_ms']:.0f} ms")
labels = {"light": "defaults: history with Python stacks + NVML", "light_history_alloc": "history, stacks at allocation only + NVML",
          "light_history_sizes": "history without stacks ('sizes') + NVML", "light_no_nvml": "history with stacks, no NVML",
          "light_no_history": "NVML, no history", "light_no_history_no_nvml": "neither"}
print(f"host-bound step ({host_bound['light']['plain_ms']:.1f} ms), {H['results']['cpu-bound bf16']['light']['round_ratio_spread_pct']:.0f}% spread on the defaults' rounds:")
for key, text in labels.items():
    print(f"  {text:<44} {host_bound[key]['overhead_pct']:+6.2f}%")

# %%
assert gpu_bound["light"]["overhead_pct"] < 1 and abs(gpu_bound["capture"]["captured_overhead_pct"]) < 1
stacks = [host_bound[k]["overhead_pct"] for k in ("light", "light_history_alloc", "light_no_nvml")]
stackless = [host_bound[k]["overhead_pct"] for k in ("light_history_sizes", "light_no_history", "light_no_history_no_nvml")]
assert min(stacks) > 5 and max(stackless) < 2   # the stacks are the cost on a host-bound step

# %% [markdown]
# On the GPU-bound step the recorder cost 0.22%, and a captured step nothing the GPU's clock could see: the
# host's extra work hides behind the GPU's. On the host-bound step every setting that records a Python stack
# per allocation cost 9-18%, and every setting without stacks under 2%: torch gathers a stack at each
# allocation, and on a step made of many small ops that work lands on the step. (A shorter, 6-round run
# put the stackless ring at +9.1%: on this step the rounds' spread is tens of percent, so one run
# decides little; RESULTS.md has all five.) These runs predate `memory_history="auto"`, today's default
# (docs/long-runs.md): during the warm-up it counts the allocations a step and multiplies them by what one
# allocation costs with stacks, without them and with no history (timed once when the recorder starts), and
# keeps the richest history that costs at most 1% of the step. Two later runs on the same H100 show what it
# chose:

# %% tags=["nbval-check-output"]
AUTO = json.loads((RESULTS / "h100_watch_auto.json").read_text())["results"]
AG, AH = AUTO["gpu-bound fp32"], AUTO["cpu-bound bf16"]
for name, r in (("GPU-bound", AG), ("host-bound", AH)):
    m, us = r["history"]["model_overhead_pct"], r["history"]["us_per_alloc"]
    print(f"{name}: {r['history']['allocs_per_step']:.0f} allocations a step of {r['history']['step_ms_no_history']:.1f} ms; "
          f"one costs {us['python_at_measured']:.2f} us with stacks, {us['sizes']:.2f} without, {us['off']:.2f} with no history")
    print(f"   the model: stacks {m['python_at_measured_frames_pct']:.2f}% of the step, the ring without them {m['sizes_pct']:.2f}%; "
          f"auto chose {r['light']['auto_modes']} over the rounds; A/B of auto {r['light']['overhead_pct']:+.2f}% "
          f"(rounds' spread {r['light']['round_ratio_spread_pct']:.1f}%)")
assert set(AG["light"]["auto_modes"]) == {"python"} and AG["light"]["overhead_pct"] < 1
assert "python" not in AH["light"]["auto_modes"] and AH["history"]["model_overhead_pct"]["python_at_measured_frames_pct"] > 1

# %% [markdown]
# On the GPU-bound step the stacks stayed and the recorder cost 0.23%. On the host-bound step the stacks
# would cost about 7% of a step, so `auto` dropped them; whether the ring without stacks fits the 1% turns
# on a fraction of a microsecond per allocation, so in some rounds it kept that ring and in most it turned
# the history off (an OOM then still leaves the allocator's segments, not how they filled). The A/B there
# cannot tell 1% from noise (its rounds spread by tens of percent): on such a step the budget is kept by
# the model's measured terms. Name a mode to override it: `True` where an OOM's post-mortem, which reads
# the stacks, is worth their cost; `"sizes"` for the ring without stacks; `False` for no history.
#
# ## 9 · Takeaways, asserted on the recording

# %% tags=["nbval-check-output"]
# 1. the recorder took a normal window after the warm-up, and one for each trigger within capture_steps + 1
#    steps of it (file, signal; live: file)
assert cap["baseline"].first_step == 20 and cap["file"].first_step == 41 and cap["signal"].first_step == 61
assert live["file"]["first_step"] - FILE_AT <= 3 + 1
# 2. a slowdown that lasts is in the slow capture (steps 91-93, 7.6x the baseline's profiled step); the step that tripped it
#    is in the index line, not the trace
assert s["trigger_step"] == 90 and round(A["slow"].numbers.step_median_us / A["baseline"].numbers.step_median_us, 1) == 7.6
# 3. diffed against the baseline, one op holds the slowdown: the DataLoader, the data got slower
assert top["name"].startswith("enumerate(DataLoader)") and top["delta_cpu_us"] > 0.95 * d.step_delta_us
# 4. at an OOM the snapshot and its sidecar hold the request, the cap and torch's message (an H200
#    recording by capture_oom, the files the watch writes)
assert set(side) == WATCH_OOM_FIELDS
print(f"slow window {A['slow'].numbers.step_median_us / 1e3:.1f} ms vs baseline "
      f"{A['baseline'].numbers.step_median_us / 1e3:.1f} ms; the DataLoader +{loader_grew_ms:.2f} ms a step")

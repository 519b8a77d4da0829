# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 33 · CUDA streams: hiding host-to-device copies behind compute
#
# A GPU has separate engines for copying (DMA over PCIe) and for computing (the SMs). They can work
# at the same time, but only if the program lets them:
#
# 1. **Pinned host memory.** A copy from ordinary (*pageable*) memory is staged by the driver through a
#    pinned bounce buffer, and `.to("cuda")` blocks the Python thread until it is done. From pinned
#    (page-locked) memory (`tensor.pin_memory()`, `DataLoader(pin_memory=True)`) the DMA engine reads
#    directly, at full PCIe speed.
# 2. **`non_blocking=True`.** The copy is queued and the host returns at once, free to queue more work.
# 3. **A second stream.** Work on one CUDA stream runs in order. To copy chunk *i+1* while chunk *i* is
#    computed, issue the copy on a side stream, and order the compute after it with an event
#    (`stream.wait_event`); `tensor.record_stream(...)` tells the caching allocator that the copied
#    tensor is also used on the compute stream.
#
# A CPU cannot show any of this (there is no copy engine and no stream), so this notebook reads real
# H200 traces: a training step where everything runs on one stream, and the same copy-then-compute
# loop recorded serial and overlapped (`benchmarks/record_streams_h200.py`).

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
# ## 1 · One stream: the shipped H200 training trace
#
# Three training steps of a transformer on the H200 (the `h200_train_step` sample). Every kernel and
# every copy sits in **one lane, one stream**: each waits for the one before. `memcpy_summary` lists
# the copies (this model makes its batches on the GPU, so there is no host-to-device traffic at all),
# `temporal_breakdown` splits the window into compute, memory-only and idle time.

# %% tags=["nbval-check-output"]
from workbench import load_trace
from workbench.analysis import memcpy_summary, temporal_breakdown

train = load_trace(samples.path("h200_train_step"))
gpu = train.events[train.events["stream"].notna()]
print("GPU streams used:", sorted(gpu["stream"].dropna().astype(int).unique().tolist()))
print(memcpy_summary(train)[["kind", "count", "total_us", "pageable_count"]].round(1).to_string(index=False))
print({k.replace("_us", "_ms"): round(v / 1e3, 2) for k, v in temporal_breakdown(train).items()})

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets
from workbench.figures import timeline_figure
from workbench.panels import PlotWidget

PlotWidget(timeline_figure(train, max_events=5_000, title="H200 training step: one stream"))

# %% [markdown]
# ## 2 · The loop, three ways
#
# The code below is what `benchmarks/record_streams_h200.py` runs on the GPU: a list of host chunks
# (32 MiB each), each copied to the GPU and then multiplied by a weight matrix a few times. The recorder
# calibrates the number of matmuls to bring a chunk's compute near its pinned copy; on the H200 a single
# matmul, the fewest it can run, already took longer than the copy (section 3 prints both), so there the
# compute is the longer side and the copies are what can hide.
#
# - **serial**: pageable chunks, blocking `.to("cuda")`, one stream;
# - **pinned**: pinned chunks, `non_blocking=True`, still one stream (faster copies, no overlap);
# - **overlap**: pinned chunks, copies on a side stream one chunk ahead, events to order compute after copy.
#
# The functions need a CUDA device; on a CPU this cell only defines them (and nbval skips it).

# %%
if GPU:
    def compute(x, w, repeat):
        for _ in range(repeat):
            x = torch.relu(x @ w)
        return x.sum()

    def run_serial(pageable, w, repeat):
        return torch.stack([compute(chunk.to("cuda"), w, repeat) for chunk in pageable]).sum()

    def run_pinned(pinned, w, repeat):
        return torch.stack([compute(chunk.to("cuda", non_blocking=True), w, repeat) for chunk in pinned]).sum()

    def run_overlap(pinned, w, repeat, copy_stream):
        main = torch.cuda.current_stream()

        def load(chunk):
            with torch.cuda.stream(copy_stream):
                x = chunk.to("cuda", non_blocking=True)
                done = torch.cuda.Event()
                done.record(copy_stream)
            return x, done

        out, nxt = [], load(pinned[0])
        for i in range(len(pinned)):
            x, done = nxt
            main.wait_event(done)            # compute on chunk i only after its copy
            x.record_stream(main)            # the allocator must not reuse it while main still reads it
            if i + 1 < len(pinned):
                nxt = load(pinned[i + 1])    # copy chunk i+1 while chunk i is computed
            out.append(compute(x, w, repeat))
        return torch.stack(out).sum()

# %% [markdown]
# ## 3 · The H200 recording: serial against overlapped

# %%
SAMPLE_DIR = Path(samples.__file__).parent
serial_path = SAMPLE_DIR / "h200_streams_serial.trace.json.gz"
overlap_path = SAMPLE_DIR / "h200_streams_overlap.trace.json.gz"
timings_path = RESULTS / "h200_streams.json"
RECORDED = serial_path.exists() and overlap_path.exists() and timings_path.exists()
if RECORDED:
    import json
    rec = json.loads(timings_path.read_text())
    serial, overlap = load_trace(serial_path), load_trace(overlap_path)
    print(f"recorded on {rec['gpu']} (torch {rec['torch_version']}, {rec['date'][:10]}): "
          f"{rec['params']['chunks']} chunks of {rec['params']['chunk_bytes'] / MIB:.0f} MiB, "
          f"{rec['params']['matmuls_per_chunk']} matmul(s) per chunk")
else:
    print("The H200 recording of this loop is pending: run `python benchmarks/record_streams_h200.py` "
          "on a GPU machine; it writes h200_streams_serial/overlap.trace.json.gz and results/h200_streams.json "
          "into workbench/samples. Until then, sections 3 and 4 show what they will compute.")

# %% [markdown]
# **Timings** (CUDA events around whole iterations, outside the profiler): per chunk, a pageable copy,
# a pinned copy and the compute; per iteration, the three versions. Ideal overlap takes about
# max(copies, compute) instead of their sum.

# %% tags=["nbval-check-output"]
if RECORDED:
    per_chunk = pd.Series(rec["per_chunk_ms"], name="ms per chunk")
    it = pd.Series(rec["iteration_ms_median"], name="ms per iteration")
    n = rec["params"]["chunks"]
    summary = pd.DataFrame({"ms_per_iteration": it, "speedup_vs_serial": it["serial"] / it})
    summary.loc["ideal (max of copies, compute)"] = [n * max(per_chunk["copy_pinned"], per_chunk["compute"]),
                                                     it["serial"] / (n * max(per_chunk["copy_pinned"], per_chunk["compute"]))]
    print(per_chunk.round(3).to_string())
    print("H2D GB/s:", {k: round(v, 1) for k, v in rec["h2d_gb_per_s"].items()},
          "| the three versions give the same result:", rec["results_agree"])
    display(summary.round(2))
    print(f"pinning alone (one stream): x{it['serial'] / it['pinned']:.2f}; the side stream on top of pinning: "
          f"x{it['pinned'] / it['overlap']:.2f}; both: x{it['serial'] / it['overlap']:.2f}")
    pin_share = (it["serial"] - it["pinned"]) / (it["serial"] - it["overlap"])
    ideal = n * max(per_chunk["copy_pinned"], per_chunk["compute"])
    print(f"of the time saved, pinning's share: {pin_share:.0%}; compute per chunk "
          f"{per_chunk['compute'] / per_chunk['copy_pinned']:.1f}x the pinned copy; overlapped "
          f"{it['overlap'] / ideal:.2f}x the ideal")
    assert rec["params"]["matmuls_per_chunk"] == 1 and per_chunk["compute"] > per_chunk["copy_pinned"]
    assert pin_share > 0.5 and it["overlap"] < 1.1 * ideal     # most of the gain is pinning; overlap near ideal

# %% [markdown]
# Most of the gain is **pinning**, not overlap (its share of the time saved is printed above): pinned
# copies run several times faster (the GB/s above) and no longer block the host, on the same single stream. The side stream then hides what is left of the copies under the
# compute, and brings the iteration close to the ideal. The traces below compare serial (pageable, one
# stream) with overlapped (pinned *and* a side stream), so their difference holds both changes.

# %% [markdown]
# **Where the copy time went.** `memcpy_summary` totals the copies in each trace (count, time, bytes,
# achieved GB/s, how many came from pageable memory); `temporal_breakdown` counts the time when
# *only* copies ran (`memory_us`): copy time not hidden behind compute.

# %% tags=["nbval-check-output"]
if RECORDED:
    rows = []
    for name, t in (("serial", serial), ("overlap", overlap)):
        h2d = memcpy_summary(t).set_index("kind").loc["HtoD"]
        b = temporal_breakdown(t)
        rows.append({"trace": name, "h2d_copies": int(h2d["count"]), "h2d_ms": h2d["total_us"] / 1e3,
                     "h2d_gb_per_s": h2d["gb_per_s"], "pageable": int(h2d["pageable_count"]),
                     "copy_only_ms": b["memory_us"] / 1e3, "compute_ms": b["compute_us"] / 1e3,
                     "idle_ms": b["idle_us"] / 1e3,
                     "streams": sorted(t.events["stream"].dropna().astype(int).unique().tolist())})
    copies = pd.DataFrame(rows).set_index("trace")
    copies["hidden_fraction"] = 1 - copies["copy_only_ms"] / copies["h2d_ms"]
    display(copies.round(3))

# %% [markdown]
# **On the timeline**, serial above, overlapped below: in the overlapped trace the copies run in their
# own stream lane, under the matmuls of the previous chunk.

# %% tags=["nbval-ignore-output"]
if RECORDED:
    display(widgets.VBox([PlotWidget(timeline_figure(serial, title="serial: pageable copies, one stream")),
                          PlotWidget(timeline_figure(overlap, title="overlapped: pinned, side stream"))]))

# %% [markdown]
# The workbench's `ComparePanel` on the two traces: kernel-time deltas (the matmuls are the same
# work, so they should barely move), GPU busy and idle, and the op table (the host stops waiting in
# `aten::copy_`/`cudaMemcpyAsync`).

# %% tags=["nbval-ignore-output"]
from workbench import ComparePanel

ComparePanel.from_traces(serial, overlap) if RECORDED else None

# %% [markdown]
# ## 4 · Exercise: read the lanes yourself
#
# Pick a trace and a time window. Each GPU stream and each CPU thread is a lane. Things to find: in
# the serial trace, how long does the GPU sit idle while the host is inside a pageable copy? In the
# overlapped one, which stream carries the `Memcpy HtoD (Pinned -> Device)` events, and does a matmul
# ever start before its own chunk's copy has ended?

# %% tags=["nbval-ignore-output"]
TRACES = {"H200 training step (one stream)": train}
if RECORDED:
    TRACES = {"streams: serial": serial, "streams: overlapped": overlap, **TRACES}


def extent_ms(t):
    ev = t.events
    lo = float(ev["ts_us"].min())
    return lo, (float((ev["ts_us"] + ev["dur_us"].fillna(0)).max()) - lo) / 1e3


def lanes_figure(name, start_ms, end_ms):
    t = TRACES[name]
    lo, _ = extent_ms(t)
    return timeline_figure(t, start_us=lo + start_ms * 1e3, end_us=lo + end_ms * 1e3, max_events=5_000, title=name)


pick = widgets.Dropdown(options=list(TRACES), description="trace", layout=widgets.Layout(width="420px"))
span = extent_ms(TRACES[pick.value])[1]
window = widgets.FloatRangeSlider(description="window (ms)", min=0, max=span, value=(0, span), step=0.01,
                                  continuous_update=False, layout=widgets.Layout(width="90%"))
lanes = PlotWidget(lanes_figure(pick.value, 0, span))


def redraw(_change=None):
    fig = lanes_figure(pick.value, *window.value)
    with lanes.batch_update():
        lanes.data = []
        lanes.add_traces(fig.data)
        lanes.layout = fig.layout


def on_pick(_change=None):
    _, span = extent_ms(TRACES[pick.value])
    with window.hold_trait_notifications():
        window.max = span
        window.value = (0, span)
    redraw()


pick.observe(on_pick, names="value")
window.observe(redraw, names="value")
widgets.VBox([pick, window, lanes])

# %% [markdown]
# Your answers for the overlapped trace, then the check reads them off its events:

# %%
MY_COPY_STREAM = 7              # the stream id that carries `Memcpy HtoD (Pinned -> Device)`
MY_MATMUL_BEFORE_COPY = False   # does a matmul ever start before its own chunk's copy has ended?

# %% tags=["nbval-check-output"]
if RECORDED:
    ev = overlap.events
    h2d = ev[ev["name"].astype(str).str.startswith("Memcpy HtoD")].sort_values("ts_us")
    mm = ev[(ev["cat"] == "kernel") & ev["name"].astype(str).str.contains("gemm")].sort_values("ts_us")
    copy_streams = sorted(h2d["stream"].astype(int).unique().tolist())
    mm_streams = sorted(mm["stream"].astype(int).unique().tolist())
    copy_end = (h2d["ts_us"] + h2d["dur_us"]).to_numpy()
    early = bool((mm["ts_us"].to_numpy() < copy_end).any())      # chunk i's matmul against chunk i's copy
    under = sum(bool(((mm["ts_us"] < e) & (mm["ts_us"] + mm["dur_us"] > s0)).any())
                for s0, e in zip(h2d["ts_us"], copy_end))           # copies that ran under some matmul
    print(f"copies on stream(s) {copy_streams}, matmuls on {mm_streams}; {len(h2d)} copies, {len(mm)} matmuls; "
          f"a matmul before its own copy ended: {early}; copies running under a matmul: {under}")
    print("stream:", "right" if [MY_COPY_STREAM] == copy_streams else "look again",
          "| matmul before its copy:", "right" if MY_MATMUL_BEFORE_COPY == early else "look again")
    # the solution: copies on their own stream, under earlier chunks' matmuls; the event keeps each matmul
    # after its own chunk's copy
    assert len(h2d) == len(mm) and set(copy_streams).isdisjoint(mm_streams) and not early and under > 0

# %% [markdown]
# ## 5 · On a GPU: run it live
#
# With a CUDA device this cell times the three versions with CUDA events and opens the overlapped one in
# the `ProfilerPanel` (Timeline tab). Skipped on a CPU.

# %% tags=["nbval-skip"]
if GPU:
    import statistics
    from workbench import ProfilerPanel

    pageable = [torch.randn(2048, 4096) for _ in range(8)]
    pinned = [c.pin_memory() for c in pageable]
    w = torch.randn(4096, 4096, device="cuda") / 64
    side = torch.cuda.Stream()
    fns = {"serial": lambda: run_serial(pageable, w, 2), "pinned": lambda: run_pinned(pinned, w, 2),
           "overlap": lambda: run_overlap(pinned, w, 2, side)}
    med = {}
    for name, fn in fns.items():
        fn(); torch.cuda.synchronize()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        print(f"{name:8s} {statistics.median(times):7.2f} ms per iteration")
        med[name] = statistics.median(times)
    assert med["overlap"] < med["pinned"] < med["serial"], med   # each change pays on this GPU too
    display(ProfilerPanel.from_step(fns["overlap"], steps=2, detail="light"))

# %% [markdown]
# ## Takeaways
#
# - One stream runs its work in order: a copy and a kernel on the same stream never overlap.
# - Pinned memory makes copies faster and lets them be asynchronous: here most of the speed-up. A side
#   stream plus an event then lets them run *under* compute. The timeline shows it as a second GPU lane
#   busy at the same time as the first.
# - Measure the steps one at a time (pageable -> pinned -> pinned + side stream) to credit each change.

# %%
b = temporal_breakdown(train)
assert train.events["stream"].dropna().nunique() == 1            # the training step: one stream
assert b["compute_us"] > 10 * b["memory_us"]
if RECORDED:
    it = rec["iteration_ms_median"]
    assert rec["results_agree"]
    assert it["overlap"] < it["pinned"] <= it["serial"] * 1.05
    assert copies.loc["overlap", "hidden_fraction"] > copies.loc["serial", "hidden_fraction"]
    assert len(copies.loc["overlap", "streams"]) >= 2 and copies.loc["serial", "pageable"] > 0
    print(f"pinning: x{it['serial'] / it['pinned']:.2f} vs serial; side stream: x{it['pinned'] / it['overlap']:.2f} "
          f"more; {copies.loc['overlap', 'hidden_fraction']:.0%} of copy time hidden in the overlapped trace")
else:
    print("recorded H200 stream traces: pending (see section 3)")

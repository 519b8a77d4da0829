# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 13 · Monitoring that means something
#
# `nvidia-smi`'s **GPU-Util** (NVML's `utilization.gpu`) is the share of the last sample period in which
# *at least one kernel* was running. It says the GPU was **occupied**, not how much of it worked: one
# kernel of two thread blocks on a GPU of 132 SMs counts the same as a matmul that fills every SM. Hopper's
# **GPM counters** (`nvmlGpmMetricsGet`) measure the work itself: the share of SMs with a kernel resident
# (*SM activity*), the warps resident against the maximum (*occupancy*), tensor-core and DRAM activity.
#
# This lesson reads one H200 session, recorded with the workbench's own sampler
# (`benchmarks/record_lesson13_h200.py`): NVML + GPM, labelled phases of at least 8 s each, the energy
# counter read 100 times a second beside it. We replay it in the workbench's live monitor panel, put NVML
# utilization beside the GPM counters phase by phase, measure energy over honest and over short windows,
# read the power cap and the clocks-event (throttle) reasons, and run the alerts the workbench raises.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import gzip, json
import numpy as np
import pandas as pd
import torch
from workbench import samples
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded H200 samples and CPU runs

# %% [markdown]
# ## 1 · The recording
#
# `h200_lesson13.json` holds what the recorder measured (per phase: medians, energy, throttle reasons;
# the power limits; the environment); the session itself is the shipped sample `h200_monitoring_session`,
# in the format `workbench monitor --csv` writes and the monitor panel replays (one JSON line per sample,
# one per mark). The phases, on the session's time axis:

# %% tags=["nbval-check-output"]
from pathlib import Path
SESSION = Path(samples.__file__).parent / "h200_monitoring_session.jsonl.gz"   # the shipped sample h200_monitoring_session
RECORDED = all(p.exists() for p in (RESULTS / "h200_lesson13.json", RESULTS / "h200_lesson13_energy.json.gz",
                                     SESSION))
if RECORDED:
    from workbench.io.nvml import load_nvml_session

    REC = json.loads((RESULTS / "h200_lesson13.json").read_text())
    session = load_nvml_session(SESSION)
    env = REC["env"]
    print(f"{env.get('nvml_gpu', env.get('gpu'))}, driver {env.get('driver')}, torch {env['torch']}, "
          f"CUDA {env.get('cuda')}, recorded {env['date_utc'][:10]}; GPM supported: {REC['gpm_supported']}")
    print(f"session: {len(session)} samples over {session.t_s.max() - session.t_s.min():.1f} s, "
          f"{len(session.attrs['marks'])} marks")
    phases = pd.DataFrame(REC["phases"]).set_index("name")
    phases["seconds"] = phases.end_s - phases.start_s
    print(phases[["start_s", "end_s", "seconds", "what"]].round(2).to_string())
else:
    print("The H200 recording of this lesson is pending: run `python benchmarks/record_lesson13_h200.py --out DIR` "
          "on the H200 and copy DIR/h200_lesson13.json and h200_lesson13_energy.json.gz into workbench/samples/results/, "
          "the session into workbench/samples/h200_monitoring_session.jsonl.gz.")

# %%
if RECORDED:
    def phase_rows(frame, name, edge=True):
        """The samples of one phase; ``edge=True`` leaves out its first ``edge_s`` and last ``tail_s`` (a GPM
        pair that straddles the change of phase mixes both), as the recorder's medians do."""
        ph = phases.loc[name]
        lo, hi = (ph.start_s + REC["edge_s"], ph.end_s - REC["tail_s"]) if edge else (ph.start_s, ph.end_s)
        return frame[(frame.t_s >= lo) & (frame.t_s <= hi)]

# %% [markdown]
# ## 2 · The session in the monitor panel
#
# `LiveGpuPanel` is the workbench's monitor: live NVML where there is a GPU, a recorded session otherwise.
# Here it shows a `ReplaySampler` of the recording, played to the end at once (a `ReplaySampler(path)`
# at `speed=1` plays it in real time, `loop=True` over and over; `LiveGpuPanel(path)` does that for
# you). The fifth row is the GPM counters; the vertical lines are the phase marks. Watch the first row
# against the fifth: in `tiny_graph` utilization is up at the GEMM's level, SM activity on the floor.

# %% tags=["nbval-ignore-output"]
if RECORDED:
    from workbench import LiveGpuPanel
    from workbench.analysis.nvml import AlertThresholds
    from workbench.capture.nvml import ReplaySampler

    # Alert durations scaled to a one-minute recording (the defaults, 5 minutes, never fire on it); section 6.
    SHORT = AlertThresholds(low_util_s=5.0, low_sm_s=5.0)
    replay = ReplaySampler(SESSION, speed=1e6)
    replay.start(); replay.wait(timeout=30)
    panel = LiveGpuPanel(replay, window_s=int(session.t_s.max()) + 5, thresholds=SHORT, autostart=False)
    display(panel)

# %% [markdown]
# The same replay in a terminal: `workbench monitor --replay FILE` prints, per interval, the mean and the
# max of every sample in it (here 8 s of recording per line, played 80 times faster than recorded).

# %% tags=["nbval-ignore-output"]
if RECORDED:
    import subprocess, sys
    cli = subprocess.run([sys.executable, "-m", "workbench", "monitor", "--replay", "h200_monitoring_session",
                          "--plain", "--speed", "80", "--interval", "0.1"], capture_output=True, text=True, timeout=60)
    print(cli.stdout[-3000:])

# %% [markdown]
# ## 3 · NVML utilization against the GPM counters, phase by phase
#
# The medians the recorder took per phase, and the same from the session with the workbench's
# `interval_stats` (the means the monitor shows per display interval), to check that the file and the
# summary say the same thing:

# %% tags=["nbval-check-output"]
if RECORDED:
    from workbench.analysis.nvml import interval_stats

    SHOW = ["nvml_util_pct", "sm_activity_pct", "sm_occupancy_pct", "tensor_activity_pct", "dram_activity_pct",
            "power_w", "sm_clock_mhz"]
    table = pd.DataFrame(REC["phase_stats"]).T.loc[phases.index, SHOW].astype(float)
    print("medians per phase (recorder):")
    print(table.round(1).to_string())
    means = pd.concat({name: interval_stats(phase_rows(session, name)).iloc[0] for name in phases.index}, axis=1).T
    means = means[["util_gpu_mean_pct", "gpm_sm_util_mean_pct", "gpm_tensor_util_mean_pct", "gpm_dram_bw_util_mean_pct"]]
    print("\nmeans per phase (interval_stats on the session):")
    print(means.astype(float).round(1).to_string())

# %% [markdown]
# Three things to read off the table:
#
# - **NVML utilization cannot tell the busy phases apart.** The tiny kernels replayed from a CUDA graph,
#   the GEMM and the copy all read near the top, yet they do completely different amounts of work.
# - **SM activity and tensor activity can.** The GEMM keeps nearly every SM busy and the tensor cores
#   busy most of the time; the copy keeps SMs busy (copy kernels are SM work) with the tensor cores idle
#   and DRAM near its peak; the tiny kernels leave the SMs idle.
# - **Eager tiny kernels** sit in between on NVML's scale: the Python loop cannot launch them fast enough
#   to keep even one kernel always resident, so utilization reads what share of the time one was.
#
# Why the tiny kernels score high on NVML and near zero on GPM, from the recorder's own numbers: each
# kernel runs a couple of thread blocks for a few microseconds, on a GPU of 132 SMs.

# %% tags=["nbval-check-output"]
if RECORDED:
    tiny = REC["tiny"]
    print(f"{tiny['elements']} floats per kernel ({tiny['kernel']}); graph of {tiny.get('graph_kernels')} kernels")
    if tiny.get("graph_kernel_ms") is not None:
        print(f"time per kernel: eager (Python launches) {tiny['eager_kernel_ms'] * 1e3:.2f} us, "
              f"in the CUDA graph {tiny['graph_kernel_ms'] * 1e3:.2f} us")
    for name in ("tiny_kernels", "tiny_graph", "bf16_gemm", "copy"):
        r = table.loc[name]
        print(f"{name:13s} NVML {r.nvml_util_pct:5.1f}%   SM {r.sm_activity_pct:5.1f}%   "
              f"tensor {r.tensor_activity_pct:5.1f}%   DRAM {r.dram_activity_pct:5.1f}%   {r.power_w:5.0f} W")

# %% [markdown]
# **The lesson, asserted on the data**: in the tiny-kernel phase that NVML calls busiest, utilization is
# high while SM activity is near zero, and the power draw stays near idle; a GEMM at the same utilization
# has its SMs and tensor cores busy and draws several times the power.

# %% tags=["nbval-check-output"]
if RECORDED:
    busiest_tiny = table.loc[["tiny_kernels", "tiny_graph"], "nvml_util_pct"].idxmax()
    t = table.loc[busiest_tiny]
    g = table.loc["bf16_gemm"]
    assert t.nvml_util_pct >= 50 and t.sm_activity_pct < 5, t            # "busy" to NVML, idle SMs
    assert t.nvml_util_pct > 10 * t.sm_activity_pct
    assert g.nvml_util_pct >= 90 and g.sm_activity_pct >= 80 and g.tensor_activity_pct >= 50, g
    assert table.loc["copy", "tensor_activity_pct"] < 5 < 50 < table.loc["copy", "dram_activity_pct"]
    assert g.power_w > 2 * t.power_w
    print(f"{busiest_tiny}: NVML {t.nvml_util_pct:.0f}% but SM activity {t.sm_activity_pct:.2f}% "
          f"({t.power_w:.0f} W); bf16 GEMM: NVML {g.nvml_util_pct:.0f}%, SM {g.sm_activity_pct:.0f}%, "
          f"tensor {g.tensor_activity_pct:.0f}% ({g.power_w:.0f} W)")

# %% [markdown]
# ## 4 · Energy over honest windows
#
# NVML has two ways to an energy figure: the **total-energy counter** (`nvmlDeviceGetTotalEnergyConsumption`,
# mJ since the driver loaded), and **power** (`nvmlDeviceGetPowerUsage`) times time. The recorder read
# both about 100 times a second, in a thread beside the sampler. First: how often does the counter move?

# %% tags=["nbval-check-output"]
if RECORDED:
    with gzip.open(RESULTS / "h200_lesson13_energy.json.gz", "rt") as f:
        fast = json.load(f)
    ft = np.asarray(fast["t_s"], float)
    fe = np.asarray(fast["energy_mj"], float) / 1e3      # J
    fp = np.asarray(fast["power_mw"], float) / 1e3       # W
    changes = ft[1:][np.diff(fe) != 0]
    upd = np.diff(changes)
    reads = np.diff(ft)
    print(f"{len(ft)} reads, one every {np.median(reads) * 1e3:.1f} ms (median); a read takes "
          f"{np.median(fast['read_us']):.0f} us")
    print(f"the counter changed at {len(changes)} of them: every {np.median(upd) * 1e3:.0f} ms (median; "
          f"10-90%: {np.percentile(upd, 10) * 1e3:.0f}-{np.percentile(upd, 90) * 1e3:.0f} ms)")
    pchanges = ft[1:][np.diff(fp) != 0]
    if len(pchanges) > 1:
        print(f"the power reading changed at {len(pchanges)} reads: every {np.median(np.diff(pchanges)) * 1e3:.0f} ms (median)")

# %% [markdown]
# Now energy over windows of *w* seconds laid end to end over the whole session: the counter's difference
# against the integral of the power readings over the same reads. Over a window a few update periods
# long the counter has moved only a few steps, and the power reading, itself an average, lags the changes
# of phase: the two disagree. Over seconds they agree.

# %% tags=["nbval-check-output"]
if RECORDED:
    _trapz = getattr(np, "trapezoid", None) or np.trapz


    def window_errors(w):
        """|counter / power integral - 1| in % for windows of w seconds laid end to end."""
        out, start = [], ft[0]
        while start + w <= ft[-1]:
            i0, i1 = np.searchsorted(ft, [start, start + w])
            i1 = min(i1, len(ft) - 1)
            if i1 - i0 >= 2:
                integ = _trapz(fp[i0:i1 + 1], ft[i0:i1 + 1])
                out.append(abs((fe[i1] - fe[i0]) / integ - 1) * 100)
            start += w
        return np.asarray(out)


    WINDOWS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    werr = pd.DataFrame({w: {"windows": len(e), "median_abs_err_pct": np.median(e), "p90_abs_err_pct": np.percentile(e, 90),
                             "max_abs_err_pct": e.max()} for w in WINDOWS for e in [window_errors(w)] if len(e)}).T
    werr.index.name = "window_s"
    print(werr.round(2).to_string())

# %% [markdown]
# Per phase (each 8 s or more), what a report would use: the counter read at the phase's two ends (the
# recorder read it there), the integral of the fast power readings, the workbench's `gpu_summary` on the
# phase's samples (it takes the session's energy column, read every 0.25 s, when there is one, else the
# integral of power), and the median power times the duration.

# %% tags=["nbval-check-output"]
if RECORDED:
    from workbench.analysis.nvml import gpu_summary

    rows = {}
    for name in phases.index:
        e = REC["energy"]["by_phase"][name]
        whole = phase_rows(session, name, edge=False)
        rows[name] = {"seconds": e["duration_s"], "counter_j": e.get("counter_j"),
                      "fast_power_integral_j": e.get("fast_power_integral_j"),
                      "gpu_summary_counter_j": gpu_summary(whole).energy_j.iloc[0],
                      "gpu_summary_power_j": gpu_summary(whole.drop(columns="energy_j")).energy_j.iloc[0],
                      "median_power_x_time_j": e.get("median_power_x_duration_j")}
    energy = pd.DataFrame(rows).T.astype(float)
    energy["power_vs_counter_pct"] = 100 * (energy.fast_power_integral_j / energy.counter_j - 1)
    print(energy.round(1).to_string())
    half = werr.loc[0.5]
    print(f"\nover whole phases power x time and the counter differ by at most "
          f"{energy.power_vs_counter_pct.abs().max():.1f}%; over 0.5 s windows by up to {half.max_abs_err_pct:.0f}% "
          f"(median {half.median_abs_err_pct:.1f}%)")

# %% [markdown]
# **Asserted**: short windows misread (0.5 s windows are off by far more than whole phases), and over a
# whole phase power x time agrees with the counter within a few percent.

# %% tags=["nbval-check-output"]
if RECORDED:
    assert werr.loc[0.5, "max_abs_err_pct"] > 3 * energy.power_vs_counter_pct.abs().max()
    assert werr.loc[0.1, "median_abs_err_pct"] > werr.loc[8.0, "median_abs_err_pct"]
    assert (energy.power_vs_counter_pct.abs() < 5).all(), energy.power_vs_counter_pct
    assert np.median(upd) > 2 * np.median(reads)       # the counter moves in steps slower than we read it
    print("whole phases: counter and power x time within 5%; 0.5 s windows: off by up to "
          f"{werr.loc[0.5, 'max_abs_err_pct']:.0f}%")

# %% [markdown]
# ## 5 · The power cap and the clocks-event reasons
#
# The board's **enforced power limit** is what the firmware holds the GPU to; when a kernel would draw
# more, it lowers the clocks and sets the `sw_power_cap` reason. The recorder read the limits (it set
# nothing) and counted, per phase, the clocks-event reasons in the samples (`gpu_idle` is the GPU saying it
# has nothing to do; `none`: the clocks ran free).

# %% tags=["nbval-check-output"]
if RECORDED:
    pw = REC.get("power", {})
    print({k: v for k, v in pw.items() if k.endswith("_w") or k.startswith("max_") or k == "supported_clocks_event_reasons"})
    reasons = pd.DataFrame({name: REC["phase_stats"][name]["clocks_event_reasons"] for name in phases.index}).T.fillna(0)
    print(reasons.astype(int).to_string())
    peak = session.power_w.max()
    print(f"peak power in the session {peak:.0f} W (median in bf16_gemm {table.loc['bf16_gemm', 'power_w']:.0f} W, "
          f"SM clock {table.loc['bf16_gemm', 'sm_clock_mhz']:.0f} MHz vs {table.loc['idle', 'sm_clock_mhz']:.0f} MHz idle)")

# %% [markdown]
# ## 6 · The alerts
#
# `gpu_alerts` (the panel's alert box, `workbench monitor`'s summary line) turns a session into episodes:
# NVML utilization below 60 % sustained, **SM activity below 60 % sustained** (sessions with GPM), memory
# above 90 % of the device, throttling. The defaults want 5 minutes of low activity before they speak; on
# this one-minute recording we scale that to 5 s (`SHORT`, above). Which phases trip which alert, and when:

# %% tags=["nbval-check-output"]
if RECORDED:
    from workbench.analysis.nvml import gpu_alerts


    def phases_in(start, end):
        """The phases an episode overlaps by more than a second."""
        return [n for n, p in phases.iterrows() if min(end, p.end_s) - max(start, p.start_s) > 1.0]


    alerts = gpu_alerts(session, SHORT)
    alerts["phases"] = [", ".join(phases_in(r.start_s, r.end_s)) for r in alerts.itertuples()]
    print(alerts[["kind", "severity", "start_s", "end_s", "value", "phases"]].round(1).to_string())
    print("\n" + "\n".join(alerts.message))
    print("\ndefault thresholds (5 minutes):", gpu_alerts(session).kind.tolist())

# %% [markdown]
# The NVML rule and the GPM rule disagree exactly where the lesson says: the tiny-kernel graph keeps
# utilization up, so the utilization alert is quiet there, while SM activity stays below 60 % and the SM
# alert covers it. The memory alert fires while the 92 % allocation is held, and only then.

# %% tags=["nbval-check-output"]
if RECORDED:
    def covering(kind, name):
        """Alerts of ``kind`` whose episode covers the inner part of phase ``name``."""
        inner = phase_rows(session, name)
        lo, hi = inner.t_s.min(), inner.t_s.max()
        a = alerts[alerts.kind == kind]
        return a[(a.start_s <= lo) & (a.end_s >= hi)]


    assert len(covering("low_sm_activity", busiest_tiny)) == 1
    assert covering("low_utilization", busiest_tiny).empty
    assert covering("low_sm_activity", "bf16_gemm").empty and covering("low_utilization", "bf16_gemm").empty
    assert len(covering("memory_high", "memory_full")) == 1
    mem = alerts[alerts.kind == "memory_high"]
    assert (mem.start_s >= phases.loc["memory_full", "start_s"]).all() and (mem.end_s <= phases.loc["idle_end", "start_s"] + 0.5).all()
    assert len(covering("low_utilization", "idle")) == 1 and len(covering("low_sm_activity", "idle")) == 1
    # the panel raises the same alerts (a replay's clock starts at the session's first sample)
    shown = panel.alerts()
    assert shown.kind.tolist() == alerts.kind.tolist()
    assert np.allclose(shown.start_s + session.t_s.min(), alerts.start_s) and np.allclose(shown.value, alerts.value)
    print(f"{busiest_tiny}: SM alert yes, utilization alert no; memory_full: memory alert "
          f"({mem.value.max():.1f}% of the device)")

# %% [markdown]
# ## 7 · Exercise: predict the alert
#
# Pick a phase, a metric (`"util_gpu_pct"`, NVML's utilization, or `"gpm_sm_util_pct"`, GPM SM activity)
# and a threshold, and predict whether that phase would raise a low-activity alert (the metric below the
# threshold for the whole phase). Change the three names and `PREDICTION`, then run the check. Try
# `copy` at 60 % on both metrics, `tiny_kernels` at 30 % on NVML's, `bf16_gemm` at 99 % on SM activity.

# %%
if RECORDED:
    PHASE = "tiny_graph"
    METRIC = "gpm_sm_util_pct"
    THRESHOLD = 60.0
    PREDICTION = True            # True: an alert covers the phase; False: it stays quiet

# %% tags=["nbval-check-output"]
if RECORDED:
    def check(phase, metric, threshold, prediction):
        th = AlertThresholds(low_util_pct=threshold if metric == "util_gpu_pct" else None, low_util_s=5.0,
                             low_sm_pct=threshold if metric == "gpm_sm_util_pct" else None, low_sm_s=5.0,
                             mem_high_pct=None, throttle_reasons=None)
        inner = phase_rows(session, phase)
        a = gpu_alerts(inner, th)
        fired = bool(len(a)) and bool(((a.start_s <= inner.t_s.min()) & (a.end_s >= inner.t_s.max())).any())
        median = inner[metric].median()
        verdict = "right" if fired == prediction else "not quite"
        print(f"{verdict}: {phase}, {metric} median {median:.1f}% vs threshold {threshold:g}% -> "
              f"{'alert' if fired else 'no alert'}")
        return fired


    fired = check(PHASE, METRIC, THRESHOLD, PREDICTION)

# %% [markdown]
# *Solution check*: the answers for the suggested cases, from the data.

# %% tags=["nbval-check-output"]
if RECORDED:
    assert check("tiny_graph", "gpm_sm_util_pct", 60, True)
    assert not check("tiny_graph", "util_gpu_pct", 60, False)
    assert not check("bf16_gemm", "gpm_sm_util_pct", 60, False)
    assert check("memory_full", "util_gpu_pct", 60, True)

# %% [markdown]
# ## 8 · On a GPU: sample live
#
# With a CUDA device this cell samples the GPU with `NvmlSampler` (NVML + GPM where the GPU has them) while
# it runs 3 s of tiny kernels and 3 s of bf16 GEMMs, marks each, and shows the phases in the monitor panel
# with the same per-phase means. Skipped on a CPU.

# %% tags=["nbval-skip"]
if RECORDED:
    if GPU:
        import time
        from workbench.capture.nvml import NvmlSampler

        x = torch.zeros(1024, device="cuda")
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def busy(fn, seconds, every):
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                for _ in range(every):
                    fn()
                torch.cuda.synchronize()

        live = NvmlSampler(interval_s=0.05)
        with live:
            print("GPM:", "yes" if live.gpm_supported else live.notes)
            marks = {}
            for name, fn, every in (("tiny", lambda: x.add_(1.0), 1000), ("gemm", lambda: a @ a, 10)):
                marks[name] = live.mark(name)
                busy(fn, 3.0, every)
            live.mark("end")
        frame = live.frame()
        for name, t0 in marks.items():
            part = frame[(frame.t_s > t0 + 0.5) & (frame.t_s < t0 + 2.9)]
            print(name, interval_stats(part)[["util_gpu_mean_pct", "gpm_sm_util_mean_pct", "gpm_tensor_util_mean_pct"]]
                  .round(1).to_dict("records"))
        display(LiveGpuPanel(live, window_s=10, thresholds=SHORT, autostart=False))

# %% [markdown]
# ## Takeaways
#
# - NVML utilization is "a kernel was running", not "the GPU was working": tiny kernels keep it high
#   while the SMs idle. Read it beside GPM SM activity, occupancy, tensor and DRAM activity (Hopper and
#   newer), which the workbench's sampler, monitor panel and `workbench monitor` all show.
# - Energy: take the counter's difference over windows of seconds, not fractions of a second; over whole
#   phases power x time and the counter agree.
# - The power cap and the clocks-event reasons say why the clocks are where they are; read them, never
#   guess them from the clock alone.
# - Alerts: sustained low SM activity catches the launch-bound job the utilization alert passes; memory
#   above 90 % is one allocation away from an OOM.

# %% tags=["nbval-check-output"]
if RECORDED:
    assert t.nvml_util_pct >= 50 and t.sm_activity_pct < 5
    assert (energy.power_vs_counter_pct.abs() < 5).all() and werr.loc[0.5, "max_abs_err_pct"] > 5
    assert len(covering("low_sm_activity", busiest_tiny)) == 1 and covering("low_utilization", busiest_tiny).empty
    print(f"NVML util {t.nvml_util_pct:.0f}% with SM activity {t.sm_activity_pct:.2f}% ({busiest_tiny}); "
          f"energy over whole phases within {energy.power_vs_counter_pct.abs().max():.1f}% of power x time; "
          f"the SM alert covers {busiest_tiny}, the utilization alert does not")


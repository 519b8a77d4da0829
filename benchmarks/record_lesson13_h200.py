"""Record lesson 13 (monitoring that means something) on the H200: one NVML + GPM session with labelled
phases, the energy counter read fast beside it, and the power limits. Read-only: nothing is set.

Run from the repository root on the H200 (about 80 s; budget 100 s)::

    python benchmarks/record_lesson13_h200.py --out DIR

It writes

- ``DIR/h200_lesson13.session.jsonl.gz``: the session, sampled by the workbench's own
  :class:`~workbench.capture.nvml.NvmlSampler` (NVML every 50 ms, GPM every 100 ms, PCIe and the energy
  counter every 0.25 s), with one mark per phase, in the format ``LiveGpuPanel`` and
  ``workbench monitor --replay`` play;
- ``DIR/h200_lesson13_energy.json.gz``: the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``)
  and the power reading (``nvmlDeviceGetPowerUsage``) read ~100 times a second over the whole session, in
  a second thread, with the session's time axis (``t_s``);
- ``DIR/h200_lesson13.json``: the phases (start/end on the session's time axis), per phase the medians of
  NVML utilization, GPM SM activity, occupancy, tensor and DRAM activity, power and the throttle reasons
  seen; per phase the energy from the counter vs the integral of power; how often the counter changes;
  the power limits; the environment.

Phases (each ``--phase-s``, default 8.5 s): ``idle``; ``tiny_kernels`` (a Python loop of elementwise
kernels on a 1024-element tensor, a couple of thread blocks each: launch bound); ``tiny_graph`` (the same
kernels replayed from a CUDA graph: back to back on the GPU, still a couple of blocks on 132 SMs); ``bf16_gemm`` (8192^3 bf16 matmuls);
``copy`` (device-to-device copies of 2 GiB); ``memory_full`` (one allocation that brings the GPU above
92 % of its memory, then nothing); ``idle_end``. ``--smoke`` runs the code paths on a CPU (tiny sizes,
short phases, a replay of the shipped GPM session instead of NVML, a made-up energy counter): its output
is for checking the script, never data.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import platform
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

T_START = time.perf_counter()
BUDGET_S = 100.0
SAFETY_S = 6.0          # stop starting phases when less than a phase + this is left


def log(msg: str) -> None:
    print(f"[lesson13 {time.perf_counter() - T_START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def left_s() -> float:
    return BUDGET_S - (time.perf_counter() - T_START)


def _err(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.replace(str(ROOT), "<repo>")[:800]


# ----------------------------------------------------------------------------------------------------
# environment and power limits (read only)


def environment(torch, nv, h) -> dict:
    env = {"date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "python": platform.python_version(), "torch": torch.__version__}
    try:
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
    except Exception as exc:
        env["torch_error"] = _err(exc)
    if nv is not None:
        for key, fn in (("nvml_gpu", lambda: nv.nvmlDeviceGetName(h)),
                        ("driver", nv.nvmlSystemGetDriverVersion),
                        ("nvml_version", nv.nvmlSystemGetNVMLVersion)):
            try:
                v = fn()
                env[key] = v.decode() if isinstance(v, bytes) else v
            except Exception as exc:
                env[key + "_error"] = _err(exc)
        try:
            from importlib.metadata import version
            env["nvidia_ml_py"] = version("nvidia-ml-py")
        except Exception:
            pass
    return env


def power_info(nv, h) -> dict:
    """Power limits, clocks and the clocks-event reasons the GPU supports: every value read, none set."""
    out: dict = {}
    reads = {
        "enforced_limit_w": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        "management_limit_w": lambda: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
        "default_limit_w": lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0,
        "limit_constraints_w": lambda: [x / 1000.0 for x in nv.nvmlDeviceGetPowerManagementLimitConstraints(h)],
        "max_sm_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "persistence_mode": lambda: nv.nvmlDeviceGetPersistenceMode(h),
        "memory_total_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(h).total,
    }
    for key, fn in reads.items():
        try:
            out[key] = fn()
        except Exception as exc:
            out[key + "_error"] = _err(exc)
    try:
        from workbench.io.nvml import decode_throttle_reasons
        fn = getattr(nv, "nvmlDeviceGetSupportedClocksEventReasons", None) or nv.nvmlDeviceGetSupportedClocksThrottleReasons
        mask = int(fn(h))
        out["supported_clocks_event_mask"] = mask
        out["supported_clocks_event_reasons"] = decode_throttle_reasons(mask)
    except Exception as exc:
        out["supported_clocks_event_error"] = _err(exc)
    return out


# ----------------------------------------------------------------------------------------------------
# the fast energy reader (a second thread)


class EnergyTrace:
    """Read the energy counter (mJ) and the power reading (mW) every ``interval_s`` in a thread; times on
    the sampler's axis (seconds after ``t0_unix``)."""

    def __init__(self, read_energy_mj, read_power_mw, t0_unix: float, interval_s: float = 0.01, read_instant_mw=None):
        self.read_energy_mj, self.read_power_mw = read_energy_mj, read_power_mw
        self.read_instant_mw = read_instant_mw   # None when the GPU has no instant-power field
        self.t0_unix, self.interval_s = t0_unix, interval_s
        self.t, self.energy_mj, self.power_mw, self.read_us = [], [], [], []
        self.instant_mw: list = []
        self.errors = 0
        self.last_error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lesson13-energy", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5.0)

    def _run(self):
        next_due = time.perf_counter()
        while not self._stop.is_set():
            try:
                t0 = time.perf_counter()
                e = self.read_energy_mj()
                t1 = time.perf_counter()
                p = self.read_power_mw()
                q = None
                if self.read_instant_mw is not None:
                    try:
                        q = self.read_instant_mw()
                    except Exception:  # never lose the counter's read for this one
                        q = None
                # the counter was read between t0 and t1: stamp it in the middle
                stamp = time.time() - (time.perf_counter() - (t0 + t1) / 2)
                self.t.append(round(stamp - self.t0_unix, 5))
                self.energy_mj.append(int(e))
                self.power_mw.append(int(p))
                self.read_us.append(round((t1 - t0) * 1e6, 1))
                if self.read_instant_mw is not None:
                    self.instant_mw.append(None if q is None else int(q))
            except Exception as exc:
                self.errors += 1
                self.last_error = _err(exc)
                if self.errors > 50:
                    return
            next_due += self.interval_s
            delay = next_due - time.perf_counter()
            if delay < 0:
                next_due = time.perf_counter()
                delay = 0
            if self._stop.wait(delay):
                return


def counter_updates(t: list[float], e: list[int]) -> dict:
    """How often the counter changed: the gaps between the reads at which its value moved."""
    changes = [t[i] for i in range(1, len(e)) if e[i] != e[i - 1]]
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    read_gaps = [b - a for a, b in zip(t, t[1:])]
    return {
        "reads": len(t),
        "changes": len(changes),
        "read_interval_median_s": statistics.median(read_gaps) if read_gaps else None,
        "update_interval_median_s": statistics.median(gaps) if gaps else None,
        "update_interval_p10_s": sorted(gaps)[len(gaps) // 10] if gaps else None,
        "update_interval_p90_s": sorted(gaps)[(9 * len(gaps)) // 10] if gaps else None,
        "changed_fraction_of_reads": (len(changes) / (len(t) - 1)) if len(t) > 1 else None,
    }


def instant_power_reader(nv, h):
    """A function that reads NVML's instant board power (field NVML_FI_DEV_POWER_INSTANT, mW), beside
    nvmlDeviceGetPowerUsage (which newer GPUs average over ~1 s); None when the field cannot be read."""
    fid = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
    if fid is None or not hasattr(nv, "nvmlDeviceGetFieldValues"):
        return None, "no NVML_FI_DEV_POWER_INSTANT in this nvidia-ml-py"
    attrs = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

    def read():
        v = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
        if v.nvmlReturn != 0:
            return None
        return getattr(v.value, attrs.get(int(v.valueType), "uiVal"))

    try:
        first = read()
    except Exception as exc:
        return None, _err(exc)
    if first is None or not first > 0:
        return None, f"field read returned {first!r}"
    return read, None


# ----------------------------------------------------------------------------------------------------
# the workloads


def busy(torch, fn, seconds: float, sync_every: int) -> int:
    """Call ``fn`` until ``seconds`` have passed, synchronizing every ``sync_every`` calls; returns calls."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        for _ in range(sync_every):
            fn()
        n += sync_every
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return n


def cuda_time_ms(torch, fn, reps: int = 5) -> float | None:
    """Median CUDA-event time of one ``fn()`` over ``reps`` (after the caller's warm-up)."""
    if not torch.cuda.is_available():
        return None
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


# ----------------------------------------------------------------------------------------------------
# per-phase numbers from the session


EDGE_S = 0.5   # leave out the first 0.5 s of a phase (a GPM pair straddling the change, clocks ramping)
TAIL_S = 0.15  # and the last sample or two


def phase_stats(frame, phases: list[dict]) -> dict:
    import numpy as np

    cols = {"util_gpu_pct": "nvml_util_pct", "util_mem_pct": "nvml_mem_util_pct",
            "gpm_sm_util_pct": "sm_activity_pct", "gpm_sm_occupancy_pct": "sm_occupancy_pct",
            "gpm_tensor_util_pct": "tensor_activity_pct", "gpm_dram_bw_util_pct": "dram_activity_pct",
            "gpm_fp32_util_pct": "fp32_activity_pct", "power_w": "power_w", "sm_clock_mhz": "sm_clock_mhz",
            "temp_c": "temp_c"}
    out = {}
    for ph in phases:
        inner = frame[(frame.t_s >= ph["start_s"] + EDGE_S) & (frame.t_s <= ph["end_s"] - TAIL_S)]
        row: dict = {"samples": int(len(inner))}
        for c, name in cols.items():
            v = inner[c].dropna().to_numpy(dtype=float) if c in inner else np.array([])
            row[name] = float(np.median(v)) if len(v) else None
        mem = inner["mem_used_bytes"].dropna() if "mem_used_bytes" in inner else []
        row["mem_used_max_bytes"] = float(max(mem)) if len(mem) else None
        tot = inner["mem_total_bytes"].dropna() if "mem_total_bytes" in inner else []
        row["mem_total_bytes"] = float(max(tot)) if len(tot) else None
        if row["mem_used_max_bytes"] and row["mem_total_bytes"]:
            row["mem_used_max_pct"] = 100.0 * row["mem_used_max_bytes"] / row["mem_total_bytes"]
        whole = frame[(frame.t_s >= ph["start_s"]) & (frame.t_s <= ph["end_s"])]
        reasons: dict[str, int] = {}
        for r in whole["throttle_reasons"] if "throttle_reasons" in whole else ():
            key = r if isinstance(r, str) else "unknown"
            reasons[key or "none"] = reasons.get(key or "none", 0) + 1
        row["clocks_event_reasons"] = reasons      # distinct reason strings -> sample count
        out[ph["name"]] = row
    return out


def energy_by_phase(trace: EnergyTrace, frame, phases: list[dict], boundary: dict) -> dict:
    """Per phase: the counter's difference over the whole phase (its reads at the two boundaries), the
    integral of the fast power readings, and of the session's power column, over the same span."""
    import numpy as np

    trap = getattr(np, "trapezoid", None) or np.trapz
    t = np.asarray(trace.t, dtype=float)
    e = np.asarray(trace.energy_mj, dtype=float) / 1000.0
    p = np.asarray(trace.power_mw, dtype=float) / 1000.0
    out = {}
    for ph in phases:
        name = ph["name"]
        row: dict = {"duration_s": ph["end_s"] - ph["start_s"]}
        b0, b1 = boundary.get((name, "start")), boundary.get((name, "end"))
        if b0 and b1:
            row["counter_j"] = (b1["energy_mj"] - b0["energy_mj"]) / 1000.0
            row["counter_span_s"] = b1["t_s"] - b0["t_s"]
        m = (t >= ph["start_s"]) & (t <= ph["end_s"])
        if m.sum() >= 2 and trace.instant_mw:
            q = np.asarray([math.nan if v is None else v for v in trace.instant_mw], dtype=float) / 1000.0
            ok = m & np.isfinite(q)
            if ok.sum() >= 2:
                row["fast_instant_power_integral_j"] = float(trap(q[ok], t[ok]))
        if m.sum() >= 2:
            row["fast_power_integral_j"] = float(trap(p[m], t[m]))
            row["fast_counter_j"] = float(e[m][-1] - e[m][0])
            row["fast_span_s"] = float(t[m][-1] - t[m][0])
        s = frame[(frame.t_s >= ph["start_s"]) & (frame.t_s <= ph["end_s"])]
        s = s[s.power_w.notna()]
        if len(s) >= 2:
            row["session_power_integral_j"] = float(trap(s.power_w.to_numpy(float), s.t_s.to_numpy(float)))
            row["session_power_median_w"] = float(s.power_w.median())
            row["median_power_x_duration_j"] = row["session_power_median_w"] * row["duration_s"]
        if "counter_j" in row and row.get("session_power_integral_j"):
            row["counter_vs_session_integral_pct"] = 100.0 * (row["counter_j"] / row["session_power_integral_j"] - 1)
        out[name] = row
    return out


def window_errors(trace: EnergyTrace, windows_s=(0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)) -> dict:
    """Counter difference over windows of w seconds vs the power integral over the same reads: the spread
    of the ratio (windows laid end to end over the whole session)."""
    import numpy as np

    trap = getattr(np, "trapezoid", None) or np.trapz
    t = np.asarray(trace.t, dtype=float)
    e = np.asarray(trace.energy_mj, dtype=float) / 1000.0
    p = np.asarray(trace.power_mw, dtype=float) / 1000.0
    out = {}
    if len(t) < 10:
        return out
    for w in windows_s:
        errs = []
        start = t[0]
        while start + w <= t[-1]:
            i0 = int(np.searchsorted(t, start))
            i1 = int(np.searchsorted(t, start + w))
            i1 = min(i1, len(t) - 1)
            if i1 - i0 >= 2:
                integ = float(trap(p[i0:i1 + 1], t[i0:i1 + 1]))
                if integ > 0:
                    errs.append(100.0 * ((e[i1] - e[i0]) / integ - 1))
            start += w
        if errs:
            a = np.abs(np.asarray(errs))
            out[str(w)] = {"windows": len(errs), "abs_err_median_pct": float(np.median(a)),
                           "abs_err_p90_pct": float(np.percentile(a, 90)), "abs_err_max_pct": float(a.max())}
    return out


# ----------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--phase-s", type=float, default=8.5)
    ap.add_argument("--smoke", action="store_true", help="CPU: code paths only (a replay, tiny sizes)")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    phase_s = 0.6 if args.smoke else float(args.phase_s)
    global BUDGET_S, EDGE_S, TAIL_S
    if args.smoke:
        BUDGET_S, EDGE_S, TAIL_S = 30.0, 0.1, 0.05

    import torch

    result: dict = {"script": "benchmarks/record_lesson13_h200.py", "smoke": bool(args.smoke),
                    "phase_s": phase_s, "budget_s": BUDGET_S, "edge_s": EDGE_S, "tail_s": TAIL_S,
                    "errors": {}, "skipped": []}
    nv = h = None
    gpu_ok = torch.cuda.is_available() and not args.smoke
    if not args.smoke:
        try:
            from workbench.capture.nvml import open_nvml
            nv = open_nvml()
            h = nv.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:
            result["errors"]["nvml"] = _err(exc)
    result["env"] = environment(torch, nv, h)
    log(f"env: {result['env']}")
    if nv is not None:
        result["power"] = power_info(nv, h)
        log(f"power: {result['power']}")

    dev = "cuda" if gpu_ok else "cpu"
    # ---- the workloads, built and warmed up before sampling (cuBLAS handle, graph, clocks) ----
    work: dict = {}
    T: dict = {}   # the big tensors, in one place so that memory_full can release them
    try:
        n_small = 1024
        x_small = torch.zeros(n_small, device=dev)
        work["tiny"] = lambda: x_small.add_(1.0)
        result["tiny"] = {"elements": n_small, "dtype": "float32", "kernel": "add_ (a couple of thread blocks)"}
        if gpu_ok:
            busy(torch, work["tiny"], 0.2, 1000)
            graph_kernels = 200
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    x_small.add_(1.0)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                for _ in range(graph_kernels):
                    x_small.add_(1.0)
            work["tiny_graph"] = g.replay
            busy(torch, g.replay, 0.2, 20)
            result["tiny"]["graph_kernels"] = graph_kernels
            result["tiny"]["eager_kernel_ms"] = cuda_time_ms(torch, lambda: [work["tiny"]() for _ in range(1000)])
            result["tiny"]["eager_kernel_ms"] /= 1000
            result["tiny"]["graph_kernel_ms"] = cuda_time_ms(torch, g.replay) / graph_kernels
        else:
            work["tiny_graph"] = lambda: [x_small.add_(1.0) for _ in range(20)]
    except Exception as exc:
        result["errors"]["tiny_setup"] = _err(exc)
        log(f"tiny setup failed: {exc}")
    try:
        n = 8192 if gpu_ok else 128
        dt = torch.bfloat16
        T["a"] = torch.randn(n, n, device=dev, dtype=dt)
        T["b"] = torch.randn(n, n, device=dev, dtype=dt)
        T["c"] = torch.empty(n, n, device=dev, dtype=dt)
        work["gemm"] = lambda: torch.matmul(T["a"], T["b"], out=T["c"])
        busy(torch, work["gemm"], 0.5 if gpu_ok else 0.05, 10)
        ms = cuda_time_ms(torch, work["gemm"])
        result["gemm"] = {"n": n, "dtype": "bfloat16", "ms": ms,
                          "tflops": (2 * n**3 / (ms * 1e-3) / 1e12) if ms else None}
    except Exception as exc:
        result["errors"]["gemm_setup"] = _err(exc)
        log(f"gemm setup failed: {exc}")
    try:
        nbytes = (2 << 30) if gpu_ok else (1 << 20)
        T["src"] = torch.empty(nbytes // 4, device=dev, dtype=torch.float32).normal_()
        T["dst"] = torch.empty_like(T["src"])
        work["copy"] = lambda: T["dst"].copy_(T["src"])
        busy(torch, work["copy"], 0.3 if gpu_ok else 0.05, 10)
        ms = cuda_time_ms(torch, work["copy"])
        result["copy"] = {"bytes": nbytes, "ms": ms,
                          "gb_per_s": (2 * nbytes / (ms * 1e-3) / 1e9) if ms else None}  # read + write
    except Exception as exc:
        result["errors"]["copy_setup"] = _err(exc)
        log(f"copy setup failed: {exc}")
    log(f"workloads ready: tiny={result.get('tiny')} gemm={result.get('gemm')} copy={result.get('copy')}")

    # ---- the sampler and the fast energy reader ----
    if args.smoke:
        from workbench import samples
        from workbench.capture.sampler import ReplaySampler
        sampler = ReplaySampler(samples.path("h200_gpm_session"), speed=2.0)
        sampler.t0_unix = time.time()
        fake = {"t0": time.perf_counter()}
        read_energy = lambda: int(100_000 * round(time.perf_counter() - fake["t0"], 1))   # 100 W, 0.1 s steps
        read_power = lambda: 100_000
        read_instant = lambda: 100_000
        result["instant_power"] = "smoke"
    else:
        from workbench.capture.nvml import NvmlSampler
        sampler = NvmlSampler(interval_s=0.05, gpus=[0], slow_interval_s=0.25, gpm=True, gpm_interval_s=0.1)
        read_energy = lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)
        read_power = lambda: nv.nvmlDeviceGetPowerUsage(h)
        read_instant, why = (None, "no NVML") if nv is None else instant_power_reader(nv, h)
        result["instant_power"] = "read" if read_instant is not None else f"not read: {why}"
    try:
        sampler.start()
    except Exception as exc:  # no NVML: say so in the JSON, and stop (there is nothing to record)
        result["errors"]["sampler_start"] = _err(exc)
        (out_dir / "h200_lesson13.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        log(f"sampler did not start: {exc}")
        return
    trace = None
    try:
        result["gpm_supported"] = bool(getattr(sampler, "gpm_supported", getattr(sampler, "has_gpm", False)))
        result["sampler_notes"] = list(getattr(sampler, "notes", []))
        if hasattr(sampler, "cadence"):
            result["cadence"] = sampler.cadence().to_dict("records")
        log(f"sampler started: gpm_supported={result['gpm_supported']} notes={result['sampler_notes']}")
        trace = EnergyTrace(read_energy, read_power, sampler.t0_unix, read_instant_mw=read_instant).start()
        boundary: dict = {}

        def boundary_read(name, which):
            try:
                t0 = time.perf_counter()
                e = read_energy()
                t1 = time.perf_counter()
                stamp = time.time() - (time.perf_counter() - (t0 + t1) / 2)
                boundary[(name, which)] = {"t_s": stamp - sampler.t0_unix, "energy_mj": int(e)}
            except Exception as exc:
                result["errors"][f"energy_{name}_{which}"] = _err(exc)

        phases: list[dict] = []
        big = {}

        def fill_memory(seconds):
            # release what the earlier phases cached, then one allocation to 92 % of the device
            for k in ("gemm", "copy"):
                work.pop(k, None)
            T.clear()
            if gpu_ok:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                free, total = torch.cuda.mem_get_info()
                used_nvml = nv.nvmlDeviceGetMemoryInfo(h).used if nv is not None else total - free
                want = int(0.92 * total) - used_nvml
                nbytes = max(0, min(want, free - (1 << 30)))
                info = {"free_before_bytes": free, "total_bytes": total, "nvml_used_before_bytes": used_nvml,
                        "target_fraction": 0.92}
                for frac in (1.0, 0.99, 0.98):
                    try:
                        big["t"] = torch.empty(int(nbytes * frac), dtype=torch.uint8, device="cuda")
                        info["allocated_bytes"] = int(nbytes * frac)
                        break
                    except torch.OutOfMemoryError as exc:
                        info.setdefault("oom", []).append(_err(exc))
                torch.cuda.synchronize()
                info["nvml_used_after_bytes"] = nv.nvmlDeviceGetMemoryInfo(h).used if nv is not None else None
                result["memory_full"] = info
                log(f"memory_full: {info}")
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                time.sleep(0.05)

        def run_tiny(seconds):
            result.setdefault("calls", {})["tiny_kernels"] = busy(torch, work["tiny"], seconds, 1000)

        def run_tiny_graph(seconds):
            result.setdefault("calls", {})["tiny_graph"] = busy(torch, work["tiny_graph"], seconds, 50)

        def run_gemm(seconds):
            result.setdefault("calls", {})["bf16_gemm"] = busy(torch, work["gemm"], seconds, 10)

        def run_copy(seconds):
            result.setdefault("calls", {})["copy"] = busy(torch, work["copy"], seconds, 10)

        def sleep(seconds):
            time.sleep(seconds)

        plan = [("idle", sleep, "nothing running"),
                ("tiny_kernels", run_tiny, "Python loop of tiny add_ kernels on 1024 floats (launch bound)"),
                ("tiny_graph", run_tiny_graph, "the same tiny kernels replayed from a CUDA graph"),
                ("bf16_gemm", run_gemm, "8192^3 bf16 matmuls"),
                ("copy", run_copy, "2 GiB device-to-device copies"),
                ("memory_full", fill_memory, "one allocation to 92% of the GPU's memory, no work"),
                ("idle_end", sleep, "memory released, nothing running")]
        need = {"tiny_kernels": "tiny", "tiny_graph": "tiny_graph", "bf16_gemm": "gemm", "copy": "copy"}
        for name, fn, what in plan:
            if name in need and need[name] not in work:
                result["skipped"].append({"phase": name, "why": "its setup failed"})
                continue
            if left_s() < phase_s + SAFETY_S:
                result["skipped"].append({"phase": name, "why": f"budget: {left_s():.1f} s left"})
                log(f"skip {name}: {left_s():.1f} s left")
                continue
            if name == "idle_end":
                big.pop("t", None)
                if gpu_ok:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            boundary_read(name, "start")
            start = sampler.mark(name)
            log(f"phase {name} at t={start:.2f}")
            try:
                fn(phase_s)
            except Exception as exc:
                result["errors"][f"phase_{name}"] = _err(exc)
                log(f"phase {name} failed: {exc}")
                traceback.print_exc()
            if gpu_ok:
                torch.cuda.synchronize()
            end = float(sampler._now()) if hasattr(sampler, "_now") else start + phase_s
            boundary_read(name, "end")
            phases.append({"name": name, "start_s": start, "end_s": end, "what": what})
        sampler.mark("end")
        time.sleep(0.3)
    finally:
        if trace is not None:
            trace.stop()
        sampler.stop()
        big.clear()
    result["phases"] = phases

    # ---- save and summarise ----
    frame = sampler.frame()
    session = out_dir / "h200_lesson13.session.jsonl.gz"
    try:
        if args.smoke:  # the replay's rows carry the replay's times; keep only what the phases covered
            frame = frame[frame.t_s <= (phases[-1]["end_s"] if phases else 0) + 0.3]
        from workbench.io.nvml import save_nvml_session
        save_nvml_session(frame, session, marks=sampler.marks())
        result["session"] = {"file": session.name, "rows": int(len(frame)), "bytes": session.stat().st_size,
                             "interval_s": 0.05, "gpm_interval_s": 0.1, "slow_interval_s": 0.25}
        log(f"session: {result['session']}")
    except Exception as exc:
        result["errors"]["session_save"] = _err(exc)
    if hasattr(sampler, "stats"):
        result["sampler_stats"] = sampler.stats()
    try:
        result["phase_stats"] = phase_stats(frame, phases)
    except Exception as exc:
        result["errors"]["phase_stats"] = _err(exc)
    try:
        result["energy"] = {
            "by_phase": energy_by_phase(trace, frame, phases, boundary),
            "counter_updates": counter_updates(trace.t, trace.energy_mj),
            "read_us_median": statistics.median(trace.read_us) if trace.read_us else None,
            "trace_errors": trace.errors, "trace_last_error": trace.last_error,
            "windows": window_errors(trace),
            "boundaries": [{"phase": k[0], "at": k[1], **v} for k, v in boundary.items()],
        }
        # how the counter moves over 2 s of the GEMM phase (full power), the 100 Hz look the lesson shows
        gemm = next((p for p in phases if p["name"] == "bf16_gemm"), None)
        if gemm:
            t0 = gemm["start_s"] + 2.0
            sel = [i for i, t in enumerate(trace.t) if t0 <= t <= t0 + 2.0]
            result["energy"]["gemm_2s"] = counter_updates([trace.t[i] for i in sel], [trace.energy_mj[i] for i in sel])
        with gzip.open(out_dir / "h200_lesson13_energy.json.gz", "wt") as f:
            fast = {"t_s": trace.t, "energy_mj": trace.energy_mj, "power_mw": trace.power_mw, "read_us": trace.read_us}
            if trace.instant_mw:
                fast["power_instant_mw"] = trace.instant_mw
            json.dump(fast, f, separators=(",", ":"))
        log(f"energy: {json.dumps({k: v for k, v in result['energy'].items() if k != 'by_phase'}, default=str)}")
    except Exception as exc:
        result["errors"]["energy"] = _err(exc)
        traceback.print_exc()
    result["elapsed_s"] = time.perf_counter() - T_START
    text = json.dumps(result, indent=1, default=str).replace(str(ROOT), "<repo>")
    (out_dir / "h200_lesson13.json").write_text(text + "\n")
    log(f"wrote {out_dir / 'h200_lesson13.json'} in {result['elapsed_s']:.1f} s; errors: {result['errors']}")


if __name__ == "__main__":
    main()

"""Findings: what is slowing a profiled step down, with the numbers behind it and a concrete fix.

Each rule reads tables from :mod:`workbench.analysis.trace` and returns at most one
:class:`Finding`. Ids: ``input_bound``, ``launch_bound``, ``sync_bound``, ``fp32_matmul``,
``memcpy_heavy`` (and ``cpu_only`` as information). Thresholds are module constants so that tests
and users can see them.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from workbench.analysis import trace as ta

__all__ = ["Finding", "findings", "trace_summary", "gemm_precision"]

SEVERITIES = ("info", "warning", "critical")

# thresholds (fractions of the GPU window unless said otherwise)
INPUT_BOUND_WARN, INPUT_BOUND_CRIT = 0.10, 0.40
LAUNCH_BOUND_WARN, LAUNCH_BOUND_CRIT = 0.05, 0.25
SYNC_BOUND_WARN, SYNC_BOUND_CRIT = 0.05, 0.25
FP32_MATMUL_WARN, FP32_MATMUL_CRIT = 0.10, 0.40  # share of kernel time
MEMCPY_WARN, MEMCPY_CRIT = 0.10, 0.30

# --- GEMM / convolution kernels and whether they use tensor cores --------------------------------
# Names seen from cuBLAS/cuBLASLt, CUTLASS, cuDNN and rocBLAS/Tensile: ampere_sgemm_*, volta_sgemm_*,
# cutlass_80_simt_sgemm_*, sm80_xmma_gemm_f32f32_..._ffma_* (SIMT fp32); cutlass_80_tensorop_s1688gemm_*,
# *_tf32f32_*, *h884*/*h1688*/*s884*, nvjet_* (Hopper cuBLASLt), *_bf16*, *wgmma*/*gmma* (tensor cores).
_GEMM_RE = re.compile(
    r"gemm|matmul|cublas|cutlass|xmma|nvjet|scudnn|hcudnn|implicit_?gemm|fprop|dgrad|wgrad|Cijk_", re.I
)
_TENSOR_CORE_RE = re.compile(
    r"tf32|bf16|f16|fp16|half|h884|h1688|h16816|s884|s1688|s16816|i8816|imma|hmma|tensorop|tensor\d|"
    r"wgmma|gmma|nvjet|e4m3|e5m2|fp8|int8|_hgemm|hcudnn|_MI\d+x\d+x\d+_?(?:HB|BB|HH|BS|HS)",
    re.I,
)
_FP32_RE = re.compile(r"sgemm|scudnn|_ffma_|f32f32_f32f32_f32|simt|gcgemm|cgemm", re.I)
# not GEMMs even though they say cutlass/cublas: attention, reductions, epilogues
_NOT_GEMM_RE = re.compile(r"fmha|attention|splitKreduce|epilogue|reduce_kernel|computeOffsets", re.I)


def gemm_precision(names: pd.Series) -> pd.Series:
    """For each kernel name: 'tensor_core' (a GEMM/convolution on tensor cores), 'fp32' (a GEMM/
    convolution on plain fp32 FMA units) or '' (not a GEMM/convolution, or unknown)."""
    s = pd.Series(names, dtype=object).astype(str)
    gemm = s.str.contains(_GEMM_RE) & ~s.str.contains(_NOT_GEMM_RE)
    tc = s.str.contains(_TENSOR_CORE_RE)
    fp32 = s.str.contains(_FP32_RE)
    out = np.where(gemm & tc, "tensor_core", np.where(gemm & fp32, "fp32", ""))
    return pd.Series(out, index=s.index)


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``id``, ``severity`` (info/warning/critical), a ``message`` that carries the
    numbers and the fix, and ``evidence`` (plain JSON-able numbers and names)."""

    id: str
    severity: str
    message: str
    evidence: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f} ms" if us >= 1e3 else f"{us:,.0f} us"


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _severity(x: float, warn: float, crit: float) -> str | None:
    if x >= crit:
        return "critical"
    if x >= warn:
        return "warning"
    return None


class _Context:
    """Tables computed once per trace and shared by the rules and the summary."""

    def __init__(self, trace):
        self.trace = trace
        self.ev = ta._events(trace)
        self.device = getattr(trace, "device", "unknown GPU")
        self.metadata = getattr(trace, "metadata", {}) or {}

    @cached_property
    def busy(self) -> ta.GpuBusy:
        return ta.gpu_busy(self.ev)

    @cached_property
    def gaps(self) -> pd.DataFrame:
        return ta.idle_gaps(self.ev)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        return ta.kernel_summary(self.ev)

    @cached_property
    def memcpy(self) -> pd.DataFrame:
        return ta.memcpy_summary(self.ev)

    @cached_property
    def breakdown(self) -> dict:
        return ta.temporal_breakdown(self.ev)

    @cached_property
    def launch(self) -> ta.LaunchStats:
        return ta.launch_stats(self.ev)

    @cached_property
    def steps(self) -> pd.DataFrame:
        return ta.step_summary(self.ev)

    def gap_us(self, cause: str) -> tuple[float, int]:
        g = self.gaps[self.gaps["cause"] == cause]
        return float(g["dur_us"].sum()), int(len(g))

    @property
    def heavy_profiling(self) -> bool:
        return bool(self.metadata.get("with_stack") or self.metadata.get("profile_memory"))


# ------------------------------------------------------------------------------------------- rules


def _input_bound(c: _Context) -> Finding | None:
    w = c.busy.window_us
    if c.busy.kernel_count == 0 or w <= 0:
        return None
    host_us, n = c.gap_us("host")
    frac = host_us / w
    sev = _severity(frac, INPUT_BOUND_WARN, INPUT_BOUND_CRIT)
    if sev is None:
        return None
    host_gaps = c.gaps[c.gaps["cause"] == "host"]
    largest = float(host_gaps["dur_us"].max())
    ann = c.ev[c.ev["cat"].isin(("user_annotation", "cpu_op"))]
    is_loader = ta._by_name(ann["name"], lambda s: s.str.contains("DataLoader|dataloader", regex=True)).astype(bool)
    loader_us = float(ann.loc[is_loader, "dur_us"].sum())
    ev = {
        "idle_fraction": round(c.busy.idle_fraction, 4),
        "host_idle_us": round(host_us, 1),
        "host_idle_fraction": round(frac, 4),
        "host_gap_count": n,
        "largest_gap_us": round(largest, 1),
        "window_us": round(w, 1),
        "dataloader_us": round(loader_us, 1),
        "heavy_profiling": c.heavy_profiling,
    }
    msg = (
        f"GPU idle {_pct(c.busy.idle_fraction)} of the {_ms(w)} profiled window; {_ms(host_us)} "
        f"({_pct(frac)}) of it in {n} gaps (largest {_ms(largest)}) while the host was neither launching "
        f"nor waiting on the GPU (Python, data loading, CPU ops)."
    )
    if loader_us > 0:
        msg += f" DataLoader calls took {_ms(loader_us)}."
    msg += (
        " Fix: overlap input with compute (DataLoader(num_workers>0, pin_memory=True, "
        "persistent_workers=True) and .to('cuda', non_blocking=True)), move preprocessing to the GPU, "
        "and cut per-step Python work (torch.compile, fewer host-side metrics/logging)."
    )
    if c.heavy_profiling:
        msg += (
            " This trace was recorded with with_stack/profile_memory, which slows the host: confirm with "
            "a light profile before optimizing."
        )
    return Finding("input_bound", sev, msg, ev)


def _launch_bound(c: _Context) -> Finding | None:
    w = c.busy.window_us
    ls = c.launch
    if ls.kernel_count == 0 or w <= 0:
        return None
    launch_us, n = c.gap_us("launch")
    frac = launch_us / w
    sev = _severity(frac, LAUNCH_BOUND_WARN, LAUNCH_BOUND_CRIT)
    if sev is None:
        return None
    ev = {
        "launch_idle_us": round(launch_us, 1),
        "launch_idle_fraction": round(frac, 4),
        "launch_gap_count": n,
        "kernel_count": ls.kernel_count,
        "kernels_per_ms": round(ls.kernels_per_ms, 2),
        "median_kernel_us": round(ls.median_kernel_us, 2),
        "short_kernel_fraction": round(ls.short_kernel_fraction, 4),
        "median_launch_us": round(ls.median_launch_us, 2) if not math.isnan(ls.median_launch_us) else None,
        "window_us": round(w, 1),
    }
    msg = (
        f"{ls.kernel_count} kernels, median {ls.median_kernel_us:.1f} us each ({_pct(ls.short_kernel_fraction)} "
        f"under {ta.SHORT_KERNEL_US:.0f} us); the GPU sat idle {_ms(launch_us)} ({_pct(frac)} of the window) "
        f"in {n} gaps where it waited for the host to dispatch and launch the next kernel (median launch call "
        f"{ls.median_launch_us:.1f} us)."
        " Fix: fewer, bigger kernels: torch.compile (mode='reduce-overhead' adds CUDA graphs), CUDA graphs "
        "for static shapes, fused optimizers (AdamW(fused=True) / foreach), larger batches."
    )
    return Finding("launch_bound", sev, msg, ev)


def _sync_bound(c: _Context) -> Finding | None:
    w = c.busy.window_us
    if c.busy.kernel_count == 0 or w <= 0:
        return None
    sync_gap_us, n = c.gap_us("sync")
    frac = sync_gap_us / w
    sev = _severity(frac, SYNC_BOUND_WARN, SYNC_BOUND_CRIT)
    if sev is None:
        return None
    host, parent, _ = ta._host_tree(c.ev)
    names = host["name"].astype(str).to_numpy()
    is_sync = ta._by_name(host["name"], lambda s: s.str.match(ta.SYNC_CALL_RE)).astype(bool)
    is_sync &= host["cat"].isin(ta.RUNTIME).to_numpy()
    sync_idx = np.flatnonzero(is_sync)
    sync_us = float(host["dur_us"].to_numpy()[sync_idx].sum())
    callers = pd.Series([names[p] if p >= 0 else "(no op)" for p in parent[sync_idx]]).value_counts()
    calls = pd.Series(names[sync_idx]).value_counts()
    nsteps = max(len(c.steps), 1)
    ev = {
        "sync_idle_us": round(sync_gap_us, 1),
        "sync_idle_fraction": round(frac, 4),
        "sync_gap_count": n,
        "sync_call_count": int(sync_idx.size),
        "sync_calls_per_step": round(sync_idx.size / nsteps, 2),
        "host_blocked_us": round(sync_us, 1),
        "calls": {str(k): int(v) for k, v in calls.head(5).items()},
        "callers": {str(k): int(v) for k, v in callers.head(5).items()},
        "window_us": round(w, 1),
    }
    top_callers = ", ".join(f"{k} x{v}" for k, v in list(ev["callers"].items())[:3])
    msg = (
        f"The GPU ran dry {n} times right when the host was blocked in a synchronizing call; those gaps "
        f"cost {_ms(sync_gap_us)} ({_pct(frac)} of the window). {sync_idx.size} blocking calls "
        f"({ev['sync_calls_per_step']} per step; from {top_callers or 'unknown ops'})."
        " Fix: drop .item()/.cpu()/.tolist()/print of GPU tensors inside the loop (accumulate metrics on "
        "the GPU and read them every N steps), use non_blocking=True copies from pinned memory, and avoid "
        "torch.cuda.synchronize() outside of timing code."
    )
    return Finding("sync_bound", sev, msg, ev)


def _fp32_matmul(c: _Context) -> Finding | None:
    k = c.kernels
    if k.empty:
        return None
    prec = gemm_precision(k["name"])
    total = float(k["total_us"].sum())
    fp32 = k[prec.to_numpy() == "fp32"]
    fp32_us = float(fp32["total_us"].sum())
    tc_us = float(k.loc[prec.to_numpy() == "tensor_core", "total_us"].sum())
    frac = fp32_us / total if total > 0 else 0.0
    sev = _severity(frac, FP32_MATMUL_WARN, FP32_MATMUL_CRIT)
    if sev is None:
        return None
    dev = c.device or ""
    no_tf32 = bool(re.search(r"V100|P100|T4|Turing|RTX 20|Quadro RTX|TITAN V|MI50|MI60|MI100", dev))
    ev = {
        "fp32_gemm_us": round(fp32_us, 1),
        "fp32_gemm_fraction": round(frac, 4),
        "fp32_gemm_kernels": int(fp32["count"].sum()),
        "tensor_core_gemm_us": round(tc_us, 1),
        "kernel_us": round(total, 1),
        "top_kernels": [str(n)[:120] for n in fp32["name"].head(3)],
        "device": dev,
    }
    msg = (
        f"{_pct(frac)} of GPU kernel time ({_ms(fp32_us)} in {ev['fp32_gemm_kernels']} launches) is matrix "
        f"multiply/convolution in plain fp32, without tensor cores (e.g. {ev['top_kernels'][0][:60]})."
    )
    if no_tf32:
        msg += (
            f" {dev} has no TF32: use mixed precision, torch.autocast('cuda', dtype=torch.float16) with "
            "torch.amp.GradScaler."
        )
    else:
        msg += (
            " Fix: allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 "
            "= True, or torch.set_float32_matmul_precision('high')), or use mixed precision "
            "(torch.autocast('cuda', dtype=torch.bfloat16)); on an H200 a transformer step went from 365 ms "
            "(fp32) to 123 ms (TF32) and 50 ms (bf16)."
        )
    return Finding("fp32_matmul", sev, msg, ev)


def _memcpy_heavy(c: _Context) -> Finding | None:
    w = c.busy.window_us
    m = c.memcpy
    if m.empty or w <= 0:
        return None
    mem_us = c.breakdown["memory_us"]  # copy time not hidden behind compute or communication
    frac = mem_us / w
    sev = _severity(frac, MEMCPY_WARN, MEMCPY_CRIT)
    if sev is None:
        return None
    by_kind = {
        str(r.kind): {"count": int(r.count), "total_us": round(float(r.total_us), 1), "bytes": int(r.bytes),
                      "gb_per_s": None if pd.isna(r.gb_per_s) else round(float(r.gb_per_s), 2),
                      "pageable_count": int(r.pageable_count)}
        for r in m.itertuples(index=False)
    }
    top = m.iloc[0]
    pageable = int(m["pageable_count"].sum())
    ev = {
        "memory_us": round(mem_us, 1),
        "memory_fraction": round(frac, 4),
        "by_kind": by_kind,
        "pageable_count": pageable,
        "window_us": round(w, 1),
    }
    msg = (
        f"Copies and memsets that nothing else overlapped took {_ms(mem_us)} ({_pct(frac)} of the window); "
        f"most of it {top['kind']} ({int(top['count'])} copies, {_ms(float(top['total_us']))}, "
        f"{float(top['bytes']) / 2**20:,.1f} MiB)."
    )
    if top["kind"] in ("HtoD", "DtoH"):
        msg += (
            " Fix: keep tensors on the GPU between steps, batch small transfers, and copy from pinned memory "
            "with non_blocking=True (DataLoader(pin_memory=True)) so copies overlap compute."
        )
        if pageable:
            msg += f" {pageable} copies used pageable host memory, which is slow and blocks the host."
    else:
        msg += (
            " Fix: device-to-device copies come from .contiguous(), torch.cat, .clone() and dtype casts: "
            "avoid layout changes in the hot loop, preallocate and write in place, or let torch.compile fuse them."
        )
    return Finding("memcpy_heavy", sev, msg, ev)


def _cpu_only(c: _Context) -> Finding | None:
    if c.busy.kernel_count or not len(c.ev):
        return None
    if bool(c.ev["cat"].isin(ta.GPU_ACTIVITY).any()):
        return None
    n_runtime = int(c.ev["cat"].isin(ta.RUNTIME).sum())
    if n_runtime:
        msg = (
            f"The host made {n_runtime} CUDA runtime/driver calls but the trace holds no GPU kernel activity "
            "(CUDA activity was not recorded, or this is a counter-range trace), so GPU findings do not apply. "
            "To see GPU time, profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]."
        )
    else:
        msg = (
            "This trace has no GPU activity: only the op table applies. To see GPU time, profile on a CUDA "
            "device with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]."
        )
    return Finding("cpu_only", "info", msg, {"x_events": int(len(c.ev)), "runtime_calls": n_runtime})


_RULES = (_input_bound, _launch_bound, _sync_bound, _fp32_matmul, _memcpy_heavy, _cpu_only)
_ORDER = {"critical": 0, "warning": 1, "info": 2}


def _run_rules(c: _Context) -> list[Finding]:
    out = [f for f in (rule(c) for rule in _RULES) if f is not None]
    return sorted(out, key=lambda f: _ORDER[f.severity])


def findings(trace) -> list[Finding]:
    """Diagnoses of one trace, most severe first."""
    return _run_rules(_Context(trace))


# ------------------------------------------------------------------------------------------- summary


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict]:
    return [_jsonable(dict(zip(cols, row))) for row in df[cols].itertuples(index=False, name=None)]


def trace_summary(trace, top: int = 10) -> dict:
    """The ``workbench trace --json`` document (every key in docs/json.md): source, gpu, breakdown, top_kernels,
    top_ops, findings; plus steps, memcpy, launch and idle_gaps."""
    c = _Context(trace)
    busy = c.busy
    ops = ta.op_summary(c.ev)
    gaps = c.gaps
    by_cause = gaps.groupby("cause")["dur_us"].agg(["count", "sum"]) if len(gaps) else None
    return _jsonable(
        {
            "source": {
                "path": getattr(trace, "path", None),
                "device": c.device,
                "events": int(getattr(trace, "n_events", len(c.ev))),
                "rank": getattr(trace, "rank", None),
            },
            "gpu": {
                "busy_us": busy.busy_us,
                "idle_us": busy.idle_us,
                "idle_fraction": busy.idle_fraction,
                "kernel_count": busy.kernel_count,
                "window_us": busy.window_us,
            },
            "breakdown": dict(c.breakdown),
            "top_kernels": _records(c.kernels.head(top), ["name", "count", "total_us", "percent", "mean_us"]),
            "top_ops": _records(
                ops.head(top),
                ["name", "count", "cpu_total_us", "cpu_self_us", "device_total_us", "device_self_us"],
            ),
            "findings": [f.as_dict() for f in _run_rules(c)],
            "steps": _records(c.steps, list(c.steps.columns)),
            "memcpy": _records(c.memcpy, list(c.memcpy.columns)),
            "launch": c.launch.as_dict(),
            "idle_gaps": {
                "count": int(len(gaps)),
                "by_cause_us": {} if by_cause is None else {str(k): float(v) for k, v in by_cause["sum"].items()},
            },
        }
    )

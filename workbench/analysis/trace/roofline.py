"""Roofline and MFU: how close each kernel, each op and the whole step come to what the GPU can do.

From the per-kernel FLOPs and bytes of :mod:`workbench.analysis.trace.flops` and a :class:`~workbench.analysis.trace.peaks.Peak`
(the datasheet row matched on the trace's device name, user overrides, or measured ceilings):

* per kernel name and per op name: achieved TFLOP/s (``flops / time``), GB/s (``bytes / time``),
  arithmetic intensity (FLOPs per byte), the roof at that intensity
  (``min(peak_tflops[dtype], intensity * peak_gbps)``), ``bound`` (``compute`` at or right of the ridge
  point ``peak_tflops / peak_gbps``, else ``memory``) and ``roofline_fraction`` (achieved / roof; for
  copies without FLOPs: GB/s / peak GB/s);
* the step: model FLOPs per step (GEMMs, convolutions, attention: what ``6·N·tokens`` + attention counts),
  achieved TFLOP/s and MFU = model FLOPs / step time / peak of the dtype that carries the most model FLOPs.
  The step time used for ``mfu`` is, in this order: the one given (``step_ms=``), the unprofiled time the
  capture measured (trace metadata ``workbench_unprofiled_step_ms``), the diagnosis' estimate of the step
  without the profiler. ``mfu_trace`` always uses the trace's own (profiled) step time.
* :func:`precision_what_ifs`: the step with the fp32 GEMMs (and convolutions) on TF32, and with bf16
  autocast (GEMMs, convolutions and fp32 attention in bf16), each kernel assumed to reach the same
  fraction of its new roof as of its old one, replayed on the step model
  (:func:`workbench.analysis.trace.diagnosis.gpu_what_if`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis.trace.flops import TraceCosts, trace_costs
from workbench.analysis.trace.peaks import DTYPES, Peak, conv_speedups, peak_for

__all__ = ["Roofline", "roofline", "precision_what_ifs", "attainable_tflops", "TABLE_COLUMNS", "summary_text",
           "display_table"]

TABLE_COLUMNS = ["costed_us", "flops", "bytes", "tflops", "gbps", "intensity", "bound", "roofline_fraction"]


def attainable_tflops(peak: Peak, dtype: str | None, intensity) -> np.ndarray:
    """The roof at ``intensity`` FLOPs/byte: min(compute peak of ``dtype``, intensity x bandwidth)."""
    comp = peak.compute(dtype)
    comp = np.nan if comp is None else comp
    return np.minimum(comp, np.asarray(intensity, float) * peak.gbps / 1e3)


def _device_props(trace) -> dict | None:
    md = getattr(trace, "metadata", {}) or {}
    props = md.get("deviceProperties") or []
    return props[0] if props and isinstance(props[0], dict) else None


def _rates(df: pd.DataFrame, peak: Peak | None, time_col: str) -> pd.DataFrame:
    t = df[time_col].to_numpy(float)
    f = df["flops"].to_numpy(float)
    b = df["bytes"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["tflops"] = np.where(t > 0, f / t / 1e6, np.nan)
        df["gbps"] = np.where(t > 0, b / t / 1e3, np.nan)
        df["intensity"] = np.where(b > 0, f / b, np.nan)
    df.loc[f <= 0, "tflops"] = np.nan
    df.loc[b <= 0, "gbps"] = np.nan
    if peak is None:
        df["bound"] = ""
        df["roofline_fraction"] = np.nan
        return df
    comp = np.array([peak.compute(d or None) or np.nan for d in df["dtype"]], float)
    ridge = comp * 1e3 / peak.gbps if peak.gbps and math.isfinite(peak.gbps) else np.full(len(df), np.nan)
    inten = df["intensity"].to_numpy(float)
    roof = np.minimum(comp, inten * peak.gbps / 1e3)
    df["bound"] = np.where(np.isnan(inten), np.where(b > 0, "memory", ""), np.where(inten >= ridge, "compute", "memory"))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(f > 0, df["tflops"].to_numpy(float) / roof,
                        np.where(b > 0, df["gbps"].to_numpy(float) / peak.gbps, np.nan))
    df["roofline_fraction"] = frac
    return df


def _dominant(df: pd.DataFrame, key: str) -> dict:
    """Per ``key`` (as text): the dtype with the most FLOPs (or time when nothing has FLOPs)."""
    return _top_per_key(df, key, "dtype", np.where(df["flops"] > 0, df["flops"], df["dur_us"] * 1e-9))


def _top_per_key(df: pd.DataFrame, key: str, col: str, w: np.ndarray) -> dict:
    """``{str(key value): the value of col whose rows' w sum most}``; on a tie the (key, value) pair met
    first in row order wins. Rows with a missing key or value count for none."""
    kc, keys = pd.factorize(df[key])
    vc, vals = pd.factorize(df[col])
    ok = (kc >= 0) & (vc >= 0)
    kc, vc, w = kc[ok].astype(np.int64), vc[ok].astype(np.int64), np.asarray(w, dtype=np.float64)[ok]
    if not kc.size:
        return {}
    pair, _ = pd.factorize(kc * len(vals) + vc)  # the (key, value) pairs in the order they are met
    sums = pd.Series(w).groupby(pair, sort=False).sum().to_numpy()
    first = np.unique(pair, return_index=True)[1]
    order = np.argsort(-sums, kind="stable")  # largest first, ties in the order met
    pair_key = kc[first][order]
    win = order[np.unique(pair_key, return_index=True)[1]]  # each key's first pair in that order
    return {str(keys[k]): str(vals[v]) for k, v in zip(kc[first][win].tolist(), vc[first][win].tolist())}


def _table(gpu: pd.DataFrame, key: str, peak: Peak | None) -> pd.DataFrame:
    gpu = gpu.assign(_costed=np.where((gpu["flops"] > 0) | (gpu["bytes"] > 0), gpu["dur_us"], 0.0))
    g = gpu.groupby(key, observed=True, sort=False)
    # kernels: launches; ops: calls (one call may launch several kernels)
    count = g["op_row"].nunique() if key == "op" else g.size()
    out = pd.DataFrame({
        "count": count, "total_us": g["dur_us"].sum(), "costed_us": g["_costed"].sum(),
        "flops": g["flops"].sum(), "bytes": g["bytes"].sum(),
    }).reset_index()
    out[key] = out[key].astype(str)
    out["dtype"] = out[key].map(_dominant(gpu, key)).fillna("").astype(str)
    # the kind that carries most of each row's time
    out["kind"] = out[key].map(_top_per_key(gpu, key, "kind", gpu["dur_us"].to_numpy(np.float64))).fillna("").astype(str)
    # rates over the launches that got a cost (a kernel launched before the trace began has none)
    out = _rates(out, peak, "costed_us")
    return out.sort_values(["total_us", key], ascending=[False, True], ignore_index=True)


@dataclass
class Roofline:
    """A trace's roofline: ``kernels`` (per kernel name), ``ops`` (per op name, the op whose FLOPs the
    kernels got), the step figures (``as_dict()``: the ``roofline`` block of ``workbench trace --json``)."""

    peak: Peak | None
    costs: TraceCosts
    kernels: pd.DataFrame
    ops: pd.DataFrame
    step: dict
    notes: list = field(default_factory=list)
    measured: Peak | None = None

    def as_dict(self) -> dict:
        p = self.peak
        cov = self.costs.coverage()
        d = {
            "device": p.name if p else None,
            "peak_source": p.source if p else None,
            "peak_tflops": ({k: p.tflops[k] for k in DTYPES if k in p.tflops} if p else {}),
            "peak_gbps": p.gbps if p else None,
            "has_shapes": self.costs.has_shapes,
            **self.step,
            "flops_coverage": cov["flops_fraction"],
            "costed_coverage": cov["costed_fraction"],
            "matched_kernel_fraction": cov["matched_fraction"],
            "notes": list(self.notes),
        }
        if self.measured is not None:
            d["measured_peak_tflops"] = dict(self.measured.tflops)
            d["measured_peak_gbps"] = self.measured.gbps
        return d


def _step_times(trace, step_ms: float | None, diagnosis) -> dict:
    md = getattr(trace, "metadata", {}) or {}
    out = {"step_ms_trace": None, "step_ms": None, "step_ms_source": None}
    if diagnosis is not None:
        out["step_ms_trace"] = diagnosis.step_ms
    measured = md.get("workbench_unprofiled_step_ms")
    try:
        measured = float(measured) if measured is not None else None
    except (TypeError, ValueError):
        measured = None
    if step_ms is not None:
        out["step_ms"], out["step_ms_source"] = float(step_ms), "given"
    elif measured:
        out["step_ms"], out["step_ms_source"] = measured, "measured without the profiler (trace metadata)"
    elif diagnosis is not None:
        out["step_ms"] = diagnosis.step_ms_unprofiled
        out["step_ms_source"] = ("the trace's step without the profiler, estimated by the diagnosis"
                                 if diagnosis.step_ms_unprofiled < diagnosis.step_ms else "the trace's step time")
    return out


_DIAGNOSE = object()  # roofline(diagnosis=...) not given: diagnose the trace here


def roofline(trace, peak: Peak | None = None, override: dict | None = None, step_ms: float | None = None,
             costs: TraceCosts | None = None, diagnosis=_DIAGNOSE, measured: Peak | dict | None = None) -> Roofline:
    """The roofline of ``trace`` (see the module docstring). ``peak``: a Peak to use as is; else the
    datasheet row matched on the trace's device with ``override`` ({dtype: TFLOP/s, "gbps": GB/s}) on top.
    ``step_ms``: the step time MFU is computed on (e.g. timed without the profiler). ``measured``: measured
    ceilings (a Peak or the JSON of :func:`workbench.capture.ceilings.measure_ceilings`), reported beside.
    ``diagnosis``: the trace's :func:`~workbench.analysis.trace.diagnosis.diagnose` result when already made
    (None included: a trace without one); not given, the trace is diagnosed here
    (:class:`~workbench.analysis.trace.analysis.TraceAnalysis` passes its own)."""
    from workbench.analysis.trace.diagnosis import diagnose
    from workbench.analysis.trace.peaks import peak_from_ceilings

    costs = costs or trace_costs(trace)
    device = getattr(trace, "device", None)
    if peak is None:
        peak = peak_for(device, _device_props(trace), override)
    if isinstance(measured, dict):
        measured = peak_from_ceilings(measured)
    notes = list(costs.notes)
    if peak is None and device not in (None, "cpu"):
        notes.append(f"no peak table row for {device!r}: pass peaks (workbench trace --peak bf16=TFLOPS "
                     "--peak gbps=GBPS, or roofline(trace, override={...}))")
    gpu = costs.gpu
    kernels = _table(gpu[gpu["cat"] == "kernel"], "name", peak)
    with_op = gpu[gpu["op"].notna()]
    ops = _table(with_op, "op", peak).rename(columns={"op": "name"})
    if diagnosis is _DIAGNOSE:
        diagnosis = diagnose(trace) if len(gpu) else None
    times = _step_times(trace, step_ms, diagnosis)
    model = costs.model_flops_per_step()
    dtype = costs.dominant_dtype()
    comp = peak.compute(dtype) if (peak is not None and dtype) else None
    step = {"model_flops": model, "flops": costs.flops_per_step(), "dtype": dtype,
            "peak_tflops_dtype": comp, **times}

    def tf(ms):
        return model / (ms * 1e-3) / 1e12 if ms and model > 0 else None

    step["achieved_tflops"] = tf(times["step_ms"])
    step["achieved_tflops_trace"] = tf(times["step_ms_trace"])
    step["mfu"] = step["achieved_tflops"] / comp if (comp and step["achieved_tflops"]) else None
    step["mfu_trace"] = step["achieved_tflops_trace"] / comp if (comp and step["achieved_tflops_trace"]) else None
    mk = gpu[gpu["model"]]
    busy_us = float(mk["dur_us"].sum()) / max(costs.n_steps, 1)
    step["model_kernel_ms"] = busy_us / 1e3 if len(mk) else None
    step["model_kernel_tflops"] = (float(mk["flops"].sum()) / max(costs.n_steps, 1)) / busy_us / 1e6 if busy_us > 0 else None
    if costs.has_shapes and model == 0:
        notes.append("no GEMM, convolution or attention op with FLOPs found: MFU is not defined for this trace")
    return Roofline(peak, costs, kernels, ops, step, notes, measured)


# ----------------------------------------------------------------------------------------- what-ifs


def _scaled_durations(rl: Roofline, sel: np.ndarray, target: str, bytes_factor: float) -> np.ndarray:
    """New durations of the selected GPU rows on ``target``: the same fraction of the new roof.
    ``bytes_factor``: how many times fewer bytes each row moves on ``target`` (2 for 16-bit operands), so its
    FLOPs per byte grow by that factor."""
    g = rl.costs.gpu
    p = rl.peak
    f = g["flops"].to_numpy(float)[sel]
    b = g["bytes"].to_numpy(float)[sel]
    d = g["dur_us"].to_numpy(float)[sel]
    inten = np.where(b > 0, f / np.where(b > 0, b, 1.0), np.inf)
    old = np.array([attainable_tflops(p, dt, i) for dt, i in zip(g["dtype"].to_numpy()[sel], inten)], float)
    new = attainable_tflops(p, target, inten * bytes_factor)
    return d * old / new


def precision_what_ifs(trace, rl: Roofline | None = None, graph=None) -> dict:
    """``{"tf32": WhatIf, "bf16": WhatIf}`` for the fp32 GEMMs/convolutions of ``trace`` (empty when the
    trace has none with FLOPs, or no peak is known; ``fp16`` instead of ``bf16`` on GPUs without bf16), and
    ``"bf16_channels_last"`` where the step has convolutions and their speed-ups on this GPU were measured
    (:data:`~workbench.analysis.trace.peaks.CONV_SPEEDUPS`: convolutions take those instead of the GEMM roof).
    See the module docstring for the model. ``graph``: the step model's graph when already built."""
    from workbench.analysis.trace.diagnosis import gpu_what_ifs

    rl = rl or roofline(trace)
    g = rl.costs.gpu
    p = rl.peak
    if p is None or g.empty:
        return {}
    fp32 = (g["dtype"].to_numpy() == "fp32") & (g["flops"].to_numpy() > 0)
    gemm = fp32 & np.isin(g["kind"].to_numpy(), ("gemm", "conv"))
    attn = fp32 & (g["kind"].to_numpy() == "attention")
    if not gemm.any():
        return {}
    rows = g["ev_row"].to_numpy()
    n = max(rl.costs.n_steps, 1)
    gemm_ms = float(g.loc[gemm, "dur_us"].sum()) / n / 1e3
    # convolutions: the speed-ups measured for this GPU's convolutions (peaks.CONV_SPEEDUPS), where known
    conv_gain = conv_speedups(getattr(trace, "device", None) or p.matched or p.name)
    is_conv = g["kind"].to_numpy() == "conv"
    dur = g["dur_us"].to_numpy(float)

    def with_conv(sel: np.ndarray, new: np.ndarray, key: str) -> tuple[np.ndarray, str]:
        conv = is_conv[sel]
        if conv_gain is None or not conv.any():
            return new, ""
        new = new.copy()
        new[conv] = dur[sel][conv] / conv_gain[key]
        return new, (f"; convolutions {conv_gain[key]:.2f}x faster than strict fp32 ({key.replace('_', ' ')}: "
                     f"{conv_gain['source']})")

    scenarios = []
    if "tf32" in p.tflops:
        new, conv_how = with_conv(gemm, _scaled_durations(rl, gemm, "tf32", 1.0), "tf32")
        scenarios.append((
            "tf32", rows[gemm], new,
            f"fp32 GEMMs/convolutions on TF32 tensor cores at the fraction of the roof they reach now "
            f"({p.name}: fp32 {p.tflops.get('fp32')} -> tf32 {p.tflops['tf32']} TFLOP/s, {p.source}){conv_how}",
            {"fp32_gemm_ms_per_step": round(gemm_ms, 3),
             "predicted_gemm_ms_per_step": round(float(new.sum()) / n / 1e3, 3)}))
    half = "bf16" if "bf16" in p.tflops else ("fp16" if "fp16" in p.tflops else None)
    if half:
        sel = gemm | attn
        scaled = _scaled_durations(rl, sel, half, 2.0)
        layouts = [("", "bf16_nchw")]
        if conv_gain is not None and (is_conv & sel).any():
            layouts.append(("_channels_last", "bf16_nhwc"))
        for suffix, key in layouts:
            new, conv_how = with_conv(sel, scaled, key)
            cl = " with channels_last model and inputs" if suffix else ""
            scenarios.append((
                half + suffix, rows[sel], new,
                f"{half} autocast{cl}: fp32 GEMMs/convolutions and attention in {half} at the fraction of the roof "
                f"they reach now ({p.name}: {half} {p.tflops[half]} TFLOP/s, {p.source}){conv_how}; elementwise "
                "work, normalisation and the optimizer unchanged",
                {"fp32_gemm_and_attention_ms_per_step": round(float(g.loc[sel, "dur_us"].sum()) / n / 1e3, 3),
                 "predicted_ms_per_step": round(float(new.sum()) / n / 1e3, 3)}))
    return {w.cause: w for w in gpu_what_ifs(trace, scenarios, graph=graph)}


def summary_text(rl: dict | Roofline) -> str:
    """One sentence for a report or the CLI: model FLOPs, coverage, achieved TFLOP/s and MFU with the step
    time they are computed on (``rl``: a Roofline or its ``as_dict()``, the ``roofline`` JSON block)."""
    if isinstance(rl, Roofline):
        rl = rl.as_dict()
    if not rl.get("has_shapes"):
        return "Roofline: " + "; ".join(rl.get("notes") or ["no FLOPs"]) + "."
    if not rl.get("model_flops"):
        return "Roofline: no GEMM, convolution or attention FLOPs in this trace."
    text = (f"Roofline: {_flop_text(rl['model_flops'])} of model FLOPs a step ({rl.get('dtype')}); "
            f"{100 * rl['flops_coverage']:.0f}% of kernel time has FLOPs")
    if rl.get("achieved_tflops") and rl.get("step_ms"):
        text += f"; {_rate_text(rl['achieved_tflops'])} over a {rl['step_ms']:,.2f} ms step ({rl['step_ms_source']})"
    if rl.get("mfu") is not None and rl.get("device"):
        text += f", MFU {_pct_text(rl['mfu'])} of {rl['device']}'s {rl['peak_tflops_dtype']:,.1f} TFLOP/s {rl.get('dtype')}"
        if rl.get("mfu_trace") is not None:
            text += f" ({_pct_text(rl['mfu_trace'])} on the profiled {rl['step_ms_trace']:,.2f} ms step)"
    elif not rl.get("device"):
        text += "; no peak known for this GPU (give one: --peak bf16=TFLOPS --peak gbps=GBPS)"
    return text + "."


def _flop_text(f: float) -> str:
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if f >= scale:
            return f"{f / scale:,.3f} {unit}"
    return f"{f:,.0f} FLOP"


def _rate_text(tflops: float) -> str:
    return f"{tflops:,.1f} TFLOP/s" if tflops >= 0.1 else f"{tflops * 1e3:,.2f} GFLOP/s"


def _pct_text(x: float) -> str:
    return f"{100 * x:.1f}%" if x >= 0.001 else f"{100 * x:.3f}%"


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """A roofline table (``Roofline.ops`` or ``.kernels``) as panels and reports show it: units in the headers."""
    if table is None or table.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "name": table["name"].astype(str),
        "calls": table["count"].astype("int64"),
        "GPU time (ms)": table["total_us"].to_numpy(float) / 1e3,
        "dtype": table["dtype"].astype(str),
        "kind": table["kind"].astype(str),
        "TFLOP/s": table["tflops"].to_numpy(float),
        "GB/s": table["gbps"].to_numpy(float),
        "FLOP/byte": table["intensity"].to_numpy(float),
        "bound": table["bound"].astype(str),
        "% of roof": 100 * table["roofline_fraction"].to_numpy(float),
    })


DISPLAY_FORMATS = {"GPU time (ms)": "{:,.3f}", "TFLOP/s": "{:,.1f}", "GB/s": "{:,.0f}", "FLOP/byte": "{:,.2f}",
                   "% of roof": "{:.0f}"}

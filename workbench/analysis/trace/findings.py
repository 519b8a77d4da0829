"""Findings: what is slowing a profiled step down, with the numbers behind it and a concrete fix.

Each rule reads one :class:`~workbench.analysis.trace.analysis.TraceAnalysis` (its tables, diagnosis and
roofline, computed once per trace) and returns at most one :class:`~workbench.analysis.findings.Finding`; ``TraceAnalysis.findings``
runs them (:func:`run_rules`). Ids: ``input_bound``, ``launch_bound``, ``sync_bound``, ``fp32_matmul``,
``memcpy_heavy``, ``graph_breaks``, ``recompiles``, ``compile_cost`` (torch.compile, docs/compile.md) and
``cpu_only`` as information. Thresholds are module constants so that tests
and users can see them.
"""

from __future__ import annotations

import re
from functools import partial

import numpy as np
import pandas as pd

from workbench.analysis.trace import step_model as sm
from workbench.analysis.trace import tables as ta
from workbench.analysis.findings import Finding, severity_rank
from workbench.analysis.trace.kernel_names import gemm_precision
from workbench.units import format_ms, format_pct


__all__ = ["run_rules"]

# thresholds (fractions of the GPU window unless said otherwise)
FP32_MATMUL_WARN, FP32_MATMUL_CRIT = 0.10, 0.40  # share of kernel time

_ms = partial(format_ms, decimals=1, small_in_us=True)  # "95.0 ms", "812 us"
_pct = partial(format_pct, decimals=0)  # "53%"


def _severity(x: float, warn: float, crit: float) -> str | None:
    if x >= crit:
        return "critical"
    if x >= warn:
        return "warning"
    return None


# ------------------------------------------------------------------------------------------- rules


# Findings from the step model: each cause's what-if (workbench.analysis.trace.diagnosis) decides whether it
# is reported and how severe it is; the message says what the fix would save.
WHATIF_WARN, WHATIF_CRIT = 0.10, 0.25   # saved share of the step: warning, critical
WHATIF_INFO = 0.03                       # smaller savings are not reported


def _whatif_severity(saved: float) -> str | None:
    if saved >= WHATIF_CRIT:
        return "critical"
    if saved >= WHATIF_WARN:
        return "warning"
    if saved >= WHATIF_INFO:
        return "info"
    return None


def _saves(w) -> str:
    return (f"fixing it would take the step from {w.step_ms:,.2f} ms to {w.step_ms_if_fixed:,.2f} ms "
            f"(saves {_pct(w.saved_fraction)})")


def _with_whatif(fid: str, w, msg: str, evidence: dict) -> Finding | None:
    sev = _whatif_severity(w.saved_fraction)
    if sev is None:
        return None
    ev = dict(evidence)
    ev.update({k: v for k, v in w.evidence.items() if k not in ev})
    return Finding(fid, sev, msg, ev, what_if=w.as_dict())


def _profiler_overhead(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    w = d.what_if("profiler") if d else None
    if w is None:
        return None
    how = "measured when the trace was captured" if w.measured else "estimated from the recorded events"
    idle = "host time" if c.cpu_only else "idle GPU time"
    msg = (
        f"The profiler's own host work makes this trace's step {w.step_ms:,.2f} ms; without the profiler it "
        f"would take about {w.step_ms_if_fixed:,.2f} ms ({how}; saves {_pct(w.saved_fraction)}), so {idle} "
        f"seen here is partly the profiler's. Recorded at {d.detail} detail."
    )
    if d.bound == "profiler":
        msg += " Without the profiler nothing outside the kernels limits the step."
    clock = "time.perf_counter()" if c.cpu_only else "CUDA events"
    msg += (" Fix: re-profile with profile_steps(step, detail='light') (no shapes, memory or stacks) and time the "
            f"step without the profiler ({clock}) before optimizing host code.")
    return _with_whatif("profiler_overhead", w, msg, {"window_us": round(c.busy.window_us, 1)})


def _input_bound(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    w = d.what_if("input") if d else None
    if w is None:
        return None
    if c.cpu_only and w.evidence.get("loader") == "workers":
        msg = (f"The main process waited {w.evidence['dataloader_per_step_us'] / 1e3:,.2f} ms of each "
               f"{w.step_ms:,.2f} ms step for its DataLoader workers; {_saves(w)} if batches were ready. Fix: "
               "more workers (num_workers), a larger prefetch_factor, or cheaper loading per batch.")
        return _with_whatif("input_bound", w, msg, {})
    if c.cpu_only:
        k = w.evidence["workers"]
        per = w.evidence.get("step_ms_with_workers", {})
        msg = (
            f"Data loading on the main process (DataLoader with num_workers=0) took "
            f"{w.evidence['dataloader_per_step_us'] / 1e3:,.2f} ms of each {w.step_ms:,.2f} ms step; {_saves(w)} with "
            f"{k} loader worker{'s' if k > 1 else ''}. Fix: DataLoader(num_workers={k}, persistent_workers=True)"
            + (f" (predicted step: {', '.join(f'{n} worker{chr(115) if n != chr(49) else str()} {v:,.2f} ms' for n, v in per.items())})" if per else "")
            + "; workers help when loading waits on I/O or the host has a free core for each."
        )
        return _with_whatif("input_bound", w, msg, {})
    msg = (
        f"Data loading on the main process took {w.evidence['dataloader_per_step_us'] / 1e3:,.2f} ms a step while the "
        f"GPU waited; {_saves(w)}. Fix: overlap input with compute: DataLoader(num_workers>="
        f"{w.evidence['workers_needed']}, pin_memory=True, persistent_workers=True) and .to('cuda', "
        "non_blocking=True); or move preprocessing to the GPU."
    )
    return _with_whatif("input_bound", w, msg, {})


def _host_bound(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    w = d.what_if("host") if d else None
    if w is None:
        return None
    msg = (
        f"The host spends {w.evidence['host_work_per_step_us'] / 1e3:,.2f} ms a step in Python/CPU work between kernel "
        f"launches (not data loading) while the GPU waits; {_saves(w)} if that work left the step. Fix: "
        "move per-step host work out of the loop (metrics, logging, Python bookkeeping), torch.compile the "
        "model, or make the GPU work per step larger (batch size)."
    )
    return _with_whatif("host_bound", w, msg, {})


def _launch_bound(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    w = d.what_if("launch") if d else None
    if w is None:
        return None
    ls = c.launch
    owners = launch_owners_per_step(c)
    for o in owners[:5]:
        fw = optimizer_fused_what_if(c, o["owner"], o["launches_per_step"])
        if fw is not None:
            o["what_if"] = fw
    said = "; ".join(f"{o['owner']} {o['launches_per_step']:,.0f} ({o['fix']}"
                     + (f": about {o['what_if'].step_ms_if_fixed:,.2f} ms a step, saves {_pct(o['what_if'].saved_fraction)}"
                        if o.get("what_if") else "") + ")" for o in owners[:3])
    msg = (
        f"{w.evidence['launches_per_step']:,.0f} kernel launches a step (median kernel {ls.median_kernel_us:.1f} us, "
        f"{_pct(ls.short_kernel_fraction)} under {ta.SHORT_KERNEL_US:.0f} us): the GPU waits for the host to "
        f"dispatch and launch each one; {_saves(w)} with free launches."
        + (f" Launches a step by the op that issues them: {said}." if said else "")
        + " Fix: CUDA graphs (torch.compile(mode='reduce-overhead') or torch.cuda.graphs for static shapes), "
        "fused/foreach ops (AdamW(fused=True)), fewer, bigger kernels."
    )
    return _with_whatif("launch_bound", w, msg, {"kernel_count": ls.kernel_count,
                                                 "median_kernel_us": round(ls.median_kernel_us, 2),
                                                 # {owner: {launches_per_step, gpu_ms_per_step, fix}}
                                                 "owners": {o["owner"]: {**{k: o[k] for k in ("launches_per_step",
                                                                                         "gpu_ms_per_step", "fix")},
                                                                  **({"step_ms_if_fixed": round(float(o["what_if"].step_ms_if_fixed), 4),
                                                                      "saved_fraction": round(float(o["what_if"].saved_fraction), 4)}
                                                                     if o.get("what_if") else {})}
                                                            for o in owners[:5]}})


_OPTIMIZER_RE = re.compile(r"^Optimizer\.step#(\w+)\.step")


PER_PARAMETER_LAUNCHES = 50  # an optimizer step launching more kernels a step than this loops over parameters
# (foreach/fused AdamW launched 8-24 a step in the H200 recordings; a per-parameter loop launches ~10 per parameter)


def _owner_fix(owner: str, launches: float = 0.0) -> str:
    m = _OPTIMIZER_RE.match(owner)
    if m and launches <= PER_PARAMETER_LAUNCHES:
        return "few launches already (fused or foreach)"
    if m:
        opt = m.group(1)
        fused = opt in ("Adam", "AdamW", "SGD", "Adagrad")
        return (f"{opt}(..., fused=True)" if fused else f"{opt}(..., foreach=True)") + ": one kernel for all parameters"
    if owner.startswith("Optimizer.zero_grad"):
        return "zero_grad(set_to_none=True): no memset per parameter"
    if owner == "backward (autograd)":
        return "torch.compile the model: fused kernels in the backward too"
    if owner == "eager ops":
        return "eager forward/loss ops, one launch each: torch.compile or a CUDA graph of the step"
    return "torch.compile it, or capture the step in a CUDA graph"


# torch's multi-tensor apply: how many tensors of each list one launch of a fused optimizer kernel takes, by
# the number of lists the kernel walks (Adam/AdamW: params, grads, exp_avg, exp_avg_sq; SGD with momentum:
# params, grads, momentum buffers) -- aten/src/ATen/native/cuda/MultiTensorApply.cuh's depth_to_max_tensors
FUSED_TENSORS_PER_LAUNCH = {"Adam": 36, "AdamW": 36, "SGD": 48, "Adagrad": 48}


def _per_item_count(ev: pd.DataFrame, lo: np.ndarray, hi: np.ndarray, n_steps: int) -> int:
    """How many items a per-item loop inside the ranges [lo, hi) goes over a step: the call count shared by
    most op names there (a per-parameter AdamW calls lerp_, addcmul_, sqrt, addcdiv_, ... once per parameter)."""
    ops = ev[ev["cat"] == "cpu_op"]
    ts = ops["ts_us"].to_numpy(np.float64)
    order = np.argsort(ts, kind="stable")
    ts_sorted = ts[order]
    inside = np.zeros(ts.size, bool)
    for a, b in zip(lo, hi):
        i, j = np.searchsorted(ts_sorted, [a, b])
        inside[order[i:j]] = True
    counts = ops.loc[inside, "name"].astype(str).value_counts()
    per_step = np.round(counts.to_numpy() / max(n_steps, 1)).astype(int)
    per_step = per_step[per_step >= 2]
    if per_step.size == 0:
        return 0
    vals, freq = np.unique(per_step, return_counts=True)
    return int(vals[np.lexsort((vals, freq))][-1])  # the most frequent count (ties: the larger)


def optimizer_fused_what_if(c: TraceAnalysis, owner: str, launches_per_step: float):
    """The step with the optimizer owner's per-parameter loop replaced by its fused kernels
    (:func:`~workbench.analysis.trace.diagnosis.fewer_launches_what_if`): ``ceil(parameters /
    FUSED_TENSORS_PER_LAUNCH)`` launches a step, the parameters counted from the per-parameter ops. None when
    the owner is not such a loop or the diagnosis has no graph."""
    from workbench.analysis.trace.diagnosis import fewer_launches_what_if

    m = _OPTIMIZER_RE.match(owner)
    d = c.diagnosis
    if not m or d is None or launches_per_step <= PER_PARAMETER_LAUNCHES or m.group(1) not in FUSED_TENSORS_PER_LAUNCH:
        return None
    ev = c.ev
    # == on a categorical column compares on its categories (no text of every event)
    rng = ev[(ev["name"] == owner) & ev["cat"].isin(("user_annotation", "cpu_op"))]
    if rng.empty:
        return None
    lo = rng["ts_us"].to_numpy(np.float64)
    hi = lo + rng["dur_us"].fillna(0.0).to_numpy(np.float64)
    g = c.graph
    n_items = _per_item_count(ev, lo, hi, g.n_steps)
    if n_items < 2:
        return None
    per_launch = FUSED_TENSORS_PER_LAUNCH[m.group(1)]
    after = -(-n_items // per_launch)
    order = np.argsort(lo)
    lo, hi = lo[order], hi[order]
    k = np.searchsorted(lo, g.h_ts, "right") - 1
    in_owner = (k >= 0) & (g.h_ts < hi[np.maximum(k, 0)])
    return fewer_launches_what_if(
        c.trace, g, d, in_owner, after, "launch_fused",
        f"{m.group(1)}(..., fused=True): {n_items} parameters in {after} launch(es) of "
        f"{per_launch} tensors a step instead of a loop over them",
        {"parameters": n_items, "tensors_per_launch": per_launch})


def launch_owners_per_step(c: TraceAnalysis) -> list[dict]:
    """Who issues the launches (:func:`~workbench.analysis.trace.tables.launch_owners`), per step, with the
    fix that fits each: ``[{owner, launches_per_step, gpu_ms_per_step, fix, ops}]`` by launches. Eager
    ops outside any range are one owner, ``eager ops`` (``ops``: the three that launch most)."""
    t = ta.launch_owners(c.ev)
    if t.empty:
        return []
    n = max(c.numbers.steps, 1)
    is_op = t["owner"].str.match(r"^(aten|cudnn|c10d|_c10d|torch_tensorrt|triton|prim)::")
    rows = [r for r in t[~is_op].itertuples(index=False)]
    out = [{"owner": r.owner, "launches_per_step": round(r.launches / n, 1),
            "gpu_ms_per_step": round(r.gpu_us / n / 1e3, 3), "fix": _owner_fix(r.owner, r.launches / n), "ops": []}
           for r in rows]
    if is_op.any():
        e = t[is_op]
        ops = [str(x) for x in e["owner"].head(3)]
        out.append({"owner": f"eager ops ({', '.join(ops)}{', ...' if len(e) > 3 else ''})",
                    "launches_per_step": round(float(e["launches"].sum()) / n, 1),
                    "gpu_ms_per_step": round(float(e["gpu_us"].sum()) / n / 1e3, 3), "fix": _owner_fix("eager ops"),
                    "ops": ops})
    return sorted(out, key=lambda o: -o["launches_per_step"])


def _sync_bound(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    w = d.what_if("sync") if d else None
    if w is None:
        return None
    calls = ", ".join(f"{k} x{v}" for k, v in list(w.evidence.get("calls", {}).items())[:3])
    dtoh = copy_directions(c).get("DtoH") or {}
    reads = dtoh.get("reads", 0.0)
    said = (f" ({reads:g} of them after a device-to-host read of {_bytes(dtoh['bytes'] / max(dtoh['copies'], 1))}: "
            ".item()-like)" if reads else "")
    msg = (
        f"The host blocks in {w.evidence['sync_calls_per_step']} synchronising call(s) a step ({calls}){said}, "
        f"{_ms(w.evidence['host_blocked_per_step_us'])} a step; {_saves(w)} without them. Fix: drop "
        ".item()/.cpu()/.tolist()/print of GPU tensors inside the loop (accumulate on the GPU, read every N "
        "steps), non_blocking=True copies from pinned memory, no torch.cuda.synchronize() outside timing code."
    )
    return _with_whatif("sync_bound", w, msg, {"device_to_host_reads_per_step": reads})


_DIRECTION_RE = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP)\b")
READ_MAX_BYTES = 4096  # a device-to-host copy this small is a read of values (.item(), .tolist(), printing)
_DIRECTION = {"HtoD": "host-to-device", "DtoH": "device-to-host", "DtoD": "device-to-device", "PtoP": "peer-to-peer"}


def copy_directions(c: TraceAnalysis) -> dict:
    """The step's copies by direction (``HtoD``, ``DtoH``, ``DtoD``, ``PtoP``): per step ``copies``, ``gpu_us``
    (copy time), ``bytes``, ``pageable`` (copies from/to pageable memory), ``host_blocked_us`` (host time
    in the calls that issued them plus a synchronise right after one: what the host waited for them) and
    ``reads`` (device-to-host copies of at most ``READ_MAX_BYTES``: ``.item()``-like reads of values)."""
    g = c.graph
    out: dict = {}
    if g.g_ts.size == 0:
        return out
    n = g.n_steps
    is_copy = g.g_cat == "gpu_memcpy"
    # plain lists: the loop reads one copy at a time
    g_bytes, g_dur, g_host = np.nan_to_num(g.g_bytes).tolist(), g.g_dur.tolist(), g.g_host.tolist()
    h_kind, h_dur, h_gap = g.h_kind.tolist(), g.h_dur.tolist(), g.h_gap.tolist()
    n_points = len(h_kind)
    direction: dict = {}  # name -> HtoD/DtoH/DtoD/PtoP or None
    for j in np.flatnonzero(is_copy).tolist():
        name = str(g.g_name[j])
        if name not in direction:
            m = _DIRECTION_RE.search(name)
            direction[name] = m.group(1) if m else None
        k = direction[name]
        if k is None:
            continue
        r = out.setdefault(k, {"copies": 0.0, "gpu_us": 0.0, "bytes": 0.0, "pageable": 0.0, "host_blocked_us": 0.0,
                               "reads": 0.0, "_points": set()})
        nbytes = float(g_bytes[j])
        r["copies"] += 1
        r["gpu_us"] += float(g_dur[j])
        r["bytes"] += nbytes
        r["pageable"] += "Pageable" in name
        r["reads"] += k == "DtoH" and nbytes <= READ_MAX_BYTES
        h = int(g_host[j])
        if h >= 0 and h not in r["_points"]:
            r["_points"].add(h)
            blocked = float(h_dur[h]) if h_kind[h] in (sm.BLOCKING_COPY, sm.SYNC) else 0.0
            # an async copy the host then waits for (.item(): cudaMemcpyAsync + cudaStreamSynchronize)
            if h + 1 < n_points and h_kind[h + 1] == sm.SYNC and h_gap[h + 1] <= sm.LAUNCH_GAP_US:
                blocked += float(h_dur[h + 1])
            r["host_blocked_us"] += blocked
    for r in out.values():
        r.pop("_points")
        for key in r:
            r[key] = round(r[key] / n, 2)
    return out


def _copy_text(k: str, r: dict) -> str:
    each = r["bytes"] / r["copies"] if r["copies"] else 0.0
    return (f"{r['copies']:g} {_DIRECTION[k]} cop{'y' if r['copies'] == 1 else 'ies'} a step of {_bytes(each)} each ({_ms(r['gpu_us'])} of copy time"
            + (f", {r['pageable']:g} pageable" if r["pageable"] else "")
            + f"; the host waits {_ms(r['host_blocked_us'])} for them)")


def _bytes(b: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:,.1f} {unit}"
    return f"{b:,.0f} B"


def _copy_fix(k: str, r: dict) -> str:
    if k == "DtoH" and r["reads"] >= 0.5 * r["copies"]:
        return ("these are reads of GPU values on the host (.item(), .cpu(), .tolist(), printing a tensor), each a "
                "wait for all queued GPU work: accumulate on the GPU and read every N steps")
    if k == "DtoH":
        return ("copy into a pinned buffer with non_blocking=True (tensor.to('cpu', non_blocking=True) into "
                "pin_memory() storage) and wait on an event only where the values are used")
    if k == "HtoD":
        return ("pin the host memory and copy asynchronously: DataLoader(pin_memory=True) or tensor.pin_memory(), "
                "then .to('cuda', non_blocking=True)" if r["pageable"] else
                "keep the data on the GPU between steps, or overlap the copies with compute on a side stream")
    return "keep the data where it is used (fewer device-to-device copies: in-place ops, views instead of copies)"


def _memcpy_heavy(c: TraceAnalysis) -> Finding | None:
    d = c.diagnosis
    if d is None or c.cpu_only:
        return None
    w_pin, w_rm = d.what_if("memcpy_pinned"), d.what_if("memcpy")
    w = w_pin if (w_pin is not None and _whatif_severity(w_pin.saved_fraction)) else w_rm
    if w is None:
        return None
    dirs = {k: r for k, r in copy_directions(c).items() if k in ("HtoD", "DtoH")}
    w_sync = d.what_if("sync")
    # .item()-like reads are waits the sync finding already counts: the same waits are said once, there
    reads_only = bool(dirs) and all(k == "DtoH" and r["reads"] >= r["copies"] for k, r in dirs.items())
    if reads_only and w_sync is not None and _whatif_severity(w_sync.saved_fraction):
        return None
    m = c.memcpy
    ev = {"memory_us": round(c.breakdown["memory_us"], 1)}
    if not m.empty:
        ev["by_kind"] = {
            str(r.kind): {"count": int(r.count), "total_us": round(float(r.total_us), 1), "bytes": int(r.bytes),
                          "gb_per_s": None if pd.isna(r.gb_per_s) else round(float(r.gb_per_s), 2),
                          "pageable_count": int(r.pageable_count)}
            for r in m.itertuples(index=False)
        }
    ev["by_direction"] = dirs
    said = "; ".join(_copy_text(k, r) for k, r in dirs.items()) or "host<->device copies"
    fixes = " ".join(f"{_DIRECTION[k].capitalize()}: {_copy_fix(k, r)}." for k, r in dirs.items())
    if w is w_pin:
        msg = (f"{said}; with the pageable ones pinned and asynchronous {_saves(w)}. Fix: {fixes}")
        if w_rm is not None:
            msg += f" Keeping the data on the GPU would save {_pct(w_rm.saved_fraction)}."
    else:
        msg = (f"{said}; {_saves(w)} if the data stayed on the GPU. Fix: {fixes}".rstrip()
               + ("" if "HtoD" not in dirs else " Generate or cache inputs on the GPU, batch small transfers."))
    reads = sum(r["reads"] for r in dirs.values())
    if reads and w_sync is not None and _whatif_severity(w_sync.saved_fraction):
        msg += (f" The {reads:g} device-to-host read(s) a step are also waits of sync_bound: the two savings "
                "overlap, do not add them.")
        ev["overlaps"] = ["sync_bound"]
    f = _with_whatif("memcpy_heavy", w, msg, ev)
    if f is not None and w_rm is not None:
        f.evidence["saved_fraction_if_removed"] = round(w_rm.saved_fraction, 4)
    return f


def _fp32_matmul(c: TraceAnalysis) -> Finding | None:
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
    wis = c.precision
    w_tf, w_bf = wis.get("tf32"), wis.get("bf16") or wis.get("fp16")
    w_cl = wis.get("bf16_channels_last")
    if no_tf32:
        msg += (
            f" {dev} has no TF32: use mixed precision, torch.autocast('cuda', dtype=torch.float16) with "
            "torch.amp.GradScaler."
        )
    else:
        msg += (
            " Fix: allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True, torch.backends.cudnn.allow_tf32 "
            "= True, or torch.set_float32_matmul_precision('high')), or use mixed precision "
            "(torch.autocast('cuda', dtype=torch.bfloat16))."
        )
    what_if = None
    if w_tf is not None or w_bf is not None:
        parts = []
        if w_tf is not None and not no_tf32:
            parts.append(f"with TF32 about {w_tf.step_ms_if_fixed:,.1f} ms (saves {_pct(w_tf.saved_fraction)})")
        if w_bf is not None:
            parts.append(f"with {w_bf.cause} autocast about {w_bf.step_ms_if_fixed:,.1f} ms (saves "
                         f"{_pct(w_bf.saved_fraction)}; GEMMs and attention only)")
        if w_cl is not None:
            parts.append(f"with bf16 autocast and channels_last about {w_cl.step_ms_if_fixed:,.1f} ms (saves "
                         f"{_pct(w_cl.saved_fraction)}; NCHW bf16 convolutions pay layout transposes)")
        if parts:
            ref = (w_tf or w_bf).step_ms
            msg += (f" From the roofline of these GEMMs ({c.roofline.peak.name}, {c.roofline.peak.source}) the "
                    f"{ref:,.1f} ms step would take {' and '.join(parts)}.")
        best = w_tf if (w_tf is not None and not no_tf32) else w_bf
        if best is not None:
            what_if = best.as_dict()
            # the severity follows what the switch would save on this step (the share of fp32 GEMM time
            # alone overstates it when the host, not the GPU, limits the step); still said as info
            sev = _whatif_severity(max(w.saved_fraction for w in (w_tf, w_bf) if w is not None)) or "info"
        for w in (w_tf, w_bf, w_cl):
            if w is not None:
                ev[f"step_ms_if_{w.cause}"] = round(float(w.step_ms_if_fixed), 3)
                ev[f"saved_fraction_if_{w.cause}"] = round(float(w.saved_fraction), 4)
    elif not (c.roofline.costs.has_shapes):
        msg += (" (Record with shapes, profile_steps(step, detail='standard'), to get the predicted step time "
                "with TF32 and with bf16 from the roofline.)")
    # without a what-if (no shapes, no peak) the fix still has its line of code
    from workbench.analysis.trace.diagnosis import fix_code

    code = "" if what_if is not None else fix_code("fp16" if no_tf32 else "tf32")
    return Finding("fp32_matmul", sev, msg, ev, what_if=what_if, fix_code=code)


def _cpu_only(c: TraceAnalysis) -> Finding | None:
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
    elif c.diagnosis is not None:
        msg = (
            "This trace has no GPU activity: the diagnosis is of the host step (data loading, the profiler, "
            "communication) and the op table is sorted by CPU self time. To see GPU time, profile on a CUDA "
            "device with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]."
        )
    else:
        msg = (
            "This trace has no GPU activity and no ProfilerStep marks: only the op table (by CPU self time) "
            "applies. To see GPU time, profile on a CUDA device with activities=[ProfilerActivity.CPU, "
            "ProfilerActivity.CUDA]."
        )
    return Finding("cpu_only", "info", msg, {"x_events": int(len(c.ev)), "runtime_calls": n_runtime})


# ------------------------------------------------------------------------------- torch.compile rules
# (the numbers: workbench.analysis.trace.compile, read through TraceAnalysis.compile / .compile_whatifs)


def _where(b: dict) -> str:
    import os

    f = b.get("file")
    return f"{os.path.basename(f)}:{b.get('line')}" if f else "an unknown line"


def _graph_breaks(c: TraceAnalysis) -> Finding | None:
    s = c.compile
    if s is None or not s.graph_breaks:
        return None
    w = c.compile_whatifs.get("graph_breaks")
    parts = [f"{_where(b)} ({b['reason']}" + (f"; `{b['code']}`" if b.get("code") else "") + ")"
             for b in s.graph_breaks[:3]]
    more = f" and {len(s.graph_breaks) - 3} more" if len(s.graph_breaks) > 3 else ""
    msg = (f"torch.compile broke the step into {s.graphs} graph{'s' if s.graphs != 1 else ''}: dynamo stopped at "
           + "; ".join(parts) + more + ".")
    ev = {"graphs": s.graphs, "graph_breaks": s.graph_break_count,
          "breaks": [{k: b[k] for k in ("reason", "file", "line", "count")} for b in s.graph_breaks]}
    hint = s.graph_breaks[0].get("hint")
    fix = (" Fix: " + hint if hint else " Fix: rewrite the line so dynamo can trace it (no .item()/print/"
           "data-dependent Python branch in the compiled code), or move it out of the compiled function.")
    if w is not None and w.saved_fraction >= WHATIF_INFO:
        msg += (f" The break costs each step {w.evidence['break_us_per_step'] / 1e3:,.3f} ms of the traced step (the "
                f"resumed region's own time, dynamo's guard checks before it, waits it forces); as one graph, "
                f"{_saves(w)}.")
        return Finding("graph_breaks", _whatif_severity(w.saved_fraction) or "info", msg + fix, ev | w.evidence,
                       what_if=w.as_dict())
    return Finding("graph_breaks", "info", msg + fix, ev)


def _recompiles(c: TraceAnalysis) -> Finding | None:
    s = c.compile
    if s is None or not s.recompiles:
        return None
    w = c.compile_whatifs.get("recompiles")
    top = s.recompiles[0]
    msg = (f"torch.compile recompiled {s.recompile_count} time{'s' if s.recompile_count != 1 else ''} during the "
           f"capture ({s.recompile_ms / 1e3:,.2f} s of compiling); most often {top['function']} because "
           f"{top['reason']} ({top['count']}x).")
    if s.steps_until_stable:
        msg += f" Calls stopped compiling after call {s.steps_until_stable}."
    msg += (" Fix: mark the changing dimension dynamic, torch._dynamo.mark_dynamic(x, dim) before the call, or "
            "torch.compile(..., dynamic=True); or pad inputs to a few fixed shapes.")
    ev = {"recompiles": [{k: r[k] for k in ("reason", "count", "function", "compile_ms")} for r in s.recompiles],
          "recompile_ms": round(s.recompile_ms, 3), "steps_until_stable": s.steps_until_stable}
    if w is not None:
        e = w.evidence
        if e.get("kept_compile_from") == "dynamic":
            kept = (f" (the compile left is the recorded one with {', '.join(e['dynamic_sizes'])} symbolic, at its "
                    f"cost: {e['kept_compile_ms'] / 1e3:,.2f} s)")
            bound = ""
        else:
            if e.get("kept_compile_from") == "partly dynamic":
                kept = (" (where a frame had no compile with a symbolic size, its compile left taken to cost what its "
                        f"first, static one did; the compiles left cost {e['kept_compile_ms'] / 1e3:,.2f} s: tracing "
                        "with symbolic sizes costs more)")
            else:
                kept = (f" (the compile left taken to cost what the first, static one did, "
                        f"{e['kept_compile_ms'] / 1e3:,.2f} s: no compile here had a symbolic size, and tracing "
                        "with symbolic sizes costs more)")
            bound = "at least "
        msg += (f" Without them the {e['calls']} captured calls take {bound}{e['calls_ms_if_fixed'] / 1e3:,.2f} s "
                f"instead of {e['calls_ms'] / 1e3:,.2f} s{kept}.")
        sev = _whatif_severity(w.saved_fraction) or "info"
        return Finding("recompiles", sev, msg, ev | w.evidence, what_if=w.as_dict())
    return Finding("recompiles", "warning" if s.recompile_count >= 3 else "info", msg, ev)


def _compile_cost(c: TraceAnalysis) -> Finding | None:
    p = c.compile_whatifs.get("compile_cost")
    if p is None:
        return None
    n = p["steps_to_pay_back"]
    head = (f"Compiling took {p['compile_ms'] / 1e3:,.2f} s; the compiled step takes {p['compiled_step_ms']:,.3f} ms "
            f"against {p['eager_step_ms']:,.3f} ms eager (measured without the profiler, the compiled functions run "
            "eagerly with torch.compiler.set_stance('force_eager')).")
    if n is None:
        msg = (head + " The compiled step is not faster, so compiling never pays back. Fix: leave this step eager, "
               "or try another backend/mode (mode='max-autotune', 'reduce-overhead' for launch-bound GPU steps) "
               "and remove graph breaks first.")
        return Finding("compile_cost", "warning", msg, p)
    msg = head + f" It saves {p['saved_per_step_ms']:,.3f} ms a step, so it pays back after {n:,} steps."
    sev = "info"
    if n > 10_000:
        sev = "warning"
        msg += (" For a run shorter than that, compiling costs more than it saves. Fix: keep such a run eager, or "
                "compile only the hot module.")
    return Finding("compile_cost", sev, msg, p)


_RULES = (_profiler_overhead, _input_bound, _host_bound, _launch_bound, _sync_bound, _fp32_matmul, _memcpy_heavy,
          _graph_breaks, _recompiles, _compile_cost, _cpu_only)


def run_rules(c: TraceAnalysis) -> list[Finding]:
    """The rules on ``c``, sorted: what-if findings first (see :func:`workbench.analysis.trace.analysis.findings`). ``TraceAnalysis.findings``
    calls this once per trace."""
    out = [f for f in (rule(c) for rule in _RULES) if f is not None]

    def key(f):
        # what-if findings by their saving (the profiler's first when it matters: the others describe the
        # step without it), then the rest by severity
        if f.what_if is not None:
            first = f.id == "profiler_overhead" and f.what_if["saved_fraction"] >= WHATIF_WARN
            return (0, 0 if first else 1, -f.what_if["saved_fraction"])
        return (1, -severity_rank(f.severity), 0.0)

    return sorted(out, key=key)


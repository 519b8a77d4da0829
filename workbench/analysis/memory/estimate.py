"""Peak-memory estimate from a fake-tensor step record: peaks, categories, phases, modules, tables.

The record comes from :func:`workbench.capture.estimate.trace_step_memory` (plain lists and dicts,
so it can also be saved as JSON and read back here without torch). The events are replayed through
:mod:`workbench.analysis.memory.allocator_model` to get what the caching allocator would allocate and
reserve; the categories come from the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from workbench.analysis.memory.allocator_model import replay_allocator, round_size
from workbench.errors import BadArgument

__all__ = [
    "CATEGORIES",
    "PHASES",
    "Estimate",
    "RESERVED_ABOVE",
    "RESERVED_ABOVE_RULED_CONV",
    "RESERVED_BELOW",
    "estimate_from_record",
    "reserved_range",
    "estimate_table",
    "category_table",
    "phase_table",
    "module_table",
    "fits_table",
]

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "workspace")

# The reserved peak as an interval (Estimate.peak_reserved_range), from the misses of the rules on the steps
# recorded on the H200 (tests/data/h200_memory/families.json: mlp, cnn, unet, lstm, encoder, decoder_lm at
# fp32, TF32 and bf16; checked on families_heldout.json, tests/test_estimate_interval.py):
# * below: the allocator model's reserved peak came out up to 4.7% above torch's (encoder bf16) -> 5%;
# * above, where no convolution workspace comes from the rules: up to 6.6% below (encoder fp32, lstm bf16) -> 7%;
# * above, where cuDNN convolution workspaces come from the rules: up to 23% below (cnn bf16 at batch 128: the
#   allocated peak is right, the cached segments are not, as cuDNN's per-call picks differ from the rule) -> 25%;
# * and never below the replay with every unpredictable workspace at its most (fp32 convolutions: the FFT's).
RESERVED_BELOW = 0.05
RESERVED_ABOVE = 0.07
RESERVED_ABOVE_RULED_CONV = 0.25
PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Estimate:
    """Predicted GPU memory of a training step (bytes). ``by_category`` is at the allocated peak."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_tensor_bytes: int  # tensor sizes alone, before the allocator's rounding
    by_phase: dict[str, int]
    by_category: dict[str, int]
    by_module: dict[str, int]
    peak_phase: str
    peak_op: str
    segments: int
    meta: dict = field(default_factory=dict)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False, compare=False)

    @property
    def peak_allocated_upper_bytes(self) -> int:
        """The allocated peak with every unpredictable workspace at its most (``meta["upper"]``; the point
        estimate where nothing is unpredictable)."""
        return int(self.meta.get("upper", {}).get("peak_allocated_bytes", self.peak_allocated_bytes))

    @property
    def peak_reserved_upper_bytes(self) -> int:
        """The reserved peak with every unpredictable workspace at its most."""
        return int(self.meta.get("upper", {}).get("peak_reserved_bytes", self.peak_reserved_bytes))

    @property
    def peak_reserved_range(self) -> tuple[int, int]:
        """``(low, high)``: where torch's reserved peak is expected to be (``meta["reserved_range"]``). The point
        estimate ``peak_reserved_bytes`` lies inside; the width is the rules' misses on the recorded steps, and
        the unpredictable workspaces at their most (see :func:`reserved_range`)."""
        r = self.meta.get("reserved_range")
        if not r:
            return int(self.peak_reserved_bytes), int(self.peak_reserved_bytes)
        return int(r["low"]), int(r["high"])

    @property
    def model_flops_per_step(self) -> float | None:
        """GEMM, convolution and attention FLOPs of one step (causal attention halved), from the fake pass."""
        v = self.meta.get("model_flops_per_step")
        return float(v) if v is not None else None

    def mfu(self, step_ms: float, peak_tflops: float) -> float | None:
        """The MFU a step of ``step_ms`` would reach on a GPU of ``peak_tflops`` (the dtype's dense peak,
        e.g. ``workbench.analysis.trace.peaks.peak_for("NVIDIA H200").compute("bf16")``)."""
        f = self.model_flops_per_step
        if not f or not step_ms or not peak_tflops:
            return None
        return f / (step_ms * 1e-3) / (peak_tflops * 1e12)

    def to_dict(self) -> dict:
        """JSON-ready summary (the ``workbench estimate --json`` payload)."""
        return {
            "peak_allocated_bytes": int(self.peak_allocated_bytes),
            "peak_reserved_bytes": int(self.peak_reserved_bytes),
            "peak_reserved_range": list(self.peak_reserved_range),
            "peak_tensor_bytes": int(self.peak_tensor_bytes),
            "peak_phase": self.peak_phase,
            "peak_op": self.peak_op,
            "segments": int(self.segments),
            "by_phase": {k: int(v) for k, v in self.by_phase.items()},
            "by_category": {k: int(v) for k, v in self.by_category.items()},
            "by_module": {k: int(v) for k, v in self.by_module.items()},
            "meta": dict(self.meta),
        }


def _category(record: dict, key: int, phase: str, freed_in_phase: bool) -> str:
    cat = record["categories"].get(key)
    if cat is None:
        cat = record["categories"].get(str(key))  # a record read back from JSON
    if cat is not None:
        return cat
    if phase == "forward" and not freed_in_phase:
        return "activations"
    return "temporaries"


def estimate_from_record(record: dict, top_modules: int = 20) -> Estimate:
    """Replay the record's events through the caching-allocator model and summarise them."""
    ev = record["events"]
    n = len(ev["action"])
    if n == 0:
        raise BadArgument("the step record holds no events (did the step create any tensor?)")
    actions = ev["action"]
    keys = ev["key"]
    nbytes = ev["nbytes"]
    phases = ev["phase"]
    replay = replay_allocator(zip(actions, keys, nbytes))
    meta = dict(record.get("meta", {}))
    upper_bytes = ev.get("nbytes_upper")
    if upper_bytes is not None and list(upper_bytes) != list(nbytes):
        up = replay_allocator(zip(actions, keys, upper_bytes))
        n_bounded = sum(1 for a, b in zip(nbytes, upper_bytes) if b != a)
        meta["upper"] = {"peak_allocated_bytes": int(up.peak_allocated_bytes),
                         "peak_reserved_bytes": int(up.peak_reserved_bytes), "bounded_allocations": n_bounded,
                         "source": meta.get("workspace_bound_source", "")}

    meta["reserved_range"] = reserved_range(int(replay.peak_reserved_bytes), meta)

    # which storages die in the phase they were born in (for the activation/temporary split)
    born: dict[int, int] = {}
    death_phase: dict[int, str] = {}
    for i in range(n):
        if actions[i] == "alloc":
            born[keys[i]] = i
        else:
            death_phase[keys[i]] = phases[i]
    cat_of: dict[int, str] = {}
    size_of: dict[int, int] = {}
    for k, i in born.items():
        ph = phases[i]
        cat_of[k] = _category(record, k, ph, death_phase.get(k) == ph)
        size_of[k] = round_size(nbytes[i]) if nbytes[i] else 0

    # categories live at the allocated peak (rounded block sizes, the way torch counts allocated)
    peak_i = replay.peak_allocated_index
    live: dict[int, int] = {}
    for i in range(peak_i + 1):
        if actions[i] == "alloc":
            live[keys[i]] = size_of[keys[i]]
        else:
            live.pop(keys[i], None)
    by_category = {c: 0 for c in CATEGORIES}
    for k, b in live.items():
        by_category[cat_of[k]] = by_category.get(cat_of[k], 0) + b
    # allocator overhead: blocks handed out whole (not split) count more than their rounded size
    overhead = replay.peak_allocated_bytes - sum(by_category.values())
    if overhead:
        by_category["allocator_rounding"] = overhead

    alloc = np.asarray(replay.allocated_bytes, dtype=np.int64)
    reserved = np.asarray(replay.reserved_bytes, dtype=np.int64)
    phase_arr = np.asarray(phases, dtype=object)
    by_phase = {}
    for ph in PHASES:
        mask = phase_arr == ph
        if ph == "forward":
            mask |= phase_arr == "inputs"
        by_phase[ph] = int(alloc[mask].max()) if mask.any() else 0

    # activations by the module that created them (alive at the end of the forward pass)
    by_module: dict[str, int] = {}
    step_of = record.get("step_of_event") or [0] * n
    last_step = max(step_of) if step_of else 0
    for k, i in born.items():
        if phases[i] == "forward" and cat_of[k] == "activations" and step_of[i] == last_step:
            m = ev["module"][i] or "(outside modules)"
            by_module[m] = by_module.get(m, 0) + size_of[k]
    by_module = dict(sorted(by_module.items(), key=lambda kv: -kv[1])[:top_modules])

    timeline = pd.DataFrame({
        "event": np.arange(n),
        "action": actions,
        "bytes": np.asarray(nbytes, dtype=np.int64),
        "phase": phases,
        "step": step_of,
        "op": ev["op"],
        "allocated_bytes": alloc,
        "reserved_bytes": reserved,
        "tensor_bytes": np.asarray(replay.requested_bytes, dtype=np.int64),
    })
    return Estimate(
        peak_allocated_bytes=replay.peak_allocated_bytes,
        peak_reserved_bytes=replay.peak_reserved_bytes,
        peak_tensor_bytes=replay.peak_requested_bytes,
        by_phase=by_phase,
        by_category=by_category,
        by_module=by_module,
        peak_phase=phases[peak_i],
        peak_op=ev["op"][peak_i] or actions[peak_i],
        segments=replay.segments,
        meta=meta,
        timeline=timeline,
    )


def reserved_range(point: int, meta: dict) -> dict:
    """The interval around the reserved peak ``point`` of a record's ``meta``: ``{"low", "high", "why"}``.
    Below: :data:`RESERVED_BELOW`. Above: the larger of the replay with every unpredictable workspace at its
    most (``meta["upper"]``) and :data:`RESERVED_ABOVE_RULED_CONV` (cuDNN convolution workspaces from the
    rules: ``meta["conv_workspaces"]["ruled"]``) or :data:`RESERVED_ABOVE` (all measured, or none) over
    ``point``. ``why`` says what sets the high end; ``wide`` is True where high is over 1.5 x low."""
    ruled = int((meta.get("conv_workspaces") or {}).get("ruled", 0) or 0)
    above = RESERVED_ABOVE_RULED_CONV if ruled else RESERVED_ABOVE
    by_margin = int(point * (1 + above))
    upper = int((meta.get("upper") or {}).get("peak_reserved_bytes", 0))
    low = int(point * (1 - RESERVED_BELOW))
    high = max(by_margin, upper)
    if upper > by_margin:
        why = ("unpredictable cuDNN workspaces at their most (fp32 convolutions may get the FFT's); "
               "a table measured on the GPU (--calibrate) narrows it")
    elif ruled:
        why = (f"{ruled} cuDNN convolution workspaces from the rules (+{above:.0%}); "
               "a table measured on the GPU (--calibrate) narrows it")
    else:
        why = f"the allocator model's misses on the recorded steps (-{RESERVED_BELOW:.0%}, +{above:.0%})"
    return {"low": low, "high": high, "why": why, "wide": bool(high > 1.5 * max(low, 1))}


def estimate_table(estimates) -> pd.DataFrame:
    """One row per estimate: configuration and peaks (``*_bytes`` and ``*_gib`` columns)."""
    rows = []
    for e in estimates:
        m = e.meta
        rows.append({
            "precision": m.get("precision"),
            "batch_size": m.get("batch_size"),
            "checkpointing": m.get("checkpointing"),
            "peak_allocated_bytes": e.peak_allocated_bytes,
            "peak_reserved_bytes": e.peak_reserved_bytes,
            "peak_reserved_low_bytes": e.peak_reserved_range[0],
            "peak_reserved_high_bytes": e.peak_reserved_range[1],
            "peak_tensor_bytes": e.peak_tensor_bytes,
            **{f"{c}_bytes": e.by_category.get(c, 0) for c in CATEGORIES},
            "peak_phase": e.peak_phase,
        })
    df = pd.DataFrame(rows)
    if len(df):
        df["peak_allocated_gib"] = df["peak_allocated_bytes"] / 2**30
        df["peak_reserved_gib"] = df["peak_reserved_bytes"] / 2**30
    return df


def fits_table(estimates, budget_bytes: int) -> pd.DataFrame:
    """:func:`estimate_table` plus whether each configuration fits ``budget_bytes``.

    ``fits`` uses the reserved peak (what the process holds); ``fits_surely`` the high end of its interval
    (:attr:`Estimate.peak_reserved_range`: what :func:`~workbench.capture.estimate.largest_batch_that_fits`
    uses); ``fits_allocated`` the allocated one (the allocator frees its cache and retries before it raises
    out-of-memory, so a configuration between the two may still run, with the retries' cost).
    """
    df = estimate_table(estimates)
    df["budget_bytes"] = int(budget_bytes)
    df["fits"] = df["peak_reserved_bytes"] <= budget_bytes
    df["fits_surely"] = df["peak_reserved_high_bytes"] <= budget_bytes
    df["fits_allocated"] = df["peak_allocated_bytes"] <= budget_bytes
    df["headroom_bytes"] = budget_bytes - df["peak_reserved_bytes"]
    return df


def category_table(estimate: Estimate) -> pd.DataFrame:
    """Bytes per category at the allocated peak, with the share of the peak."""
    df = pd.DataFrame({"category": list(estimate.by_category), "bytes": list(estimate.by_category.values())})
    total = max(int(estimate.peak_allocated_bytes), 1)
    df["percent"] = 100.0 * df["bytes"] / total
    return df


def phase_table(estimate: Estimate) -> pd.DataFrame:
    """Peak allocated bytes within each phase of the step."""
    return pd.DataFrame({"phase": list(estimate.by_phase), "peak_allocated_bytes": list(estimate.by_phase.values())})


def module_table(estimate: Estimate) -> pd.DataFrame:
    """Activation bytes held at the end of the forward pass, by the module that made them."""
    return pd.DataFrame({"module": list(estimate.by_module), "activation_bytes": list(estimate.by_module.values())})

"""Before and after: ratios of experiment results against a baseline, and the diff of two traces.

Ledger (rows written by the experiment harness, loaded with :func:`workbench.io.load_ledger`)::

    baseline_ratios(ledger, baseline="fp32")      # + is_baseline, speedup, *_ratio columns

Traces (any two Kineto traces, loaded with :func:`workbench.io.load_trace`, or their
:class:`~workbench.analysis.trace.analysis.TraceAnalysis`: each side's tables, summary and findings are
read from its analysis, computed once)::

    d = trace_diff(load_trace("before.json.gz"), load_trace("after.json.gz"))
    d.kernels            # name, base/test count and total_us, deltas, status (both/appeared/disappeared)
    d.ops                # the same per host op (CPU and device time)
    diff_summary(d)      # the ``workbench diff --json`` document (docs/json.md)

Deltas are ``test - base`` (negative: the test run spends less). With ``normalize="per_step"`` every
count and time (kernels, ops, GPU busy/idle, the breakdown) is divided by its trace's number of
ProfilerStep#N annotations, so traces of different lengths compare per step; ``d.unit`` says which.

What changed, in the order the CLI, the HTML report and the ComparePanel say it::

    d.changes            # step time (median), then compute / memcpy / communication / idle, largest change first
    d.headline           # one sentence: the largest breakdown change and the step-time change
    d.findings_change    # findings resolved (base only), new (test only), changed severity, kept
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.analysis.trace.tables import GpuBusy
from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.errors import BadArgument

__all__ = [
    # experiment ledger
    "RATIO_METRICS",
    "baseline_ratios",
    "check_verdicts",
    # trace diff
    "TraceDiff",
    "trace_diff",
    "diff_summary",
    "BREAKDOWN_PARTS",
]

# temporal_breakdown key -> the label the diff prints (the parts add up to the GPU window)
BREAKDOWN_PARTS: dict[str, str] = {
    "compute_us": "compute",
    "memory_us": "memcpy/memset",
    "communication_us": "communication",
    "idle_us": "idle",
}

# metric column -> (ratio column, True when lower is better)
RATIO_METRICS: dict[str, tuple[str, bool]] = {
    "step_ms_median": ("step_time_ratio", True),
    "peak_allocated_bytes": ("peak_allocated_ratio", True),
    "peak_reserved_bytes": ("peak_reserved_ratio", True),
    "samples_per_s": ("throughput_ratio", False),
    "energy_j_per_step": ("energy_ratio", True),
}


def _pick_baseline(group: pd.DataFrame, baseline: str | None) -> int | None:
    ok = group[group["status"].astype("string").fillna("ok") == "ok"] if "status" in group else group
    if baseline is not None:
        hit = ok[ok["configuration"].astype(str) == baseline]
        return hit.index[0] if len(hit) else None
    for name in ("fp32",):
        hit = ok[ok["configuration"].astype(str) == name]
        if len(hit):
            return hit.index[0]
    return ok.index[0] if len(ok) else None


def baseline_ratios(ledger: pd.DataFrame, baseline: str | None = None, by: str | None = "experiment") -> pd.DataFrame:
    """The ledger with ``is_baseline`` and, per metric of :data:`RATIO_METRICS`, ``<metric> / baseline``
    (``step_time_ratio``, ``peak_allocated_ratio``, ``peak_reserved_ratio``, ``throughput_ratio``,
    ``energy_ratio``) and ``speedup`` (baseline step time / step time).

    ``baseline`` names a configuration (default: ``fp32`` when present, else the first row that ran);
    ratios are taken within each group of ``by`` (default: each experiment), so a ledger that
    accumulated many runs compares each run with its own baseline. A group without its baseline
    gets missing ratios.
    """
    if "configuration" not in ledger.columns:
        raise BadArgument("baseline_ratios needs a ledger with a 'configuration' column (see workbench.io.ledger)")
    out = ledger.copy()
    out["is_baseline"] = False
    for _, ratio_col in RATIO_METRICS.values():
        out[ratio_col] = np.nan
    out["speedup"] = np.nan
    if by is not None and by in out.columns:
        groups = out.groupby(out[by].astype("string").fillna(""), sort=False, dropna=False).groups.values()
    else:
        groups = [out.index]
    if baseline is not None and not (out["configuration"].astype(str) == baseline).any():
        raise BadArgument(
            f"baseline {baseline!r} is not in the ledger; choose one of: "
            f"{', '.join(dict.fromkeys(out['configuration'].astype(str)))}"
        )
    for idx in groups:
        group = out.loc[idx]
        b = _pick_baseline(group, baseline)
        if b is None:
            continue
        out.loc[b, "is_baseline"] = True
        for metric, (ratio_col, _) in RATIO_METRICS.items():
            if metric not in out.columns:
                continue
            vals = pd.to_numeric(group[metric], errors="coerce").astype("float64")
            base = vals.loc[b]
            if pd.notna(base) and base != 0:
                out.loc[idx, ratio_col] = (vals / base).to_numpy()
        if "step_ms_median" in out.columns:
            steps = pd.to_numeric(group["step_ms_median"], errors="coerce").astype("float64")
            base = steps.loc[b]
            if pd.notna(base):
                out.loc[idx, "speedup"] = (base / steps.where(steps > 0)).to_numpy()
    return out


def check_verdicts(ledger: pd.DataFrame) -> pd.DataFrame:
    """The numerical-check columns of a ledger, one row per configuration that was checked."""
    cols = ["configuration", "check_verdict", "check_loss_rel_err", "check_output_max_rel_err",
            "check_grad_max_rel_err", "check_grad_underflow_fraction", "check_update_vanished_fraction",
            "check_update_underflow_fraction", "check_message"]
    have = [c for c in cols if c in ledger.columns]
    if "check_verdict" not in ledger.columns:
        return pd.DataFrame(columns=cols)
    return ledger.loc[ledger["check_verdict"].notna(), have].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# Trace diff


@dataclass(frozen=True)
class TraceDiff:
    """Two traces side by side. ``kernels`` and ``ops`` are sorted by the size of the change.

    ``kernels``: name, base_count, test_count, delta_count, base_total_us, test_total_us, delta_us,
    delta_pct (of the base total; NaN when the kernel is new), status (``both``, ``appeared``,
    ``disappeared``).
    ``ops``: name, base_count, test_count, delta_count, base_cpu_total_us, test_cpu_total_us,
    delta_cpu_us, base_device_total_us, test_device_total_us, delta_device_us, status.
    ``base_busy``/``test_busy``: :class:`~workbench.analysis.trace.tables.GpuBusy`.
    ``base_step_us``/``test_step_us``: the median step (:func:`~workbench.analysis.trace.tables.step_numbers`,
    the same number ``workbench trace`` shows; NaN without step annotations).
    ``base_busy``/``test_busy`` and the breakdowns are as measured (whole trace); ``gpu`` and
    ``breakdown`` give them in the diff's unit (divided by the step count with ``per_step``).
    ``base_summary``/``test_summary``: each side's :func:`~workbench.analysis.trace_summary` (findings
    included), from ``base_analysis``/``test_analysis`` (each side's
    :class:`~workbench.analysis.trace.analysis.TraceAnalysis`), computed once.
    """

    kernels: pd.DataFrame
    ops: pd.DataFrame
    base_busy: GpuBusy
    test_busy: GpuBusy
    base_breakdown: dict
    test_breakdown: dict
    base_steps: int
    test_steps: int
    base_step_us: float
    test_step_us: float
    normalize: str = "total"
    base_summary: dict | None = field(default=None, repr=False, compare=False)
    test_summary: dict | None = field(default=None, repr=False, compare=False)
    base: object = field(default=None, repr=False, compare=False)
    test: object = field(default=None, repr=False, compare=False)
    base_analysis: TraceAnalysis | None = field(default=None, repr=False, compare=False)
    test_analysis: TraceAnalysis | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        return (
            f"TraceDiff(kernels={len(self.kernels)} names, kernel time {self.kernel_delta_us:+,.1f} us, "
            f"appeared {len(self.appeared_kernels)}, disappeared {len(self.disappeared_kernels)}; "
            f"ops={len(self.ops)} names; GPU busy {self.base_busy.busy_us:,.0f} -> {self.test_busy.busy_us:,.0f} us; "
            f"median step {self.base_step_us:,.0f} -> {self.test_step_us:,.0f} us; normalize={self.normalize!r})"
        )

    @property
    def appeared_kernels(self) -> list[str]:
        return self.kernels.loc[self.kernels["status"] == "appeared", "name"].tolist()

    @property
    def disappeared_kernels(self) -> list[str]:
        return self.kernels.loc[self.kernels["status"] == "disappeared", "name"].tolist()

    @property
    def appeared_ops(self) -> list[str]:
        return self.ops.loc[self.ops["status"] == "appeared", "name"].tolist()

    @property
    def disappeared_ops(self) -> list[str]:
        return self.ops.loc[self.ops["status"] == "disappeared", "name"].tolist()

    @property
    def warnings(self) -> list[str]:
        """What says the two traces are not comparable runs of one program on one machine: different
        devices, or recorded far apart (:func:`~workbench.analysis.trace.ranks.job_warnings`)."""
        from workbench.analysis.trace.ranks import _start_unix_ns, job_warnings

        sides = []
        for label, t in (("base", self.base), ("test", self.test)):
            if t is None or isinstance(t, pd.DataFrame):
                return []
            name = f"{label} {Path(str(getattr(t, 'path', '') or label)).name}"
            sides.append((name, getattr(t, "device", "unknown GPU"), _start_unix_ns(t)))
        return [w.replace("these traces are not one job on one kind of GPU",
                          "their times compare different hardware").replace(
                    "ranks of one job start together", "the program, driver or machine may have changed between them")
                for w in job_warnings(sides)]

    @property
    def step_delta_us(self) -> float:
        return self.test_step_us - self.base_step_us

    @property
    def step_ratio(self) -> float:
        b = self.base_step_us
        return self.test_step_us / b if b and not math.isnan(b) else float("nan")

    @property
    def kernel_delta_us(self) -> float:
        """Change of the summed kernel time (in the diff's unit)."""
        return float(self.kernels["delta_us"].sum())

    # -- what changed, in the diff's unit ----------------------------------------------------------

    def _div(self, side: str) -> float:
        if self.normalize != "per_step":
            return 1.0
        n = self.base_steps if side == "base" else self.test_steps
        return float(n) if n else 1.0

    @property
    def unit(self) -> str:
        """What the numbers are: ``per step`` or ``total over B -> T steps`` (``total`` without steps)."""
        if self.normalize == "per_step":
            return "per step"
        if self.base_steps or self.test_steps:
            return f"total over {self.base_steps} -> {self.test_steps} steps"
        return "total"

    def gpu(self, side: str) -> dict:
        """``busy_us``, ``idle_us``, ``window_us``, ``kernel_count`` (divided by the steps with
        ``per_step``) and ``idle_fraction`` of one side (``"base"`` or ``"test"``)."""
        b = self.base_busy if side == "base" else self.test_busy
        div = self._div(side)
        return {"busy_us": b.busy_us / div, "idle_us": b.idle_us / div, "window_us": b.window_us / div,
                "kernel_count": b.kernel_count / div if self.normalize == "per_step" else b.kernel_count,
                "idle_fraction": b.idle_fraction}

    def breakdown(self, side: str) -> dict:
        """One side's temporal breakdown in the diff's unit (keys of :data:`BREAKDOWN_PARTS`)."""
        src = self.base_breakdown if side == "base" else self.test_breakdown
        div = self._div(side)
        return {k: float(src.get(k, 0.0)) / div for k in BREAKDOWN_PARTS}

    @property
    def changes(self) -> list[dict]:
        """What changed, first to say: the median step (when both traces have steps), then the four
        breakdown parts, largest absolute change first. Each ``{key, label, base_us, test_us, delta_us,
        delta_pct}`` (``delta_pct`` None when base is 0); ``key`` is ``step`` or a breakdown key."""
        rows = []
        if not (math.isnan(self.base_step_us) or math.isnan(self.test_step_us)):
            rows.append(_change("step", "median step", self.base_step_us, self.test_step_us))
        b, t = self.breakdown("base"), self.breakdown("test")
        parts = [_change(k, label, b[k], t[k]) for k, label in BREAKDOWN_PARTS.items()]
        order = sorted(range(len(parts)), key=lambda i: (-abs(parts[i]["delta_us"]), i))
        return rows + [parts[i] for i in order]

    @property
    def headline(self) -> str:
        """One sentence that leads the diff: the largest breakdown change, then the step time."""
        parts = [c for c in self.changes if c["key"] != "step"]
        step = [c for c in self.changes if c["key"] == "step"]
        said = []
        if parts and parts[0]["delta_us"] != 0:
            said.append(f"{parts[0]['label']} {_change_text(parts[0], self.unit)}")
        if step:
            said.append(f"median step {_change_text(step[0], 'per step' if self.normalize != 'per_step' else '')}")
        if not said:
            return "no change in the GPU time breakdown"
        return "; ".join(said)

    @property
    def findings_change(self) -> dict:
        """Findings of each side by id: ``resolved`` (base only), ``new`` (test only), ``changed``
        (both, another severity: ``{id, base_severity, test_severity, message}``, message of the
        test), ``kept`` (both, same severity). Each finding ``{id, severity, message}``."""
        def by_id(summary):
            out = {}
            for f in (summary or {}).get("findings", []):
                out.setdefault(f["id"], f)
            return out

        b, t = by_id(self.base_summary), by_id(self.test_summary)
        brief = lambda f: {"id": f["id"], "severity": f["severity"], "message": f["message"]}  # noqa: E731
        changed = [{"id": i, "base_severity": b[i]["severity"], "test_severity": t[i]["severity"],
                    "message": t[i]["message"]} for i in b if i in t and b[i]["severity"] != t[i]["severity"]]
        return {
            "resolved": [brief(f) for i, f in b.items() if i not in t],
            "new": [brief(f) for i, f in t.items() if i not in b],
            "changed": changed,
            "kept": [brief(f) for i, f in t.items() if i in b and b[i]["severity"] == f["severity"]],
        }


def _change(key: str, label: str, base: float, test: float) -> dict:
    base, test = float(base), float(test)
    return {"key": key, "label": label, "base_us": base, "test_us": test, "delta_us": test - base,
            "delta_pct": 100.0 * (test - base) / base if base else None}


def _change_text(c: dict, unit: str = "") -> str:
    pct = f", {c['delta_pct']:+.1f}%" if c["delta_pct"] is not None else ""
    unit = f"; {unit}" if unit else ""
    return f"{c['base_us'] / 1e3:,.1f} -> {c['test_us'] / 1e3:,.1f} ms ({c['delta_us'] / 1e3:+,.1f} ms{pct}{unit})"


def _status(base_count: pd.Series, test_count: pd.Series) -> np.ndarray:
    return np.where(base_count == 0, "appeared", np.where(test_count == 0, "disappeared", "both"))


def _outer(base: pd.DataFrame, test: pd.DataFrame, cols: dict[str, str]) -> pd.DataFrame:
    """Outer-join two per-name tables; ``cols`` maps a source column to the output stem."""
    keep = ["name", *cols]
    b = base[keep].groupby("name", sort=False).sum(numeric_only=True)
    t = test[keep].groupby("name", sort=False).sum(numeric_only=True)
    both = pd.merge(b, t, how="outer", left_index=True, right_index=True, suffixes=("_b", "_t")).fillna(0.0)
    out = pd.DataFrame({"name": both.index.astype(str)})
    for src, stem in cols.items():
        out[f"base_{stem}"] = both[f"{src}_b"].to_numpy(np.float64)
        out[f"test_{stem}"] = both[f"{src}_t"].to_numpy(np.float64)
    return out


def _steps_of(a: TraceAnalysis) -> tuple[int, float]:
    """ProfilerSteps and the median step by the one definition (``a.numbers``, the ``per_step`` block of
    ``workbench trace --json``); ``(0, nan)`` without ProfilerStep annotations."""
    n = a.numbers
    if not n.delimited:
        return 0, float("nan")
    return n.steps, n.step_median_us


def trace_diff(base, test, normalize: str = "total") -> TraceDiff:
    """Per-kernel and per-op deltas (time and count) from ``base`` to ``test`` (two loaded traces, or
    their :class:`~workbench.analysis.trace.analysis.TraceAnalysis`), kernels and ops that appeared or
    disappeared, GPU busy/idle of each, and the step-time change. Every number of a side comes from its
    TraceAnalysis (built here for a trace), so each side is analysed (and diagnosed) once.

    ``normalize="per_step"`` divides counts and times by each trace's number of profiler steps.
    """
    if normalize not in ("total", "per_step"):
        raise BadArgument(f"normalize must be 'total' or 'per_step', not {normalize!r}")
    a_base, a_test = (x if isinstance(x, TraceAnalysis) else TraceAnalysis(x) for x in (base, test))
    base, test = a_base.trace, a_test.trace
    base_steps, base_step_us = _steps_of(a_base)
    test_steps, test_step_us = _steps_of(a_test)
    div_b = div_t = 1.0
    if normalize == "per_step":
        missing = [getattr(t, "path", "trace") for t, n in ((base, base_steps), (test, test_steps)) if n == 0]
        if missing:
            raise BadArgument(
                f"{', '.join(map(str, missing))}: no ProfilerStep#N annotations, so there is no per-step "
                "normalisation; use normalize='total' or profile with a schedule (prof.step())"
            )
        div_b, div_t = float(base_steps), float(test_steps)

    k = _outer(a_base.kernels, a_test.kernels, {"count": "count", "total_us": "total_us"})
    for side, div in (("base", div_b), ("test", div_t)):
        k[f"{side}_count"] /= div
        k[f"{side}_total_us"] /= div
    k["delta_count"] = k["test_count"] - k["base_count"]
    k["delta_us"] = k["test_total_us"] - k["base_total_us"]
    k["delta_pct"] = np.where(k["base_total_us"] > 0, 100.0 * k["delta_us"] / k["base_total_us"].where(k["base_total_us"] > 0), np.nan)
    k["status"] = _status(k["base_count"], k["test_count"])
    k = k[["name", "base_count", "test_count", "delta_count", "base_total_us", "test_total_us", "delta_us",
           "delta_pct", "status"]]
    k = k.iloc[np.lexsort((k["name"].to_numpy(), -k["delta_us"].abs().to_numpy()))].reset_index(drop=True)
    if normalize == "total":
        k[["base_count", "test_count", "delta_count"]] = k[["base_count", "test_count", "delta_count"]].astype("int64")

    o = _outer(a_base.ops, a_test.ops,
               {"count": "count", "cpu_total_us": "cpu_total_us", "device_total_us": "device_total_us"})
    for side, div in (("base", div_b), ("test", div_t)):
        for c in ("count", "cpu_total_us", "device_total_us"):
            o[f"{side}_{c}"] /= div
    o["delta_count"] = o["test_count"] - o["base_count"]
    o["delta_cpu_us"] = o["test_cpu_total_us"] - o["base_cpu_total_us"]
    o["delta_device_us"] = o["test_device_total_us"] - o["base_device_total_us"]
    o["status"] = _status(o["base_count"], o["test_count"])
    o = o[["name", "base_count", "test_count", "delta_count", "base_cpu_total_us", "test_cpu_total_us",
           "delta_cpu_us", "base_device_total_us", "test_device_total_us", "delta_device_us", "status"]]
    # biggest device-time change first, then biggest CPU-time change, then name
    order = np.lexsort((o["name"].to_numpy(), -o["delta_cpu_us"].abs().to_numpy(),
                        -o["delta_device_us"].abs().to_numpy()))
    o = o.iloc[order].reset_index(drop=True)
    if normalize == "total":
        o[["base_count", "test_count", "delta_count"]] = o[["base_count", "test_count", "delta_count"]].astype("int64")

    return TraceDiff(
        kernels=k, ops=o, base_busy=a_base.busy, test_busy=a_test.busy,
        base_breakdown=a_base.breakdown, test_breakdown=a_test.breakdown,
        base_steps=base_steps, test_steps=test_steps, base_step_us=base_step_us, test_step_us=test_step_us,
        normalize=normalize, base_summary=a_base.summary(), test_summary=a_test.summary(),
        base=base, test=test, base_analysis=a_base, test_analysis=a_test,
    )


def _num(v):
    if v is None:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if math.isnan(f) or math.isinf(f) else f
    return v


def _rows(df: pd.DataFrame) -> list[dict]:
    return [{k: _num(v) for k, v in zip(df.columns, row)} for row in df.itertuples(index=False, name=None)]


def _summary_of(analysis: TraceAnalysis | None, trace) -> dict:
    return (analysis if analysis is not None else TraceAnalysis(trace)).summary()


def diff_summary(base_or_diff, test=None, top: int | None = None, normalize: str = "total") -> dict:
    """The ``workbench diff --json`` document (every key in docs/json.md): ``base`` and ``test`` (each a
    :func:`~workbench.analysis.trace_summary`), ``kernels[{name, base_total_us, test_total_us, delta_us,
    base_count, test_count, delta_count, delta_pct, status}]``; plus ``ops``, ``appeared``/``disappeared``
    (kernels and ops), ``gpu`` (busy/idle of each and the change), ``steps`` (median step time of each
    and the change) and ``breakdown`` (each side's temporal breakdown).

    Pass two traces (or their TraceAnalysis), or a :class:`TraceDiff` made from traces. ``top`` keeps the
    largest changes only.
    """
    if isinstance(base_or_diff, TraceDiff):
        d = base_or_diff
    else:
        if test is None:
            raise BadArgument("diff_summary needs a TraceDiff or two traces (base, test)")
        d = trace_diff(base_or_diff, test, normalize=normalize)
    if d.base is None or d.test is None:
        raise BadArgument("this TraceDiff does not hold its traces; build it with trace_diff(base, test)")
    kernels = d.kernels if top is None else d.kernels.head(top)
    ops = d.ops if top is None else d.ops.head(top)
    b, t = d.gpu("base"), d.gpu("test")
    return {
        "base": d.base_summary if d.base_summary is not None else _summary_of(d.base_analysis, d.base),
        "test": d.test_summary if d.test_summary is not None else _summary_of(d.test_analysis, d.test),
        "normalize": d.normalize,
        "unit": d.unit,
        "headline": d.headline,
        "changes": [{k: _num(v) for k, v in c.items()} for c in d.changes],
        "findings": d.findings_change,
        "kernels": _rows(kernels),
        "ops": _rows(ops),
        "appeared": {"kernels": d.appeared_kernels, "ops": d.appeared_ops},
        "disappeared": {"kernels": d.disappeared_kernels, "ops": d.disappeared_ops},
        "gpu": {
            "base_busy_us": _num(b["busy_us"]), "test_busy_us": _num(t["busy_us"]),
            "delta_busy_us": _num(t["busy_us"] - b["busy_us"]),
            "base_idle_us": _num(b["idle_us"]), "test_idle_us": _num(t["idle_us"]),
            "delta_idle_us": _num(t["idle_us"] - b["idle_us"]),
            "base_idle_fraction": _num(b["idle_fraction"]), "test_idle_fraction": _num(t["idle_fraction"]),
            "delta_idle_fraction": _num(t["idle_fraction"] - b["idle_fraction"]),
            "base_kernel_count": _num(b["kernel_count"]), "test_kernel_count": _num(t["kernel_count"]),
            "kernel_delta_us": _num(d.kernel_delta_us),
        },
        "steps": {
            "base_count": d.base_steps, "test_count": d.test_steps,
            "base_median_us": _num(d.base_step_us), "test_median_us": _num(d.test_step_us),
            "delta_us": _num(d.step_delta_us), "ratio": _num(d.step_ratio),
        },
        "breakdown": {"base": {k: _num(v) for k, v in d.breakdown("base").items()},
                      "test": {k: _num(v) for k, v in d.breakdown("test").items()}},
        "warnings": d.warnings,
    }

"""What an experiment's measurements mean: numerical-check verdicts, step-time statistics, batch-size
search, and the result records the harness and the estimator hand back.

Everything here is arithmetic on numbers the capture layer already took (step times in ms, sampled
losses, gradients and parameter updates as float64 numpy arrays, peaks in bytes); no torch.
:mod:`workbench.capture.runner` (the harness) and :mod:`workbench.capture.estimate` (the estimator)
call it, and so can anyone holding a ledger.

Precisions have one spelling everywhere: ``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``
(:func:`precision_name` turns ``"bfloat16"``, ``torch.bfloat16`` and friends into it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError
from workbench.io.ledger import ledger_frame

__all__ = [
    # precision spellings
    "PRECISIONS",
    "PRECISION_ORDER",
    "precision_name",
    "lowest_precision",
    "DEFAULT_TOLERANCE",
    # result records
    "NumericalCheck",
    "ConfigResult",
    "Experiment",
    "Headroom",
    "HEADROOM_COLUMNS",
    # arithmetic
    "compare_step",
    "numerical_verdict",
    "numerical_check",
    "step_time_stats",
    "search_largest",
]

# --------------------------------------------------------------------------------------------------
# Precision spellings

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")
# lowest first: the precision of a combination of configurations is the lowest of theirs
PRECISION_ORDER: tuple[str, ...] = ("fp16", "bf16", "tf32", "fp32")
_ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
    "fp8": "fp8",
}


def precision_name(value: Any) -> str:
    """The one spelling of a precision or floating dtype: ``"bfloat16"``, ``"torch.bfloat16"`` and
    ``torch.bfloat16`` all give ``"bf16"`` (``float32`` → ``fp32``, ``float16``/``half`` → ``fp16``,
    ``float64`` → ``fp64``). Other dtypes keep torch's name without the ``torch.`` prefix (``int8``).

    >>> precision_name("bfloat16"), precision_name("fp16"), precision_name("float32")
    ('bf16', 'fp16', 'fp32')
    """
    text = str(value).strip().lower().replace("torch.", "")
    return _ALIASES.get(text, text)


def lowest_precision(precisions) -> str:
    """The lowest of ``precisions`` (one spelling), ``fp32`` when there is none."""
    names = [precision_name(p) for p in precisions] or ["fp32"]
    return min(names, key=lambda p: PRECISION_ORDER.index(p) if p in PRECISION_ORDER else len(PRECISION_ORDER))


# Relative-error tolerance of the numerical check by the precision the math runs in.
DEFAULT_TOLERANCE: dict[str, float] = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 5e-2, "fp16": 1e-2}


# --------------------------------------------------------------------------------------------------
# Result records


@dataclass(frozen=True)
class NumericalCheck:
    """A configuration's first steps against the reference's.

    Relative errors are ``max|x - ref| / max|ref|`` (scaled by the reference's magnitude, so values
    near zero do not blow it up): ``loss_rel_err`` and ``output_max_rel_err`` over the checked steps,
    ``grad_max_rel_err`` over every parameter's gradient.

    ``grad_underflow_fraction``: of the gradient elements that are nonzero in the reference, the
    fraction that are exactly zero here (fp16 gradients flushed to zero without loss scaling).
    ``update_vanished_fraction``: of the parameter elements the reference's step moved, the fraction
    this configuration's step left unchanged.
    ``update_underflow_fraction``: of the parameter elements with a nonzero gradient, the fraction
    whose update is below the parameter dtype's resolution, ``|update| < eps(dtype) * |param|``
    (update rounded away: pure fp16/bf16 weights with small learning rates). Needs no reference.
    ``param_dtype`` is the parameters' precision (``fp32``, ``bf16``, ``fp16``).

    Large tensors are checked on a fixed sample of up to ``max_elements`` per tensor (the same
    elements in every configuration). Steps that a GradScaler skipped (inf/NaN at that scale) are
    left out of the update statistics.
    """

    reference: str
    steps: int
    loss_rel_err: float
    output_max_rel_err: float
    grad_max_rel_err: float
    grad_underflow_fraction: float
    update_vanished_fraction: float
    update_underflow_fraction: float
    param_dtype: str
    skipped_steps: int
    verdict: str
    message: str
    per_step: pd.DataFrame = field(repr=False, compare=False, default=None)

    def as_row(self) -> dict:
        return {
            "check_reference": self.reference,
            "check_steps": self.steps,
            "check_loss_rel_err": self.loss_rel_err,
            "check_output_max_rel_err": self.output_max_rel_err,
            "check_grad_max_rel_err": self.grad_max_rel_err,
            "check_grad_underflow_fraction": self.grad_underflow_fraction,
            "check_update_vanished_fraction": self.update_vanished_fraction,
            "check_update_underflow_fraction": self.update_underflow_fraction,
            "check_verdict": self.verdict,
            "check_message": self.message,
        }


@dataclass
class ConfigResult:
    """What one configuration measured (``row`` is its ledger row)."""

    name: str
    status: str
    row: dict
    step_ms: list[float] = field(default_factory=list)
    check: NumericalCheck | None = None
    trace_path: str | None = None
    error: str | None = None


@dataclass
class Experiment:
    """All configurations of one run; ``ledger`` is the DataFrame (one row each)."""

    name: str
    results: list[ConfigResult]
    reference: str | None
    interrupted: bool = False

    @property
    def ledger(self) -> pd.DataFrame:
        return ledger_frame([r.row for r in self.results])

    def result(self, name: str) -> ConfigResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no configuration named {name!r}; have {[r.name for r in self.results]}")

    def checks(self) -> pd.DataFrame:
        """Per-step numerical check of every configuration (configuration, step, loss, errors...)."""
        frames = [r.check.per_step.assign(configuration=r.name) for r in self.results
                  if r.check is not None and r.check.per_step is not None]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def save(self, path, append: bool = True):
        """Add this experiment's rows to a ledger file (``.json`` or ``.parquet``)."""
        from workbench.io.ledger import save_ledger

        return save_ledger(self.ledger, path, append=append)

    def __repr__(self) -> str:
        cols = ["configuration", "status", "step_ms_median", "peak_allocated_bytes", "check_verdict"]
        return f"Experiment({self.name!r}, reference={self.reference!r})\n" + self.ledger[cols].to_string()


HEADROOM_COLUMNS = ["batch_size", "fits", "peak_allocated_bytes", "peak_reserved_bytes", "reason"]


@dataclass(frozen=True)
class Headroom:
    """The largest batch size that fitted, the memory it used, and every try.

    Both batch-size searches return it: the harness's :func:`~workbench.capture.runner.find_max_batch_size`
    (measured; ``estimate`` is None) and the estimator's
    :func:`~workbench.capture.estimate.largest_batch_that_fits` (predicted; ``estimate`` is the
    :class:`~workbench.analysis.memory.estimate.Estimate` at ``batch_size``, or at the smallest batch tried when
    none fitted). ``tries`` has one row per batch size tried (``batch_size``, ``fits``,
    ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``reason``).

    It unpacks as ``batch_size, estimate = headroom`` (and ``headroom[0]``), the pair the estimator
    returned before it returned this.
    """

    batch_size: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    limit_bytes: int | None
    limit_source: str
    tries: pd.DataFrame = field(repr=False, compare=False)
    estimate: Any = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        peak = "" if self.peak_allocated_bytes is None else f", peak {self.peak_allocated_bytes / 2**30:.2f} GiB"
        limit = "" if self.limit_bytes is None else f" of {self.limit_bytes / 2**30:.2f} GiB ({self.limit_source})"
        return f"largest batch size that fits: {self.batch_size}{peak}{limit}"

    def __iter__(self):
        return iter((self.batch_size, self.estimate))

    def __getitem__(self, i):
        return (self.batch_size, self.estimate)[i]

    def __len__(self) -> int:
        return 2


# --------------------------------------------------------------------------------------------------
# Numerical check: one step against the reference's, then the verdict


def _rel_err(x: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    if ref.size == 0 or x.shape != ref.shape:
        return float("nan")
    diff = float(np.abs(x - ref).max())
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def compare_step(rec: dict, ref: dict | None) -> dict:
    """Per-step numbers of the numerical check (see :class:`NumericalCheck`).

    ``rec`` (and ``ref``, the reference's record of the same step, or None) hold ``loss`` (float),
    ``outputs`` (a float64 array or None), and for a training step ``grads``, ``params`` and
    ``updates`` ({parameter name: float64 array}), ``eps`` ({name: the parameter dtype's machine
    epsilon}) and ``skipped`` (the GradScaler skipped the step).
    """
    out = {"loss": rec["loss"], "skipped": rec.get("skipped", False)}
    finite = math.isfinite(rec["loss"])
    if "grads" in rec:
        finite = finite and all(g is None or bool(np.isfinite(g).all()) for g in rec["grads"].values())
    out["finite"] = finite
    # self-contained: updates below the parameter dtype's resolution, where the gradient asked for a move
    if "updates" in rec and not out["skipped"]:
        under = moved_total = 0
        for n, u in rec["updates"].items():
            g = rec["grads"].get(n)
            if g is None:
                continue
            eps = rec["eps"][n]
            want = g != 0
            under += int(((np.abs(u) < eps * np.abs(rec["params"][n])) & want).sum())
            moved_total += int(want.sum())
        out["update_underflow_fraction"] = under / moved_total if moved_total else float("nan")
    else:
        out["update_underflow_fraction"] = float("nan")
    nan = float("nan")
    out.update(loss_rel_err=nan, output_max_rel_err=nan, grad_max_rel_err=nan,
               grad_underflow_fraction=nan, update_vanished_fraction=nan)
    if ref is None:
        return out
    out["loss_rel_err"] = abs(rec["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    if rec.get("outputs") is not None and ref.get("outputs") is not None:
        out["output_max_rel_err"] = _rel_err(rec["outputs"], ref["outputs"])
    if "grads" in rec and "grads" in ref and not out["skipped"]:  # a skipped step's grads are inf by definition
        errs, zero, nonzero = [], 0, 0
        for n, g in rec["grads"].items():
            gr = ref["grads"].get(n)
            if g is None or gr is None or g.shape != gr.shape:
                continue
            errs.append(_rel_err(g, gr))
            nz = gr != 0
            zero += int(((g == 0) & nz).sum())
            nonzero += int(nz.sum())
        errs = [e for e in errs if not math.isnan(e)]
        out["grad_max_rel_err"] = max(errs) if errs else nan
        out["grad_underflow_fraction"] = zero / nonzero if nonzero else nan
    if "updates" in rec and "updates" in ref and not out["skipped"]:
        vanished = moved = 0
        for n, u in rec["updates"].items():
            ur = ref["updates"].get(n)
            if ur is None or u.shape != ur.shape:
                continue
            m = ur != 0
            vanished += int(((u == 0) & m).sum())
            moved += int(m.sum())
        out["update_vanished_fraction"] = vanished / moved if moved else nan
    return out


def _nanmax(values) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return max(vals) if vals else float("nan")


def numerical_verdict(stats: list[dict], reference: str, precision: str, param_dtype: str,
                      tolerance: float | None = None, vanish_threshold: float = 0.01,
                      not_comparable: str = "") -> NumericalCheck:
    """The verdict over the per-step numbers of :func:`compare_step`:
    ``nonfinite`` > ``vanishing_updates`` > ``grad_underflow`` > (``n/a`` when ``not_comparable`` says
    why) > ``large_error`` (loss/outputs beyond ``precision``'s tolerance, gradients beyond 10×) > ``ok``."""
    precision = precision_name(precision)
    per_step = pd.DataFrame(stats)
    per_step.insert(0, "step", range(len(stats)))
    loss_err = _nanmax(s["loss_rel_err"] for s in stats)
    out_err = _nanmax(s["output_max_rel_err"] for s in stats)
    grad_err = _nanmax(s["grad_max_rel_err"] for s in stats)
    g_under = _nanmax(s["grad_underflow_fraction"] for s in stats)
    vanished = _nanmax(s["update_vanished_fraction"] for s in stats)
    underflow = _nanmax(s["update_underflow_fraction"] for s in stats)
    skipped = sum(bool(s.get("skipped")) for s in stats)
    skip_note = (f" ({skipped} step(s) skipped by the GradScaler; steps after the first skip are not compared)"
                 if skipped else "")
    tol = tolerance if tolerance is not None else DEFAULT_TOLERANCE.get(precision, 1e-2)
    worst_update = _nanmax([vanished, underflow])
    if not all(s["finite"] for s in stats if not s.get("skipped")):
        verdict, msg = "nonfinite", "loss or gradients became inf/NaN; use bf16, or fp16 with a GradScaler"
    elif not math.isnan(worst_update) and worst_update > vanish_threshold:
        verdict = "vanishing_updates"
        msg = (f"{worst_update:.1%} of parameter updates vanish in {param_dtype} "
               f"(|update| < eps*|param| or unchanged where fp32 moved); keep fp32 master weights "
               f"(autocast) or raise the update size")
    elif not math.isnan(g_under) and g_under > vanish_threshold:
        verdict = "grad_underflow"
        msg = (f"{g_under:.1%} of gradient elements are zero here but not in {reference}: "
               f"fp16 gradients underflow; scale the loss (torch.amp.GradScaler)")
    elif not_comparable:
        verdict, msg = "n/a", f"{not_comparable}: only update underflow was checked"
    elif (not math.isnan(loss_err) and loss_err > tol) or (not math.isnan(out_err) and out_err > tol) \
            or (not math.isnan(grad_err) and grad_err > 10 * tol):
        verdict = "large_error"
        msg = (f"error against {reference} above what {precision} explains: loss {loss_err:.2e}, "
               f"outputs {out_err:.2e} (tolerance {tol:.0e}), gradients {grad_err:.2e} (tolerance {10 * tol:.0e})")
    else:
        verdict = "ok"
        parts = [f"{what} {val:.2e}" for what, val in
                 (("loss", loss_err), ("outputs", out_err), ("gradients", grad_err)) if not math.isnan(val)]
        msg = f"within {precision} tolerance of {reference}: " + ", ".join(parts)
    msg += skip_note
    return NumericalCheck(
        reference=reference, steps=len(stats), loss_rel_err=loss_err, output_max_rel_err=out_err,
        grad_max_rel_err=grad_err, grad_underflow_fraction=g_under, update_vanished_fraction=vanished,
        update_underflow_fraction=underflow, param_dtype=param_dtype, skipped_steps=skipped,
        verdict=verdict, message=msg, per_step=per_step,
    )


def numerical_check(records: list[dict], reference_records: list[dict | None], reference: str, precision: str,
                    tolerance: float | None = None, vanish_threshold: float = 0.01,
                    not_comparable: str = "") -> NumericalCheck:
    """Compare each checked step's record with the reference's (None: nothing to compare with) and
    give the verdict. After a step the GradScaler skipped, this run is one update behind the reference,
    so later steps are not compared (their own update check still runs)."""
    stats, diverged = [], False
    for rec, ref in zip(records, reference_records):
        stats.append(compare_step(rec, None if diverged else ref))
        diverged = diverged or bool(rec.get("skipped"))
    dtypes = records[0].get("dtypes") or {}
    param_dtype = precision_name(next(iter(dtypes.values()))) if dtypes else "n/a"
    return numerical_verdict(stats, reference, precision, param_dtype, tolerance, vanish_threshold, not_comparable)


# --------------------------------------------------------------------------------------------------
# Step times


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def step_time_stats(step_ms: list[float], batch_size: int, tokens_per_sample: int | None = None) -> dict:
    """The ledger's step-time columns from the timed steps: median, quartiles, min, max, samples/s
    (and tokens/s when ``tokens_per_sample`` is given)."""
    med = statistics.median(step_ms)
    q1, q3 = _quartiles(step_ms)
    row = dict(step_ms_median=med, step_ms_q1=q1, step_ms_q3=q3, step_ms_min=min(step_ms), step_ms_max=max(step_ms),
               samples_per_s=batch_size / (med / 1e3) if med > 0 else float("nan"))
    if tokens_per_sample:
        row["tokens_per_s"] = row["samples_per_s"] * tokens_per_sample
    return row


# --------------------------------------------------------------------------------------------------
# Batch-size search


def search_largest(fits: Callable[[int], bool], start: int, high: int, *, below_start: bool = True) -> int:
    """The largest ``n`` in ``[1, high]`` with ``fits(n)``, assuming ``fits`` is monotone: try ``start``,
    double while it fits (up to ``high``), then bisect between the last that fitted and the first that
    did not. When ``start`` does not fit: bisect below it (``below_start=True``) or answer 0. 0 when
    nothing fits. ``fits`` is called once per distinct ``n`` in that order (it may cache)."""
    if start < 1:
        raise WorkbenchError(f"a batch-size search starts at 1 or more, not {start}")
    lo_ok, hi_bad = 0, None
    n = start
    if fits(n):
        lo_ok = n
        while n < high:
            n = min(n * 2, high)
            if fits(n):
                lo_ok = n
            else:
                hi_bad = n
                break
    elif below_start:
        hi_bad = n
    else:
        return 0
    if hi_bad is not None:
        while hi_bad - lo_ok > 1:
            mid = (lo_ok + hi_bad) // 2
            if fits(mid):
                lo_ok = mid
            else:
                hi_bad = mid
    return lo_ok

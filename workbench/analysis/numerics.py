"""Numerical agreement of one computation done two ways (a precision, a device) against a reference.

NumPy and pandas only. Two relative errors per tensor, both scaled by the reference's magnitude so that
elements near zero do not blow them up:

- :func:`max_rel_err`: ``max|x - ref| / max|ref|`` (the definition of the harness's numerical check,
  :class:`~workbench.analysis.experiment.NumericalCheck`): the worst element against the tensor's scale;
- :func:`norm_rel_err`: ``||x - ref||_2 / ||ref||_2``: the error of the tensor as a whole.

:func:`error_table` puts them side by side for many tensors and candidates; :data:`UNIT_ROUNDOFF` is
each format's unit roundoff (half the spacing of numbers in ``[1, 2)``), the scale one rounding makes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from workbench.analysis.experiment import precision_name

__all__ = ["UNIT_ROUNDOFF", "max_rel_err", "norm_rel_err", "error_table", "bitwise_equal", "max_abs_diff"]

# 2**-(mantissa bits + 1): fp64 52 stored bits, fp32 23, tf32 10, fp16 10, bf16 7
UNIT_ROUNDOFF: dict[str, float] = {"fp64": 2.0**-53, "fp32": 2.0**-24, "tf32": 2.0**-11,
                                   "fp16": 2.0**-11, "bf16": 2.0**-8}


def _pair(x, ref) -> tuple[np.ndarray, np.ndarray]:
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {x.shape} vs reference {ref.shape}")
    return x, ref


def _ratio(diff: float, scale: float) -> float:
    if math.isnan(diff) or math.isnan(scale):
        return float("nan")
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def max_rel_err(x, ref) -> float:
    """``max|x - ref| / max|ref|`` over all elements (0 for two equal all-zero tensors, inf when only
    the reference is zero, NaN when either holds a NaN, nan for empty tensors)."""
    x, ref = _pair(x, ref)
    if ref.size == 0:
        return float("nan")
    return _ratio(float(np.abs(x - ref).max()), float(np.abs(ref).max()))


def norm_rel_err(x, ref) -> float:
    """``||x - ref||_2 / ||ref||_2`` (same conventions as :func:`max_rel_err`)."""
    x, ref = _pair(x, ref)
    if ref.size == 0:
        return float("nan")
    return _ratio(float(np.linalg.norm((x - ref).ravel())), float(np.linalg.norm(ref.ravel())))


def max_abs_diff(x, ref) -> float:
    """``max|x - ref|`` (0.0 for empty tensors)."""
    x, ref = _pair(x, ref)
    return float(np.abs(x - ref).max()) if x.size else 0.0


def bitwise_equal(x, ref) -> bool:
    """Same shape, same dtype, same bytes (NaNs with the same bits count as equal)."""
    x, ref = np.asarray(x), np.asarray(ref)
    return x.shape == ref.shape and x.dtype == ref.dtype and x.tobytes() == ref.tobytes()


def error_table(candidates: Mapping[str, Mapping[str, object]], reference: Mapping[str, object],
                metric: str = "max_rel") -> pd.DataFrame:
    """One row per tensor of ``reference`` ({name: array}), one column per candidate
    ({candidate: {name: array}}): the candidate's error on that tensor, ``metric`` ``"max_rel"``
    (:func:`max_rel_err`) or ``"norm_rel"`` (:func:`norm_rel_err`). A tensor a candidate lacks is NaN.
    The last row, ``"(worst)"``, is each column's maximum."""
    fn = {"max_rel": max_rel_err, "norm_rel": norm_rel_err}.get(metric)
    if fn is None:
        raise ValueError(f"metric must be 'max_rel' or 'norm_rel', not {metric!r}")
    rows = {name: {cand: (fn(tensors[name], ref) if name in tensors else float("nan"))
                   for cand, tensors in candidates.items()}
            for name, ref in reference.items()}
    table = pd.DataFrame.from_dict(rows, orient="index", columns=list(candidates))
    table.loc["(worst)"] = table.max(axis=0, skipna=True)
    table.index.name = "tensor"
    return table


def unit_roundoff(precision) -> float:
    """:data:`UNIT_ROUNDOFF` of ``precision`` in any spelling (``"bfloat16"``, ``torch.float32``...)."""
    name = precision_name(precision)
    if name not in UNIT_ROUNDOFF:
        raise ValueError(f"no unit roundoff known for {precision!r}; known: {', '.join(UNIT_ROUNDOFF)}")
    return UNIT_ROUNDOFF[name]


__all__.append("unit_roundoff")

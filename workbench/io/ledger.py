"""The results ledger: one row per (experiment, configuration), saved and reloaded as JSON or Parquet.

Runs accumulate across sessions and machines, so every row carries where and when it was measured
(``machine``, ``gpu``, ``torch_version``, ``date``). The harness (:mod:`workbench.capture.runner`)
writes rows; :mod:`workbench.analysis.trace.diff` turns them into ratios against a baseline.

JSON is always available::

    {"format": "gpu-workbench-ledger", "version": 1, "rows": [{...}, ...]}

Parquet needs ``pyarrow``; without it :class:`~workbench.errors.MissingDependency` says what to install.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from workbench._optional import import_optional
from workbench.errors import BadArtifact
from workbench.io._files import _short_repr, atomic_write, check_input, read_input

__all__ = [
    "LEDGER_COLUMNS",
    "LEDGER_FORMAT",
    "ledger_frame",
    "save_ledger",
    "load_ledger",
]

LEDGER_FORMAT = "gpu-workbench-ledger"
_VERSION = 1

# column -> pandas dtype. Rows may carry more columns (user metadata); these always exist, in this order.
LEDGER_COLUMNS: dict[str, str] = {
    # which run
    "experiment": "string",
    "configuration": "string",
    "status": "string",  # ok | oom | error | skipped
    "error": "string",
    "batch_size": "Int64",
    # where and when (on every row)
    "machine": "string",
    "device": "string",  # cuda:0 | cpu
    "gpu": "string",  # device name, "none" on CPU
    "torch_version": "string",
    "cuda_version": "string",
    "date": "string",  # ISO 8601, UTC
    # time
    "steps": "Int64",
    "warmup": "Int64",
    "timer": "string",  # cuda_events | wall_clock
    "first_step_ms": "float64",
    "step_ms_median": "float64",
    "step_ms_q1": "float64",
    "step_ms_q3": "float64",
    "step_ms_min": "float64",
    "step_ms_max": "float64",
    # memory
    "memory_source": "string",  # cuda_allocator | cpu_profiler
    "peak_allocated_bytes": "Int64",
    "peak_reserved_bytes": "Int64",
    # throughput and energy
    "samples_per_s": "float64",
    "tokens_per_s": "float64",
    "energy_j_per_step": "float64",
    "power_w": "float64",
    # numerical check against the reference configuration
    "check_reference": "string",
    "check_steps": "Int64",
    "check_loss_rel_err": "float64",
    "check_output_max_rel_err": "float64",
    "check_grad_max_rel_err": "float64",
    "check_grad_underflow_fraction": "float64",
    "check_update_vanished_fraction": "float64",
    "check_update_underflow_fraction": "float64",
    "check_verdict": "string",  # ok | large_error | vanishing_updates | grad_underflow | nonfinite | n/a
    "check_message": "string",
    # optional light trace of this configuration
    "trace_path": "string",
}


def _clean(value):
    """JSON-safe scalar: NaN/NA -> None, numpy scalars -> Python."""
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else value
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value


def ledger_frame(rows) -> pd.DataFrame:
    """A ledger DataFrame from a list of dicts (or a DataFrame): every column of
    :data:`LEDGER_COLUMNS` present with its dtype, extra columns kept after them.

    >>> ledger_frame([{"configuration": "fp32", "step_ms_median": 12.5}])[["configuration", "status"]]
      configuration status
    0          fp32   <NA>
    """
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    for col, dtype in LEDGER_COLUMNS.items():
        if col not in df.columns:
            df[col] = pd.Series([None] * len(df), dtype=dtype, index=df.index)
        else:
            series = df[col]
            if dtype == "float64":
                df[col] = pd.to_numeric(series, errors="coerce").astype("float64")
            elif dtype == "Int64":
                df[col] = pd.to_numeric(series, errors="coerce").round().astype("Int64")
            else:
                df[col] = series.astype("string")
    extra = [c for c in df.columns if c not in LEDGER_COLUMNS]
    return df[list(LEDGER_COLUMNS) + extra].reset_index(drop=True)


def _atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` then an atomic replace of ``path`` (io/_files.py: mode kept, symlinks and
    FIFOs refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write, by_name=True)


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    if name.endswith(".json"):
        return "json"
    raise BadArtifact(path, "unknown ledger format", "name the file *.json or *.parquet")


def _pyarrow(purpose: str):
    return import_optional("pyarrow", purpose)


def save_ledger(ledger, path: str | os.PathLike, append: bool = False) -> Path:
    """Write a ledger to ``path`` (``.json`` or ``.parquet``), atomically.

    With ``append=True`` the rows already in ``path`` (if it exists) are kept and the new rows added
    after them, so one file can collect runs from many sessions and machines. Returns the path.
    """
    path = Path(path)
    kind = _kind(path)
    df = ledger_frame(ledger)
    if append and path.exists():
        df = ledger_frame(pd.concat([load_ledger(path), df], ignore_index=True))
    if kind == "parquet":
        _pyarrow("to save a ledger as Parquet (or save it as .json)")
        _atomic_write(path, lambda tmp: df.to_parquet(tmp, engine="pyarrow", index=False))
        return path
    rows = [{k: _clean(v) for k, v in row.items()} for row in df.to_dict("records")]
    text = json.dumps({"format": LEDGER_FORMAT, "version": _VERSION, "rows": rows}, indent=1)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    _atomic_write(path, write)
    return path


def load_ledger(path: str | os.PathLike) -> pd.DataFrame:
    """Read a ledger written by :func:`save_ledger` (JSON or Parquet) into a DataFrame."""
    path = Path(path)
    kind = _kind(path)
    if not os.path.lexists(path):
        raise BadArtifact(path, "no such ledger file", "check the path, or save one with save_ledger(...)")
    check_input(path, "a ledger file", "check the path, or save one with save_ledger(...)")
    if kind == "parquet":
        _pyarrow("to read a Parquet ledger")
        try:
            df = pd.read_parquet(path, engine="pyarrow")
        except Exception as exc:  # pyarrow raises its own ArrowInvalid family
            raise BadArtifact(path, f"not a readable Parquet file ({exc})", "re-save the ledger") from None
        return ledger_frame(df)
    try:
        data = json.loads(read_input(path, "a ledger file"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadArtifact(path, f"not a JSON ledger ({exc})", "re-save it with save_ledger(...)") from None
    except RecursionError:
        raise BadArtifact(path, "nests JSON too deeply to be a ledger (a hostile or damaged file)",
                          "re-save it with save_ledger(...)") from None
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT or not isinstance(data.get("rows"), list):
        raise BadArtifact(
            path,
            f"not a gpu-workbench ledger (expected a JSON object with format={LEDGER_FORMAT!r} and rows)",
            "give a file written by save_ledger(...)",
        )
    rows = data["rows"]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadArtifact(path, f"row {i} is a {type(row).__name__}, not an object", "re-save it with save_ledger(...)")
        for k, v in row.items():
            if isinstance(v, (dict, list)):
                raise BadArtifact(path, f"row {i}: {str(k)[:40]} is a JSON {type(v).__name__}, not a value",
                                  "re-save it with save_ledger(...)")
            if isinstance(v, int) and not -(2**63) <= v < 2**63:
                raise BadArtifact(path, f"row {i}: {str(k)[:40]} is {_short_repr(v)}, beyond a 64-bit integer",
                                  "re-save it with save_ledger(...)")
    try:
        return ledger_frame(rows)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadArtifact(path, f"a ledger column cannot be read ({type(exc).__name__}: {_short_repr(str(exc))})",
                          "re-save it with save_ledger(...)") from None

"""NVML sessions on disk: one row per GPU per sample, as JSON lines or CSV (either may be gzipped).

The columns of a session (:data:`NVML_COLUMNS`) carry their unit in the name. A row may also be a
*mark* (``{"t_s": 12.5, "mark": "epoch 2"}``): an annotation on the time axis, which
:func:`load_nvml_session` returns in ``frame.attrs["marks"]`` instead of as a sample.

Older files with the short names of the first H200 recording (``t``, ``util_gpu``, ``mem_used``,
``power_mw``, ``sm_mhz``...) load too; they are renamed and ``power_mw`` becomes ``power_w``.

>>> from workbench import samples
>>> df = load_nvml_session(samples.path("h200_nvml_session"))
>>> len(df), list(df.columns[:4])
(427, ['t_s', 'gpu', 'util_gpu_pct', 'util_mem_pct'])
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import zlib
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from workbench.errors import BadArgument, BadArtifact
from workbench.io._files import _short_repr, atomic_write, check_input, line_blocks, open_input

__all__ = [
    # schema
    "NVML_COLUMNS",
    "GPM_COLUMNS",
    "THROTTLE_REASONS",
    "decode_throttle_reasons",
    "encode_throttle_reasons",
    # files
    "load_nvml_session",
    "save_nvml_session",
]

# Every column of a session frame, in order. `throttle_reasons` is text ("sw_power_cap,sw_thermal";
# "" when the clocks run free; missing when the GPU cannot say); everything else is a number.
NVML_COLUMNS: tuple[str, ...] = (
    "t_s",                    # seconds since the session started
    "gpu",                    # NVML device index
    "util_gpu_pct",           # % of the last sample period in which a kernel ran
    "util_mem_pct",           # % of the period in which device memory was read or written
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "throttle_reasons",
    "time_ns",                # the same instant as t_s in Unix epoch nanoseconds (time.time_ns()); the
                              # clock Kineto traces and allocator snapshots use (workbench.analysis.timeline)
    # Hopper+ GPM counters (nvmlGpmMetricsGet between two samples ~100 ms apart); NaN where unsupported
    "gpm_sm_util_pct",        # % of SMs busy (a kernel resident), averaged over the sample pair
    "gpm_sm_occupancy_pct",   # % of warps resident vs the SMs' theoretical maximum
    "gpm_tensor_util_pct",    # % of time the SMs issued any tensor-core instruction
    "gpm_hmma_util_pct",      # ... half-precision (fp16/bf16) tensor-core instructions
    "gpm_dram_bw_util_pct",   # % of the theoretical DRAM bandwidth used
    "gpm_fp32_util_pct",      # % of time in non-tensor fp32 math
    "gpm_fp16_util_pct",      # ... fp16
    "gpm_fp64_util_pct",      # ... fp64
    "gpm_pcie_tx_bytes_per_s",
    "gpm_pcie_rx_bytes_per_s",
    "gpm_nvlink_rx_bytes_per_s",  # all links
    "gpm_nvlink_tx_bytes_per_s",
    "pcie_tx_bytes_per_s",    # read on the slow cadence (a call blocks ~20 ms); last value seen
    "pcie_rx_bytes_per_s",
    "energy_j",               # energy since the driver loaded, slow cadence; last value seen
)

# NVML's clocks-event ("throttle") reason bits -> short names. The bit values are NVML's
# (nvmlClocksEventReason*), the same in the older nvmlClocksThrottleReason* API.
THROTTLE_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}
_REASON_BITS = {name: bit for bit, name in THROTTLE_REASONS.items()}

# short names of the first recording -> schema names (value unchanged)
_LEGACY_NAMES = {
    "t": "t_s",
    "util_gpu": "util_gpu_pct",
    "util_mem": "util_mem_pct",
    "mem_used": "mem_used_bytes",
    "mem_total": "mem_total_bytes",
    "sm_mhz": "sm_clock_mhz",
    "mem_mhz": "mem_clock_mhz",
    # GPM counters as the H200 recordings name them (% unchanged; MiB/s scaled in _LEGACY_MIB_S)
    "gpm_sm_util": "gpm_sm_util_pct",
    "gpm_sm_occupancy": "gpm_sm_occupancy_pct",
    "gpm_any_tensor_util": "gpm_tensor_util_pct",
    "gpm_hmma_tensor_util": "gpm_hmma_util_pct",
    "gpm_dram_bw_util": "gpm_dram_bw_util_pct",
    "gpm_fp32_util": "gpm_fp32_util_pct",
    "gpm_fp16_util": "gpm_fp16_util_pct",
    "gpm_fp64_util": "gpm_fp64_util_pct",
}
# GPM rates recorded in MiB/s (NVML's unit) -> schema columns in bytes/s
_LEGACY_MIB_S = {
    "gpm_pcie_tx_per_sec": "gpm_pcie_tx_bytes_per_s",
    "gpm_pcie_rx_per_sec": "gpm_pcie_rx_bytes_per_s",
    "gpm_nvlink_total_rx_per_sec": "gpm_nvlink_rx_bytes_per_s",
    "gpm_nvlink_total_tx_per_sec": "gpm_nvlink_tx_bytes_per_s",
}
GPM_COLUMNS: tuple[str, ...] = tuple(c for c in NVML_COLUMNS if c.startswith("gpm_"))
_FIX = "Record a session with NvmlSampler(...).save(path) or `workbench monitor --csv OUT`"


def decode_throttle_reasons(mask) -> str | None:
    """Names of the reasons set in an NVML clocks-event bit mask, comma-joined; ``None`` when unknown.

    >>> decode_throttle_reasons(0x4 | 0x20)
    'sw_power_cap,sw_thermal'
    >>> decode_throttle_reasons(0), decode_throttle_reasons(float("nan"))
    ('', None)
    """
    if mask is None or (isinstance(mask, float) and math.isnan(mask)):
        return None
    mask = int(mask)
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return ",".join(names)


def encode_throttle_reasons(text) -> float:
    """Inverse of :func:`decode_throttle_reasons` (unknown names are kept only as hex bits); NaN when missing.

    >>> encode_throttle_reasons("sw_power_cap,sw_thermal")
    36.0
    """
    if text is None or (isinstance(text, float) and math.isnan(text)) or text is pd.NA:
        return math.nan
    mask = 0
    for name in str(text).split(","):
        name = name.strip()
        if not name:
            continue
        if name in _REASON_BITS:
            mask |= _REASON_BITS[name]
        elif name.startswith("0x"):
            try:
                mask |= int(name, 16)
            except ValueError:
                pass
    return float(mask)


_WHAT = "an NVML session file"
_HINT = "Check the path; shipped sessions: workbench.samples.names('nvml')"


def _open(path: Path):
    """Binary, gunzipped, bounded (io/_files.py); lines are read with read_lines (bounded too)."""
    return open_input(path, _WHAT, _HINT)


def _jsonl_frame(blocks, path: Path) -> pd.DataFrame:
    """JSON lines -> a raw frame, built block by block (~4 MiB of lines at a time): each block's rows
    become a small DataFrame at once and its dicts are dropped, so memory is the columns (~100 B a
    row), never a dict per row."""
    loads = orjson.loads
    parts = []
    for first, block in blocks:
        lines = block.split(b"\n")
        try:
            rows = [loads(ln) for ln in lines if ln and not ln.isspace()]
        except orjson.JSONDecodeError:
            for lineno, ln in enumerate(lines, first):
                if ln and not ln.isspace():
                    try:
                        loads(ln)
                    except orjson.JSONDecodeError as exc:
                        raise BadArtifact(path, f"line {lineno} is not JSON ({exc})", _truncation_fix(lineno)) from None
            raise
        if not all(type(r) is dict for r in rows):
            lineno = first + next(i for i, ln in enumerate(lines) if ln and not ln.isspace()
                                  and not isinstance(loads(ln), dict))
            raise BadArtifact(path, f"line {lineno} is not a JSON object", _FIX)
        # a session row holds numbers, strings and nulls, nothing nested: looked at only when the block
        # has a '[' or more '{' than rows
        if b"[" in block or block.count(b"{") > len(rows):
            for i, row in enumerate(rows):
                for k, v in row.items():
                    if isinstance(v, (dict, list)):
                        lineno = first + [j for j, ln in enumerate(lines) if ln and not ln.isspace()][i]
                        raise BadArtifact(path, f"line {lineno}: {str(k)[:40]} is a JSON {type(v).__name__}, "
                                                "not a value", _FIX)
        del lines, block
        if not rows:
            continue
        frame = pd.DataFrame.from_records(rows)
        if "time_ns" in frame:  # keep the nanoseconds exact where some rows (marks) lack them
            frame["time_ns"] = pd.Series([_int_or_none(r.get("time_ns")) for r in rows], dtype=object)
        del rows
        parts.append(frame)
    if not parts:
        return pd.DataFrame()
    if len(parts) == 1:
        return parts[0]
    raw = pd.concat(parts, ignore_index=True, sort=False)
    if "time_ns" in raw:
        raw["time_ns"] = raw["time_ns"].astype(object).where(raw["time_ns"].notna(), None)
    return raw


def _truncation_fix(lineno: int) -> str:
    return f"The file may be truncated or not a session file; re-copy it, or cut it before line {lineno}"


_NA = ["", "NA", "N/A", "NaN", "nan", "None", "null"]


class _BlockStream(io.RawIOBase):
    """A readable stream over the checked line blocks (for pandas' CSV reader)."""

    def __init__(self, blocks):
        self._blocks, self._buf = blocks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            nxt = next(self._blocks, None)
            if nxt is None:
                return 0
            self._buf = memoryview(nxt[1])
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def _csv_frame(blocks) -> pd.DataFrame:
    # "" in throttle_reasons means "no reason" and must not become NaN; "NA" there means unknown.
    na = {c: _NA for c in (*NVML_COLUMNS, *_LEGACY_NAMES, "power_mw")}
    na["throttle_reasons"] = ["NA"]
    na["mark"] = ["", "NA"]
    # pandas reads the checked blocks as a stream: lines bounded, blank runs skipped and bounded
    return pd.read_csv(io.BufferedReader(_BlockStream(blocks), 1 << 20), keep_default_na=False, na_values=na,
                       dtype={"throttle_reasons": str, "mark": str})


def load_nvml_session(path) -> pd.DataFrame:
    """Read a recorded NVML session (JSON lines or CSV, ``.gz`` or not) into a frame of :data:`NVML_COLUMNS`.

    Marks go to ``frame.attrs["marks"]`` (a list of ``{"t_s", "label"}``), the path to
    ``frame.attrs["source"]``. Rows are sorted by time. Raises :class:`BadArtifact` naming the file,
    the problem and the fix for a missing, truncated, corrupt or unrelated file.

    Bounds (docs/safety.md): the decoded size (``io/_files.open_input``, checked while streaming), a
    line at most 16 MiB, at most 16 MiB of blank lines (skipped in bulk; more is refused), and the
    rows are turned into columns block by block.
    """
    path = check_input(path, _WHAT, _HINT)
    try:
        with _open(path) as fh:
            if fh.raw is not fh._f:
                # gzip: inflated once to its end before any row is built (C speed, nothing kept), so a file
                # over its decoded limit is refused with no memory spent on it; blank runs refused there too
                for _ in line_blocks(fh, path):
                    pass
        with _open(path) as fh:
            blocks = line_blocks(fh, path)
            head = next(blocks, None)
            if head is None:
                raw = pd.DataFrame()
            else:
                blocks = itertools.chain([head], blocks)
                raw = _jsonl_frame(blocks, path) if head[1].lstrip().startswith(b"{") else _csv_frame(blocks)
    except BadArtifact:
        raise
    except pd.errors.EmptyDataError:
        raw = pd.DataFrame()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise BadArtifact(path, f"cannot be read ({type(exc).__name__}: {exc})",
                          "The file is corrupt or truncated; re-copy it") from None
    except (pd.errors.ParserError, ValueError, OverflowError) as exc:
        raise BadArtifact(path, f"not a CSV or JSON-lines session ({_short_repr(str(exc))})", _FIX) from None
    box = [raw]  # _normalise takes the only reference, so it can drop the raw columns once used
    del raw
    try:
        return _normalise(box, path)
    except BadArtifact:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # a column pandas could not make sense of
        raise BadArtifact(path, f"not a usable session ({type(exc).__name__}: {_short_repr(str(exc))})", _FIX) from None


def _normalise(box: list, path: Path) -> pd.DataFrame:
    raw = box.pop()
    if raw.empty:
        raise BadArtifact(path, "holds no samples", _FIX)
    raw = raw.rename(columns=_LEGACY_NAMES)
    if "power_mw" in raw and "power_w" not in raw:
        raw["power_w"] = pd.to_numeric(raw["power_mw"], errors="coerce") / 1000.0
    for old, col in _LEGACY_MIB_S.items():
        if old in raw and col not in raw:
            raw[col] = pd.to_numeric(raw[old], errors="coerce") * float(1 << 20)
    if "t_s" not in raw and "time_ns" in raw:
        # a session with absolute times only: t_s counts from its first sample
        ns = pd.to_numeric(raw["time_ns"], errors="coerce")
        if "mark" in raw:
            ns = ns.where(raw["mark"].isna() | (raw["mark"].astype(str) == ""))
        if ns.notna().any():
            raw["t_s"] = (ns - ns.min()) / 1e9
    missing = [c for c in ("t_s", "gpu") if c not in raw]
    if missing:
        raise BadArtifact(
            path, f"not an NVML session: no column {', '.join(missing)} (columns: {', '.join(map(str, raw.columns[:12]))})",
            _FIX,
        )
    marks: list[dict] = []
    if "mark" in raw:
        is_mark = raw["mark"].notna() & (raw["mark"].astype(str) != "")
        for t, label in zip(raw.loc[is_mark, "t_s"], raw.loc[is_mark, "mark"]):
            t = _finite(t)
            if t is None or abs(t) > _MAX_T_S:
                raise BadArtifact(path, f"a mark ({_short_repr(label)}) has no usable t_s ({_short_repr(t)})", _FIX)
            marks.append({"t_s": t, "label": str(label)[:500]})
        raw = raw.loc[~is_mark]
    if raw.empty:
        raise BadArtifact(path, "holds marks but no samples", _FIX)
    if "phase" in raw:
        # recordings that label each row with a phase: every change of phase becomes a mark
        order = raw.sort_values("t_s", kind="stable")
        prev = None
        for t, phase in zip(order["t_s"], order["phase"]):
            if isinstance(phase, str) and phase and phase != prev:
                marks.append({"t_s": float(t), "label": phase})
            prev = phase
    out = {}
    n = len(raw)
    for col in NVML_COLUMNS:
        if col == "throttle_reasons":
            if col in raw:
                out[col] = np.array([None if _missing(v) or v is pd.NA else str(v) for v in raw[col]], dtype=object)
            else:
                out[col] = np.full(n, None, dtype=object)
            continue
        if col not in raw:
            out[col] = pd.array(np.full(n, None), dtype="Int64") if col == "time_ns" else np.full(n, np.nan)
            continue
        if col == "time_ns":  # exact integers (float64 would round Unix nanoseconds to 256 ns)
            vals = pd.to_numeric(raw[col], errors="coerce")
            bad = vals.isna() & raw[col].notna()
            if bad.any():
                raise BadArtifact(path, f"column time_ns holds a non-number ({raw.loc[bad, col].iloc[0]!r})", _FIX)
            out[col] = pd.array([None if pd.isna(v) else int(v) for v in vals], dtype="Int64")
            continue
        try:
            vals = pd.to_numeric(raw[col], errors="coerce")
        except (TypeError, ValueError, OverflowError):  # e.g. ints beyond int64 in an object column
            vals = pd.Series([_finite(v, keep_inf=True) for v in raw[col]], index=raw.index, dtype=float)
        bad = vals.isna() & raw[col].notna()
        if bad.any():
            first = raw.loc[bad, col].iloc[0]
            raise BadArtifact(path, f"column {col} holds a non-number ({_short_repr(first)})", _FIX)
        out[col] = vals.to_numpy(dtype=float)
    if np.isnan(out["t_s"]).any() or np.isnan(out["gpu"]).any():
        raise BadArtifact(path, "a sample row lacks t_s or gpu", _FIX)
    if not (np.abs(out["t_s"]) <= _MAX_T_S).all():
        raise BadArtifact(path, f"a sample's t_s is {out['t_s'][~(np.abs(out['t_s']) <= _MAX_T_S)][0]!r}, "
                                f"beyond {_MAX_T_S:.0e} s (not a session time)", _FIX)
    gpu = out["gpu"]
    bad_gpu = ~np.isfinite(gpu) | (gpu < 0) | (gpu > 4095) | (gpu != np.round(gpu))
    if bad_gpu.any():
        raise BadArtifact(path, f"a sample's gpu is {gpu[bad_gpu][0]!r}, not an NVML device index (0-4095)", _FIX)
    del raw  # (memory: the raw columns not shared with `out` go now)
    out["gpu"] = out["gpu"].astype(np.int64)
    t_s = out["t_s"]
    if len(t_s) > 1 and not (t_s[1:] >= t_s[:-1]).all():  # a recording is in time order: no copy then
        order = np.argsort(t_s, kind="stable")
        out = {k: (v[order] if isinstance(v, np.ndarray) else v.take(order)) for k, v in out.items()}
    frame = pd.DataFrame(out, columns=list(NVML_COLUMNS), copy=False)
    frame.attrs["marks"] = sorted(marks, key=lambda m: m["t_s"])
    frame.attrs["source"] = str(path)
    return frame


def save_nvml_session(frame: pd.DataFrame, path, marks=None, inputs=()) -> Path:
    """Write a session frame (and its marks) to ``path``: JSON lines for ``.jsonl``/``.jsonl.gz``,
    CSV for ``.csv``/``.csv.gz``. The write is atomic (a temporary file, then a rename).

    ``marks`` defaults to ``frame.attrs["marks"]``; each is ``{"t_s", "label"}`` or ``(t_s, label)``.
    ``inputs``: files this one must not overwrite (e.g. the session being replayed). Returns the path
    written.
    """
    path = Path(path)
    name = path.name.lower()
    gz = name.endswith(".gz")
    base = name[:-3] if gz else name
    if not (base.endswith(".jsonl") or base.endswith(".json") or base.endswith(".csv")):
        raise BadArtifact(path, "unknown session format", "Name the file *.jsonl, *.jsonl.gz, *.csv or *.csv.gz")
    missing = [c for c in ("t_s", "gpu") if c not in frame]
    if missing:
        raise BadArgument(f"frame lacks column(s) {missing}; expected the columns of NVML_COLUMNS")
    cols = [c for c in NVML_COLUMNS if c in frame]
    body = frame[cols].copy()
    if marks is None:
        marks = frame.attrs.get("marks", [])
    mark_rows = []
    for m in marks or []:
        t, label = (m["t_s"], m["label"]) if isinstance(m, dict) else (m[0], m[1])
        mark_rows.append({"t_s": float(t), "mark": str(label)})
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(raw):
        fh = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) if gz else raw
        try:
            if base.endswith(".csv"):
                out = body
                if mark_rows:
                    out = pd.concat([body, pd.DataFrame(mark_rows)], ignore_index=True)
                    out = out.sort_values("t_s", kind="stable")
                fh.write(out.to_csv(index=False, lineterminator="\n", na_rep="NA").encode())
            else:
                records = body.to_dict("records")
                for rec in records:
                    fh.write(orjson.dumps({k: v for k, v in rec.items() if not _missing(v)},
                                          option=orjson.OPT_SERIALIZE_NUMPY))
                    fh.write(b"\n")
                for rec in mark_rows:
                    fh.write(orjson.dumps(rec))
                    fh.write(b"\n")
        finally:
            if gz:
                fh.close()

    # atomic, the existing file's mode kept; a symlink/FIFO/folder target is refused (io/_files.py)
    atomic_write(path, write, inputs=inputs)
    return path


def _int_or_none(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) else v
    return v


_MAX_T_S = 1e12  # seconds (31,000 years): t_s is seconds since the start, or a Unix time in old files


def _finite(v, keep_inf: bool = False) -> float | None:
    """A number from the file as a float (None when it is not one; infinities only with keep_inf)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating, str)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isnan(f) or (math.isinf(f) and not keep_inf):
        return None
    return f


def _missing(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))

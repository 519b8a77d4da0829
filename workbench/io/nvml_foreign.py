"""GPU samples recorded by other tools, read as NVML session frames (the columns of
``io/nvml.py::NVML_COLUMNS``), so that everything that takes an NVML session takes them too: the live panel's
replay, ``workbench monitor --replay``, ``workbench timeline --nvml``, ``TimelinePanel(nvml=...)``.

Three formats (the registry, ``io/kinds.py``, tells them apart by content):

* ``nvidia_smi``: ``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv
  -lms 100`` output. The header carries the units (``utilization.gpu [%]``, ``memory.used [MiB]``,
  ``power.draw [W]``), the values too unless ``nounits`` (``35 %``, ``1024 MiB``, ``75.32 W``); ``[N/A]`` /
  ``[Not Supported]`` are missing values; a header repeated by a looping run is skipped. The timestamp
  (``2026/08/17 10:00:00.123``) is the recording machine's local time: it is read as this machine's local
  time (set ``TZ`` to the recording machine's zone when they differ) and gives ``time_ns``. Add ``index``
  (or ``uuid``/``pci.bus_id``) to the query for several GPUs; without one, the rows that share a timestamp
  are numbered 0, 1, ... in the order nvidia-smi printed them.
* ``dcgm``: DCGM exporter scrapes (Prometheus text: ``DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-..."} 37``),
  one or several concatenated (``while sleep 1; do curl -s host:9400/metrics; done > scrapes.txt``). A new
  scrape starts where a (metric, GPU) pair repeats. Samples carrying a Prometheus timestamp (ms) are placed
  by it; otherwise scrape *i* is at ``i * interval_s`` (default 1 s, said in ``frame.attrs["notes"]``).
  ``DCGM_FI_PROF_*`` ratios become the ``gpm_*_pct`` columns (x100), framebuffer MiB become bytes, energy mJ
  becomes J; the GPU is the ``gpu`` label (else the UUID's order).
* ``metrics_table``: any CSV or JSON-lines table with a time column (``t_s``, ``time``, ``timestamp``,
  ``time_ns``... seconds, epoch s/ms/µs/ns, or date-time text) and at least one known metric
  (``io/metric_names.py``: ``gpu_util``, ``memory_used_mib``, ``power [W]``, ``temperature``...), one
  column per metric, an optional GPU column (``gpu``, ``index``, ``uuid``...; else GPU 0). Units come from
  the header (``[MiB]``, ``(W)``, ``_mib``); memory without a unit is MiB when every value is below 4 Mi
  (no GPU has 4 TiB), else bytes.

:func:`load_gpu_samples` loads any of these or a workbench NVML session (``io.nvml.load_nvml_session``).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "smi.csv"
>>> _ = p.write_text("timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]\\n"
...                  "2026/08/17 10:00:00.000, 95 %, 7650 MiB, 81.25 W\\n")
>>> df = load_gpu_samples(p)
>>> df.loc[0, ["util_gpu_pct", "mem_used_bytes", "power_w"]].tolist()
[95.0, 8021606400.0, 81.25]
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

from workbench.errors import BadArtifact
from workbench.io._files import _short_repr, check_input, read_input
from workbench.io.metric_names import (
    DCGM_FIELDS,
    MEMORY_COLUMNS,
    gpu_column,
    metric_column,
    normalize,
    time_column,
)

__all__ = ["load_gpu_samples", "load_nvidia_smi_csv", "load_dcgm_scrape", "load_metrics_table"]

_WHAT = "a GPU metrics log"
_HINT = "Check the path"
_MISSING = {"", "n/a", "[n/a]", "na", "nan", "none", "null", "[not supported]", "not supported", "[unknown error]",
            "[gpu is lost]", "-"}
_MIB_BELOW = 4 * 2**20  # memory values without a unit: all below this -> MiB


def load_gpu_samples(path):
    """A session frame from any file of GPU samples gpu-workbench reads: a workbench NVML session, an
    nvidia-smi CSV log, DCGM exporter scrapes or a metrics table (module docstring). A file of none of
    these kinds gets the NVML session loader's message."""
    from workbench.io import kinds
    from workbench.io.nvml import load_nvml_session

    p = check_input(path, _WHAT, _HINT)
    kind = kinds.sniff_file(p)
    loader = {"nvidia_smi": load_nvidia_smi_csv, "dcgm": load_dcgm_scrape, "metrics_table": load_metrics_table}
    return loader.get(kind, load_nvml_session)(p)


def _text(path: Path) -> str:
    data = read_input(path, _WHAT, _HINT)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadArtifact(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})",
                          "Give the text log the tool wrote (gzip is fine)") from None


def _value(text, scale: float = 1.0):
    """A cell as a float (units after the number dropped: "35 %", "1024 MiB"), None when missing."""
    if text is None:
        return None
    if isinstance(text, bool):
        return float(text)
    if isinstance(text, (int, float)):
        v = float(text)
        return v * scale if math.isfinite(v) else None
    s = str(text).strip()
    if s.lower() in _MISSING:
        return None
    m = re.match(r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)$", s)
    if not m:
        return float("nan")  # not a number: the caller names the column
    v = float(m.group(1)) * scale
    return v if math.isfinite(v) else None


def _throttle(text):
    """An NVML clocks-event mask ("0x0000000000000004", 4) as the session's text."""
    from workbench.io.nvml import decode_throttle_reasons

    if text is None:
        return None
    s = str(text).strip()
    if s.lower() in _MISSING:
        return None
    try:
        mask = int(s, 16) if s.lower().startswith("0x") else int(float(s))
    except ValueError:
        return None
    return decode_throttle_reasons(mask)


# ------------------------------------------------------------------------------------------- tables


def _rows_of_csv(text: str, path: Path) -> tuple[list[str], list[list[str]]]:
    reader = csv.reader(io.StringIO(text), skipinitialspace=True)
    try:
        rows = [r for r in reader if r and any(c.strip() for c in r)]
    except csv.Error as exc:
        raise BadArtifact(path, f"is not a readable CSV ({exc})", "Give the CSV the tool wrote") from None
    if not rows:
        raise BadArtifact(path, "holds no samples", "Give a log with a header and at least one row")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if [c.strip() for c in r] != header]  # a looping nvidia-smi may repeat it
    return header, body


def _rows_of_jsonl(text: str, path: Path) -> tuple[list[str], list[list]]:
    import orjson

    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise BadArtifact(path, f"line {lineno} is not JSON ({exc})", "Give the JSON-lines log the tool wrote") \
                from None
        if not isinstance(rec, dict):
            raise BadArtifact(path, f"line {lineno} is not a JSON object", "Give one JSON object per line")
        records.append(rec)
    header: list[str] = []
    for rec in records:
        header += [k for k in rec if k not in header]
    return header, [[rec.get(k) for k in header] for rec in records]


def _epoch_ns(values, header: str, path: Path):
    """The time column as ``(t_s, time_ns or None)`` lists."""
    import pandas as pd

    name = normalize(header)
    nums = [_value(v) for v in values]
    if all(v is not None and not math.isnan(v) for v in nums):
        hi = max(abs(v) for v in nums) if nums else 0.0
        if name.endswith("_ns") or hi > 1e17:
            ns = [int(v) for v in nums]
        elif name.endswith("_us") or hi > 1e14:
            ns = [int(round(v * 1e3)) for v in nums]
        elif name.endswith("_ms") or hi > 1e11:
            ns = [int(round(v * 1e6)) for v in nums]
        elif hi > 1e9:  # Unix seconds
            ns = [int(round(v * 1e9)) for v in nums]
        else:  # seconds since the start of the log
            t0 = min(nums) if name not in ("t_s", "t", "time_s", "elapsed_s", "seconds") else 0.0
            return [v - t0 for v in nums], None
        t0 = min(ns)
        return [(n - t0) / 1e9 for n in ns], ns
    texts = [None if v is None else str(v).strip() for v in values]
    if any(t is None or t.lower() in _MISSING for t in texts):
        raise BadArtifact(path, f"a row has no {header}", "Every sample needs its time")
    try:
        stamps = pd.to_datetime(pd.Series(texts), format="mixed")
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadArtifact(path, f"column {header} holds a time pandas cannot read ({_short_repr(str(exc))})",
                          "Give seconds, epoch numbers or ISO date-times") from None
    if stamps.dt.tz is None:  # nvidia-smi: the recording machine's local time, read as this machine's
        stamps = stamps.dt.tz_localize(_local_zone(), ambiguous="NaT", nonexistent="NaT")
    if stamps.isna().any():
        raise BadArtifact(path, f"column {header} holds a time that does not exist in the local zone",
                          "Set TZ to the recording machine's zone")
    utc = stamps.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")  # whatever pandas parsed to
    ns = [int(v) for v in utc.astype("int64")]
    t0 = min(ns)
    return [(n - t0) / 1e9 for n in ns], ns


def _local_zone():
    from datetime import datetime

    return datetime.now().astimezone().tzinfo


def _table_frame(header: list[str], rows: list[list], path: Path, what: str):
    import pandas as pd

    from workbench.io.nvml import _normalise

    tcol = time_column(header)
    metrics = {h: metric_column(h) for h in header if h != tcol}
    metrics = {h: m for h, m in metrics.items() if m is not None}
    if tcol is None or not metrics:
        raise BadArtifact(path, f"is not {what}: it needs a time column and at least one known metric "
                                f"(columns: {', '.join(header[:12])})",
                          "Name the time column t_s, time or timestamp and the metrics e.g. gpu_util, "
                          "memory_used_mib, power_w (workbench/io/metric_names.py)")
    idx = {h: i for i, h in enumerate(header)}
    rows = [r + [None] * (len(header) - len(r)) for r in rows]
    if not rows:
        raise BadArtifact(path, "holds no samples", "Give a log with at least one row")
    t_s, ns = _epoch_ns([r[idx[tcol]] for r in rows], tcol, path)
    raw: dict[str, list] = {"t_s": t_s}
    if ns is not None:
        raw["time_ns"] = ns
    gcol = gpu_column(header)
    if gcol is not None and gcol != tcol:
        ids = [r[idx[gcol]] for r in rows]
        nums = [_value(v) for v in ids]
        if all(v is not None and not math.isnan(v) and v == int(v) for v in nums):
            raw["gpu"] = [int(v) for v in nums]
        else:  # UUIDs, bus ids, names: numbered in order of appearance
            order: dict = {}
            raw["gpu"] = [order.setdefault(str(v), len(order)) for v in ids]
    else:  # rows sharing a time are the GPUs of one sample, in the order printed
        seen: dict = {}
        stamp = [r[idx[tcol]] for r in rows]
        raw["gpu"] = []
        for s in stamp:
            raw["gpu"].append(seen.get(s, 0))
            seen[s] = seen.get(s, 0) + 1
    for h, (col, scale) in metrics.items():
        cells = [r[idx[h]] for r in rows]
        if col == "throttle_reasons":
            raw[col] = [_throttle(c) for c in cells]
            continue
        vals = [_value(c, scale or 1.0) for c in cells]
        bad = next((c for c, v in zip(cells, vals) if v is not None and math.isnan(v)), None)
        if bad is not None:
            raise BadArtifact(path, f"column {h} holds a non-number ({_short_repr(bad)})",
                              "Give numbers (units after them are fine: 35 %, 1024 MiB)")
        if scale == 0.0 and col in MEMORY_COLUMNS:  # no unit written: MiB when the values are that small
            known = [v for v in vals if v is not None]
            factor = float(2**20) if known and max(known) < _MIB_BELOW else 1.0
            vals = [None if v is None else v * factor for v in vals]
        if col not in raw:
            raw[col] = vals
        else:  # two spellings of one metric (power.draw and power.draw.instant): the first wins where given
            raw[col] = [a if a is not None else b for a, b in zip(raw[col], vals)]
    frame = pd.DataFrame(raw)
    if "time_ns" in frame:
        frame["time_ns"] = pd.Series(raw["time_ns"], dtype=object)
    out = _normalise([frame], path)
    out.attrs["format"] = what
    return out


def load_metrics_table(path):
    """A CSV or JSON-lines table of GPU metrics with a time column (module docstring) as a session frame."""
    p = check_input(path, _WHAT, _HINT)
    text = _text(p)
    first = text.lstrip()[:1]
    header, rows = _rows_of_jsonl(text, p) if first == "{" else _rows_of_csv(text, p)
    return _table_frame(header, rows, p, "a GPU metrics table")


def load_nvidia_smi_csv(path):
    """``nvidia-smi --query-gpu=... --format=csv[,nounits] -l/-lms N`` output as a session frame."""
    p = check_input(path, _WHAT, _HINT)
    header, rows = _rows_of_csv(_text(p), p)
    return _table_frame(header, rows, p, "an nvidia-smi CSV log")


# -------------------------------------------------------------------------------------------- DCGM

def load_dcgm_scrape(path, interval_s: float = 1.0):
    """DCGM exporter scrapes (Prometheus text exposition) as a session frame (module docstring)."""
    import pandas as pd

    from prometheus_client.parser import text_string_to_metric_families

    from workbench.io.nvml import _normalise

    p = check_input(path, _WHAT, _HINT)
    scrape = 0
    seen: set = set()
    gpus: dict[str, int] = {}
    samples: dict[tuple[int, int], dict] = {}  # (scrape, gpu) -> row
    stamped = False
    # the Prometheus text format is parsed by prometheus_client (a dependency already, for `monitor
    # --prometheus`); families come in the text's order, so a sample seen again starts the next scrape
    try:
        parsed = [(s.name, s.labels, s.value, s.timestamp)
                  for fam in text_string_to_metric_families(_text(p)) for s in fam.samples]
    except ValueError as exc:
        raise BadArtifact(p, f"is not Prometheus text ({_short_repr(str(exc))})",
                          "Give the text a DCGM exporter's /metrics endpoint serves") from None
    for name, labels, value, stamp in parsed:
        if name not in DCGM_FIELDS and name != "DCGM_FI_DEV_FB_FREE":
            continue
        key = labels.get("gpu") if labels.get("gpu", "").isdigit() else labels.get("UUID", labels.get("gpu", "0"))
        gpu = int(key) if str(key).isdigit() else gpus.setdefault(str(key), len(gpus))
        if (name, gpu) in seen:  # the next scrape
            scrape += 1
            seen.clear()
        seen.add((name, gpu))
        row = samples.setdefault((scrape, gpu), {"gpu": gpu})
        if stamp is not None:  # the exposition's milliseconds, as seconds
            row["time_ns"] = int(round(float(stamp) * 1000)) * 1_000_000
            stamped = True
        if name == "DCGM_FI_DEV_FB_FREE":
            row["_free"] = None if math.isnan(value) else float(value) * 2.0**20
            continue
        col, scale = DCGM_FIELDS[name]
        if col == "throttle_reasons":
            row[col] = _throttle(str(int(value)))
        else:
            row.setdefault(col, None if math.isnan(value) else float(value) * scale)
    if not samples:
        raise BadArtifact(p, "holds no DCGM_FI_* GPU samples", "Scrape a DCGM exporter's /metrics endpoint")
    rows = []
    for (i, _gpu), row in sorted(samples.items()):
        if "_free" in row:
            free = row.pop("_free")
            if row.get("mem_total_bytes") is None and row.get("mem_used_bytes") is not None and free is not None:
                row["mem_total_bytes"] = row["mem_used_bytes"] + free
        row["t_s"] = i * float(interval_s)
        rows.append(row)
    frame = pd.DataFrame(rows)
    notes = []
    if stamped and "time_ns" in frame and frame["time_ns"].notna().all():
        ns = [int(v) for v in frame["time_ns"]]
        frame["t_s"] = [(n - min(ns)) / 1e9 for n in ns]
        frame["time_ns"] = pd.Series(ns, dtype=object)
    else:
        frame = frame.drop(columns=["time_ns"], errors="ignore")
        notes.append(f"the scrapes carry no time: scrape i is placed at i x {interval_s:g} s")
    out = _normalise([frame], p)
    out.attrs["format"] = "DCGM exporter scrapes"
    out.attrs["notes"] = notes
    return out

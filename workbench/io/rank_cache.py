"""A columnar cache of compact per-rank frames, keyed by the trace file's content hash.

The cross-rank view (``workbench ranks``, ``RanksPanel``) reduces each rank's trace to a few small
tables (steps, collectives, a busy/idle summary). Decoding a trace of hundreds of MB takes seconds;
reading its reduction back takes milliseconds. So the reduction is written once as one Parquet file:
the main table as Parquet columns, the small ones and the scalars as JSON in the schema's key-value
metadata. The file name is the BLAKE2b hash of the trace's bytes (compressed, as on disk) plus a format
version, so an edited or re-recorded trace never reads a stale entry and two copies of one trace share
one entry.

Where: ``cache_dir`` if given; ``"next"`` for a ``.workbench-cache/`` folder beside the trace; else
``$WORKBENCH_CACHE_DIR`` or ``$XDG_CACHE_HOME/gpu-workbench/ranks`` (``~/.cache/...``). A cache that
cannot be written (read-only disk) is skipped, never an error: it only saves time.

Faults: an entry is written to a temporary file in the cache folder, ``fsync``-ed and renamed over its
name, so a worker killed mid-write never leaves a half entry under a cache name. Each entry carries
Parquet page checksums and its row count; one that fails to read, to verify or to match (a torn or
damaged file, e.g. cut by a full disk or a copy) is treated as absent: the trace is read again and the
entry rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from workbench._optional import import_optional

__all__ = ["FORMAT_VERSION", "file_hash", "cache_path", "save_frame", "load_frame", "default_cache_dir"]

# Bump when what is cached changes meaning (analysis.trace.ranks.RankFrame's tables or their columns).
FORMAT_VERSION = 2  # 2: RankFrame carries the step numbers and the start on Unix time
_META_KEY = b"workbench"


def file_hash(path: str | os.PathLike) -> str:
    """BLAKE2b-160 of the file's bytes, as hex (streamed in 4 MiB reads)."""
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get("WORKBENCH_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpu-workbench" / "ranks"


def cache_path(trace_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
               digest: str | None = None) -> Path:
    """Where the reduction of ``trace_path`` is (or would be) cached."""
    p = Path(trace_path)
    if cache_dir == "next":
        folder = p.parent / ".workbench-cache"
    else:
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"{digest or file_hash(p)}.v{FORMAT_VERSION}.parquet"


def save_frame(target: Path, frame: pd.DataFrame, meta: dict[str, Any]) -> bool:
    """Write ``frame`` + ``meta`` (JSON-able) atomically to ``target``; False when it cannot be written."""
    pa = import_optional("pyarrow", "for the per-rank cache")
    pq = import_optional("pyarrow.parquet", "for the per-rank cache")
    table = pa.Table.from_pandas(frame, preserve_index=False)
    md = dict(table.schema.metadata or {})
    md[_META_KEY] = json.dumps(dict(meta, _rows=len(frame)), separators=(",", ":"), allow_nan=True).encode()
    table = table.replace_schema_metadata(md)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=target.parent)
        os.close(fd)
        try:
            pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
            with open(tmp, "rb") as f:  # on disk before the rename: a crash leaves the old entry or the new
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return False
    return True


def load_frame(target: Path) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """The cached (frame, meta), or None when absent or unreadable (then it is simply rebuilt)."""
    if not target.is_file():
        return None
    pq = import_optional("pyarrow.parquet", "for the per-rank cache")
    try:
        table = pq.read_table(target, page_checksum_verification=True)
        meta = json.loads(table.schema.metadata[_META_KEY])
        rows = meta.pop("_rows", None)
        if not isinstance(meta, dict) or (rows is not None and rows != table.num_rows):
            return None
        frame = table.to_pandas()
    except Exception:  # a torn, damaged or foreign file: ignore it, the trace is the truth (and rewrites it)
        return None
    return frame, meta

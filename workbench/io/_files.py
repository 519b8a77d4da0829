"""Opening artifact files whether or not they are gzipped: the one place that sniffs gzip.

A file is gzip when it starts with the gzip magic bytes, whatever its name says (``.json`` files
that are gzipped and ``.gz`` files that are not both occur in the wild).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO

from workbench.errors import BadArgument

__all__ = ["GZIP_MAGIC", "is_gzip", "open_maybe_gzip", "read_maybe_gzip"]

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(source: bytes | str | os.PathLike) -> bool:
    """Whether ``source`` (the first bytes of a file, or a path) is gzip data, by its magic bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:2]) == GZIP_MAGIC
    with open(source, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_maybe_gzip(path: str | os.PathLike, mode: str = "rb", encoding: str = "utf-8") -> IO:
    """``path`` opened for reading (``mode`` ``'rb'`` or ``'rt'``), decompressed on the fly when it is
    gzip. A binary gzip file comes back as a :class:`gzip.GzipFile` whose ``fileobj`` is the raw file
    (its position is the compressed bytes read so far)."""
    if mode not in ("rb", "rt"):
        raise BadArgument(f"mode must be 'rb' or 'rt', not {mode!r}")
    gz = is_gzip(path)
    if mode == "rb":
        return gzip.open(path, "rb") if gz else open(path, "rb")
    return gzip.open(path, "rt", encoding=encoding) if gz else open(path, encoding=encoding)


def read_maybe_gzip(path: str | os.PathLike) -> bytes:
    """The whole file's bytes, gunzipped when it is gzip (concatenated members included). Raises what
    reading raises (``OSError``) and, for bad gzip data, ``gzip.BadGzipFile``/``EOFError``/``zlib.error``."""
    raw = Path(path).read_bytes()
    return gzip.decompress(raw) if is_gzip(raw) else raw

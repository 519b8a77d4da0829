"""Opening artifact files safely: the one place io checks paths, sniffs gzip, bounds what a file may
decode to, and writes outputs atomically.

Reading (every loader goes through here):

* :func:`check_input` refuses what is not a regular file (a FIFO or device would block or never
  end, a folder, a symbolic-link loop, an over-long name, a path through a file) with one line that
  names the file and the cause;
* :func:`open_input` opens it without ever blocking (``O_NONBLOCK``, then ``fstat`` of what was
  really opened) and, when it is gzip (by its magic bytes, whatever its name says), decompresses on
  the fly through :class:`gzip.GzipFile`, whose CRC and length checks run when the stream is read to
  its end (:func:`drain` does that for readers that stop early, such as the unpickler);
* what a file decodes to is bounded (:func:`decoded_limit`): at most ``RATIO`` times the file's size
  (``FLOOR`` at least) and never more than ``ABSOLUTE`` bytes, so a small ``.gz`` cannot inflate to
  gigabytes; ``WORKBENCH_MAX_DECODED_BYTES`` replaces the limit for a genuinely huge file;
  the check also runs *while streaming*: a gzip stream that has inflated more than ``RATIO`` times the
  compressed bytes read so far (plus ``FLOOR``) is refused there, so a small bomb is stopped after
  ~``FLOOR`` bytes, long before its whole-file limit (and before whatever a reader builds from them);
* :func:`read_lines` yields lines no longer than ``MAX_LINE_BYTES`` without ever holding a longer one;
  :func:`line_blocks` yields blocks of whole lines (same bound) and skips blank lines in bulk, refusing
  a file with more than ``MAX_BLANK_BYTES`` of them (a work bound: a gzip of 10^9 blank lines is
  refused after 16 MiB, not read line by line);
* :func:`checked_int` turns a number that does not fit the int64 column it is meant for into an error.

Writing (every output goes through here): :func:`check_output` runs *before* the work (the folder
exists and is writable, the target is not a symlink/FIFO/device/folder, not one of the inputs);
:func:`atomic_write` writes a temporary file in the same folder and ``os.replace``-s it over the
target, keeping an existing file's permission bits; :func:`output_note` says when something was
overwritten. See docs/safety.md.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import re
import stat
import tempfile
import zlib
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from workbench.errors import BadArgument, BadArtifact

__all__ = [
    "GZIP_MAGIC",
    "is_gzip",
    "open_maybe_gzip",
    "read_maybe_gzip",
    "check_input",
    "open_input",
    "read_input",
    "read_lines",
    "line_blocks",
    "drain",
    "rss_bytes",
    "decoded_limit",
    "LIMIT_ENV",
    "MAX_LINE_BYTES",
    "MAX_BLANK_BYTES",
    "MAX_SKIP_BYTES",
    "checked_int",
    "INT64_MIN",
    "INT64_MAX",
    "check_output",
    "atomic_write",
    "output_note",
    "OutputTarget",
]

GZIP_MAGIC = b"\x1f\x8b"

# decoded-size limits (see decoded_limit); docs/safety.md states them
LIMIT_ENV = "WORKBENCH_MAX_DECODED_BYTES"
RATIO = 256                 # deflate tops out near 1032:1; real traces/snapshots/sessions compress 5-40x
FLOOR = 64 * 2**20          # any file may decode to 64 MiB
ABSOLUTE = 64 * 2**30       # and none to more than 64 GiB unless WORKBENCH_MAX_DECODED_BYTES says so
MAX_LINE_BYTES = 16 * 2**20  # one NVML session line is ~300 bytes
MAX_BLANK_BYTES = 16 * 2**20  # blank lines a line-oriented file may hold (a session has none)
MAX_SKIP_BYTES = 16 * 2**20   # what a reader skips without using (whitespace, bytes after a pickle's end)
_WATCH_EVERY = 4 * 2**20      # decoded bytes between two calls of a _Bounded reader's watch()

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_FIX_COPY = "Copy the file again: it was probably cut off or damaged while being written or copied (copy it again from its source, or re-export it)"


# ---------------------------------------------------------------------------------------------- reading


def is_gzip(source: bytes | str | os.PathLike) -> bool:
    """Whether ``source`` (the first bytes of a file, or a path) is gzip data, by its magic bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:2]) == GZIP_MAGIC
    with open_input(source, raw=True) as f:
        return f.read(2) == GZIP_MAGIC


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _os_error(path, exc: OSError, what: str, hint: str | None) -> BadArtifact:
    e = exc.errno
    if isinstance(exc, FileNotFoundError) or e == errno.ENOENT:
        return BadArtifact(path, "no such file", hint or "Check the path")
    if e == errno.ELOOP:
        return BadArtifact(path, "is a loop of symbolic links", "Point the link at a real file")
    if e == errno.ENAMETOOLONG:
        return BadArtifact(path, "the name is too long for the file system", "Give a shorter path")
    if e == errno.ENOTDIR:
        return BadArtifact(path, "is not a valid path (a part of it is a file, not a folder)", "Check the path")
    if isinstance(exc, PermissionError) or e in (errno.EACCES, errno.EPERM):
        return BadArtifact(path, "cannot be read (permission denied)", "Fix the file's permissions")
    if isinstance(exc, IsADirectoryError):
        return BadArtifact(path, f"is a directory, not {what}", "Give the path of one file in it")
    return BadArtifact(path, f"cannot be read ({exc.strerror or exc})", hint)


def check_input(path: str | os.PathLike, what: str = "a file", hint: str | None = None) -> Path:
    """``path`` as a :class:`Path` when it names a regular file (symlinks followed); otherwise
    :class:`BadArtifact` with one line naming the file and the cause. Nothing is opened."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise _os_error(p, exc, what, hint) from None
    except ValueError as exc:  # an embedded NUL byte
        raise BadArtifact(p, f"is not a usable path ({exc})", "Check the path") from None
    if not stat.S_ISREG(st.st_mode):
        kind = _kind_of(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            raise BadArtifact(p, f"is a directory, not {what}", "Give the path of one file in it")
        raise BadArtifact(p, f"is {kind}, not a regular file (reading it could block or never end)",
                          "Copy the data into a regular file first")
    return p


class _Bounded(io.RawIOBase):
    """A read-only stream over ``f`` that raises :class:`BadArtifact` once more than ``limit`` bytes
    have come out of it (and turns gzip's errors into :class:`BadArtifact`)."""

    def __init__(self, f, path: Path, limit: int, compressed_size: int, gz: bool, rate: int = 0,
                 rate_floor: int = FLOOR):
        self._f, self._path, self._limit = f, path, limit
        self._size, self._gz = compressed_size, gz
        self.count = 0
        self.raw = f.fileobj if gz else f  # the file on disk (its position = compressed bytes read)
        # the streaming check (gzip, default limits only): decoded <= FLOOR + RATIO * compressed read so far
        self._rate, self._rate_floor = (rate if gz else 0), rate_floor
        # watch(count): called every _WATCH_EVERY decoded bytes (a reader bounding what it builds)
        self.watch: Callable[[int], None] | None = None
        self._next_watch = _WATCH_EVERY

    def readable(self) -> bool:
        return True

    def _account(self, n: int) -> None:
        self.count += n
        if self.count > self._limit:
            raise too_large(self._path, self._limit, self._size, self._gz)
        if self._rate and self.count > self._rate_floor:
            try:
                consumed = self.raw.tell()
            except (OSError, ValueError):
                consumed = self._size
            if self.count > self._rate_floor + self._rate * consumed:
                raise too_fast(self._path, self._limit, self._size, self.count, consumed, self._rate)
        if self.watch is not None and self.count >= self._next_watch:
            self._next_watch = self.count + _WATCH_EVERY
            self.watch(self.count)

    def _call(self, fn, *a):
        try:
            return fn(*a)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise BadArtifact(self._path, f"gzip data is truncated or corrupt ({exc or type(exc).__name__})",
                              _FIX_COPY) from None
        except OSError as exc:
            raise _os_error(self._path, exc, "a file", None) from None

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:  # in pieces: one read(limit) would allocate the whole limit at once
            parts = []
            while True:
                b = self.read(8 << 20)
                if not b:
                    return b"".join(parts)
                parts.append(b)
        out = self._call(self._f.read, n)
        self._account(len(out))
        return out

    def readinto(self, b) -> int:
        n = self._call(self._f.readinto, b)
        self._account(n or 0)
        return n

    def readline(self, limit: int = -1) -> bytes:
        if limit is None or limit < 0:
            limit = MAX_LINE_BYTES + 1
        out = self._call(self._f.readline, limit)
        self._account(len(out))
        return out

    def peek(self, n: int = 0) -> bytes:
        return self._call(self._f.peek, n) if hasattr(self._f, "peek") else b""

    def close(self) -> None:
        try:
            self._f.close()
            if self._gz:
                self.raw.close()
        finally:
            super().close()


def decoded_limit(compressed_size: int) -> int:
    """How many bytes a file of ``compressed_size`` bytes may decode to: ``WORKBENCH_MAX_DECODED_BYTES``
    when set (a number of bytes, ``K``/``M``/``G``/``T`` suffixes allowed, 0 for no limit), else
    ``min(ABSOLUTE, max(FLOOR, RATIO * compressed_size))``."""
    env = os.environ.get(LIMIT_ENV, "").strip()
    if env:
        m = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", env, re.IGNORECASE)
        if not m:
            raise BadArgument(f"{LIMIT_ENV}={env!r}: give a number of bytes, e.g. 200G (0: no limit)")
        n = int(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())
        return n if n > 0 else 2**62
    return min(ABSOLUTE, max(FLOOR, RATIO * compressed_size))


def _fmt(n: int) -> str:
    from workbench.units import format_bytes

    return format_bytes(n)


def too_large(path, limit: int, size: int, gz: bool) -> BadArtifact:
    """The error for a file that decodes to more than its limit."""
    what = f"decompresses to more than {_fmt(limit)}" if gz else f"holds more than {_fmt(limit)}"
    return BadArtifact(
        path, f"{what} (the limit for a {_fmt(size)} file; a hostile or damaged file is refused here)",
        f"If the file is genuine, raise the limit: {LIMIT_ENV}={max(limit * 4, 2**30) // 2**30}G (or 0 for none)",
    )


def too_fast(path, limit: int, size: int, count: int, consumed: int, rate: int = RATIO) -> BadArtifact:
    """The error for a gzip stream that inflates faster than ``rate``:1 (checked while streaming)."""
    return BadArtifact(
        path, f"decompresses to more than {rate} times its size ({_fmt(count)} from its first {_fmt(consumed)}; "
              f"at most {_fmt(limit)} for this {_fmt(size)} file): a hostile or damaged file is refused here, "
              "before the rest is read",
        f"If the file is genuine, raise the limit: {LIMIT_ENV}={max(limit * 4, 2**30) // 2**30}G (or 0 for none)",
    )


def rss_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _open_fd(p: Path, what: str, hint: str | None):
    """An fd opened without blocking, checked to be a regular file (what was opened, not the name)."""
    check_input(p, what, hint)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(p, exc, what, hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO between the check and the open
            raise BadArtifact(p, f"is {_kind_of(st.st_mode)}, not a regular file", "Copy the data into a regular file first")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_input(path: str | os.PathLike, what: str = "a file", hint: str | None = None, *,
               raw: bool = False, limit: int | None = None, rate: int = RATIO, rate_floor: int = FLOOR) -> IO[bytes]:
    """A binary reader over ``path``: checked (:func:`check_input`), gunzipped when it is gzip, and
    bounded (:func:`decoded_limit` unless ``limit`` is given). ``raw=True``: the file's own bytes,
    unbounded and not decompressed (for sniffing). ``.count`` is the decoded bytes read so far and
    ``.raw`` the file on disk. With the default limit, a gzip stream may inflate at most ``rate``
    times the compressed bytes read so far, plus ``rate_floor`` (checked as it is read;
    ``WORKBENCH_MAX_DECODED_BYTES`` turns the check off)."""
    p = Path(path)
    fd, size = _open_fd(p, what, hint)
    f = os.fdopen(fd, "rb")
    if raw:
        return f
    try:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
    except OSError as exc:
        f.close()
        raise _os_error(p, exc, what, hint) from None
    inner = gzip.GzipFile(fileobj=f, mode="rb") if gz else f
    if limit is not None or os.environ.get(LIMIT_ENV, "").strip():
        rate = 0
    return _Bounded(inner, p, decoded_limit(size) if limit is None else limit, size, gz, rate=rate,
                    rate_floor=rate_floor)


def read_input(path: str | os.PathLike, what: str = "a file", hint: str | None = None) -> bytes:
    """The whole (gunzipped, concatenated members included) content of ``path``, bounded and checked
    as :func:`open_input` does; gzip's CRC is verified."""
    with open_input(path, what, hint) as f:
        parts = []
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            parts.append(b)
    return b"".join(parts)


def drain(f, path=None, max_bytes: int | None = None, what: str = "after the end of its data") -> int:
    """Read ``f`` to its end (bounded like every read of it), so gzip checks its CRC and length even
    when the reader stopped early; returns the bytes that were left. ``max_bytes``: more than that
    left is refused (a work bound: a reader never skips gigabytes it does not use)."""
    n = 0
    while True:
        b = f.read(1 << 20)
        if not b:
            return n
        n += len(b)
        if max_bytes is not None and n > max_bytes:
            raise BadArtifact(path, f"holds more than {_fmt(max_bytes)} {what} (refused after skipping "
                                    f"{_fmt(max_bytes)}; nothing belongs there)",
                              "The file is damaged or not of the expected kind")


def line_blocks(f, path, max_line: int = MAX_LINE_BYTES, max_blank: int = MAX_BLANK_BYTES,
                block: int = 4 << 20) -> Iterator[tuple[int, bytes]]:
    """``(line number of its first line, block)``: the stream cut into blocks of whole lines (the
    last may lack its newline). A line longer than ``max_line`` is refused after ``max_line`` bytes;
    blocks of blank lines are skipped in bulk (never line by line) and more than ``max_blank`` bytes of
    blank lines are refused (a work bound on what is skipped). Lines inside a block are not checked
    for blankness here: a reader skips them as it splits (and may count them against the same bound)."""
    pending = b""
    lineno = 1          # the number of the first line of `pending`
    blank = 0

    def too_blank(at: int):
        return BadArtifact(path, f"holds more than {_fmt(max_blank)} of blank lines (by line {at:,}; refused after "
                                 f"skipping {_fmt(max_blank)}: no file of this kind has more than a few)",
                           "The file is damaged or not of the expected kind")

    while True:
        b = f.read(block)
        if not b:
            break
        data = pending + b if pending else b
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > max_line:
                raise BadArtifact(path, f"line {lineno} is longer than {_fmt(max_line)} (no line of this kind of file "
                                        "is more than a few KiB)", "The file is damaged or not of the expected kind")
            pending = data
            continue
        whole, pending = data[: cut + 1], data[cut + 1:]
        first = whole.find(b"\n")
        if first > max_line:  # only the first line can be long: the rest lie inside one read block
            raise BadArtifact(path, f"line {lineno} is longer than {_fmt(max_line)} (no line of this kind of file "
                                    "is more than a few KiB)", "The file is damaged or not of the expected kind")
        start = lineno
        lineno += whole.count(b"\n")
        if whole.isspace():
            blank += len(whole)
            if blank > max_blank:
                raise too_blank(lineno)
            continue
        blank += whole.count(b"\n\n")
        if blank > max_blank:
            raise too_blank(lineno)
        yield start, whole
    if pending and not pending.isspace():
        yield lineno, pending


def read_lines(f, path, max_line: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """The lines of a binary stream, each at most ``max_line`` bytes; a longer line raises
    :class:`BadArtifact` after reading ``max_line`` bytes of it, never the whole line."""
    lineno = 0
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        lineno += 1
        if len(line) > max_line and not line.endswith(b"\n"):
            raise BadArtifact(path, f"line {lineno} is longer than {_fmt(max_line)} (no line of this kind of file "
                                    "is more than a few KiB)", "The file is damaged or not of the expected kind")
        yield line


def open_maybe_gzip(path: str | os.PathLike, mode: str = "rb", encoding: str = "utf-8") -> IO:
    """``path`` opened for reading (``mode`` ``'rb'`` or ``'rt'``) as :func:`open_input` opens it."""
    if mode not in ("rb", "rt"):
        raise BadArgument(f"mode must be 'rb' or 'rt', not {mode!r}")
    f = open_input(path)
    if mode == "rb":
        return f
    return io.TextIOWrapper(io.BufferedReader(f), encoding=encoding)


def read_maybe_gzip(path: str | os.PathLike) -> bytes:
    """The whole file's bytes, gunzipped when it is gzip: :func:`read_input`."""
    return read_input(path)


def checked_int(value, path, what: str, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int:
    """``value`` as an int in ``[lo, hi]``, or :class:`BadArtifact` naming the field."""
    if type(value) is bool or not isinstance(value, (int, float)):
        raise BadArtifact(path, f"{what} is not an integer ({_short_repr(value)})", "The file is damaged or not of this kind")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadArtifact(path, f"{what} is not an integer ({value!r})", "The file is damaged or not of this kind")
        value = int(value)
    if not lo <= value <= hi:
        raise BadArtifact(path, f"{what} {_short_repr(value)} is out of range ({lo}..{hi})",
                          "The file is damaged or was not written by the tool it claims to come from")
    return value


def _short_repr(v) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        s = str(v) if v.bit_length() < 256 else f"an integer of {v.bit_length()} bits"
    elif isinstance(v, (str, float)):
        s = repr(v)
    else:
        s = f"a {type(v).__name__}"
    return s if len(s) <= 60 else s[:57] + "..."


# ---------------------------------------------------------------------------------------------- writing


class OutputTarget:
    """A checked output path: ``path``, whether it ``existed`` (and its ``mode``)."""

    def __init__(self, path: Path, existed: bool, mode: int | None):
        self.path, self.existed, self.mode = path, existed, mode

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), what: str = "output") -> OutputTarget:
    """Check, before any work, that ``path`` can be written: its folder exists and is writable; it is
    not a symlink, FIFO, device or folder; it is not one of ``inputs`` (the same file under any
    name). Raises :class:`BadArgument` with one line saying why."""
    p = Path(path)
    label = f"{what} {p}"
    if not str(p) or str(p).endswith(os.sep):
        raise BadArgument(f"{label}: give a file name, not a folder")
    try:
        lst = os.lstat(p)
    except FileNotFoundError:
        lst = None
    except OSError as exc:
        raise BadArgument(f"{label}: cannot be written ({_reason(exc)})") from None
    except ValueError as exc:
        raise BadArgument(f"{label}: not a usable path ({exc})") from None
    if lst is not None:
        if stat.S_ISLNK(lst.st_mode):
            raise BadArgument(f"{label}: is a symbolic link; refusing to write through it (remove it or give another name)")
        if not stat.S_ISREG(lst.st_mode):
            raise BadArgument(f"{label}: is {_kind_of(lst.st_mode)}, not a regular file; give another name")
        for src in inputs:
            try:
                if _same_file(os.stat(src), lst):
                    raise BadArgument(f"{label}: is also an input ({src}); refusing to overwrite it, give another name")
            except OSError:
                continue
    parent = p.parent if str(p.parent) else Path(".")
    try:
        pst = os.stat(parent)
    except OSError as exc:
        raise BadArgument(f"{label}: its folder {parent} does not exist or cannot be used ({_reason(exc)})") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise BadArgument(f"{label}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadArgument(f"{label}: the folder {parent} is not writable (permission denied)")
    if lst is not None and not os.access(p, os.W_OK):
        raise BadArgument(f"{label}: the existing file is not writable (permission denied)")
    return OutputTarget(p, lst is not None, stat.S_IMODE(lst.st_mode) if lst is not None else None)


def _reason(exc: OSError) -> str:
    return {errno.ELOOP: "a loop of symbolic links", errno.ENAMETOOLONG: "the name is too long",
            errno.ENOTDIR: "a part of the path is a file, not a folder",
            errno.EACCES: "permission denied"}.get(exc.errno, exc.strerror or str(exc))


def atomic_write(path: str | os.PathLike | OutputTarget, write: Callable, inputs: Iterable[str | os.PathLike] = (),
                 *, by_name: bool = False) -> OutputTarget:
    """Write ``path`` atomically: ``write(f)`` fills a temporary file in the same folder, which then
    replaces the target (``os.replace``); an existing file keeps its permission bits, a new one gets
    the usual ``0o666 & ~umask``. The target is checked (:func:`check_output`) first and again just
    before the rename. ``by_name=True``: ``write(tmp_path)`` writes the file itself (for writers that
    take a path, e.g. pyarrow). Returns the :class:`OutputTarget` (``.existed``: something was replaced)."""
    target = path if isinstance(path, OutputTarget) else check_output(path, inputs)
    p = target.path
    parent = p.parent if str(p.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:200]}.", suffix=".tmp", dir=parent)
    try:
        if by_name:
            os.close(fd)
            write(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        if target.mode is not None:
            mode = target.mode
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        again = check_output(p, inputs)  # nothing turned into a symlink/FIFO meanwhile
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return OutputTarget(p, target.existed or again.existed, target.mode if target.mode is not None else again.mode)


def output_note(target: OutputTarget, what: str = "") -> str:
    """``wrote X`` or ``wrote X (replaced the existing file)``."""
    extra = f" {what}" if what else ""
    return f"wrote{extra} {target.path}" + (" (replaced the existing file)" if target.existed else "")

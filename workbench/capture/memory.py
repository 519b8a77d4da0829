"""Allocator history and the one-call OOM snapshot.

:func:`record_memory_history` turns torch's allocator history on for a block of code and writes a
snapshot when the block ends (gzip pickle, written atomically). :func:`capture_oom` installs an
out-of-memory observer that writes a snapshot plus a small JSON sidecar at the moment an allocation
fails, and leaves the ``OutOfMemoryError`` itself alone.

Why it is built this way:

- torch calls OOM observers from inside the allocator, after it has released the allocator's lock and
  before it raises; the snapshot taken there is the state that failed. The observer never raises:
  any problem while writing is recorded on the handle (``handle.errors``) and the original error
  propagates untouched.
- torch has no way to detach an observer, so ``remove()`` disarms ours (it returns at once from then
  on); installing again later adds a fresh one.
- Without CUDA both functions say so once (a ``RuntimeWarning`` and a log line) and do nothing else,
  so the same notebook runs on a laptop.
- torch's own message ("Tried to allocate ... GiB allowed ...") only exists once the exception is
  built, after the observer returns; when ``capture_oom`` is used as a context manager (or
  ``handle.note_exception(exc)`` is called) the message is added to the last sidecar.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import BadArgument
from workbench.io.snapshot import load_snapshot, save_snapshot

__all__ = [
    "record_memory_history",
    "MemoryRecording",
    "capture_oom",
    "OomCapture",
    "cuda_available",
]

log = logging.getLogger("workbench.capture.memory")


def cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # broken driver installs raise here
        return False


def _no_cuda(what: str) -> None:
    msg = f"{what}: no CUDA device (torch.cuda.is_available() is False); nothing is recorded on this machine"
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _write_json_atomic(path: Path, obj: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class MemoryRecording:
    """What :func:`record_memory_history` produced: ``path`` of the snapshot (None without CUDA or
    when no path was given and nothing was written) and ``snapshot`` (the raw dict, kept only when
    ``keep=True``)."""

    path: Path | None = None
    snapshot: dict | None = None
    enabled: bool = False
    events: int = 0

    def load(self):
        """The written snapshot as a :class:`workbench.io.snapshot.MemorySnapshot`."""
        if self.path is None:
            from workbench.errors import NoDevice

            raise NoDevice("no snapshot was recorded (no CUDA device, or no path given); run on a CUDA machine")
        return load_snapshot(self.path)


class record_memory_history:  # noqa: N801 - used as a function/context manager, named for the action
    """Record allocator history while the block runs, then write a snapshot.

    >>> with record_memory_history("step.snapshot.pickle.gz", max_entries=100_000) as rec:  # doctest: +SKIP
    ...     train_step()
    >>> rec.path  # doctest: +SKIP

    ``stacks='python'`` records Python frames only (cheapest); ``'all'`` adds C++ frames (lets
    gradients be told from backward temporaries). ``max_entries`` bounds the ring buffer (each entry
    costs a few hundred bytes to a few KB of host memory). History recording is switched off at exit
    (and the previous history cleared only if ``clear=True``).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, max_entries: int = 100_000,
                 stacks: str = "python", context: str = "all", device=None, keep: bool = False,
                 clear: bool = True):
        if stacks not in ("python", "all"):
            raise BadArgument("stacks must be 'python' or 'all'")
        self.path = Path(path) if path is not None else None
        self.max_entries = int(max_entries)
        self.stacks = stacks
        self.context = context
        self.device = device
        self.keep = keep
        self.clear = clear
        self.result = MemoryRecording()

    def __enter__(self) -> MemoryRecording:
        if not cuda_available():
            _no_cuda("record_memory_history")
            return self.result
        import torch

        torch.cuda.init()
        kwargs = dict(context=self.context, stacks=self.stacks, max_entries=self.max_entries)
        if self.clear:
            kwargs["clear_history"] = True
        try:
            torch.cuda.memory._record_memory_history("all", device=self.device, **kwargs)
        except TypeError:  # older torch without clear_history
            kwargs.pop("clear_history", None)
            torch.cuda.memory._record_memory_history("all", device=self.device, **kwargs)
        self.result.enabled = True
        return self.result

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.result.enabled:
            return False
        import torch

        try:
            snap = torch.cuda.memory._snapshot()
            self.result.events = sum(len(t) for t in snap.get("device_traces", []))
            if self.path is not None:
                self.result.path = save_snapshot(snap, self.path)
            if self.keep:
                self.result.snapshot = snap
        finally:
            torch.cuda.memory._record_memory_history(None)
        return False  # never swallow the block's exception


@dataclass
class OomCapture:
    """Handle returned by :func:`capture_oom`: ``dumps`` (snapshot paths written), ``errors`` (what went
    wrong while writing, never raised), ``active``; ``remove()`` disarms the observer."""

    directory: Path | None
    max_dumps: int
    active: bool = False
    dumps: list = field(default_factory=list)
    sidecars: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    skipped: int = 0
    _lock: Any = field(default_factory=threading.Lock, repr=False)

    def remove(self) -> None:
        """Stop writing dumps (torch cannot detach an observer; ours becomes a no-op)."""
        self.active = False

    def note_exception(self, exc: BaseException) -> None:
        """Add torch's error message to the last sidecar (the observer runs before the message exists)."""
        if not self.sidecars:
            return
        side = self.sidecars[-1]
        try:
            data = json.loads(side.read_text())
            if data.get("torch_message") is None:
                data["torch_message"] = str(exc)
                _write_json_atomic(side, data)
        except Exception as e:  # never let bookkeeping replace the user's exception
            self.errors.append(f"{side}: could not add the message ({e})")

    def __enter__(self) -> "OomCapture":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and self.active and _is_oom(exc):
            self.note_exception(exc)
        self.remove()
        return False  # the OutOfMemoryError (or anything else) propagates unchanged

    # the observer: (device, requested bytes, limit bytes: the per-process cap when set else the
    # device total, bytes free on the device as CUDA reports)
    def _observe(self, device: int, alloc: int, limit: int, device_free: int) -> None:
        if not self.active:
            return
        with self._lock:
            if len(self.dumps) >= self.max_dumps:
                self.skipped += 1
                return
            try:
                import torch

                stamp = time.strftime("%Y%m%d-%H%M%S")
                base = self.directory / f"oom-{stamp}-pid{os.getpid()}-{len(self.dumps) + 1}"
                stats = {}
                try:
                    stats = dict(torch.cuda.memory_stats(device))
                except Exception as e:
                    self.errors.append(f"memory_stats failed: {e}")
                snap = torch.cuda.memory._snapshot()
                path = save_snapshot(snap, base.with_name(base.name + ".pickle.gz"))
                side = base.with_name(base.name + ".oom.json")
                _write_json_atomic(side, {
                    "device": int(device),
                    "requested_bytes": int(alloc),
                    "limit_bytes": int(limit),
                    "device_free_bytes": int(device_free),
                    "time_unix_s": time.time(),
                    "torch_version": torch.__version__,
                    "torch_message": None,
                    "memory_stats": stats,
                })
                self.dumps.append(path)
                self.sidecars.append(side)
                log.warning("out of memory on cuda:%s: snapshot written to %s", device, path)
            except BaseException as e:  # noqa: BLE001 - the observer must never raise into the allocator
                self.errors.append(f"{type(e).__name__}: {e}")


def _is_oom(exc: BaseException) -> bool:
    try:
        import torch

        return isinstance(exc, torch.cuda.OutOfMemoryError)
    except Exception:
        return "out of memory" in str(exc).lower()


def capture_oom(directory: str | os.PathLike = "oom_snapshots", *, max_dumps: int = 3,
                record_history: bool = True, max_entries: int = 100_000, stacks: str = "python") -> OomCapture:
    """One call: on every CUDA out-of-memory (up to ``max_dumps``), write
    ``<directory>/oom-<time>-pid<pid>-<n>.pickle.gz`` (the allocator snapshot, atomically: temporary
    file then rename) and ``...oom.json`` (requested bytes, the cap, bytes free on the device,
    ``torch.cuda.memory_stats()`` at that moment, and torch's message when known).

    CUDA is initialised first (the observer can only be attached to a live allocator). With
    ``record_history`` (default) allocator history is switched on too, so the snapshot shows what led
    up to the OOM. The ``OutOfMemoryError`` is never caught or replaced. Use the handle's ``remove()``
    to stop, or use it as a context manager::

        with capture_oom("oom/") as oom:
            train()
        # on OOM: the error propagates; oom.dumps lists the files

    Without CUDA: a warning, and a handle that does nothing.
    """
    handle = OomCapture(directory=Path(directory), max_dumps=int(max_dumps))
    if not cuda_available():
        _no_cuda("capture_oom")
        return handle
    import torch

    handle.directory.mkdir(parents=True, exist_ok=True)
    torch.cuda.init()
    if record_history:
        torch.cuda.memory._record_memory_history("all", context="all", stacks=stacks, max_entries=max_entries)
    torch._C._cuda_attach_out_of_memory_observer(handle._observe)
    handle.active = True
    return handle

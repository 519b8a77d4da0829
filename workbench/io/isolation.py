"""Run a loader in a forked child process, with its progress bars drawn by the caller.

Some files can kill the process that reads them before any Python code could look at them: the C
unpickler hashes dict keys as it builds them, and a tuple nested 10^6 deep overflows the C stack
(SIGSEGV, a dead notebook kernel). :func:`run_isolated` runs ``load()`` in a forked child instead, so
such a crash, or the kernel's OOM killer, is one :class:`~workbench.errors.BadArtifact` line in the
caller. Only the result comes back (pickled by our own code, never the file's bytes); the child also
drops whatever temporary objects the loader built by exiting, not by freeing them one by one.

Progress: a loader asks :func:`make_bar` for a bar (a tqdm bar normally). In the child it gets a
stand-in that sends ``open`` / ``update`` / ``close`` messages over a second pipe, and a thread in the
parent draws real tqdm bars from them. :class:`ReadProgress` wraps a binary reader so a bar follows the
bytes read. Linux only (``fork``); elsewhere, or when a fork fails, ``load()`` runs in this process.

Used by ``io/snapshot.py`` (``load_snapshot``; ``WORKBENCH_SNAPSHOT_ISOLATION=0`` turns it off there).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, TypeVar

from workbench.errors import BadArtifact

__all__ = ["run_isolated", "can_isolate", "make_bar", "ReadProgress"]

T = TypeVar("T")

# In the forked child of run_isolated, bars are drawn by the parent: the child sends
# (open / update / close) messages over this pipe, the parent's thread turns them into tqdm bars.
_CHILD_PROGRESS_FD: int | None = None


def can_isolate() -> bool:
    """Whether :func:`run_isolated` runs the loader in a forked child here (Linux with ``os.fork``)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def make_bar(total: int, desc: str, unit: str):
    """A progress bar for a loader: tqdm, or in an isolated child a stand-in drawn by the parent."""
    if _CHILD_PROGRESS_FD is not None:
        return _PipeBar(_CHILD_PROGRESS_FD, total, desc, unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False)


class ReadProgress:
    """A file wrapper that advances a bar by the bytes of the (compressed) file read so far:
    ``raw`` is the underlying file whose ``tell()`` counts them, ``f`` the reader that is read."""

    def __init__(self, f, raw, bar):
        self._f, self._raw, self._bar, self._pos = f, raw, bar, 0

    def _tick(self):
        pos = self._raw.tell()
        if pos > self._pos:
            self._bar.update(pos - self._pos)
            self._pos = pos

    def read(self, n=-1):
        out = self._f.read(n)
        self._tick()
        return out

    def readinto(self, b):
        out = self._f.readinto(b)
        self._tick()
        return out

    def readline(self, limit=-1):
        return self._f.readline(limit)

    def peek(self, n=0):
        return self._f.peek(n) if hasattr(self._f, "peek") else b""

    def close(self):
        self._f.close()


def _send(fd: int, msg: tuple) -> None:
    data = pickle.dumps(msg, protocol=5)
    os.write(fd, len(data).to_bytes(4, "little") + data)


class _PipeBar:
    """A tqdm stand-in in the isolated child: updates go to the parent at most every 1% or 0.1 s."""

    _ids = 0

    def __init__(self, fd: int, total: int, desc: str, unit: str):
        _PipeBar._ids += 1
        self.fd, self.id, self.total, self.pending, self.t = fd, _PipeBar._ids, total, 0, time.monotonic()
        _send(fd, ("open", self.id, int(total), str(desc), str(unit)))

    def update(self, n: int = 1) -> None:
        self.pending += n
        now = time.monotonic()
        if self.pending >= max(1, self.total // 100) or now - self.t > 0.1:
            _send(self.fd, ("update", self.id, self.pending))
            self.pending, self.t = 0, now

    def close(self) -> None:
        if self.pending:
            _send(self.fd, ("update", self.id, self.pending))
            self.pending = 0
        _send(self.fd, ("close", self.id))


def _draw_child_progress(fd: int) -> None:
    """Parent side: read the child's bar messages until the pipe closes, drawing real tqdm bars."""
    from tqdm.auto import tqdm

    bars = {}
    try:
        with os.fdopen(fd, "rb") as f:
            while True:
                head = f.read(4)
                if len(head) < 4:
                    break
                msg = pickle.loads(f.read(int.from_bytes(head, "little")))  # our own child's messages
                if msg[0] == "open":
                    bars[msg[1]] = tqdm(total=msg[2], desc=msg[3], unit=msg[4], unit_scale=True, leave=False)
                elif msg[0] == "update" and msg[1] in bars:
                    bars[msg[1]].update(msg[2])
                elif msg[0] == "close" and msg[1] in bars:
                    bars.pop(msg[1]).close()
    except Exception:  # progress is best effort; the load's own result decides
        pass
    finally:
        for b in bars.values():
            b.close()


def _child(load: Callable[[], Any], w: int, pw: int | None, parent_ends: tuple) -> None:
    """The forked child: run ``load``, send the outcome down ``w``, exit. Never returns."""
    global _CHILD_PROGRESS_FD
    code = 0
    try:
        for fd in parent_ends:
            if fd is not None:
                os.close(fd)
        if pw is not None:
            _CHILD_PROGRESS_FD = pw
        warnings.simplefilter("ignore")
        try:
            payload = ("ok", load())
        except BadArtifact as exc:  # BadArtifact and its subclasses (UnsafePickle), rebuilt by the parent
            payload = ("bad", type(exc), exc.path, exc.problem, exc.fix)
        except MemoryError:
            payload = ("memory",)
        except BaseException as exc:  # a bug: the parent raises it as such
            payload = ("bug", type(exc).__name__, str(exc)[:500])
        data = pickle.dumps(payload, protocol=5)
        view = memoryview(data)
        while view:
            view = view[os.write(w, view[: 1 << 20]):]
    except BaseException:
        code = 3
    finally:
        os._exit(code)


def run_isolated(load: Callable[[], T], path: str | os.PathLike, fix: str, *, progress: bool = False,
                 crashed: str = "crashed the loader") -> T:
    """``load()`` run in a forked child; its result (picklable) comes back.

    ``path`` and ``fix`` go into the :class:`BadArtifact` raised when the child dies: killed by a
    signal (SIGKILL: "ran out of memory while loading"; any other: ``crashed`` and the signal's name,
    e.g. "crashed the unpickler (SIGSEGV)") or exiting without a result. A ``BadArtifact`` (or subclass)
    raised by ``load`` is raised again here; a ``MemoryError`` becomes a BadArtifact; anything else
    (a bug) a ``RuntimeError`` naming it. ``progress``: draw the child's :func:`make_bar` bars here.
    Ctrl-C kills the child. Without ``fork`` (:func:`can_isolate`) or when the fork fails (no memory
    or process slot), ``load()`` runs in this process."""
    if not can_isolate():
        return load()
    r, w = os.pipe()
    pr, pw = os.pipe() if progress else (None, None)
    try:
        pid = os.fork()
    except OSError:  # no memory or process slot for a fork: load here instead
        for fd in (r, w, pr, pw):
            if fd is not None:
                os.close(fd)
        return load()
    if pid == 0:  # child: never returns into the caller's code
        _child(load, w, pw, (r, pr))
    os.close(w)
    drawer = None
    if pr is not None:
        os.close(pw)
        drawer = threading.Thread(target=_draw_child_progress, args=(pr,), daemon=True)
        drawer.start()
    chunks = []
    try:
        with os.fdopen(r, "rb") as f:
            while True:
                b = f.read(8 << 20)
                if not b:
                    break
                chunks.append(b)
        _, status = os.waitpid(pid, 0)
        if drawer is not None:
            drawer.join(timeout=5)
    except BaseException:  # Ctrl-C: do not leave the child running
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        raise
    path = Path(path)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        what = "ran out of memory" if sig == signal.SIGKILL else f"{crashed} ({name})"
        raise BadArtifact(path, f"{what} while loading (a hostile or damaged file; nothing from it ran)", fix)
    data = b"".join(chunks)
    del chunks
    if os.WEXITSTATUS(status) != 0 or not data:
        raise BadArtifact(path, "could not be loaded (the loading process failed)", fix)
    payload = pickle.loads(data)  # our own child's pickle of the loader's result
    if payload[0] == "ok":
        return payload[1]
    if payload[0] == "bad":
        cls = payload[1]
        if not (isinstance(cls, type) and issubclass(cls, BadArtifact)):
            cls = BadArtifact
        raise cls(*payload[2:])
    if payload[0] == "memory":
        raise BadArtifact(path, "ran out of memory while loading",
                          "Free memory, or load it on a larger machine")
    raise RuntimeError(f"{payload[1]}: {payload[2]}")

"""Load one trace per rank and reduce each where it was loaded: in this process, a local process pool or
a Dask cluster, through the Parquet cache of ``io/rank_cache.py``.

A rank's trace can be hundreds of MB; what the cross-rank view needs of it is a few KB (its steps, its
collectives, where its time went). So each worker loads one file and sends back only the reduction,
never the trace. The reduction itself is the analysis layer's (``analysis.trace.ranks.RankFrame``); io only
knows its shape, given as ``frame_type``, a class with:

* ``frame_type.from_trace(trace)`` -> a frame (the reduction of a loaded :class:`~workbench.io.trace.Trace`);
* ``frame.to_cache()`` -> ``(DataFrame, dict)`` and ``frame_type.from_cache(frame, meta, path=)``
  (the Parquet cache entry and back).

``frame_type`` must be importable by name (a module-level class) when work goes to other processes or
Dask workers, which then need gpu-workbench installed.

>>> from workbench.analysis.trace.ranks import RankFrame
>>> frames = load_rank_frames(["r0.json.gz", "r1.json.gz"], RankFrame, processes=1)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from workbench.errors import BadArtifact

__all__ = ["load_rank_frame", "load_rank_frames"]


def load_rank_frame(path: str | os.PathLike, frame_type: Any, cache: bool = True, cache_dir=None):
    """Load one trace file and reduce it with ``frame_type.from_trace``, through the Parquet cache
    (``io.rank_cache``) unless ``cache=False``. Raises BadArtifact for a file that is not a trace."""
    from workbench.io import rank_cache
    from workbench.io.trace import load_trace

    p = Path(path)
    target = None
    if cache:
        try:
            target = rank_cache.cache_path(p, cache_dir)
        except OSError:
            target = None  # unreadable: load_trace below says why
        if target is not None:
            hit = rank_cache.load_frame(target)
            if hit is not None:
                return frame_type.from_cache(*hit, path=str(p))
    frame = frame_type.from_trace(load_trace(p))
    if target is not None:
        rank_cache.save_frame(target, *frame.to_cache())
    return frame


def _frame_or_error(path, frame_type, cache: bool, cache_dir):
    """Worker side: a frame, or the error as plain values (BadArtifact does not pickle)."""
    try:
        return load_rank_frame(path, frame_type, cache, cache_dir), None
    except BadArtifact as exc:
        return None, (exc.path, exc.problem, exc.fix)


_FIX_CLUSTER = ("Run again (a worker that died is replaced or its work retried); if it happens again, the file "
                "may kill the worker (memory): load it alone with `workbench trace`")


def _on_cluster(client, paths: list[Path], frame_type, cache: bool, cache_dir) -> list:
    """One (frame, error) pair per path from a Dask cluster. A task whose worker died is retried by the
    scheduler on another worker (``distributed.scheduler.allowed-failures``); one that still fails, or
    is lost, comes back as an error naming its file, never as a hole that shifts the others."""
    from workbench.errors import BadArgument

    futures = client.map(_frame_or_error, [str(p) for p in paths], frame_type=frame_type, cache=cache,
                         cache_dir=None if cache_dir is None else str(cache_dir), pure=False)
    results = []
    for p, fut in zip(paths, futures):  # each waits for its own task; they all run meanwhile
        try:
            results.append(fut.result())
            continue
        except (OSError, TimeoutError) as exc:  # the scheduler itself went away
            if type(exc).__name__ not in ("CancelledError", "FutureCancelledError"):
                client.cancel(futures)
                raise BadArgument(f"lost the Dask scheduler while reading {len(paths)} traces "
                                  f"({type(exc).__name__}: {exc}); start it again and rerun") from None
            err = exc
        except Exception as exc:  # noqa: BLE001 - KilledWorker (its worker died too often), a lost task, ...
            err = exc
        name = type(err).__name__
        why = "its worker died while reading it" if name == "KilledWorker" else f"{name}: {str(err)[:200]}"
        results.append((None, (str(p), f"could not be read on the Dask cluster ({why})", _FIX_CLUSTER)))
    return results


_FIX_DIED = "The file may need more memory than a worker has: load it alone with `workbench trace`, or use --processes 1"


def _in_pool(paths: list[Path], n: int, frame_type, cache: bool, cache_dir) -> list:
    """(frame, error) per path from a local process pool. A worker that dies (the OOM killer, a crash)
    breaks the pool: the files it had not finished are retried one per fresh single-worker pool, and
    one that kills its worker again comes back as that file's error."""
    from concurrent.futures.process import BrokenProcessPool

    results: list = [None] * len(paths)
    retry = []
    pool = ProcessPoolExecutor(max_workers=n)
    try:
        futures = [pool.submit(_frame_or_error, p, frame_type, cache, cache_dir) for p in paths]
        for i, fut in enumerate(futures):
            try:
                results[i] = fut.result()
            except BrokenProcessPool:
                retry.append(i)
    except BaseException:  # Ctrl-C: do not wait for queued files
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    for i in retry:
        with ProcessPoolExecutor(max_workers=1) as one:
            try:
                results[i] = one.submit(_frame_or_error, paths[i], frame_type, cache, cache_dir).result()
            except BrokenProcessPool:
                results[i] = (None, (str(paths[i]), "could not be read: its worker process died while reading it",
                                     _FIX_DIED))
    return results


def load_rank_frames(
    paths: Sequence[str | os.PathLike],
    frame_type: Any,
    *,
    processes: int | None = None,
    client=None,
    cache: bool = True,
    cache_dir=None,
    on_skip: Callable[[str, str], None] | None = None,
) -> list:
    """Reduce each trace with :func:`load_rank_frame`, order following ``paths``: in this process
    (``processes=1``), in a local process pool (default: min(files, CPUs) workers), or on a Dask cluster
    when ``client`` (a ``distributed.Client``) is given; the workers send back frames, never traces. A
    file that is not a trace raises BadArtifact, or is reported to ``on_skip(path, message)`` and left out."""
    paths = [Path(p) for p in paths]
    if client is not None:
        results = _on_cluster(client, paths, frame_type, cache, cache_dir)
    else:
        n = processes or min(len(paths), os.cpu_count() or 1)
        if n <= 1 or len(paths) <= 1:
            results = [_frame_or_error(p, frame_type, cache, cache_dir) for p in paths]
        else:
            results = _in_pool(paths, n, frame_type, cache, cache_dir)
    from workbench.io.trace import _collect  # (value, error) pairs -> values; errors raised or skipped

    return _collect(results, on_skip)

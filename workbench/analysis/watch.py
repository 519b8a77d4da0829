"""What a flight recorder's folder holds, as one document: each capture with why it was taken, its steps,
its files, and the normal capture to compare it with (``workbench watch DIR``, text and ``--json``).

A capture of a slow window is read against a normal one: :func:`normal_capture` picks, for a capture,
the latest earlier capture of the same rank taken for no fault (``baseline`` or ``every``) that has a
trace; ``workbench diff NORMAL SLOW`` then says what changed.
"""

from __future__ import annotations

import statistics

from workbench.io.watch import REASONS, WatchCapture, WatchIndex

__all__ = ["watch_summary", "normal_capture", "NORMAL_REASONS"]

#: captures taken for no fault: what a slow one is compared with
NORMAL_REASONS = ("baseline", "every")


def normal_capture(index: WatchIndex, capture: WatchCapture) -> WatchCapture | None:
    """The latest capture before ``capture`` on its rank, of a normal window, with a trace (None when
    there is none, or when ``capture`` is itself normal)."""
    if capture.reason in NORMAL_REASONS:
        return None
    best = None
    for c in index.captures:
        if c is capture:
            break
        if c.rank == capture.rank and c.reason in NORMAL_REASONS and c.trace and c.first_step < capture.first_step:
            best = c
    return best


def _median(values) -> float | None:
    xs = [float(v) for v in values or () if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return round(statistics.median(xs), 4) if xs else None


def watch_summary(index: WatchIndex) -> dict:
    """The ``workbench watch --json`` document (keys in docs/json.md)."""
    captures = []
    for c in index.captures:
        normal = normal_capture(index, c)
        d = c.as_dict()
        d.update({
            "last_step": c.last_step,
            "why": REASONS.get(c.reason, "unknown reason"),
            "captured_median_ms": _median(c.extra.get("step_ms")),
            "paths": {k: str(index.path(v)) for k, v in c.files().items()},
            "missing": index.missing(c),
            "compare_with": normal.trace if normal is not None and c.trace else None,
        })
        captures.append(d)
    by_reason: dict[str, int] = {}
    for c in index.captures:
        by_reason[c.reason] = by_reason.get(c.reason, 0) + 1
    return {
        "folder": str(index.folder),
        "captures": captures,
        "ranks": sorted({c.rank for c in index.captures}),
        "by_reason": by_reason,
        "problems": list(index.problems),
    }

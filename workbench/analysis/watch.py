"""What a flight recorder's folder holds, as one document: each capture with why it was taken, its steps,
its files, and the normal capture to compare it with (``workbench watch DIR``, text and ``--json``).

A capture of a slow window is read against a normal one: :func:`normal_capture` picks, for a capture,
the latest earlier capture of the same rank taken for no fault (``baseline`` or ``every``) that has a
trace; ``workbench diff NORMAL SLOW`` then says what changed.
"""

from __future__ import annotations

import statistics

from workbench.io.watch import REASONS, WatchCapture, WatchIndex

__all__ = ["watch_summary", "normal_capture", "history_words", "NORMAL_REASONS"]

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


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def history_words(history: dict | None) -> str | None:
    """An index line's ``history`` in words (None when the line has none: a CPU run, or an older recorder).

    >>> history_words({"mode": "sizes", "auto": True, "cost_pct": 13.2, "allocs_per_step": 1450, "budget_pct": 1})
    'without stacks: stacks would cost 13.2% of a step (1450 allocations a step; budget 1%)'
    >>> history_words({"mode": "off", "auto": True, "cost_pct": 7.4, "sizes_cost_pct": 1.9, "allocs_per_step": 499,
    ...                "budget_pct": 1})
    'off: stacks would cost 7.4% of a step, the ring without them 1.9% (499 allocations a step; budget 1%)'
    """
    if not isinstance(history, dict):
        return None
    mode = history.get("mode")
    if not mode:
        return "not recorded"
    what = {"python": "with Python stacks", "all": "with Python and C++ stacks", "alloc": "with stacks at allocation",
            "sizes": "without stacks", "off": "off"}.get(str(mode), f"mode {mode}")
    if not history.get("auto"):
        return f"{what} (as asked)"
    pct, allocs, budget = (_num(history.get(k)) for k in ("cost_pct", "allocs_per_step", "budget_pct"))
    if allocs is None:
        return f"{what} (the budget not checked yet: the warm-up was not over)"
    cost = "more than the step itself" if pct is None else f"{pct:g}% of a step"
    budget_txt = "" if budget is None else f"; budget {budget:g}%"
    if mode == "sizes":
        return f"{what}: stacks would cost {cost} ({allocs:.0f} allocations a step{budget_txt})"
    if mode == "off":
        ring = _num(history.get("sizes_cost_pct"))
        ring_txt = "" if ring is None else f", the ring without them {ring:g}%"
        return f"{what}: stacks would cost {cost}{ring_txt} ({allocs:.0f} allocations a step{budget_txt})"
    return f"{what}: they cost {cost} ({allocs:.0f} allocations a step{budget_txt})"


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
    latest: dict[int, dict] = {}  # each rank's allocator history, as its latest line says
    for c in index.captures:
        if isinstance(c.extra.get("history"), dict):
            latest[c.rank] = c.extra["history"]
    history = [{"rank": r, "mode": h.get("mode"), "auto": bool(h.get("auto")), "cost_pct": _num(h.get("cost_pct")),
                "allocs_per_step": _num(h.get("allocs_per_step")), "text": history_words(h)}
               for r, h in sorted(latest.items())]
    by_reason: dict[str, int] = {}
    for c in index.captures:
        by_reason[c.reason] = by_reason.get(c.reason, 0) + 1
    return {
        "folder": str(index.folder),
        "captures": captures,
        "ranks": sorted({c.rank for c in index.captures}),
        "by_reason": by_reason,
        "history": history,
        "problems": list(index.problems),
    }

"""Interval arithmetic on numpy arrays (microseconds): union, covered length, nesting depth.

Private helpers for the trace analyses; vectorized so that a 250k-event trace costs milliseconds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["merge", "total_length", "covered", "overlap_with", "nesting_parents"]


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [start, end) as sorted, disjoint (starts, ends). Touching intervals join."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    if starts.size == 0:
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, s.size - 1]
    return s[first], e[last]


def total_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = merge(starts, ends)
    return float((e - s).sum())


def covered(ms: np.ndarray, me: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each query [a_i, b_i): how much of it the *merged* intervals (ms, me) cover."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if ms.size == 0:
        return np.zeros_like(a)
    cum = np.r_[0.0, np.cumsum(me - ms)]  # cum[k]: length of the first k merged intervals

    def upto(x):  # covered length of (-inf, x)
        k = np.searchsorted(ms, x, side="right")  # intervals starting at or before x
        full = cum[np.maximum(k - 1, 0)]
        part = np.where(k > 0, np.clip(x - ms[np.maximum(k - 1, 0)], 0.0, (me - ms)[np.maximum(k - 1, 0)]), 0.0)
        return full + part

    return np.maximum(upto(b) - upto(a), 0.0)


def overlap_with(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    """Length of the union of the intervals inside [lo, hi)."""
    s, e = merge(np.clip(starts, lo, hi), np.clip(ends, lo, hi))
    return float((e - s).sum())


def nesting_parents(group: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parent index (-1 for roots) and depth of each interval, intervals nesting within each group (thread).

    Intervals on one thread nest like a call stack. Sorting by (group, start, -end), the depth of an
    interval is the number of earlier intervals of its group still open at its start, and its parent
    is the nearest earlier interval one level up. Zero-length intervals are treated as 1 ns long so
    that they count as children, not as closed siblings.
    """
    n = starts.size
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, depth
    ends = np.maximum(ends, starts + 1e-3)
    order = np.lexsort((-ends, starts, group))
    g = group[order]
    s = starts[order]
    e = ends[order]
    bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
    d = np.empty(n, dtype=np.int64)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ends_sorted = np.sort(e[lo:hi])
        closed = np.searchsorted(ends_sorted, s[lo:hi], side="right")
        d[lo:hi] = np.maximum(np.arange(hi - lo) - closed, 0)
    # parent: previous position (same group) with depth d-1
    par_sorted = np.full(n, -1, dtype=np.int64)
    gid = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
    for level in range(1, int(d.max()) + 1 if n else 1):
        child = np.flatnonzero(d == level)
        if child.size == 0:
            continue
        cand = np.flatnonzero(d == level - 1)
        if cand.size == 0:
            continue
        k = np.searchsorted(cand, child) - 1
        ok = k >= 0
        p = cand[np.maximum(k, 0)]
        ok &= gid[p] == gid[child]
        par_sorted[child[ok]] = p[ok]
    parent[order] = np.where(par_sorted >= 0, order[np.maximum(par_sorted, 0)], -1)
    depth[order] = d
    return parent, depth

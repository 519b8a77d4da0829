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
    """Parent index (-1 for roots) and depth of each interval; intervals nest within each group (thread).

    This is the call-stack rule (sort by start, longest first; pop the stack while its top has ended;
    the top is the parent) in vector form: the parent of an interval is the nearest earlier interval
    of its group that has not ended by its start. Found for all intervals at once by binary lifting
    over a sparse table of running maxima of the end times, so imperfectly nested ranges (a child
    that ends a microsecond after its parent) get exactly the parent a stack would give them.
    """
    n = starts.size
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    if n == 0:
        return parent, depth
    order = np.lexsort((-ends, starts, group))
    g = group[order]
    s = starts[order]
    e = ends[order]
    new = np.r_[True, g[1:] != g[:-1]]
    gstart = np.maximum.accumulate(np.where(new, np.arange(n), 0))  # first index of each one's group
    prev_i = np.arange(n) - 1
    # most intervals are the first child of the one before them (or a later child whose elder sibling
    # is still open): that one is the parent; the others scan left
    direct = (prev_i >= gstart) & (prev_i >= 0)
    direct &= e[np.maximum(prev_i, 0)] > s
    par_sorted = np.where(direct, prev_i, -1)
    q = np.flatnonzero(~direct)
    if q.size:
        # table[k][p] = max(e[p - 2**k + 1 .. p])
        table = [e]
        k = 1
        while (1 << k) <= n:
            prev = table[-1]
            half = 1 << (k - 1)
            cur = np.empty_like(prev)
            cur[:half] = prev[:half]
            np.maximum(prev[half:], prev[:-half], out=cur[half:])
            table.append(cur)
            k += 1
        pos = q - 1  # candidate parent: scan left from the previous interval
        qs, qg = s[q], gstart[q]
        for k in range(len(table) - 1, -1, -1):
            step = 1 << k
            lo = pos - step + 1  # the block (pos - step, pos]
            ok = (lo >= qg) & (pos >= 0)
            blk = table[k][np.maximum(pos, 0)]
            jump = ok & (blk <= qs)
            pos = np.where(jump, pos - step, pos)
        has = (pos >= qg) & (pos >= 0)
        has &= e[np.maximum(pos, 0)] > qs
        par_sorted[q] = np.where(has, pos, -1)
    # depth by pointer doubling: d[i] counts the links from i to p[i]; each round adds the count from
    # p[i] on and jumps there, so log2(depth) rounds
    p = par_sorted.copy()
    d = (p >= 0).astype(np.int64)
    live = np.flatnonzero(p >= 0)
    while live.size:
        up = p[live]
        d[live] += d[up]
        p[live] = p[up]
        live = live[p[live] >= 0]
    parent[order] = np.where(par_sorted >= 0, order[np.maximum(par_sorted, 0)], -1)
    depth[order] = d
    return parent, depth

"""Keep figures light: no trace ships more than a bounded number of points to the browser."""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_POINTS", "minmax_downsample"]

MAX_POINTS = 50_000  # per figure, whatever the size of the artifact (docs/architecture.md, "Speed targets")


def minmax_downsample(x, y, max_points: int = 5_000):
    """Downsample a line to at most ``max_points`` points, keeping each bucket's min and max of ``y``
    so peaks (the thing a memory or utilization plot is read for) survive.

    >>> import numpy as np
    >>> x = np.arange(1_000_000); y = np.zeros(1_000_000); y[123_456] = 9.0
    >>> xs, ys = minmax_downsample(x, y, 1000)
    >>> len(xs) <= 1000, float(ys.max())
    (True, 9.0)
    """
    x = np.asarray(x)
    y = np.asarray(y)
    n = len(x)
    if n <= max_points:
        return x, y
    buckets = max(1, max_points // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts = edges[:-1]
    starts = starts[edges[1:] > starts]
    ends = np.append(starts[1:], n)
    idx = np.empty(2 * len(starts), dtype=np.int64)
    for k, (s, e) in enumerate(zip(starts, ends)):  # ~max_points/2 buckets: cheap
        seg = y[s:e]
        a = s + int(np.argmin(seg))
        b = s + int(np.argmax(seg))
        idx[2 * k], idx[2 * k + 1] = (a, b) if a <= b else (b, a)
    idx = np.unique(idx)
    return x[idx], y[idx]

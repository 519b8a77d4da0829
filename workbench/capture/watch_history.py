"""The allocator history's cost, for the flight recorder's budget (``memory_history="auto"`` of
:mod:`workbench.capture.watch`): a calibration of what one recorded allocation costs with Python stacks, without
them and with the history off (:func:`calibrate_history`), the stacks' cost at a step's depth
(:func:`stacks_us_at`), and the pure decision from those terms and a step's allocations and time
(:func:`history_cost`). docs/long-runs.md describes the model and its approximations."""

from __future__ import annotations

import sys
import time

__all__ = ["history_cost", "stacks_us_at", "calibrate_history", "cost_words", "py_depth", "STEP_FRAMES"]

#: the Python frames a step's allocations are taken to sit below the loop's ``with w.step()`` line (about
#: 3 frames per nn.Module call: six levels of modules and a few functional wrappers); the calibration's
#: cost per frame is scaled to that depth
STEP_FRAMES = 24
_CAL_PAIRS = 1000        # allocations (each freed at once) per timed calibration run
_CAL_REPEATS = 3         # timed runs per mode (the fastest is kept: noise only adds)
_CAL_EXTRA_DEPTH = 48    # the second calibration depth: this many frames below the first
_CAL_RING = 1024         # the calibration's own ring (it wraps, so evicting old entries is timed too)

def history_cost(allocs_per_step: float, step_ms: float, stacks_us: float, sizes_us: float,
                 budget: float = 0.01, off_us: float | None = None) -> dict:
    """What the allocator history costs a step, and the richest mode the budget allows (pure).

    ``allocs_per_step``: allocations per step (each one freed within the run of steps: a free records an
    entry too); ``step_ms``: the step's time, measured *with* stacks on (their cost is taken out of it);
    ``stacks_us`` / ``sizes_us`` / ``off_us``: one allocation and its free with the history recording
    stacks / recording no stacks / not recording (``off_us`` None: not measured, and the ring without
    stacks is taken as free).
    Returns ``mode``: 'python' when the history with stacks costs at most ``budget`` of the step without
    any history, else 'sizes' when the ring without stacks does, else 'off'; ``cost_pct`` (the stacks'
    share of that step beyond the ring without them, in percent; None when it cannot be said),
    ``sizes_cost_pct`` (the ring without stacks; None when ``off_us`` is None), ``cost_ms`` and the
    inputs, rounded.

    >>> history_cost(1500, 22.0, 3.5, 1.2)["mode"], history_cost(1500, 22.0, 3.5, 1.2)["cost_pct"]
    ('sizes', 18.6)
    >>> history_cost(300, 186.0, 3.5, 1.2)["mode"]
    'python'
    >>> history_cost(500, 16.0, 2.7, 0.6, off_us=0.0)["mode"]  # even the ring without stacks is 1.9%
    'off'
    """
    allocs = max(float(allocs_per_step), 0.0)
    stacks, sizes = float(stacks_us), float(sizes_us)
    floor = sizes if off_us is None else min(float(off_us), sizes)
    extra_us = max(stacks - sizes, 0.0)
    cost_ms = allocs * extra_us / 1e3
    sizes_ms = allocs * max(sizes - floor, 0.0) / 1e3
    step = float(step_ms)
    out = {"allocs_per_step": round(allocs, 1), "step_ms": round(step, 4), "stacks_us": round(stacks, 3),
           "sizes_us": round(sizes, 3), "off_us": None if off_us is None else round(float(off_us), 3),
           "cost_ms": round(cost_ms, 4), "sizes_cost_ms": round(sizes_ms, 4),
           "budget_pct": round(float(budget) * 100, 3)}
    if not step > 0:  # no step time (nothing timed): keep the stacks, the cost unknown
        return {**out, "mode": "python", "cost_pct": None, "sizes_cost_pct": None}
    base = step - cost_ms - sizes_ms  # the step with no history at all
    inf = float("inf")
    share = cost_ms / base if base > 0 else inf  # more than the step itself: the history is all of it
    sizes_share = sizes_ms / base if base > 0 else inf
    mode = ("python" if share + sizes_share <= float(budget) else
            "sizes" if off_us is None or sizes_share <= float(budget) else "off")
    return {**out, "mode": mode, "cost_pct": round(share * 100, 2) if share != inf else None,
            "sizes_cost_pct": None if off_us is None else (round(sizes_share * 100, 2) if sizes_share != inf
                                                            else None)}


def stacks_us_at(calibration: dict, depth: float) -> float:
    """The stacks' cost per allocation at ``depth`` Python frames, from the calibration's two depths
    (linear in the frames gathered; a slope the noise made negative counts as flat)."""
    (d0, d1), (u0, u1) = calibration["depths"], calibration["python_us"]
    slope = max((u1 - u0) / (d1 - d0), 0.0) if d1 != d0 else 0.0
    return max(u0 + slope * (float(depth) - d0), 0.0)


def py_depth(frame) -> int:
    """The number of Python frames from ``frame`` to the bottom of the stack."""
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def _at_depth(extra: int, fn, *args):
    """``fn(*args)`` called ``extra`` Python frames deeper than here."""
    if extra <= 0:
        return fn(*args)
    return _at_depth(extra - 1, fn, *args)


def _timed_pairs(empty, device: str, n: int) -> tuple[float, int]:
    """Microseconds per allocation-and-free of a small tensor, and the Python depth the allocations saw."""
    depth = py_depth(sys._getframe())
    for _ in range(64):  # untimed: the segment, the first stack gathered
        empty(64, device=device)
    t0 = time.perf_counter()
    for _ in range(n):
        empty(64, device=device)  # dropped at once: an allocation and its free
    return (time.perf_counter() - t0) / n * 1e6, depth


def calibrate_history(device: str = "cuda", *, pairs: int = _CAL_PAIRS, repeats: int = _CAL_REPEATS,
                      extra_depth: int = _CAL_EXTRA_DEPTH, off: bool = False) -> dict:
    """Time one allocation and its free (a 256-byte ``torch.empty`` on ``device``) with the allocator
    history recording Python stacks (at two Python depths), recording none ('sizes'), and, with
    ``off=True``, not recording. Each mode runs in its own small ring that wraps (so evicting old entries
    is timed too); the fastest of ``repeats`` runs is kept. The history is left off (its ring cleared).

    Returns ``{"depths": [d0, d1], "python_us": [at d0, at d1], "sizes_us": ..., "off_us": ... or None,
    "pairs": ..., "seconds": ...}``. CUDA only (raises where torch cannot record the history)."""
    import torch

    record = torch.cuda.memory._record_memory_history
    modes = [("python", 0), ("python", int(extra_depth)), ("sizes", 0)] + ([("off", 0)] if off else [])
    best: dict = {}
    depths: dict = {}
    t_start = time.perf_counter()
    try:
        for _ in range(int(repeats)):
            for mode, extra in modes:
                if mode == "off":
                    record(None)
                else:
                    record("all", context="all" if mode == "python" else None, stacks="python", max_entries=_CAL_RING)
                us, depth = _at_depth(extra, _timed_pairs, torch.empty, device, int(pairs))
                key = (mode, extra)
                best[key] = min(best.get(key, us), us)
                depths[key] = depth
    finally:
        record(None)  # off, and the calibration's ring cleared
    return {"depths": [depths[("python", 0)], depths[("python", int(extra_depth))]],
            "python_us": [round(best[("python", 0)], 4), round(best[("python", int(extra_depth))], 4)],
            "sizes_us": round(best[("sizes", 0)], 4), "off_us": round(best[("off", 0)], 4) if off else None,
            "pairs": int(pairs), "seconds": round(time.perf_counter() - t_start, 3)}


def cost_words(est: dict) -> str:
    """:func:`history_cost`'s estimate in words (the watch's log line and problem)."""
    pct = "more than the whole step" if est["cost_pct"] is None else f"{est['cost_pct']:.2f}% of a step"
    ring = "" if est.get("sizes_cost_pct") is None else (
        f", the ring without them {est['sizes_cost_pct']:.2f}% "
        f"({max(est['sizes_us'] - (est.get('off_us') or 0.0), 0):.2f} us each)")
    return (f"stacks would cost {pct} ({est['allocs_per_step']:.0f} allocations a step x "
            f"{max(est['stacks_us'] - est['sizes_us'], 0):.2f} us each{ring}, a step of {est['step_ms']:.2f} ms; "
            f"budget {est['budget_pct']:g}%)")

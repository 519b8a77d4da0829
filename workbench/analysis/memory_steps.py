"""Training steps in an allocator history: where they begin, which phase an event belongs to, and where
in the step an out-of-memory error fell ("forward of block 9 of 16") with what the whole step needs.

Step boundaries, best evidence first:

1. ``ProfilerStep#N`` ranges among the snapshot's ``external_annotations`` (``torch.profiler``'s
   ``prof.step()``, or ``record_function("ProfilerStep#N")``): a step starts at each START.
2. The optimizer's own ranges (``Optimizer.step#…`` / ``Optimizer.zero_grad#…``, recorded whenever
   history is): a step ends with the last of them, the next starts after it.
3. The allocation pattern: a step starts where allocations made in ``forward`` follow ones made in
   backward or in the optimizer (phases from the stacks, :func:`workbench.analysis.memory.stack_features`).

Blocks inside the forward are found without names: identical blocks allocate the same sequence of
(Python stack, size) pairs, so the forward's allocations since the step began are searched for the
shortest pattern that repeats back to back and runs up to the failing request. The number of blocks
in the model comes from the live parameters: the count that most of the parameter bytes' tensor
sizes are multiples of (16 blocks of a transformer have 16 (or 32) tensors of each weight size).
"""

from __future__ import annotations

import math

import numpy as np

from workbench.analysis.memory import _codes, device_events, stack_features
from workbench.io.snapshot import Action

__all__ = ["event_phases", "step_boundaries", "oom_position", "block_count_from_parameters"]

_OPT_ANNOTATION = ("Optimizer.step#", "Optimizer.zero_grad#")


def event_phases(snap, device: int) -> np.ndarray:
    """Per device event: ``forward``, ``backward``, ``optimizer`` or ``""`` (no telling frame)."""
    ev = device_events(snap, device)
    feats = stack_features(snap)
    sid = ev["stack_id"].to_numpy()
    out = np.full(len(ev), "", dtype=object)
    if not len(feats) or not len(ev):
        return out
    ok = sid >= 0
    s = np.where(ok, sid, 0)
    opt = feats["optimizer"].to_numpy()[s] | feats["zero_grad"].to_numpy()[s]
    bwd = feats["backward"].to_numpy()[s] | feats["accumulate_grad"].to_numpy()[s]
    fwd = feats["forward"].to_numpy()[s]
    out[ok & fwd] = "forward"
    out[ok & bwd] = "backward"
    out[ok & opt] = "optimizer"
    return out


def step_boundaries(snap, device: int, phases: np.ndarray | None = None) -> dict:
    """``{"method", "starts" (event indices), "names"}``; method ``annotations`` (ProfilerStep),
    ``optimizer_annotations``, ``allocation_pattern`` or None (one step, or no telling)."""
    ev = device_events(snap, device)
    n = len(ev)
    t = ev["time_us"].to_numpy()
    ann = getattr(snap, "annotations", None)
    if ann is not None and len(ann) and n:
        a = ann[ann["device"].to_numpy() == device] if "device" in ann else ann
        names = a["name"].astype(str)
        ps = a[(a["stage"].astype(str) == "START") & names.str.startswith("ProfilerStep#")]
        if len(ps):
            idx = np.searchsorted(t, ps["time_us"].to_numpy(), side="left")
            keep = idx < n
            starts, labels = [], []
            for i, nm in zip(idx[keep], ps["name"].to_numpy()[keep]):
                if not starts or int(i) > starts[-1]:
                    starts.append(int(i))
                    labels.append(str(nm))
            return {"method": "annotations", "starts": starts, "names": labels}
        opt = a[(a["stage"].astype(str) == "END") & names.str.startswith(_OPT_ANNOTATION)]
        if len(opt):
            ends = np.searchsorted(t, opt["time_us"].to_numpy(), side="right")
            # the END of the last optimizer range before the next forward: group ranges closer than
            # the next allocation in forward (step and zero_grad of one step follow each other)
            if phases is None:
                phases = event_phases(snap, device)
            fwd_idx = np.flatnonzero(phases == "forward")
            starts = [0]
            for e in np.unique(ends):
                nxt = fwd_idx[np.searchsorted(fwd_idx, e)] if np.searchsorted(fwd_idx, e) < len(fwd_idx) else None
                if nxt is not None and int(nxt) > starts[-1]:
                    starts.append(int(nxt))
            starts = sorted(set(starts))
            return {"method": "optimizer_annotations", "starts": starts,
                    "names": [f"step {i + 1}" for i in range(len(starts))]}
    if phases is None:
        phases = event_phases(snap, device)
    starts, seen_back = [], False
    codes = _codes(ev)
    for i in np.flatnonzero((phases != "") & ((codes == Action.ALLOC) | (codes == Action.OOM))):
        ph = phases[i]
        if ph == "forward" and (not starts or seen_back):
            starts.append(int(i))
            seen_back = False
        elif ph in ("backward", "optimizer"):
            seen_back = True
    if len(starts) <= 1:
        return {"method": None if not starts else "allocation_pattern", "starts": starts or [0],
                "names": ["step 1"]}
    return {"method": "allocation_pattern", "starts": starts, "names": [f"step {i + 1}" for i in range(len(starts))]}


def block_count_from_parameters(sizes) -> tuple[int | None, str]:
    """How many identical blocks the model has, from its parameters' tensor sizes: the largest count
    ``c >= 2`` such that the sizes whose number of tensors is a multiple of ``c`` hold at least 90% of
    the bytes that the best count explains. Returns (count or None, reason)."""
    sizes = np.asarray(list(sizes), dtype=np.int64)
    if len(sizes) < 4:
        return None, "too few parameter tensors to tell blocks apart"
    vals, counts = np.unique(sizes, return_counts=True)
    repeated = counts >= 2
    if not repeated.any():
        return None, "no parameter size repeats: no identical blocks"
    total = int((vals * counts).sum())
    cover = {}
    for c in range(2, int(counts.max()) + 1):
        m = counts % c == 0
        cover[c] = int((vals[m] * counts[m]).sum())
    best = max(cover.values())
    if best < 0.5 * total:
        return None, "the repeated parameter sizes hold less than half the parameter bytes"
    c = max(k for k, v in cover.items() if v >= 0.9 * best)
    return c, (f"{c} blocks: parameter tensor sizes holding {100 * cover[c] / total:.0f}% of the parameter "
               f"bytes occur a multiple of {c} times")


def _python_keys(snap) -> np.ndarray:
    """Per stack id, an id of its Python frames only (C++ frames differ with allocator internals)."""
    files = snap.frames["filename"].astype(str).to_numpy() if len(snap.frames) else np.empty(0, object)
    py = np.array([f.endswith(".py") for f in files], dtype=bool)
    ids: dict[tuple, int] = {}
    out = np.empty(len(snap.stacks), dtype=np.int64)
    for sid, st in enumerate(snap.stacks):
        key = tuple(f for f in st if py[f])
        out[sid] = ids.setdefault(key, len(ids))
    return out


def _find_blocks(keys: np.ndarray, max_offset: int = 256) -> tuple[int, int, int] | None:
    """(offset, period, full copies) of the shortest pattern that repeats back to back from ``offset``
    and whose copies (the last one possibly partial) run to the end of ``keys``; None if none does."""
    n = len(keys)
    best = None
    for p in range(2, n // 2 + 1):
        for o in range(0, min(max_offset, n - 2 * p) + 1):
            if not np.array_equal(keys[o:o + p], keys[o + p:o + 2 * p]):
                continue
            k = 2
            while o + (k + 1) * p <= n and np.array_equal(keys[o:o + p], keys[o + k * p:o + (k + 1) * p]):
                k += 1
            rest = keys[o + k * p:]
            if not np.array_equal(rest, keys[o:o + len(rest)]):
                continue  # the copies do not reach the failing request
            score = k * p
            if best is None or score > best[3]:
                best = (o, p, k, score)
            break  # the smallest offset for this period
        if best is not None and best[1] < p and best[3] >= n - best[0] - p:
            break  # a longer period cannot cover more
    if best is None:
        return None
    o, p, k, _ = best
    # the first block can differ a little (e.g. the first matmul takes the cuBLAS workspace): a stretch
    # before the offset that matches at least half the pattern, aligned at its end, is a block too
    while o > 0:
        lo = max(0, o - p)
        seg = keys[lo:o]
        pat = keys[o + p - len(seg):o + p] if len(seg) < p else keys[o:o + p]
        if len(seg) >= p // 2 and (seg == pat).mean() >= 0.5:
            o, k = lo, k + 1
        else:
            break
    return o, p, k


def oom_position(snap, analysis, index: int, phases: np.ndarray | None = None) -> dict:
    """Where the OOM at device event ``index`` fell: phase, step, block (``layer``) and what the
    forward would need in full, from the live forward allocations so far.

    Keys: ``phase``, ``step`` (1-based within the recording), ``steps_method``, ``layer``, ``layers``,
    ``layers_reason``, ``block_frame`` (the user frame that calls the blocks), ``prefix_bytes`` (live
    forward allocations before the first block), ``block_bytes`` (live bytes one full block keeps;
    a lower bound from the partial first block when none is complete), ``block_bytes_is_lower_bound``,
    ``forward_so_far_bytes``, ``forward_total_bytes`` (prefix + layers x block), ``confidence``, ``reason``,
    ``text``.
    """
    device = analysis.device
    if phases is None:
        phases = event_phases(snap, device)
    steps = step_boundaries(snap, device, phases)
    starts = steps["starts"]
    step_i = int(np.searchsorted(np.asarray(starts), index, side="right")) if starts else 1
    start = starts[step_i - 1] if starts and step_i >= 1 else 0
    ev = device_events(snap, device)
    phase = phases[index] if index < len(phases) else ""
    if not phase:  # the failing request's own stack says nothing: the last allocation before it
        prior = np.flatnonzero(phases[:index] != "")
        phase = phases[prior[-1]] if len(prior) else ""
    out = {"phase": phase or None, "step": step_i, "steps_method": steps["method"], "layer": None, "layers": None,
           "layers_reason": None, "block_frame": None, "prefix_bytes": None, "block_bytes": None,
           "block_bytes_is_lower_bound": None, "forward_so_far_bytes": None, "forward_total_bytes": None,
           "confidence": 0.0, "reason": "", "text": ""}
    allocs = analysis.allocs
    live_params = allocs[(allocs["category"].astype(str) == "parameters") & (allocs["alloc_index"] <= index)
                         & (allocs["free_index"] > index)]
    n_layers, why = block_count_from_parameters(live_params["size_bytes"].to_numpy())
    out["layers"], out["layers_reason"] = n_layers, why
    if phase != "forward":
        out["text"] = f"{phase or 'unknown phase'} of step {step_i}"
        out["reason"] = "block position is worked out for an OOM in the forward only"
        return out
    a = allocs[(allocs["alloc_index"] >= start) & (allocs["alloc_index"] < index)]
    a = a[phases[a["alloc_index"].to_numpy()] == "forward"].sort_values("alloc_index")
    pk = _python_keys(snap)
    sid = a["alloc_stack_id"].to_numpy()
    req_sid = int(ev["stack_id"].iloc[index])
    req_size = int(ev["size_bytes"].iloc[index])
    sig = np.r_[np.where(sid >= 0, pk[np.maximum(sid, 0)], -1), pk[req_sid] if req_sid >= 0 else -1]
    sizes = np.r_[a["size_bytes"].to_numpy(), (req_size + 511) // 512 * 512]
    _, keys = np.unique(np.stack([sig, sizes], axis=1), axis=0, return_inverse=True)
    keys = keys.ravel()
    live = (a["free_index"].to_numpy() > index)
    live_bytes = np.r_[np.where(live, a["size_bytes"].to_numpy(), 0), req_size]
    found = _find_blocks(keys[-20000:]) if len(keys) >= 4 else None
    off = max(0, len(keys) - 20000)
    out["forward_so_far_bytes"] = int(live_bytes.sum())
    if found is not None:
        o, p, k = found
        o += off
        full = [live_bytes[o + j * p:o + (j + 1) * p].sum() for j in range(k) if o + (j + 1) * p <= len(keys) - 1]
        layer = int((len(keys) - 1 - o) // p) + 1  # the failing request's block
        block = float(np.median(full)) if full else float(live_bytes[o:].sum())
        out.update(layer=layer, prefix_bytes=int(live_bytes[:o].sum()), block_bytes=int(block),
                   block_bytes_is_lower_bound=not full)
        out["confidence"] = 0.8 if len(full) >= 2 else 0.6
        out["reason"] = (f"the forward's allocations repeat a {p}-allocation pattern {k} times back to back up to "
                         f"the failing request")
        # the frame that calls the blocks: the innermost user frame shared by one block's stacks
        out["block_frame"] = _caller_frame(snap, a["alloc_stack_id"].to_numpy()[o - off:o - off + p] if o >= off else [])
    else:
        out.update(layer=1, prefix_bytes=0, block_bytes=int(live_bytes.sum()), block_bytes_is_lower_bound=True)
        out["confidence"] = 0.4
        out["reason"] = ("no allocation pattern has repeated in this forward yet: the OOM is in its first block "
                         "(if the model is made of identical blocks); the block's size is at least what it "
                         "allocated so far")
        out["block_frame"] = _caller_frame(snap, a["alloc_stack_id"].to_numpy())
    if n_layers is not None and out["layer"] is not None:
        if out["layer"] > n_layers:  # the pattern is finer than a block (or the count is wrong)
            out["confidence"] = min(out["confidence"], 0.3)
        out["forward_total_bytes"] = int(out["prefix_bytes"] + n_layers * out["block_bytes"])
        out["text"] = f"forward of block {out['layer']} of {n_layers}, step {step_i}"
    else:
        out["text"] = f"forward of block {out['layer']}, step {step_i}"
    return out


def _caller_frame(snap, stack_ids) -> str | None:
    from workbench.analysis.memory import _INTERNAL

    files = snap.frames["filename"].astype(str).to_numpy()
    names = snap.frames["name"].astype(str).to_numpy()
    lines = snap.frames["line"].to_numpy()
    chains = []
    for s in stack_ids:
        if s < 0:
            continue
        user = [f for f in snap.stacks[int(s)] if files[f].endswith(".py") and not _INTERNAL.search(files[f])]
        chains.append(list(reversed(user)))  # outermost first
    if not chains:
        return None
    common = chains[0]
    for c in chains[1:]:
        m = 0
        while m < min(len(common), len(c)) and common[m] == c[m]:
            m += 1
        common = common[:m]
    if not common:
        return None
    f = common[-1]
    return f"{files[f]}:{lines[f]} {names[f]}"


def batch_fraction_that_fits(budget_bytes: int, static_bytes: int, activation_bytes: int) -> float | None:
    """The fraction of the current batch whose activations fit next to ``static_bytes`` in the budget
    (activations scale with the batch); None when nothing is known about activations."""
    if activation_bytes <= 0:
        return None
    return max(0.0, (budget_bytes - static_bytes) / activation_bytes)


def largest_batch(batch_size: int | None, fraction: float | None) -> int | None:
    if batch_size is None or fraction is None:
        return None
    return int(math.floor(batch_size * fraction + 1e-9))

"""Training steps in an allocator history: where they begin, which phase an event belongs to, and where
in the step an out-of-memory error fell ("forward of block 9 of 16") with what the whole step needs.

Step boundaries, best evidence first:

1. ``ProfilerStep#N`` ranges among the snapshot's ``external_annotations`` (``torch.profiler``'s
   ``prof.step()``, or ``record_function("ProfilerStep#N")``): a step starts at each START.
2. The optimizer's own ranges (``Optimizer.step#…`` / ``Optimizer.zero_grad#…``, recorded whenever
   history is): a step ends with the last of them, the next starts after it.
3. The allocation pattern: a step starts where allocations made in ``forward`` follow ones made in
   backward or in the optimizer (phases from the stacks, :func:`workbench.analysis.memory.allocations.stack_features`).

Blocks inside the forward are found without names: identical blocks allocate the same sequence of
(Python stack, size) pairs, so the forward's allocations since the step began are searched for the
shortest pattern that repeats back to back and runs up to the failing request. The number of blocks
in the model comes from the live parameters: the count that most of the parameter bytes' tensor
sizes are multiples of (16 blocks of a transformer have 16 (or 32) tensors of each weight size).
"""

from __future__ import annotations


import numpy as np

from workbench.analysis.memory.allocations import _codes, device_events, stack_features
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
                # a range ends a step only when a forward ran since the current step began: a
                # zero_grad before the first forward (a fresh run) is no step of its own
                if not ((fwd_idx >= starts[-1]) & (fwd_idx < e)).any():
                    continue
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


def _block_candidates(keys: np.ndarray, max_offset: int = 256, min_tail: int = 3) -> list[tuple[int, int, int]]:
    """Candidate (offset, period, full copies) for the forward's blocks, best first: patterns that repeat
    back to back from ``offset`` with their copies (the last possibly partial) running to the end of
    ``keys`` (the failing request), by the allocations they cover, then the shortest period; after
    them, one full copy followed by a partial one of at least ``min_tail`` allocations (an OOM early in
    block 2)."""
    n = len(keys)
    twice = []
    for p in range(2, n // 2 + 1):
        for o in range(0, min(max_offset, n - 2 * p) + 1):
            if not np.array_equal(keys[o:o + p], keys[o + p:o + 2 * p]):
                continue
            k = 2
            while o + (k + 1) * p <= n and np.array_equal(keys[o:o + p], keys[o + k * p:o + (k + 1) * p]):
                k += 1
            rest = keys[o + k * p:]
            if np.array_equal(rest, keys[o:o + len(rest)]):
                twice.append((o, p, k, k * p))
                break  # the smallest offset for this period
    twice.sort(key=lambda c: (-c[3], c[1]))
    once = []
    if n <= 4000:
        for p in range(2, n):
            for o in range(0, min(max_offset, n - p - min_tail) + 1):
                t = n - o - p
                if min_tail <= t < p and np.array_equal(keys[o + p:], keys[o:o + t]):
                    once.append((o, p, 1))
                    break
    return [c[:3] for c in twice] + once


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
    # the tensors' own sizes (a block handed out whole can be larger than its tensor)
    psize = live_params["requested_bytes"].to_numpy() if "requested_bytes" in live_params else live_params["size_bytes"].to_numpy()
    n_layers, why = block_count_from_parameters((psize + 511) // 512 * 512)
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
    off = max(0, len(keys) - 20000)
    cands = _block_candidates(keys[off:]) if len(keys) >= 4 else []
    out["forward_so_far_bytes"] = int(live_bytes.sum())
    sids = np.r_[sid, req_sid]
    found = None
    for o, p, k in cands[:50]:
        o += off
        # The pattern's phase is ambiguous (any rotation repeats too) and the first block can differ a
        # little (its first matmul takes the cuBLAS workspace). Anchor it: the frame that calls the
        # blocks (innermost user frame shared by one copy's stacks) is in every block allocation and in
        # no allocation before the first block; the first such allocation starts block 1, and each later
        # block starts with the same (stack, size) key, a whole period after the one before.
        caller = _caller_frame_id(snap, sids[o:o + p])
        with_caller = [i for i, st in enumerate(sids) if st >= 0 and caller is not None
                       and caller in snap.stacks[int(st)]]
        anchor = with_caller[0] if with_caller else o
        start_key = keys[anchor]
        starts = [i for i in range(o, len(keys)) if keys[i] == start_key]
        if not starts or starts[0] - anchor > p + p // 2:
            continue  # the copies must begin by the second block: a repeat inside a block is not one
        found = (o, p, k, caller, anchor, starts)
        break
    if found is not None:
        o, p, k, caller, anchor, starts = found
        s_first = starts[0]
        q = max(i for i in starts if (i - s_first) % p == 0)
        before = 1 if anchor < s_first else 0  # block 1 lies before the exact copies
        layer = (q - s_first) // p + 1 + before
        full = [live_bytes[s_first + j * p:s_first + (j + 1) * p].sum() for j in range((q - s_first) // p)]
        if before:
            full.append(live_bytes[anchor:s_first].sum())
        block = float(np.median(full)) if full else float(live_bytes[q:].sum())
        out.update(layer=int(layer), prefix_bytes=int(live_bytes[:anchor].sum()), block_bytes=int(block),
                   block_bytes_is_lower_bound=not full)
        out["confidence"] = 0.8 if k >= 2 and len(full) >= 2 else 0.5
        out["reason"] = (f"the forward's allocations repeat a {p}-allocation pattern back to back up to the failing "
                         f"request; blocks counted from the first allocation under the frame that calls them")
        out["block_frame"] = _frame_text(snap, caller)
    else:
        out.update(layer=1, prefix_bytes=0, block_bytes=int(live_bytes.sum()), block_bytes_is_lower_bound=True)
        out["confidence"] = 0.4
        out["reason"] = ("no allocation pattern has repeated in this forward yet: the OOM is in its first block "
                         "(if the model is made of identical blocks); the block is taken as what it holds so far")
        out["block_frame"] = _frame_text(snap, _caller_frame_id(snap, sids))
    if n_layers is not None and out["layer"] is not None:
        if out["layer"] > n_layers:  # the pattern is finer than a block (or the count is wrong)
            out["confidence"] = min(out["confidence"], 0.3)
        out["forward_total_bytes"] = int(out["prefix_bytes"] + n_layers * out["block_bytes"])
        out["text"] = f"forward of block {out['layer']} of {n_layers}, step {step_i}"
    else:
        out["text"] = f"forward of block {out['layer']}, step {step_i}"
    return out


def _caller_frame_id(snap, stack_ids) -> int | None:
    """The innermost user (non-torch, non-stdlib) Python frame common to all these stacks."""
    from workbench.analysis.memory.allocations import _INTERNAL

    files = snap.frames["filename"].astype(str).to_numpy()
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
    return int(common[-1]) if common else None


def _frame_text(snap, fid: int | None) -> str | None:
    if fid is None:
        return None
    fr = snap.frames.iloc[fid]
    return f"{fr['filename']}:{fr['line']} {fr['name']}"

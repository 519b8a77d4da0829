"""Allocator snapshots -> timelines, lifetimes, stacks and categories (numpy/pandas only).

Everything starts from a :class:`workbench.io.snapshot.MemorySnapshot` (columns, interned stacks).
The trace is a ring buffer, so the first recorded event is rarely the program's first: the state at
the start of the window is reconstructed backwards from the state at snapshot time (segments and
blocks) minus the recorded deltas. Event *indices* (row positions within one device's events) are the
clock; ``time_us`` goes with each index.

Definitions used throughout (docs/memory.md repeats them):

- allocated bytes: blocks handed to tensors, from ``alloc`` until ``free_completed``.
- reserved bytes: segments obtained from CUDA (``segment_alloc``/``segment_map`` until
  ``segment_free``/``segment_unmap``).

The segments themselves at any moment (blocks, holes, fragmentation) are in ``segments.py``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from workbench.io.snapshot import Action

__all__ = [
    # lifetimes and timelines
    "device_events",
    "allocations",
    "memory_timeline",
    "category_timeline",
    "peak_memory",
    "live_allocations",
    "group_live",
    "surviving_allocations",
    # stacks
    "user_frame_labels",
    "stack_features",
    # categories
    "CATEGORIES",
    "allocation_categories",
    "profiler_category_peak",
]

CATEGORIES = ("parameters", "optimizer_state", "gradients", "activations", "temporaries", "unknown")


# --------------------------------------------------------------------------------------------------
# events of one device
# --------------------------------------------------------------------------------------------------

def _default_device(snap) -> int:
    ev = snap.events
    if len(ev):
        oom = ev.index[ev["action"].cat.codes.to_numpy() == Action.OOM]
        if len(oom):
            return int(ev["device"].iloc[oom[-1]])
        return int(ev["device"].value_counts().idxmax())
    if len(snap.segments):
        return int(snap.segments["device"].value_counts().idxmax())
    return 0


def device_events(snap, device: int | None = None) -> pd.DataFrame:
    """The events of one device (default: the device of the OOM, else the one with most events),
    re-indexed 0..n-1 with an ``index`` that is the clock of every other function here."""
    device = _default_device(snap) if device is None else device
    ev = snap.events
    if ev["device"].nunique() > 1:
        ev = ev[ev["device"].to_numpy() == device]
    return ev.reset_index(drop=True)


def _codes(ev: pd.DataFrame) -> np.ndarray:
    return ev["action"].cat.codes.to_numpy()


def _end_segments(snap, device):
    seg = snap.segments
    return seg[seg["device"].to_numpy() == device] if len(seg) else seg


def _pair(idx_open, addr_open, idx_close, addr_close, n):
    """Pair each opening event with the next closing event of the same address.

    Returns (open_idx, close_idx) arrays over all intervals: opens never closed get close = n; closes
    never opened (the thing existed before the window) get open = -1.
    """
    idx = np.concatenate([idx_open, idx_close])
    addr = np.concatenate([addr_open, addr_close])
    kind = np.concatenate([np.zeros(len(idx_open), np.int8), np.ones(len(idx_close), np.int8)])
    order = np.lexsort((idx, addr))
    idx, addr, kind = idx[order], addr[order], kind[order]
    m = len(idx)
    nxt_same = np.zeros(m, dtype=bool)
    if m > 1:
        nxt_same[:-1] = (addr[1:] == addr[:-1]) & (kind[1:] == 1)
    is_open = kind == 0
    paired_open = is_open & nxt_same
    opens = idx[is_open]
    closes = np.full(len(opens), n, dtype=np.int64)
    closes[paired_open[is_open]] = idx[np.flatnonzero(paired_open) + 1]
    # closes whose previous row is not an open of the same address
    prev_open_same = np.zeros(m, dtype=bool)
    if m > 1:
        prev_open_same[1:] = (addr[1:] == addr[:-1]) & (kind[:-1] == 0)
    orphan = (kind == 1) & ~prev_open_same
    return opens, closes, idx[orphan], addr[orphan], order


def allocations(snap, device: int | None = None) -> pd.DataFrame:
    """One row per allocation seen in the window (or live across all of it).

    Columns: ``addr``, ``size_bytes``, ``alloc_index`` (-1: allocated before the window),
    ``free_requested_index``/``free_index`` (n = still live at snapshot time), ``alloc_stack_id``,
    ``free_stack_id`` (the stack that dropped the tensor; -1 when unknown), ``preexisting`` (bool).
    Pre-existing allocations come from frees without an alloc in the window and from blocks active at
    snapshot time that the window never allocated.
    """
    device = _default_device(snap) if device is None else device
    ev = device_events(snap, device)
    n = len(ev)
    codes = _codes(ev)
    addr = ev["addr"].to_numpy()
    size = ev["size_bytes"].to_numpy()
    stack = ev["stack_id"].to_numpy()
    ia = np.flatnonzero(codes == Action.ALLOC)
    ic = np.flatnonzero(codes == Action.FREE_COMPLETED)
    opens, closes, orphan_idx, orphan_addr, _ = _pair(ia, addr[ia], ic, addr[ic], n)
    ir = np.flatnonzero(codes == Action.FREE_REQUESTED)
    r_opens, r_closes, _, _, _ = _pair(ia, addr[ia], ir, addr[ir], n)
    # r_opens is the same set as opens, both sorted by (addr, idx); re-sort both by open index
    o1 = np.argsort(opens, kind="stable")
    o2 = np.argsort(r_opens, kind="stable")
    opens, closes = opens[o1], closes[o1]
    req = r_closes[o2]
    # a free_requested after the free_completed pairing is impossible; clamp to the completed free
    req = np.minimum(req, closes)
    free_stack = np.where(req < n, stack[np.minimum(req, n - 1)] if n else -1, -1)
    free_stack = np.where((free_stack < 0) & (closes < n), stack[np.minimum(closes, n - 1)] if n else -1,
                          free_stack)
    frame = pd.DataFrame(
        {
            "addr": addr[opens],
            "size_bytes": size[opens],
            "alloc_index": opens.astype(np.int64),
            "free_requested_index": req.astype(np.int64),
            "free_index": closes.astype(np.int64),
            "alloc_stack_id": stack[opens].astype(np.int32),
            "free_stack_id": free_stack.astype(np.int32),
            "preexisting": np.zeros(len(opens), dtype=bool),
        }
    )
    parts = [frame]
    if len(orphan_idx):  # freed in the window, allocated before it
        # the matching free_requested (if recorded) precedes the free_completed: take the nearest one
        rq_before = np.full(len(orphan_idx), -1, dtype=np.int64)
        if len(ir):
            o = np.lexsort((ir, addr[ir]))
            ra, ri = addr[ir][o], ir[o]
            pos = np.searchsorted(ra, orphan_addr, side="left")
            for k, (p, a, ci) in enumerate(zip(pos, orphan_addr, orphan_idx)):
                # last free_requested of this addr before ci
                hi = np.searchsorted(ra, a, side="right")
                cand = ri[p:hi]
                cand = cand[cand < ci]
                if len(cand):
                    rq_before[k] = cand[-1]
        fs = np.where(rq_before >= 0, stack[np.maximum(rq_before, 0)], stack[orphan_idx])
        parts.append(pd.DataFrame({
            "addr": orphan_addr,
            "size_bytes": size[orphan_idx],
            "alloc_index": np.full(len(orphan_idx), -1, np.int64),
            "free_requested_index": np.where(rq_before >= 0, rq_before, orphan_idx).astype(np.int64),
            "free_index": orphan_idx.astype(np.int64),
            "alloc_stack_id": np.full(len(orphan_idx), -1, np.int32),
            "free_stack_id": fs.astype(np.int32),
            "preexisting": np.ones(len(orphan_idx), dtype=bool),
        }))
    blk = snap.blocks
    if len(blk):
        blk = blk[(blk["device"].to_numpy() == device) & (blk["state"].to_numpy() == "active_allocated")]
        if len(blk):
            allocated_in_window = np.isin(blk["address"].to_numpy(), addr[ia])
            blk = blk[~allocated_in_window]
            if len(blk):
                parts.append(pd.DataFrame({
                    "addr": blk["address"].to_numpy(),
                    "size_bytes": blk["size_bytes"].to_numpy(),
                    "alloc_index": np.full(len(blk), -1, np.int64),
                    "free_requested_index": np.full(len(blk), n, np.int64),
                    "free_index": np.full(len(blk), n, np.int64),
                    "alloc_stack_id": blk["stack_id"].to_numpy().astype(np.int32),
                    "free_stack_id": np.full(len(blk), -1, np.int32),
                    "preexisting": np.ones(len(blk), dtype=bool),
                    "_requested": blk["requested_size_bytes"].to_numpy(),
                }))
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else frame
    # Trace sizes are the rounded request; when the allocator hands out a whole block because the
    # remainder was too small to split, the block is larger. Blocks live at snapshot time give the
    # true block size (what torch's allocated_bytes counts); earlier ones keep the trace size.
    # Trace sizes are the bytes requested; the allocator rounds every block up to a multiple of 512 B.
    req_b = out["size_bytes"].to_numpy()
    out["requested_bytes"] = req_b
    if snap.extra.get("block_rounding", True):  # not for torch.profiler's memory events (exact sizes)
        out["size_bytes"] = np.maximum(512, (req_b + 511) // 512 * 512)
    if "_requested" in out:  # blocks live at snapshot time that predate the window: torch's requested size
        r = out.pop("_requested").to_numpy()
        ok = ~np.isnan(r.astype(np.float64)) & (np.nan_to_num(r.astype(np.float64)) > 0)
        out.loc[ok, "requested_bytes"] = r[ok].astype(np.int64)
    blk_all = snap.blocks
    if len(blk_all):
        act = blk_all[(blk_all["device"].to_numpy() == device)
                      & (blk_all["state"].to_numpy() == "active_allocated")]
        if len(act):
            live_end = np.flatnonzero((out["free_index"].to_numpy() >= n) & (out["alloc_index"].to_numpy() >= 0))
            bsize = pd.Series(act["size_bytes"].to_numpy(), index=act["address"].to_numpy())
            bsize = bsize[~bsize.index.duplicated()]
            got = bsize.reindex(out["addr"].to_numpy()[live_end]).to_numpy()
            ok = ~np.isnan(got)
            sizes = out["size_bytes"].to_numpy().copy()
            sizes[live_end[ok]] = got[ok].astype(np.int64)
            out["size_bytes"] = sizes
    ta = snap.extra.get("total_allocated_bytes")  # torch.profiler: the running total is known exactly
    if ta is not None and len(ta) == n and n:
        first = int(size[0]) if codes[0] == Action.ALLOC else -int(size[0])
        hidden = int(ta[0]) - first - int(out.loc[out["alloc_index"] < 0, "size_bytes"].sum())
        if hidden > 0:  # allocated before profiling and never freed in it: one unattributed row
            out = pd.concat([out, pd.DataFrame({
                "addr": [-1], "size_bytes": [hidden], "alloc_index": [-1], "free_requested_index": [n],
                "free_index": [n], "alloc_stack_id": np.array([-1], np.int32),
                "free_stack_id": np.array([-1], np.int32), "preexisting": [True], "requested_bytes": [hidden]})],
                ignore_index=True)
    out.attrs["n_events"] = n
    out.attrs["device"] = device
    return out


def memory_timeline(snap, device: int | None = None, allocs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Allocated and reserved bytes after every event: columns ``index``, ``time_us``, ``action``,
    ``allocated_bytes``, ``reserved_bytes``. ``attrs['start_allocated_bytes']`` holds the state
    before the first event. Allocated bytes come from the allocation lifetimes (:func:`allocations`),
    so they end exactly at the snapshot's allocated size."""
    if allocs is None:
        allocs = allocations(snap, device)
    device = allocs.attrs.get("device", _default_device(snap))
    ev = device_events(snap, device)
    n = len(ev)
    base_a = int(allocs["size_bytes"].to_numpy()[allocs["alloc_index"].to_numpy() < 0].sum())
    d_alloc = np.zeros(n + 1, dtype=np.int64)
    a = allocs["alloc_index"].to_numpy()
    f = allocs["free_index"].to_numpy()
    size = allocs["size_bytes"].to_numpy()
    np.add.at(d_alloc, a[a >= 0], size[a >= 0])
    np.add.at(d_alloc, f[f < n], -size[f < n])
    codes = _codes(ev)
    esize = ev["size_bytes"].to_numpy()
    d_res = (np.where((codes == Action.SEGMENT_ALLOC) | (codes == Action.SEGMENT_MAP), esize, 0)
             - np.where((codes == Action.SEGMENT_FREE) | (codes == Action.SEGMENT_UNMAP), esize, 0))
    seg = _end_segments(snap, device)
    end_res = int(seg["total_size_bytes"].sum()) if len(seg) else int(d_res.sum())
    base_r = end_res - int(d_res.sum())
    res = snap.extra.get("reserved_bytes")  # torch.profiler reports the reserved total with each event
    if res is not None and len(res) == n:
        base_r, d_res = int(res[0]) if n else 0, np.diff(np.r_[res[:1], res])
    out = pd.DataFrame(
        {
            "index": np.arange(n, dtype=np.int64),
            "time_us": ev["time_us"].to_numpy(),
            "action": ev["action"],
            "allocated_bytes": base_a + np.cumsum(d_alloc[:n]),
            "reserved_bytes": base_r + np.cumsum(d_res),
        }
    )
    out.attrs.update(start_allocated_bytes=base_a, start_reserved_bytes=base_r, device=device)
    return out


def peak_memory(timeline: pd.DataFrame) -> dict:
    """Index, time and bytes of the allocated peak (the first time it is reached)."""
    if not len(timeline):
        a = int(timeline.attrs.get("start_allocated_bytes", 0))
        return {"index": -1, "time_us": None, "allocated_bytes": a, "reserved_bytes":
                int(timeline.attrs.get("start_reserved_bytes", 0))}
    alloc = timeline["allocated_bytes"].to_numpy()
    k = int(np.argmax(alloc))
    start = int(timeline.attrs.get("start_allocated_bytes", 0))
    if start > alloc[k]:
        k = -1
    row = timeline.iloc[max(k, 0)]
    return {
        "index": k,
        "time_us": int(row["time_us"]),
        "allocated_bytes": int(alloc[k]) if k >= 0 else start,
        "reserved_bytes": int(row["reserved_bytes"]),
    }


def live_allocations(allocs: pd.DataFrame, index: int) -> pd.DataFrame:
    """Allocations live just after event ``index`` (-1: before the first event), largest first."""
    a = allocs["alloc_index"].to_numpy()
    f = allocs["free_index"].to_numpy()
    live = allocs[(a <= index) & (f > index)]
    return live.sort_values("size_bytes", ascending=False, kind="stable")


# --------------------------------------------------------------------------------------------------
# stacks
# --------------------------------------------------------------------------------------------------

_INTERNAL = re.compile(
    r"(^|/)(torch|torchvision|torchaudio|functorch|triton)/|<frozen |/lib/python3\.\d+/[^/]+\.py$|"
    r"(^|/)(contextlib|functools|threading|runpy|_contextlib)\.py$"
)


_CPP_PLUMBING = re.compile(
    r"^(torch::unwind|torch::CapturedTraceback|torch::cuda::\(anonymous|c10::|at::detail::|at::_ops::|at::meta::|"
    r"torch::autograd::VariableType::|"
    r"at::empty|at::\(anonymous|at::native::empty|at::TensorIteratorBase|_PyEval|PyObject_|_PyObject|Py[A-Z]|"
    r"_Py|__libc|_start$)"
)


# the backward node a C++-only (autograd thread) allocation ran in: the user's op, as torch names it
_AUTOGRAD_NODE = re.compile(r"^torch::autograd::generated::(\w+)::apply\(")


def _is_python(fn: str) -> bool:
    # files, notebook cells and exec'd strings; not the '<cpu_op>'-style pseudo files of profiler stacks
    return fn.endswith(".py") or fn.startswith("<ipython-input") or fn in ("<string>", "<stdin>")


_MODULE_PREFIX = "module: "  # the profiler range workbench.capture.modules.module_scopes opens per submodule


def user_frame_labels(snap) -> dict:
    """Per stack id: ``frame`` (the user's ``file:line function``: the innermost Python frame outside
    torch and the standard library, else the innermost Python frame; for a C++-only stack, e.g. autograd's
    worker thread, the backward node it ran in (``torch::autograd::generated::AddmmBackward0::apply``),
    else the first frame past the allocator, dispatcher and shape-function (``at::meta::``) plumbing; a
    C++ frame without source (``??:0``) is labelled by its name only) and
    ``function`` (``file:function``, the module/function grouping), and ``module``: the ``nn.Module``
    path (``blocks.3.mlp``) whose forward was running, from the ``module: <path>`` profiler ranges that
    :func:`workbench.capture.modules.module_scopes` opens (profiler memory snapshots), else
    ``(no module)``. Keys -1 map to '(no stack)'."""
    names = snap.frames["name"].to_numpy()
    files = snap.frames["filename"].to_numpy()
    lines = snap.frames["line"].to_numpy()
    internal = np.array([bool(_INTERNAL.search(str(f))) for f in files], dtype=bool)
    plumbing = np.array([bool(_CPP_PLUMBING.search(str(nm))) for nm in names], dtype=bool)
    python = np.array([_is_python(str(f)) for f in files], dtype=bool)
    node = np.array([bool(_AUTOGRAD_NODE.search(str(nm))) for nm in names], dtype=bool)
    module_names = [str(nm)[len(_MODULE_PREFIX):] if str(nm).startswith(_MODULE_PREFIX) and
                    str(fl) == "<user_annotation>" else None for nm, fl in zip(names, files)]
    module_lbl = []
    for st in snap.stacks:  # the innermost module range open at the allocation (capture.modules)
        module_lbl.append(next((module_names[f] for f in st if module_names[f] is not None), "(no module)"))
    frame_lbl, func_lbl = [], []
    for st in snap.stacks:
        pick = None
        for fid in st:
            if python[fid] and not internal[fid]:
                pick = fid
                break
        if pick is None:
            for fid in st:
                if python[fid]:
                    pick = fid
                    break
        if pick is None:  # C++ only (autograd's thread): the backward node it ran in, e.g. AddmmBackward0
            for fid in st:
                if node[fid]:
                    pick = fid
                    break
        if pick is None:
            for fid in st:  # else the first frame past the allocator, dispatcher and shape-function plumbing
                if not plumbing[fid]:
                    pick = fid
                    break
        if pick is None and st:
            pick = st[0]
        if pick is None:
            frame_lbl.append("(no stack)")
            func_lbl.append("(no stack)")
        else:
            nm = str(names[pick])
            nm = nm if len(nm) <= 80 else nm[:77] + "..."
            fn = str(files[pick])
            if node[pick]:
                nm = _AUTOGRAD_NODE.search(str(names[pick])).group(1) + " (autograd backward)"
                frame_lbl.append(nm)
                func_lbl.append(nm)
                continue
            if fn in ("??", "") and not lines[pick]:  # a C++ frame without source: its name says it
                frame_lbl.append(nm)
            else:
                frame_lbl.append(f"{nm} {fn}" if fn.startswith("<") and not lines[pick] else f"{fn}:{lines[pick]} {nm}")
            func_lbl.append(f"{files[pick]}:{nm}")
    return {"frame": frame_lbl, "function": func_lbl, "module": module_lbl}


_FEATURES = {
    # feature: (name regex, filename regex); a frame matches when both match (None = any)
    "optimizer": (None, r"(?:^|/)torch/optim/"),
    "optimizer_init": (r"^(?:_init_group|_init_state|__init__)$", r"(?:^|/)torch/optim/"),
    "zero_grad": (r"^zero_grad$", None),
    "accumulate_grad": (r"AccumulateGrad|accumulate_grad|accumulateGrad", None),
    "backward": (r"^(?:backward|_engine_run_backward|run_backward)$|autograd::Engine|autograd::generated::|"
                 r"evaluate_function|call_function\(", None),
    "forward": (r"^(?:forward|_call_impl|_wrapped_call_impl)$", None),
    "param_init": (r"^(?:_apply|cuda|to|__init__|reset_parameters|_load_from_state_dict|load_state_dict|"
                   r"to_empty|register_parameter|_replicate_for_data_parallel)$",
                   r"(?:^|/)torch/nn/(?:modules/|parameter\.py)"),
    "checkpoint": (r"^(?:checkpoint|_checkpoint_without_reentrant_generator|recompute_fn|unpack_hook)$",
                   r"(?:^|/)torch/utils/checkpoint\.py"),
}


def stack_features(snap) -> pd.DataFrame:
    """Boolean features per stack id (rows) from its frames: optimizer, optimizer_init, zero_grad,
    accumulate_grad, backward, forward, param_init, checkpoint."""
    names = snap.frames["name"].astype(str)
    files = snap.frames["filename"].astype(str)
    fr = {}
    for feat, (nre, fre) in _FEATURES.items():
        m = np.ones(len(names), dtype=bool)
        if nre:
            m &= names.str.contains(nre, regex=True).to_numpy()
        if fre:
            m &= files.str.contains(fre, regex=True).to_numpy()
        fr[feat] = m
    out = {feat: np.zeros(len(snap.stacks), dtype=bool) for feat in _FEATURES}
    for sid, st in enumerate(snap.stacks):
        ids = np.fromiter(st, dtype=np.int64, count=len(st))
        for feat in _FEATURES:
            out[feat][sid] = bool(fr[feat][ids].any())
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------------
# categories
# --------------------------------------------------------------------------------------------------

def allocation_categories(snap, allocs: pd.DataFrame) -> pd.DataFrame:
    """``allocs`` with ``category`` (one of :data:`CATEGORIES`), ``confidence`` (0-1) and ``reason``.

    Rules, first match wins (alloc stack = A, the stack that freed it = F):

    ========================================================  ================  ====
    A sets up modules (``Module._apply``/``to``/``cuda``,      parameters        0.9
    ``__init__``/``reset_parameters`` in torch.nn)
    A in ``torch/optim`` and never freed in the window          optimizer_state   0.85
    A in ``torch/optim`` and freed                              temporaries       0.7
    A in autograd's AccumulateGrad (C++ stacks)                 gradients         0.9
    A in backward, F is ``zero_grad`` or never freed            gradients         0.7
    A in backward, freed otherwise                              temporaries       0.6
    A in forward, F in backward (saved for backward)            activations       0.85
    A in forward, F in forward                                  temporaries       0.7
    A in forward, freed elsewhere or never                      activations       0.5
    no alloc stack, F is ``zero_grad``                          gradients         0.6
    no alloc stack, F in backward                               activations       0.5
    anything else freed in the window                           temporaries       0.3
    anything else                                               unknown           0.2
    ========================================================  ================  ====

    Then what predates the recording and lives to its end (no stack) is inferred by
    :func:`_infer_predating`: parameters matched by the optimizer state's tensor sizes (0.8), else
    parameters and buffers by being alive and never freed (0.35).
    """
    feats = stack_features(snap)
    n = int(allocs.attrs.get("n_events", 0))
    A = allocs["alloc_stack_id"].to_numpy()
    F = allocs["free_stack_id"].to_numpy()
    freed = allocs["free_index"].to_numpy() < n

    def feat(name, ids):
        col = feats[name].to_numpy() if len(feats) else np.zeros(0, dtype=bool)
        out = np.zeros(len(ids), dtype=bool)
        ok = ids >= 0
        if len(col):
            out[ok] = col[ids[ok]]
        return out

    a_param = feat("param_init", A)
    a_opt = feat("optimizer", A)
    a_acc = feat("accumulate_grad", A)
    a_bwd = feat("backward", A)
    a_fwd = feat("forward", A) & ~a_bwd
    f_zero = feat("zero_grad", F)
    f_bwd = feat("backward", F)
    f_fwd = feat("forward", F) & ~f_bwd
    no_a = A < 0
    rules = [
        (a_param, "parameters", 0.9, "allocated while setting up modules (to/cuda/_apply/__init__)"),
        (a_opt & ~freed, "optimizer_state", 0.85, "allocated in torch.optim and kept"),
        (a_opt & freed, "temporaries", 0.7, "optimizer step temporary"),
        (a_acc, "gradients", 0.9, "allocated by autograd's AccumulateGrad"),
        (a_bwd & (f_zero | ~freed), "gradients", 0.7, "allocated in backward, freed by zero_grad or kept"),
        (a_bwd, "temporaries", 0.6, "allocated and freed within backward"),
        (a_fwd & f_bwd, "activations", 0.85, "allocated in forward, freed by backward (saved tensor)"),
        (a_fwd & f_fwd, "temporaries", 0.7, "allocated and freed within forward"),
        (a_fwd, "activations", 0.5, "allocated in forward"),
        (no_a & f_zero, "gradients", 0.6, "allocated before the window, freed by zero_grad"),
        (no_a & f_bwd, "activations", 0.5, "allocated before the window, freed in backward"),
        (freed, "temporaries", 0.3, "freed in the window, no telling frame"),
    ]
    cat = np.full(len(allocs), "unknown", dtype=object)
    conf = np.full(len(allocs), 0.2)
    reason = np.full(len(allocs), "no telling frame", dtype=object)
    done = np.zeros(len(allocs), dtype=bool)
    for mask, c, p, why in rules:
        m = mask & ~done
        cat[m] = c
        conf[m] = p
        reason[m] = why
        done |= m
    _infer_predating(allocs, cat, conf, reason, freed)
    out = allocs.copy()
    out["category"] = pd.Categorical(cat, categories=list(CATEGORIES))
    out["confidence"] = conf
    out["reason"] = reason
    out.attrs.update(allocs.attrs)
    return out


# Workspaces torch takes per (handle, stream) and never frees: cuBLAS (CUBLAS_WORKSPACE_CONFIG defaults
# ":4096:8" on Hopper and later, ":4096:2:16:8" before) and cuBLASLt (TORCH_CUBLASLT_WORKSPACE_SIZE,
# 1 MiB by default). A block of exactly such a size that predates the recording, has no stack and is not
# matched by the optimizer state is more likely one of these than a parameter.
_CUBLAS_WORKSPACE_SIZES = (8 * 4096 * 1024, 2 * 4096 * 1024 + 8 * 16 * 1024, 1024 * 1024)


def _infer_predating(allocs: pd.DataFrame, cat, conf, reason, freed) -> None:
    """Allocations made before the recording began and alive to its end carry no stack: infer what
    they are (in place on ``cat``/``conf``/``reason``).

    1. The optimizer's state, identified by its stacks, holds per parameter tensors of exactly the
       parameter's size (Adam/AdamW: ``exp_avg`` and ``exp_avg_sq``, two per parameter; SGD momentum:
       one). For each state size, the number of state tensors divided by the tensors per parameter
       gives how many parameters of that size exist; that many unexplained blocks of the size become
       parameters (confidence 0.8), after those already identified as parameters are counted.
    2. Blocks that remain, predate the recording and are never freed: where there is optimizer state,
       they match none of its sizes, so they are no trained parameter and stay unknown with that reason
       (a buffer, a frozen parameter, an input kept alive); where there is none (inference, or state
       made before the recording too), parameters and buffers (confidence 0.35: the usual long-lived
       tensors). Blocks of exactly a cuBLAS workspace's size stay unknown with that reason.
    """
    pre = allocs["preexisting"].to_numpy() & ~freed & (cat == "unknown")
    if not pre.any() or not int(allocs.attrs.get("n_events", 0)):
        return  # no history at all: everything "predates" it, nothing tells parameters from activations
    size = (np.maximum(512, (allocs["requested_bytes"].to_numpy() + 511) // 512 * 512)
            if "requested_bytes" in allocs else allocs["size_bytes"].to_numpy())
    state = (cat == "optimizer_state")
    if state.any():
        s_sizes, s_counts = np.unique(size[state], return_counts=True)
        # tensors per parameter: 2 when every state size comes in pairs (Adam-style), else 1
        per_param = 2 if (s_counts % 2 == 0).all() else 1
        style = "Adam-style (2 state tensors per parameter)" if per_param == 2 else "1 state tensor per parameter"
        known = cat == "parameters"
        for sz, cnt in zip(s_sizes, s_counts):
            expected = int(cnt) // per_param - int((known & ~freed & (size == sz)).sum())
            if expected <= 0:
                continue
            idx = np.flatnonzero(pre & (size == sz))[:expected]
            cat[idx] = "parameters"
            conf[idx] = 0.8
            reason[idx] = (f"predates the recording; the optimizer state ({style}) holds {int(cnt)} tensors of "
                           f"exactly this size ({int(sz)} B), i.e. {int(cnt) // per_param} parameters")
            pre[idx] = False
    ws = pre & np.isin(size, _CUBLAS_WORKSPACE_SIZES) & (allocs["alloc_stack_id"].to_numpy() < 0)
    reason[ws] = "predates the recording, never freed, exactly a cuBLAS/cuBLASLt workspace's size"
    rest = pre & ~ws
    if state.any():
        # Every trained parameter has state tensors of its own size, and step 1 matched those sizes: a
        # block left over is no parameter this optimizer trains (a buffer, a frozen parameter, or an
        # input or other tensor made before the recording and kept alive).
        reason[rest] = ("predates the recording and is never freed, but matches no optimizer-state size: "
                        "not a trained parameter (a buffer, a frozen parameter or an input kept alive)")
        return
    cat[rest] = "parameters"
    conf[rest] = 0.35
    reason[rest] = "predates the recording and is never freed: most such blocks are parameters and buffers"


def category_timeline(snap, allocs: pd.DataFrame, timeline: pd.DataFrame) -> pd.DataFrame:
    """Allocated bytes per category after every event (``index``, ``time_us`` and one
    ``<category>_bytes`` column each); needs ``allocs`` from :func:`allocation_categories`."""
    n = len(timeline)
    codes = allocs["category"].cat.codes.to_numpy()
    size = allocs["size_bytes"].to_numpy()
    a = allocs["alloc_index"].to_numpy()
    f = allocs["free_index"].to_numpy()
    out = {"index": timeline["index"].to_numpy(), "time_us": timeline["time_us"].to_numpy()}
    for ci, c in enumerate(CATEGORIES):
        m = codes == ci
        delta = np.zeros(n + 1, dtype=np.int64)
        start = int(size[m & (a < 0)].sum())
        inw = m & (a >= 0)
        np.add.at(delta, a[inw], size[inw])
        fr = m & (f < n)
        np.add.at(delta, f[fr], -size[fr])
        out[f"{c}_bytes"] = start + np.cumsum(delta[:n])
    return pd.DataFrame(out)


def group_live(live: pd.DataFrame, labels: dict, by: str = "frame", top: int | None = None) -> pd.DataFrame:
    """Live allocations grouped by user frame (``by='frame'``), by ``file:function``
    (``by='function'``), by module path (``by='module'``, see :func:`user_frame_labels`) or by
    ``category``: ``bytes``, ``count``, largest first."""
    if by == "category":
        key = live["category"].astype(str) if "category" in live else pd.Series("unknown", index=live.index)
    else:
        lbl = np.asarray(labels[by] + ["(no stack)"], dtype=object)
        sid = live["alloc_stack_id"].to_numpy()
        key = pd.Series(lbl[np.where(sid >= 0, sid, len(lbl) - 1)], index=live.index)
    g = (live.assign(_k=key.to_numpy()).groupby("_k", sort=False)["size_bytes"]
         .agg(bytes="sum", count="size").reset_index().rename(columns={"_k": by})
         .sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True))
    return g.head(top) if top else g


def surviving_allocations(allocs: pd.DataFrame, labels: dict, min_count: int = 3) -> pd.DataFrame:
    """Allocations made inside the window and still live at snapshot time, grouped by user frame:
    ``bytes``, ``count``, ``first_index``, ``last_index``, ``spread`` (fraction of the window between
    the first and last such allocation). Many survivors from one frame spread over the window are what
    a leak across steps looks like; ``leak_like`` marks groups with ``count >= min_count`` and
    ``spread >= 0.5``."""
    n = int(allocs.attrs.get("n_events", 0))
    s = allocs[(allocs["alloc_index"].to_numpy() >= 0) & (allocs["free_index"].to_numpy() >= n)]
    lbl = np.asarray(labels["frame"] + ["(no stack)"], dtype=object)
    sid = s["alloc_stack_id"].to_numpy()
    key = lbl[np.where(sid >= 0, sid, len(lbl) - 1)]
    g = (s.assign(frame=key).groupby("frame", sort=False)
         .agg(bytes=("size_bytes", "sum"), count=("size_bytes", "size"),
              first_index=("alloc_index", "min"), last_index=("alloc_index", "max"))
         .reset_index())
    g["spread"] = (g["last_index"] - g["first_index"]) / max(n, 1)
    if "category" in s:
        cat = (s.assign(frame=key).groupby("frame", sort=False)["category"]
               .agg(lambda c: c.astype(str).value_counts().idxmax()))
        g["category"] = g["frame"].map(cat).to_numpy()
        setup = g["category"].isin(["parameters", "optimizer_state"]).to_numpy()
    else:
        setup = np.zeros(len(g), dtype=bool)
    # parameters and optimizer state are created once and kept: that is not a leak
    g["leak_like"] = (g["count"] >= min_count) & (g["spread"] >= 0.5) & ~setup
    return g.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)


def profiler_category_peak(profiler_timeline: pd.DataFrame) -> dict:
    """From torch.profiler's memory timeline (``io.load_memory_timeline``): the time of the total's
    peak and the bytes per profiler category there. Those categories come from the profiler's own
    tensor tracking, so their confidence is 1.0."""
    cols = [c for c in profiler_timeline.columns if c.endswith("_bytes")]
    total = profiler_timeline[cols].sum(axis=1).to_numpy()
    if not len(total):
        return {"time_us": None, "total_bytes": 0, "by_category": {}}
    k = int(np.argmax(total))
    row = profiler_timeline.iloc[k]
    return {
        "time_us": int(row["time_us"]),
        "total_bytes": int(total[k]),
        "by_category": {c[: -len("_bytes")]: int(row[c]) for c in cols},
        "confidence": 1.0,
    }

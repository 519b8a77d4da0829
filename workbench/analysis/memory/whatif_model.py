"""The memory what-if's model of the training step, built from the allocator history (issue 31):
:class:`StepMemoryModel`, :class:`Change` and :func:`step_memory_model`. How the model is made and what
it assumes: :mod:`workbench.analysis.memory.whatif`; the replay of a change: ``whatif_replay.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from workbench.analysis.memory.allocations import _INTERNAL, device_events, stack_features
from workbench.analysis.memory.allocator_model import LARGE_BUFFER, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER
from workbench.analysis.memory.steps import block_count_from_parameters, event_phases, step_boundaries
from workbench.units import format_bytes

__all__ = ["StepMemoryModel", "Change", "step_memory_model", "predating_segments", "recorded_events"]

# tensors whose dtype follows autocast's: outputs of matmul-like ops (their frames in torch)
# (not torch/nn/modules/activation.py: nn.Softmax lives there, and softmax outputs stay fp32 under autocast)
_HALVES = re.compile(r"(^|/)torch/nn/modules/(linear|conv)\.py$")
_HALVES_NAMES = re.compile(r"^(linear|conv\d?d|matmul|bmm|baddbmm|addmm|mm|scaled_dot_product_attention|"
                           r"multi_head_attention_forward|_conv_forward)$")



@dataclass
class StepMemoryModel:
    """One training step's memory, per kind (bytes; lists hold tensor sizes). See the module docstring."""

    cap_bytes: int | None
    batch_size: int | None
    step: int  # 1-based step of the OOM within the recording
    phase: str | None
    params: list = field(default_factory=list)
    grads_live: list = field(default_factory=list)  # gradients live at the OOM
    grads_kept: bool = False  # gradients live in the forward: kept across steps (set_to_none=False)
    state: list = field(default_factory=list)  # optimizer state live at the OOM
    state_exists: bool = False
    states_per_param: int = 2
    state_assumed: bool = False
    opt_temporaries: str = "foreach"  # foreach | single | none
    other: list = field(default_factory=list)  # workspaces, buffers: live, made before this step
    leak_live: list = field(default_factory=list)  # leaked tensors live at the OOM (made in earlier steps)
    leak_per_step: list = field(default_factory=list)  # sizes one step leaks
    leak_frames: list = field(default_factory=list)  # [{frame, bytes_per_step, count}]
    leak_scales: bool = True
    inputs: list = field(default_factory=list)
    prefix: list = field(default_factory=list)  # pattern events: (op, id, size, halves)
    block: list = field(default_factory=list)
    head: list = field(default_factory=list)
    n_blocks: int = 0
    blocks_seen: int = 0
    blocks_method: str = ""
    block_bytes_kept: int = 0
    extrapolated: bool = False
    # segments reserved before the history began (a warm-up run before the recording): their sizes; the
    # replay starts with them cached, free, as the process did (each fix's run does its warm-up too)
    predating_segments: list = field(default_factory=list)
    # steps of different shapes (variable sequence lengths): the recorded history up to the OOM, replayed as it
    # was (events (op, key, bytes, scales with the batch)), then the rest of the OOM's step; empty otherwise
    history: list = field(default_factory=list)
    history_live: list = field(default_factory=list)  # keys of the OOM step's tensors live at the OOM, in order
    history_sizes: dict = field(default_factory=dict)  # key -> (bytes, scales)
    # the part of the forward after the blocks when the history ends before it (an OOM in the first forward):
    # {"bytes": estimated peak of it at the recorded batch (None: not estimated, not counted), "how": text};
    # None when it was seen (or there are no blocks)
    after_blocks: dict | None = None
    evidence: list = field(default_factory=list)

    @property
    def params_bytes(self) -> int:
        return int(sum(self.params))

    def summary(self) -> dict:
        """The JSON's ``oom.step_model``: the memory of the step by kind (docs/json.md)."""
        kept = lambda pat: int(sum(e[2] for e in pat if e[0] == "alloc")) - int(  # noqa: E731
            sum(e[2] for e in pat if e[0] == "free"))
        return {
            "step": self.step, "phase": self.phase,
            "blocks": self.n_blocks, "blocks_seen": self.blocks_seen, "blocks_method": self.blocks_method,
            "static": {"parameters_bytes": self.params_bytes, "gradients_live_bytes": int(sum(self.grads_live)),
                       "gradients_kept_across_steps": self.grads_kept,
                       "optimizer_state_bytes": int(self.state_bytes), "optimizer_state_exists": self.state_exists,
                       "optimizer_state_assumed": self.state_assumed, "states_per_parameter": self.states_per_param,
                       "other_bytes": int(sum(self.other))},
            "per_step": {"inputs_bytes": int(sum(self.inputs)), "prefix_kept_bytes": kept(self.prefix),
                         "block_kept_bytes": int(self.block_bytes_kept), "head_kept_bytes": kept(self.head),
                         "forward_kept_bytes": kept(self.prefix) + self.n_blocks * int(self.block_bytes_kept)
                         + kept(self.head)},
            "growth": {"bytes_per_step": int(sum(self.leak_per_step)), "leaked_bytes": int(sum(self.leak_live)),
                       "frames": list(self.leak_frames)},
            "extrapolated": self.extrapolated,
            "unseen_after_blocks": dict(self.after_blocks) if self.after_blocks is not None else None,
        }

    @property
    def state_bytes(self) -> int:
        return int(sum(self.state)) if self.state_exists else self.states_per_param * self.params_bytes


@dataclass(frozen=True)
class Change:
    """One counterfactual: every field is the value in the replay (defaults: the run as it was)."""

    batch_fraction: float = 1.0
    checkpointing: bool = False
    bf16: bool = False
    optimizer: str | None = None  # None: as recorded; sgd, sgd_momentum, adam, adam_fused, adam_foreach_off, adam8bit
    zero_grad_set_to_none: bool = False
    remove_leak: bool = False
    expandable: bool | None = None  # None: as recorded
    max_split_size: int | None = None
    cap: bool = True  # False: no cap (a bigger GPU)
    steps: int = 2
    leaked_before: int | None = None  # bytes already leaked before the first replayed step (None: as at the OOM)




def _user_chain(snap, sid: int, files, internal) -> list:
    """User (non-torch, non-stdlib) Python frame ids of a stack, outermost first."""
    if sid < 0:
        return []
    return [f for f in reversed(snap.stacks[sid]) if files[f].endswith(".py") and not internal[f]]


def _split_blocks(snap, sids: np.ndarray, modules: list | None = None) -> tuple[np.ndarray, int | None]:
    """Block number (0-based; -1 outside the blocks) of each allocation, from the frames: the frame that
    calls the blocks is the innermost user frame shared by at least half of the allocations whose
    children differ; a block begins where the line of the frame inside it goes back."""
    n = len(sids)
    out = np.full(n, -1, dtype=np.int64)
    if modules is not None:
        idx = [re.search(r"(?:^|\.)(\d+)(?:\.|$)", m or "") for m in modules]
        if sum(x is not None for x in idx) >= n // 2 and n:
            last, b = None, -1
            for i, m in enumerate(idx):
                if m is None:
                    continue
                if m.group(1) != last:
                    b += 1
                    last = m.group(1)
                out[i] = b
            return out, None
    files = snap.frames["filename"].astype(str).to_numpy()
    internal = np.array([bool(_INTERNAL.search(f)) for f in files], dtype=bool)
    chains = [_user_chain(snap, int(s), files, internal) for s in sids]
    counts: dict = {}
    for ch in chains:
        for depth, f in enumerate(ch):
            if depth + 1 < len(ch):  # a caller: something runs inside it
                counts[f] = counts.get(f, 0) + 1
    if not counts:
        return out, None
    lines = snap.frames["line"].to_numpy()
    # the innermost frame in at least a third of the allocations whose inner frames restart (blocks)
    best = None
    for f, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        if c < max(2, n // 3):
            break
        inner = [ch[ch.index(f) + 1] for ch in chains if f in ch and ch.index(f) + 1 < len(ch)]
        ln = [int(lines[x]) for x in inner]
        restarts = sum(1 for a, b in zip(ln, ln[1:]) if b < a)
        if restarts >= 1:
            depth = np.median([ch.index(f) for ch in chains if f in ch])
            if best is None or depth > best[1]:
                best = (f, depth)
    if best is None:
        return out, None
    caller = best[0]
    b, prev = -1, None
    for i, ch in enumerate(chains):
        if caller not in ch or ch.index(caller) + 1 >= len(ch):
            continue
        ln = int(lines[ch[ch.index(caller) + 1]])
        if prev is None or ln < prev:
            b += 1
        prev = ln
        out[i] = b
    return out, int(caller)


def _pattern(rows, lo: int, hi: int, halves: np.ndarray) -> tuple[list, int]:
    """Alloc/free events of the allocations made in [lo, hi) (rows sorted by alloc index): those freed
    before ``hi`` are freed there (temporaries), the rest are kept. Returns (events, kept bytes)."""
    evs = []
    kept = 0
    for j, r in enumerate(rows):
        ai, fi, size = int(r[0]), int(r[1]), int(r[2])
        if not (lo <= ai < hi):
            continue
        evs.append((ai, "alloc", j, size, bool(halves[j])))
        if fi < hi:
            evs.append((fi, "free", j, size, bool(halves[j])))
        else:
            kept += size
    evs.sort(key=lambda e: (e[0], 0 if e[1] == "free" else 1))
    return [(e[1], e[2], e[3], e[4]) for e in evs], kept


def _halves_mask(snap, sids: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """Which allocations (in order) autocast makes bf16: outputs of matmul-like ops (their frames), and, given
    ``sizes``, an allocation of the same size made right after one of those from the same line of user code
    (an elementwise op on it, ``F.gelu(self.up(x))``: autocast runs it in its input's dtype). A residual add
    (``x + self.attn(x)``) is made on another line than the attention's output projection: it stays fp32."""
    files = snap.frames["filename"].astype(str).to_numpy()
    names = snap.frames["name"].astype(str).to_numpy()
    hit = np.array([bool(_HALVES.search(f)) or bool(_HALVES_NAMES.search(nm)) for f, nm in zip(files, names)],
                   dtype=bool)
    out = np.zeros(len(sids), dtype=bool)
    for i, s in enumerate(sids):
        if s >= 0:
            out[i] = bool(hit[list(snap.stacks[int(s)])].any()) if len(snap.stacks[int(s)]) else False
    if sizes is not None and len(sids) >= 2:
        internal = np.array([bool(_INTERNAL.search(f)) for f in files], dtype=bool)
        inner = [(_user_chain(snap, int(s), files, internal) or [None])[-1] for s in sids]
        for i in range(1, len(sids)):
            if not out[i] and out[i - 1] and sizes[i] == sizes[i - 1] and inner[i] is not None \
                    and inner[i] == inner[i - 1]:
                out[i] = True
    return out


def _triples(sizes) -> float:
    """Share of the bytes in tensor sizes that occur a multiple of 3 times."""
    vals, counts = np.unique(np.asarray(sizes), return_counts=True)
    total = float((vals * counts).sum())
    return float((vals * counts)[counts % 3 == 0].sum()) / total if total else 0.0


def _count_blocks_built(snap, allocs) -> int | None:
    """Blocks counted from their construction: parameters made under a loop that builds the blocks."""
    p = allocs[(allocs["category"].astype(str) == "parameters") & (allocs["alloc_index"] >= 0)]
    if len(p) < 4:
        return None
    p = p.sort_values("alloc_index")
    bn, caller = _split_blocks(snap, p["alloc_stack_id"].to_numpy())
    nb = int(bn.max()) + 1 if (bn >= 0).any() else 0
    return nb if nb >= 2 else None


def _params_around_blocks(snap, allocs, k: int) -> tuple[list, list] | None:
    """Sizes of the parameters live at the OOM (index ``k``) built inside the block loop and built after it
    (the final norm, the head), from where the model built them; None when the construction does not show
    the blocks (it predates the recording, or no loop builds them)."""
    p = allocs[(allocs["category"].astype(str) == "parameters") & (allocs["alloc_index"] >= 0)]
    if len(p) < 4:
        return None
    p = p.sort_values("alloc_index")
    bn, _ = _split_blocks(snap, p["alloc_stack_id"].to_numpy())
    if not (bn >= 0).any() or int(bn.max()) < 1:
        return None
    ai, fi, size = (p[c].to_numpy() for c in ("alloc_index", "free_index", "size_bytes"))
    last = int(ai[bn >= 0].max())
    live = fi > k
    return ([int(x) for x in size[(bn >= 0) & live]], [int(x) for x in size[(ai > last) & (bn < 0) & live]])


def _outside_blocks(params: list, inside: list | None, n_blocks: int) -> tuple[list, list]:
    """(block parameter sizes, the other parameter sizes): the blocks' from their construction when known, else
    the sizes that occur at least once per block (each such size counted ``count // n_blocks`` times a block)."""
    vals, counts = np.unique(np.asarray(params, dtype=np.int64), return_counts=True)
    if inside is None:
        per = {int(v): int(c) // n_blocks for v, c in zip(vals, counts) if n_blocks >= 2 and c >= n_blocks}
        inside = [v for v, c in per.items() for _ in range(c * n_blocks)]
    left = dict(zip(vals.tolist(), counts.tolist()))
    for v in inside:
        if left.get(v, 0) > 0:
            left[v] -= 1
    return list(inside), [int(v) for v, c in left.items() for _ in range(c)]


def _after_blocks(snap, allocs, k: int, block: list, params: list, n_blocks: int) -> tuple[list, dict]:
    """The part of the forward after the blocks when the OOM came before it ran (nothing of it in the history):
    estimated as a linear head over the blocks' output followed by a cross-entropy loss. Returns (pattern
    events, ``{bytes, how}``); no events and ``bytes`` None when the parameters do not give its shapes.

    The shapes are read from sizes: the blocks' output (the last tensor a block keeps, ``R`` = rows x width x
    e bytes); the width ``s`` = width x e is a block parameter's size (a norm's weight) that divides ``R``, and
    a square block weight (width x width x e = s² / e for e of 4, 2, 1 or 8 bytes) confirms it. The head's
    weight ``W`` (outputs x width x e) is the largest weight built after the blocks, or, when the construction
    does not show one (it predates the recording, or the head is tied to the embedding), the largest weight
    outside the blocks; it makes ``R x W / (s² / e)`` bytes of logits. The loss is taken as a language model's
    cross-entropy: one copy of the logits (a shifted or flattened slice, or an fp32 cast) and the log-softmax
    (kept for the backward); the logits and the copy go at the loss' end."""
    none = {"bytes": None, "how": ("the part after the blocks (final norm, head, loss) is not in the history and "
                                   "the parameters do not give its shapes: not counted")}
    kept = [e for e in block if e[0] == "alloc" and not any(f[0] == "free" and f[1] == e[1] for f in block)]
    if not kept or not params:
        return [], none
    around = _params_around_blocks(snap, allocs, k)
    inside, outside = _outside_blocks(params, around[0] if around else None, max(n_blocks, 1))
    R = int(kept[-1][2])
    square = None
    for s in sorted(x for x in set(inside) if x > 0):
        for e in (4, 2, 1, 8):
            if R % s == 0 and (s * s) % e == 0 and (s * s) // e in set(inside):
                square = (s, (s * s) // e)
                break
        if square:
            break
    if square is None:
        return [], none
    s, sq = square
    mats = lambda xs: [w for w in xs if w > s and w % s == 0]  # noqa: E731
    after = mats(around[1]) if around else []
    W = max(after or mats(outside) or [0])
    if not W:
        return [], none
    where = "built after the blocks" if after else "outside the blocks (the largest: the head, or the embedding " \
                                                   "it is tied to)"
    L = R * W // sq
    ev = [("alloc", 0, R, False), ("alloc", 1, L, True), ("alloc", 2, L, False), ("alloc", 3, L, False),
          ("free", 2, L, False), ("free", 1, L, True)]
    how = (f"the part after the blocks is not in the history: estimated as a norm and a linear head over the blocks' "
           f"{format_bytes(R)} output, the head's weight the {format_bytes(W)} one {where}: the norm "
           f"({format_bytes(R)}), the logits ({format_bytes(L)}), and in the loss a copy of them and the "
           f"log-softmax ({format_bytes(L)} each)")
    return ev, {"bytes": R + 3 * L, "how": how}


def predating_segments(snap, device: int) -> list:
    """Sizes of the segments the process held when the history began: freed in the history (``segment_free``,
    e.g. torch releasing its cache before an OOM) or still there at the snapshot, without a ``segment_alloc``
    in the history. Expandable segments (mapped page by page) are not told apart: empty."""
    ev = device_events(snap, device)
    act = ev["action"].astype(str).to_numpy()
    if (act == "segment_map").any() or (act == "segment_unmap").any():
        return []
    seg = snap.segments
    if len(seg) and "device" in seg:
        seg = seg[seg["device"].to_numpy() == device]
    if len(seg) and "is_expandable" in seg and seg["is_expandable"].astype(bool).any():
        return []
    if not ((act == "segment_alloc") | (act == "segment_free")).any():
        return []  # a history without segment events (made by hand, or an old torch): nothing to tell
    addr, size = ev["addr"].to_numpy(), ev["size_bytes"].to_numpy()
    alive: set = set()
    out = []
    for i in np.flatnonzero((act == "segment_alloc") | (act == "segment_free")):
        if act[i] == "segment_alloc":
            alive.add(int(addr[i]))
        elif int(addr[i]) in alive:
            alive.discard(int(addr[i]))
        else:
            out.append(int(size[i]))
    if len(seg):
        for a_, s_ in zip(seg["address"].to_numpy(), seg["total_size_bytes"].to_numpy()):
            if int(a_) not in alive:
                out.append(int(s_))
    # only sizes the caching allocator makes (2 MiB small, 20 MiB, or 2 MiB multiples from 10 MiB): other
    # "segments" are not its cache (a history written by another tool, one tensor a segment)
    return [s for s in out if s in (SMALL_BUFFER, LARGE_BUFFER) or (s >= MIN_LARGE_ALLOC and s % ROUND_LARGE == 0)]


def recorded_events(allocs, k: int) -> list:
    """The allocator's history up to event ``k`` (not included) as ``(op, row)`` in order, ``op`` 'alloc' or
    'free' and ``row`` the allocation's row in ``allocs``: what was live before the window first (allocated
    before it), then every allocation and free; at one index a free comes before an allocation."""
    ai = allocs["alloc_index"].to_numpy()
    fi = allocs["free_index"].to_numpy()
    evs = [(-1, 1, int(j), "alloc") for j in np.flatnonzero((ai < 0) & (fi > 0))]
    evs += [(int(ai[j]), 1, int(j), "alloc") for j in np.flatnonzero((ai >= 0) & (ai < k))]
    evs += [(int(fi[j]), 0, int(j), "free") for j in np.flatnonzero((fi < k) & (fi > 0))]
    evs.sort(key=lambda e: (e[0], e[1]))
    return [(op, j) for _, _, j, op in evs]


def _history_of_shapes(m: StepMemoryModel, a, k: int, starts: list, step_i: int, ph, fixed_cat,
                       requested: int) -> None:
    """When the complete steps before the OOM's (the first left out) ran tensors of different sizes (variable
    shapes), one step is no model of what the allocator went through: keep the recorded history up to the OOM
    (``m.history``) to be replayed as it was, and the OOM step's live tensors (``m.history_live``) for the rest
    of its step."""
    ai = a["alloc_index"].to_numpy()
    size = a["size_bytes"].to_numpy()
    fwd = ph == "forward"
    shapes = set()
    for i in range(1, step_i - 1):  # not the first step: it makes once-only things (a cuBLAS workspace)
        s0, s1 = starts[i], starts[i + 1]
        sel = (ai >= s0) & (ai < s1) & fwd
        if sel.any():
            shapes.add(tuple(sorted(size[sel].tolist())))
    if len(shapes) < 2:
        return
    fi = a["free_index"].to_numpy()
    scales = ~fixed_cat & (ai >= 0)  # per-step tensors scale with the batch; static and pre-window ones do not
    m.history = [(op, j, int(size[j]), bool(scales[j])) for op, j in recorded_events(a, k)]
    m.history.append(("alloc", "request", requested, True))
    start = starts[step_i - 1]
    live = np.flatnonzero((ai >= start) & (ai < k) & (fi >= k) & ~fixed_cat)
    m.history_live = [int(j) for j in live[np.argsort(ai[live], kind="stable")]] + ["request"]
    m.history_sizes = {int(j): (int(size[j]), bool(scales[j])) for j in live}
    m.history_sizes["request"] = (requested, True)
    m.evidence.append(f"the {step_i - 2} complete steps after the first ran {len(shapes)} different sets of tensor "
                      "sizes (variable shapes): the recorded history is replayed as it was (per-step tensors "
                      "scaled with the batch), then the rest of the OOM's step")


def step_memory_model(analysis, rep, batch_size: int | None = None) -> StepMemoryModel | None:
    """The step model at the OOM of ``rep`` (an :class:`~workbench.analysis.memory.oom.OomReport`), or None
    when the history shows no training step (no forward allocation in the OOM's step or before)."""
    snap, k = analysis.snap, rep.index
    device = analysis.device
    phases = event_phases(snap, device)
    steps = step_boundaries(snap, device, phases)
    starts = list(steps["starts"]) or [0]
    a = analysis.allocs
    ai = a["alloc_index"].to_numpy()
    fi = a["free_index"].to_numpy()
    size = a["size_bytes"].to_numpy()
    cat = a["category"].astype(str).to_numpy()
    sid = a["alloc_stack_id"].to_numpy()
    ph = np.where(ai >= 0, phases[np.clip(ai, 0, max(len(phases) - 1, 0))] if len(phases) else "", "")
    live = (ai <= k) & (fi > k)
    step_i = int(np.searchsorted(np.asarray(starts), k, side="right")) or 1
    start = starts[step_i - 1]
    fwd_in_step = (ai >= start) & (ai < k) & (ph == "forward")
    # the step whose forward is the pattern: the OOM's own, else the last complete one
    if not fwd_in_step.any() and not (ph[(ai >= 0) & (ai < k)] == "forward").any():
        return None
    pos = rep.position or {}
    m = StepMemoryModel(cap_bytes=rep.cap_bytes, batch_size=batch_size, step=step_i, phase=pos.get("phase"))
    ev = m.evidence
    m.predating_segments = predating_segments(snap, device)
    if m.predating_segments:
        ev.append(f"{len(m.predating_segments)} segments ({format_bytes(sum(m.predating_segments))}) were reserved "
                  "before the history began: the replay starts with them cached, as the process did")
    fixed_cat = np.isin(cat, ["parameters", "gradients", "optimizer_state"])
    m.params = [int(x) for x in size[live & (cat == "parameters")]]
    m.grads_live = [int(x) for x in size[live & (cat == "gradients")]]
    # optimizer state made before this step exists; state made in this step is being created (first step)
    st_live = live & (cat == "optimizer_state")
    m.state = [int(x) for x in size[st_live & (ai < start)]]
    m.state_exists = bool(m.state)
    files = snap.frames["filename"].astype(str).to_numpy()
    opt_files = {str(files[f]) for j in np.flatnonzero((cat == "optimizer_state") & (sid >= 0))
                 for f in snap.stacks[int(sid[j])] if "/optim/" in str(files[f])}
    per = 1 if any(re.search(r"/optim/sgd\.py$", f) for f in opt_files) else 2
    pb = max(m.params_bytes, 1)
    pre_params = live & (cat == "parameters") & (ai < 0) & (sid < 0)
    reclass = np.zeros(len(a), dtype=bool)  # predating tensors taken for parameters + state by their sizes
    if m.state_exists:
        m.states_per_param = max(1, int(round(sum(m.state) / pb)))
    elif pre_params.sum() >= 3 and pre_params.sum() == (live & (cat == "parameters")).sum() and \
            _triples(size[pre_params]) >= 0.9:
        # everything predates the recording, with no stack: the sizes that occur a multiple of 3 times (most
        # of the bytes) are a parameter and its two Adam-style states (exp_avg, exp_avg_sq)
        vals, counts = np.unique(size[pre_params], return_counts=True)
        m.params = [int(v) for v, c in zip(vals, counts) for _ in range(c // 3 if c % 3 == 0 else c)]
        m.state = [int(v) for v, c in zip(vals, counts) if c % 3 == 0 for _ in range(2 * (c // 3))]
        m.state_exists, m.states_per_param = True, 2
        ev.append("parameters and optimizer state predate the recording (no stacks): the tensor sizes that occur "
                  "a multiple of 3 times are taken as a parameter and its two Adam-style states")
        # a size shared with a cuBLAS workspace (32 MiB: a 1024 x 8192 fp32 head) is taken for one by the
        # classifier; a process holds one or two workspaces: the rest of them, in threes, is parameters + state
        ws = live & (ai < 0) & (sid < 0) & (cat == "unknown")
        for v, c in zip(*np.unique(size[ws], return_counts=True)):
            n = int(c) // 3  # at most two (c % 3) are left as workspaces
            if n:
                js = np.flatnonzero(ws & (size == v))[: 3 * n]
                reclass[js] = True
                m.params += [int(v)] * n
                m.state += [int(v)] * (2 * n)
                ev.append(f"{3 * n} of the {int(c)} tensors of {format_bytes(int(v))} that predate the recording "
                          f"(a cuBLAS workspace's size) are taken as {n} parameter(s) and their two states; "
                          f"{int(c) - 3 * n} as workspaces")
    elif step_i > 1 and not st_live.any():
        # a step completed and left no state: a stateless optimizer (plain SGD) or none
        m.states_per_param, m.opt_temporaries = 0, "none"
        ev.append(f"no optimizer state after {step_i - 1} completed step(s): a stateless optimizer (plain SGD)")
    else:
        # the optimizer's lazily created state: made in its first step
        m.states_per_param, m.state_assumed = per, not bool(st_live.any())
        seen = f" ({format_bytes(int(size[st_live].sum()))} of it made when the OOM hit)" if st_live.any() else ""
        ev.append(f"the optimizer creates its state in its first step{seen}: "
                  + ("assumed Adam-style (2 x the parameters)" if per == 2 else "1 state per parameter (SGD momentum)")
                  + ", made in the replay's first optimizer step")
    feats = stack_features(snap)
    opt_feat = feats["optimizer"].to_numpy() if len(feats) else np.zeros(0, bool)
    # the optimizer's temporaries seen in the history: foreach (many at once) or single
    tmp = (cat == "temporaries") & (sid >= 0) & (ai >= 0)
    tmp &= np.array([bool(opt_feat[s]) if 0 <= s < len(opt_feat) else False for s in sid], dtype=bool)
    if tmp.any():
        m.opt_temporaries = "foreach" if tmp.sum() > 2 else "single"
    # gradients live while the forward runs: kept across steps (zero_grad(set_to_none=False) or none)
    m.grads_kept = bool(m.grads_live) and pos.get("phase") == "forward"
    # growth across steps: made in an earlier step, never freed, no parameter/grad/state
    prev = (ai >= 0) & (ai < start) & (fi >= k) & ~fixed_cat & (step_i > 1)
    labels = analysis.labels["frame"]
    if prev.any():
        step_of = np.searchsorted(np.asarray(starts), ai, side="right")
        groups: dict = {}
        for j in np.flatnonzero(prev):
            lbl = labels[sid[j]] if 0 <= sid[j] < len(labels) else "(no stack)"
            groups.setdefault(lbl, []).append(j)
        done_steps = step_i - 1
        for lbl, js in groups.items():
            steps_with = len(set(step_of[js].tolist()))
            if steps_with >= max(2, done_steps // 2):
                per = int(size[js].sum()) // steps_with
                m.leak_live += [int(size[j]) for j in js]
                m.leak_frames.append({"frame": lbl, "bytes_per_step": per, "count": len(js),
                                      "steps": steps_with})
                last = [j for j in js if step_of[j] == step_of[js].max()]
                m.leak_per_step += [int(size[j]) for j in last]
                m.leak_scales = m.leak_scales and bool((ph[js] == "forward").any())
        if m.leak_frames:
            m.leak_frames.sort(key=lambda d: -d["bytes_per_step"])
            ev.append(f"growth across steps: {format_bytes(sum(m.leak_per_step))} a step made in "
                      f"{m.leak_frames[0]['frame']} is never freed ({m.leak_frames[0]['steps']} steps seen)")
    is_leak = np.zeros(len(a), bool)
    if m.leak_frames:
        lf = {d["frame"] for d in m.leak_frames}
        is_leak = prev & np.array([(labels[s] if 0 <= s < len(labels) else "(no stack)") in lf for s in sid])
    # other long-lived memory: live, made before this step (or before the window), nothing above
    other = live & ~fixed_cat & ~is_leak & ~reclass & ((ai < start) | ((ai >= start) & (ph != "forward") & (ph == "")
                                                            & (ai < 0)))
    m.other = [int(x) for x in size[other]]
    # this step's inputs: made in the step outside any phase, before its forward, live
    fwd_idx = np.flatnonzero(fwd_in_step)
    first_fwd = int(ai[fwd_idx].min()) if len(fwd_idx) else k
    m.inputs = [int(x) for x in size[live & (ai >= start) & (ai < first_fwd) & (ph == "") & ~fixed_cat]]
    _history_of_shapes(m, a, k, starts, step_i, ph, fixed_cat, int(rep.requested_bytes or 0))
    # the forward's pattern
    mod_lbl = analysis.labels.get("module")
    use_mod = bool(mod_lbl) and any(x != "(no module)" for x in mod_lbl)
    big = np.iinfo(np.int64).max // 2

    req_sid = int(device_events(snap, device)["stack_id"].iloc[k])

    def structure(idx, complete: bool) -> dict:
        order = idx[np.argsort(ai[idx], kind="stable")]
        sids = sid[order] if complete else np.r_[sid[order], req_sid]  # the failing request: which block
        modules = [mod_lbl[x] if 0 <= x < len(mod_lbl) else None for x in sids] if use_mod else None
        bn_all, _ = _split_blocks(snap, sids, modules)
        bn = bn_all[:len(order)]
        halves = _halves_mask(snap, sid[order], size[order])
        rows = np.stack([ai[order], np.where(fi[order] > k, big, fi[order]), size[order]], axis=1)
        end = int(rows[:, 0].max()) + 1 if complete else k + 1
        seen = int(bn.max()) + 1 if (bn >= 0).any() else 0
        # the request begins a block of its own: every block before it is complete
        opens = (not complete) and seen > 0 and int(bn_all[-1]) >= seen
        out = {"seen": seen + (1 if opens else 0), "complete": complete, "prefix": [], "head": [], "full": 0}
        if seen == 0:
            out["block"], out["kept"] = _pattern(rows, int(rows[0, 0]), end, halves)
            return out
        edges = [int(ai[order][np.flatnonzero(bn == b)[0]]) for b in range(seen)]
        after_last = np.flatnonzero((bn < 0) & (ai[order] > edges[-1]))
        last_end = int(ai[order][after_last[0]]) if len(after_last) else end
        edges.append(last_end)
        out["prefix"], _ = _pattern(rows, int(rows[0, 0]), edges[0], halves)
        full = seen if (complete or opens) else seen - 1
        rep_b = full - 1 if full >= 1 else 0
        out["block"], out["kept"] = _pattern(rows, edges[rep_b], edges[rep_b + 1] if full >= 1 else end, halves)
        out["full"] = full
        if complete:
            out["head"], _ = _pattern(rows, last_end, end, halves)
        return out

    cur_complete = (pos.get("phase") or "") in ("backward", "optimizer") or \
        bool(((ph == "backward") | (ph == "optimizer"))[(ai >= start) & (ai < k)].any())
    cur = structure(fwd_idx, cur_complete) if len(fwd_idx) >= 2 else None
    prev, prev_step = None, None
    done = (ai >= 0) & (ai < start) & (ph == "forward")
    if done.any():
        ls = int(np.searchsorted(np.asarray(starts), int(ai[done].max()), side="right"))
        s0, s1 = starts[ls - 1], (starts[ls] if ls < len(starts) else start)
        pidx = np.flatnonzero((ai >= s0) & (ai < s1) & (ph == "forward"))
        if len(pidx) >= 2:
            prev, prev_step = structure(pidx, True), ls
    if cur is None and prev is None:
        return None

    def alloc_sizes(pattern):
        return [e[2] for e in pattern if e[0] == "alloc"]

    if cur is None or cur["complete"]:
        st = cur or prev
        m.n_blocks = max(st["seen"], 1)
        m.blocks_method = (f"{st['seen']} blocks counted in a complete forward of the history" if st["seen"] else
                           "no block structure in the frames: the whole forward is taken as the model")
        m.prefix, m.block, m.head, m.block_bytes_kept = st["prefix"], st["block"], st["head"], st["kept"]
        m.blocks_seen = st["seen"]
    else:
        m.blocks_seen = cur["seen"]
        cs, ps = alloc_sizes(cur["block"]), alloc_sizes(prev["block"]) if prev else []
        same = prev is not None and prev["seen"] >= 1 and cur["seen"] >= 1 and \
            (cs == ps if cur["full"] >= 1 else ps[:len(cs)] == cs)
        if same:
            # this step repeats the shapes of a complete one: its blocks, head and count are the model
            m.n_blocks = prev["seen"]
            m.blocks_method = f"{prev['seen']} blocks counted in the complete forward of step {prev_step}"
            m.prefix, m.block, m.head, m.block_bytes_kept = cur["prefix"], prev["block"], prev["head"], prev["kept"]
            ev.append(f"the rest of this step's forward repeats step {prev_step}'s (the same tensor sizes)")
        elif cur["seen"] == 0:
            m.block, m.block_bytes_kept = cur["block"], cur["kept"]
            n_p = pos.get("layers")
            if n_p:
                m.n_blocks = int(n_p)
                m.blocks_method = (f"no block seen complete in the frames: the forward so far is taken as block 1 "
                                   f"of {n_p} (the count from the parameters' tensor sizes; a lower bound)")
                m.extrapolated = True
            else:
                m.n_blocks = 1
                m.blocks_method = "no block structure in the frames: the forward so far is taken as the model"
            ev.append(m.blocks_method)
            return m
        else:
            m.prefix, m.block, m.block_bytes_kept = cur["prefix"], cur["block"], cur["kept"]
            seen = cur["seen"]
            if prev is not None and prev["seen"] >= 1:
                m.n_blocks = max(prev["seen"], seen)
                m.blocks_method = f"{prev['seen']} blocks counted in the complete forward of step {prev_step}"
                head_note = ("the part after the blocks is not counted (step "
                             f"{prev_step} had other tensor sizes)")
                m.after_blocks = {"bytes": None, "how": head_note}
            else:
                built = _count_blocks_built(snap, a)
                if built:
                    m.n_blocks = max(built, seen)
                    m.blocks_method = f"{built} blocks counted where the model built them (parameter frames)"
                else:
                    # the parameters' tensor sizes (without state told from them when it predates the recording)
                    n_p = pos.get("layers") if not m.state_exists or len(m.params) == int((live & (
                        cat == "parameters")).sum()) else None
                    if not n_p:
                        n_p, _ = block_count_from_parameters((np.asarray(m.params) + 511) // 512 * 512)
                    m.n_blocks = max(int(n_p or seen), seen)
                    m.blocks_method = (f"{m.n_blocks} blocks from the parameters' tensor sizes (the model's "
                                       "construction is not in the history)")
                m.head, m.after_blocks = _after_blocks(snap, a, k, m.block, m.params, m.n_blocks)
                head_note = m.after_blocks["how"]
            m.extrapolated = True
            ev.append(f"the OOM fell in block {seen} of the forward: blocks {seen}..{m.n_blocks} are assumed to "
                      f"repeat the recorded block; {head_note}; the backward runs op by op in reverse: each saved "
                      "tensor meets the gradient flowing back and makes one as large as it; each block's backward "
                      "creates its parameters' gradients")
            if cur["full"] < 1:
                ev.append("no block is complete yet: the block is what the first one holds so far (a lower bound)")
    ev.insert(0, f"blocks: {m.blocks_method}; one block keeps {format_bytes(m.block_bytes_kept)} for the backward")
    return m

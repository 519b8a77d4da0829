"""Memory what-if: a model of the training step's memory, built from the allocator history, in which
every OOM fix is applied and replayed through the caching-allocator model (issue 31).

The model (:func:`step_memory_model`), from the history up to the OOM:

- **steps and phases**: :func:`workbench.analysis.memory.steps.step_boundaries` and
  :func:`~workbench.analysis.memory.steps.event_phases` (forward, backward, optimizer, zero_grad).
- **blocks**: the forward's allocations are split into blocks by the module structure the Python frames
  name: the frame that calls the blocks (``for blk in self.blocks: x = blk(x)``) is in every block
  allocation, and a new block starts where the line inside the block's ``forward`` goes back to an
  earlier one (or where the ``module: blocks.N`` range of ``workbench.capture.modules`` changes). The
  number of blocks in the model: from a complete forward in the history; else from the construction of
  the blocks (parameters made under the same kind of loop, counted the same way); else from the
  parameter sizes (:func:`~workbench.analysis.memory.steps.block_count_from_parameters`).
- **static** memory: parameters, gradients, optimizer state (the optimizer creates its state in its first
  step: when the OOM came before it, the state is assumed, Adam-style, and made in the replay's first
  optimizer step), workspaces and other long-lived tensors.
- **per step**: inputs, the forward's prefix (embedding), every block's allocations (what a block keeps
  for the backward and the temporaries it frees), and what follows the blocks when a complete forward was
  seen. These scale with the batch.
- **growth across steps**: allocations made in an earlier step that are never freed and are not
  parameters, gradients or state, grouped by the frame that made them: a leak.

A counterfactual edits the model and replays two steps (forward, backward block by block in reverse,
optimizer step, zero_grad) through :class:`~workbench.analysis.memory.allocator_model.CachingAllocatorModel`
(or :class:`~workbench.analysis.memory.allocator_expandable.ExpandableSegmentsModel`) under the cap
(:func:`~workbench.analysis.memory.allocator_expandable.replay_capped`): the peak reserved bytes it needs and
whether it fits. When the OOM fell in the first step before the step completed, the unseen rest is
extrapolated: the remaining blocks repeat the recorded block, the backward allocates one transient per
tensor a block kept and frees the block's saved tensors in reverse, creating each block's gradients, and
the optimizer creates its state if it was not there. Each advice item states its assumptions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from workbench.analysis.memory.allocator_expandable import replay_capped
from workbench.analysis.memory.allocations import _INTERNAL, device_events, stack_features
from workbench.analysis.memory.steps import block_count_from_parameters, event_phases, step_boundaries
from workbench.units import format_bytes

__all__ = [
    "StepMemoryModel",
    "Change",
    "step_memory_model",
    "replay_change",
    "history_replay",
    "obtainable_bytes",
    "whatif_advice",
    "RECORDER_FIX_ADVICE",
    "recorder_fix_advice",
    "advice_mark",
    "advice_table",
]

# The advice id each fix of benchmarks/record_oom_whatif_h200.py checks, from the fix's ``change`` dict: a
# change that is only a batch size is ``batch``; otherwise each (key, value) of the change names its advice.
# None: no advice models it (the recorder runs it for the record). The one place this mapping lives.
RECORDER_FIX_ADVICE = {
    ("checkpointing", True): "checkpointing",
    ("precision", "bf16"): "bf16_autocast",
    ("alloc_conf", "expandable_segments:True"): "expandable_segments",
    ("alloc_conf", "expandable_segments:False,max_split_size_mb:64"): "max_split_size",
    ("alloc_conf", "expandable_segments:False"): None,  # turning expandable segments off: never advised
    ("optimizer", "sgd"): "optimizer_sgd",
    ("optimizer", "sgd_momentum"): "optimizer_sgd_momentum",
    ("optimizer", "adamw_foreach_off"): "optimizer_adam_foreach_off",
    ("optimizer", "adamw_fused"): "optimizer_adam_fused",
    ("optimizer", "adafactor"): None,  # factored state: not modelled
    ("optimizer", "adafactor_foreach_off"): None,
    ("zero_grad", "after_step"): "zero_grad_set_to_none",
    ("leak", False): "remove_leak",
    ("seq_lens", None): None,  # padding to one shape: not modelled
    ("cap_bytes", None): "bigger_gpu",
}


def recorder_fix_advice(change: dict) -> str | None:
    """The advice id a recorder fix's ``change`` checks (see :data:`RECORDER_FIX_ADVICE`); KeyError for a
    change the mapping does not know (the test that reads the recorder's FIX_CHANGES keeps them level)."""
    if change and set(change) <= {"batch_size", "batch_fraction"}:
        return "batch"
    ids = {RECORDER_FIX_ADVICE[(k, v)] for k, v in change.items()}
    return ids.pop() if len(ids) == 1 else None


# how cheap a change is (lower first among the ones that fit)
_COST = {"remove_leak": 0, "expandable_segments": 1, "max_split_size": 2, "zero_grad_set_to_none": 3,
         "optimizer_adam_fused": 4, "optimizer_adam_foreach_off": 5, "bf16_autocast": 6, "checkpointing": 7,
         "batch": 8, "optimizer_adam8bit": 9, "optimizer_sgd_momentum": 10, "optimizer_sgd": 11,
         "free_live": 12, "bigger_gpu": 20}

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


# --------------------------------------------------------------------------------------------------
# building the model from the history
# --------------------------------------------------------------------------------------------------

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


def _halves_mask(snap, sids: np.ndarray) -> np.ndarray:
    files = snap.frames["filename"].astype(str).to_numpy()
    names = snap.frames["name"].astype(str).to_numpy()
    hit = np.array([bool(_HALVES.search(f)) or bool(_HALVES_NAMES.search(nm)) for f, nm in zip(files, names)],
                   dtype=bool)
    out = np.zeros(len(sids), dtype=bool)
    for i, s in enumerate(sids):
        if s >= 0:
            out[i] = bool(hit[list(snap.stacks[int(s)])].any()) if len(snap.stacks[int(s)]) else False
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
    other = live & ~fixed_cat & ~is_leak & ((ai < start) | ((ai >= start) & (ph != "forward") & (ph == "")
                                                            & (ai < 0)))
    m.other = [int(x) for x in size[other]]
    # this step's inputs: made in the step outside any phase, before its forward, live
    fwd_idx = np.flatnonzero(fwd_in_step)
    first_fwd = int(ai[fwd_idx].min()) if len(fwd_idx) else k
    m.inputs = [int(x) for x in size[live & (ai >= start) & (ai < first_fwd) & (ph == "") & ~fixed_cat]]
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
        halves = _halves_mask(snap, sid[order])
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
                head_note = "the part after the blocks (final norm, head, loss) is not seen and not counted"
            m.extrapolated = True
            ev.append(f"the OOM fell in block {seen} of the forward: blocks {seen}..{m.n_blocks} are assumed to "
                      f"repeat the recorded block; {head_note}; the backward frees each block's saved tensors in "
                      "reverse with one transient as large as them, and creates the gradients")
            if cur["full"] < 1:
                ev.append("no block is complete yet: the block is what the first one holds so far (a lower bound)")
    ev.insert(0, f"blocks: {m.blocks_method}; one block keeps {format_bytes(m.block_bytes_kept)} for the backward")
    return m


# --------------------------------------------------------------------------------------------------
# the replay
# --------------------------------------------------------------------------------------------------

class _Events:
    def __init__(self):
        self.ev: list = []
        self.n = 0

    def alloc(self, size: int, label: str = "") -> int | None:
        if size <= 0:
            return None
        self.n += 1
        self.ev.append(("alloc", self.n, int(size), label))
        return self.n

    def free(self, key) -> None:
        if key is not None:
            self.ev.append(("free", key, 0))


_OPT = {  # states per parameter, bytes per state element / parameter element, temporaries
    "sgd": (0, 1.0, "none"), "sgd_momentum": (1, 1.0, "none"), "adam": (2, 1.0, "foreach"),
    "adam_fused": (2, 1.0, "none"), "adam_foreach_off": (2, 1.0, "single"), "adam8bit": (2, 0.25, "single"),
}


def _scaled(size: int, f: float, half: bool = False) -> int:
    s = size * f
    return int(s / 2 if half else s)


def build_events(m: StepMemoryModel, ch: Change) -> list:
    """The alloc/free events of ``ch.steps`` steps of the model with the change applied."""
    E = _Events()
    f = ch.batch_fraction
    if ch.optimizer is None:
        nstate, ratio, temps = m.states_per_param, 1.0, m.opt_temporaries
        keep_state = m.state_exists
    else:
        nstate, ratio, temps = _OPT[ch.optimizer]
        keep_state = m.state_exists and ch.optimizer in ("adam", "adam_fused", "adam_foreach_off") \
            and nstate == m.states_per_param
    params = [E.alloc(p, "parameters") for p in m.params]  # noqa: F841 (live throughout)
    state_keys = []
    if keep_state:
        state_keys = [E.alloc(s, "optimizer state") for s in m.state]
    for o in m.other:
        E.alloc(o, "other")
    grads: dict = {}
    grads_kept = m.grads_kept and not ch.zero_grad_set_to_none
    if grads_kept:  # gradients already there at the step's start (kept from the previous step)
        for i, g in enumerate(m.grads_live):
            grads[i] = E.alloc(g, "gradients")
    leaked = m.leak_live if ch.leaked_before is None else []
    if ch.remove_leak:
        leaked = []
    for x in leaked:  # what leaked before the OOM stays as it was, whatever the change
        E.alloc(x, "leak")
    if ch.leaked_before:
        E.alloc(ch.leaked_before, "leak")
    nb = max(m.n_blocks, 1)
    # parameters by block, for the gradients the backward creates (the rest: embedding/head)
    per_block = np.array_split(np.arange(len(m.params)), nb + 1) if m.params else [[] for _ in range(nb + 1)]
    bf16_copy = [int(sum(m.params[i] for i in grp) / 2) for grp in per_block] if ch.bf16 else [0] * (nb + 1)

    def run(pattern, tag):
        """Replay a forward pattern; returns {pattern id: (key, bytes)} of what it keeps for the backward."""
        loc = {}
        for op, j, size, half in pattern:
            if op == "alloc":
                loc[j] = (E.alloc(_scaled(size, f, half and ch.bf16), tag), _scaled(size, f, half and ch.bf16))
            else:
                key = loc.pop(j, (None, 0))[0]
                E.free(key)
        return loc

    for _s in range(ch.steps):
        inputs = [E.alloc(_scaled(x, f), "inputs") for x in m.inputs]
        casts = [E.alloc(bf16_copy[-1], "bf16 weight copies")]
        pre = run(m.prefix, "activations")
        saved: list = []  # per block: dict of kept keys
        outs: list = []
        for b in range(nb):
            c = E.alloc(bf16_copy[b], "bf16 weight copies")
            kept = run(m.block, "activations")
            if ch.checkpointing and kept:
                last = max(kept)
                for j, (key, _) in list(kept.items()):
                    if j != last:
                        E.free(key)
                outs.append((kept[last][0], c))
                saved.append({})
            else:
                saved.append(kept)
                outs.append((None, c))
        head = run(m.head, "activations")
        if m.leak_per_step and not ch.remove_leak:
            for x in m.leak_per_step:
                E.alloc(_scaled(x, f, ch.bf16) if m.leak_scales else x, "leak")  # forward outputs: bf16 halves
        # backward: the head's saved tensors go first
        for key, _ in head.values():
            E.free(key)
        if nb:  # the last block's output (checkpointing: kept for the head) goes with the head's backward
            E.free(outs[nb - 1][0])
        for b in reversed(range(nb)):
            kept = saved[b]
            if ch.checkpointing:
                kept = run(m.block, "recomputed activations")
            tmp = [E.alloc(sz, "backward transient") for _, sz in kept.values()]
            if not grads_kept:
                for i in per_block[b + 1] if b + 1 < len(per_block) else []:
                    if i not in grads:
                        grads[i] = E.alloc(m.params[i], "gradients")
            for key, _ in kept.values():
                E.free(key)
            for t in tmp:
                E.free(t)
            E.free(outs[b][1])  # the block's bf16 weight copies
            if b >= 1:  # its input, the previous block's output (checkpointing), is no longer needed
                E.free(outs[b - 1][0])
        for key, _ in pre.values():
            E.free(key)
        for i in range(len(m.params)):
            if i not in grads:
                grads[i] = E.alloc(m.params[i], "gradients")
        E.free(casts[0])
        for x in inputs:
            E.free(x)
        # the optimizer step
        if nstate and not state_keys:
            state_keys = [E.alloc(int(p * ratio), "optimizer state") for p in m.params for _ in range(nstate)]
        if nstate and temps == "foreach":
            t = [E.alloc(p, "optimizer temporaries") for p in m.params]
            for x in t:
                E.free(x)
        elif nstate and temps == "single":
            for p in m.params:
                E.free(E.alloc(p, "optimizer temporaries"))
        # zero_grad
        if not grads_kept:
            for key in grads.values():
                E.free(key)
            grads = {}
    return E.ev


def replay_change(m: StepMemoryModel, ch: Change, expandable: bool) -> dict:
    """Replay the model with a change: ``{fits, peak_bytes (reserved), peak_allocated_bytes, oom_label}``;
    the peak is the run's (uncapped) need, ``fits`` the capped run's outcome."""
    exp = expandable if ch.expandable is None else ch.expandable
    evs = build_events(m, ch)
    mss = None if exp else ch.max_split_size
    free_run = replay_capped(evs, None, exp, mss)
    cap = m.cap_bytes if ch.cap else None
    capped = replay_capped(evs, cap, exp, mss) if cap else free_run
    run = capped if capped.fits else free_run  # what fits under the cap peaks there (cached memory released)
    return {"fits": capped.fits, "peak_bytes": int(run.peak_reserved_bytes),
            "peak_allocated_bytes": int(run.peak_allocated_bytes), "oom_label": capped.oom_label,
            "need_bytes": int(free_run.peak_reserved_bytes)}


def history_replay(analysis, rep, expandable: bool, max_split_size: int | None = None,
                   cap: bool = True) -> dict:
    """Replay the recorded history up to and including the failing request: what was live before the window
    first, then every allocation and free in order. ``{fits, peak_bytes}``."""
    a = analysis.allocs
    k = rep.index
    ai = a["alloc_index"].to_numpy()
    fi = a["free_index"].to_numpy()
    size = a["size_bytes"].to_numpy()
    evs = []
    pre = np.flatnonzero((ai < 0) & (fi > 0))
    for j in pre:
        evs.append((-1, 0, ("alloc", int(j), int(size[j]))))
    for j in np.flatnonzero((ai >= 0) & (ai < k)):
        evs.append((int(ai[j]), 1, ("alloc", int(j), int(size[j]))))
    for j in np.flatnonzero((fi < k) & ((ai >= 0) | (ai < 0))):
        if ai[j] < 0 and fi[j] <= 0:
            continue
        evs.append((int(fi[j]), 0, ("free", int(j), 0)))
    evs.sort(key=lambda e: (e[0], e[1]))
    seq = [e[2] for e in evs] + [("alloc", "request", int(rep.requested_bytes), "the failing request")]
    r = replay_capped(seq, rep.cap_bytes if cap else None, expandable, None if expandable else max_split_size)
    return {"fits": r.fits, "peak_bytes": int(r.peak_reserved_bytes)}


# --------------------------------------------------------------------------------------------------
# the advice
# --------------------------------------------------------------------------------------------------

def obtainable_bytes(rep) -> int:
    """What the process may hold in all: the cap when one is known; else, when the device reported less free
    memory than the request, reserved + that free memory; else reserved at the OOM (a cap not recorded)."""
    if rep.cap_bytes:
        return int(rep.cap_bytes)
    free = rep.device_free_bytes
    if free is not None and 0 <= free < rep.requested_bytes:
        return int(rep.reserved_bytes + free)
    return int(rep.reserved_bytes)


def _item(id_: str, text: str, change: dict, peak: int, fixed: int, cap: int | None, fits: bool,
          evidence: list | None = None, **extra) -> dict:
    margin = (cap - fixed) if cap is not None else None
    out = {"id": id_, "text": text,
           "what_if": {"change": change, "peak_bytes": int(peak), "peak_if_fixed_bytes": int(fixed),
                       "cap_bytes": cap, "fits": bool(fits), "margin_bytes": margin}}
    out.update(extra)
    out["evidence"] = list(evidence or [])
    return out


def _batch_search(m: StepMemoryModel, exp: bool, base: Change) -> float:
    """The largest batch fraction whose replay fits (0 when even a tiny batch does not)."""
    if replay_change(m, replace(base, batch_fraction=1.0), exp)["fits"]:
        return 1.0
    lo, hi = 0.0, 1.0
    if not replay_change(m, replace(base, batch_fraction=1e-3), exp)["fits"]:
        return 0.0
    lo = 1e-3
    for _ in range(14):
        mid = (lo + hi) / 2
        if replay_change(m, replace(base, batch_fraction=mid), exp)["fits"]:
            lo = mid
        else:
            hi = mid
    return lo


def _leak_returns(m: StepMemoryModel, exp: bool, f: float, change: Change | None = None) -> int | None:
    """The step (1-based, counted as the recording counts them) at which the OOM comes back at batch x f
    (with ``change`` applied): one step is replayed with more and more already leaked; a step fits while
    the leak so far is below the largest amount that still fits. None: no leak."""
    per = sum(m.leak_per_step) * (f if m.leak_scales else 1.0)
    if change is not None and change.bf16 and m.leak_scales:
        per /= 2  # the leaked tensors are forward outputs: halved under autocast (logits of a linear)
    if per <= 0:
        return None
    base = replace(change or Change(), batch_fraction=f, steps=1, leaked_before=0)
    if not replay_change(m, base, exp)["fits"]:
        return 1
    lo, hi = 0, max(int(m.cap_bytes or 0), 1)
    for _ in range(40):
        if hi - lo <= max(per / 64, 1):
            break
        mid = (lo + hi) // 2
        if replay_change(m, replace(base, leaked_before=mid), exp)["fits"]:
            lo = mid
        else:
            hi = mid
    return int(lo // per) + 2


def whatif_advice(analysis, rep, batch_size: int | None = None) -> tuple[list, StepMemoryModel | None]:
    """The advice items of an OOM: each fix replayed through the allocator model. Returns (items, model).

    A history the step model cannot follow (an inconsistent or hostile file) gets the advice of a history
    without a training step, the reason in each item's evidence: the post-mortem never fails on it."""
    try:
        return _whatif_advice(analysis, rep, batch_size, use_model=True)
    except (ValueError, IndexError, KeyError, ZeroDivisionError, AttributeError) as exc:
        items, _ = _whatif_advice(analysis, rep, batch_size, use_model=False)
        for it in items:
            it["evidence"].append(f"the step model could not follow this history ({type(exc).__name__}: "
                                  f"{str(exc)[:120]}): no fix of the step was replayed")
        return items, None


def _whatif_advice(analysis, rep, batch_size, use_model: bool) -> tuple[list, StepMemoryModel | None]:
    fb = format_bytes
    st = rep.allocator_settings or {}
    exp_on = bool(st.get("expandable_segments"))
    mss = st.get("max_split_size_bytes")
    cap = obtainable_bytes(rep)
    rep_cap = rep
    if cap != rep.cap_bytes:
        rep_cap = replace(rep, cap_bytes=cap) if hasattr(rep, "__dataclass_fields__") else rep
    m = step_memory_model(analysis, rep_cap, batch_size) if use_model else None
    items: list = []
    cannot: list = []
    frag = rep.cause == "fragmentation"
    if m is None:
        need = rep.reserved_bytes + max(rep.requested_bytes - rep.free_in_reserved_bytes, 0) \
            if not frag else rep.reserved_bytes + rep.requested_bytes
        if frag:
            _frag_items(analysis, rep_cap, items, cannot, exp_on, mss, cap, need, None)
        else:
            short = rep.shortfall_bytes
            items.append(_item(
                "free_live",
                f"The request for {fb(rep.requested_bytes)} exceeds all free reserved memory "
                f"({fb(rep.free_in_reserved_bytes)})"
                + (f" plus the headroom under the {fb(rep.cap_bytes)} cap" if rep.cap_bytes else "")
                + f": at least {fb(short)} of live tensors must go (live: {fb(rep.allocated_bytes)}). "
                "This is a capacity problem: allocator settings (expandable segments, max_split_size) cannot help.",
                {"free_live_bytes": int(short)}, need, need - short, cap, True,
                ["no training step in the history: the shortfall is the request less what is free in reserved "
                 "memory and under the cap"]))
        items.append(_item("bigger_gpu", f"A device (or cap) of at least {fb(need)} serves this request.",
                           {"cap_bytes": None}, need, need, cap, True))
        return _with_cap_note(rep, cap, _order(items, cannot)), None

    exp = exp_on
    base = replay_change(m, Change(), exp)
    peak = base["peak_bytes"]
    if base["fits"]:
        m.evidence.append(
            f"the step model, replayed as it was, fits ({format_bytes(peak)} against {format_bytes(cap)}): what made "
            "this OOM is outside the model (tensors of other shapes in earlier steps, fragmentation, memory "
            "outside the steps); the fixes below are replayed on the step as modelled")
    ev0 = list(m.evidence)
    capt = fb(cap) if cap else "reserved"

    def add(id_, ch: Change, text, change, evidence=(), label=None, **extra):
        r = replay_change(m, ch, exp)
        fixed = r["peak_bytes"]
        if m.leak_frames and id_ != "remove_leak":
            back = _leak_returns(m, exp, ch.batch_fraction, ch)
            cannot.append(_item(id_, f"{label or text.split(':')[0]} leaves the leak: the OOM returns at step "
                                f"{back} (now step {m.step}).", change, peak, fixed, cap, False,
                                ev0 + list(evidence), oom_returns_at_step=back, **extra))
            return r
        if not r["fits"] and fixed >= peak * 0.995:
            cannot.append(_item(id_, f"{label or text.split(':')[0]} cannot fix this: the peak stays at {fb(fixed)}"
                                + (f" against the {capt} cap" if cap else "") + ".",
                                change, peak, fixed, cap, False, ev0 + list(evidence), **extra))
            return r
        items.append(_item(id_, f"{text}.", change, peak, fixed, cap,
                           r["fits"], ev0 + list(evidence), **extra))
        return r

    static = m.params_bytes + m.state_bytes + m.params_bytes  # parameters + gradients + state
    # the leak first: it is the cause when it is there
    if m.leak_frames:
        lf = m.leak_frames[0]
        add("remove_leak", Change(remove_leak=True),
            f"Stop keeping {fb(lf['bytes_per_step'])} every step alive at {lf['frame']} "
            f"({lf['count']} tensors over {lf['steps']} steps, never freed: a leak; e.g. store .item() or "
            ".cpu() of what you keep)", {"remove_leak": True}, label="Removing the leak")
    # batch
    bf = _batch_search(m, exp, Change(remove_leak=False))
    bs = batch_size
    if m.leak_frames:
        half = _leak_returns(m, exp, 0.5)
        now = _leak_returns(m, exp, 1.0)
        m.evidence.append(f"the leak replayed at the batch as it was: the OOM at step {now} (recorded: step {m.step})")
        ch = Change(batch_fraction=0.5)
        r = replay_change(m, replace(ch, remove_leak=False), exp)
        cannot.append(_item(
            "batch", f"A smaller batch cannot fix a leak, it only delays the OOM: at half the batch it returns at "
            f"step {half} (now step {m.step}).", {"batch_fraction": 0.5}, peak, r["peak_bytes"], cap, False,
            ev0 + ["leak growth scales with the batch" if m.leak_scales else "leak growth does not scale with the batch",
                   f"replayed: at batch x 1 the OOM step is {now}"],
            batch_fraction=None, oom_returns_at_step=half))
    elif bf <= 0:
        need = static + sum(m.other)
        cannot.append(_item(
            "batch", f"A smaller batch cannot fix this: parameters + gradients + optimizer state need "
            f"{fb(need)} against the {capt} cap" + (" (state assumed Adam-style: 2 x the parameters)" if m.state_assumed
                                               else "") + ".",
            {"batch_fraction": 0.0}, peak, replay_change(m, Change(batch_fraction=1e-3), exp)["peak_bytes"], cap,
            False, ev0, batch_fraction=0.0))
    elif bf < 1:
        largest = math.floor(bs * bf + 1e-9) if bs else None
        while bs and largest is not None and largest + 1 < bs and \
                replay_change(m, Change(batch_fraction=(largest + 1) / bs), exp)["fits"]:
            largest += 1
        if bs and largest:
            bf = max(bf, largest / bs)
        frac = (largest / bs) if bs and largest else bf
        r = replay_change(m, Change(batch_fraction=frac), exp)
        txt = (f"Reduce the batch to {100 * frac:.1f}% of it (by at least {math.ceil(100 * (1 - frac))}%)"
               + (f"; with batch {bs}, the largest that fits is about {largest}" if largest is not None else ""))
        items.append(_item("batch", f"{txt}.",
                           {"batch_fraction": round(frac, 4), **({"batch_size": largest} if largest else {})},
                           peak, r["peak_bytes"], cap, r["fits"] and frac > 0,
                           ev0 + ["activations and inputs scale with the batch; parameters, gradients and "
                                  "optimizer state do not"], batch_fraction=round(bf, 4), largest_batch=largest))
    if m.block_bytes_kept and m.n_blocks >= 2:
        add("checkpointing", Change(checkpointing=True),
            "Checkpoint each block (torch.utils.checkpoint): only the block inputs are kept through the forward "
            "and one block's activations are recomputed in the backward", {"checkpointing": True},
            label="Checkpointing each block")
    add("bf16_autocast", Change(bf16=True),
        "Run the forward under torch.autocast(dtype=torch.bfloat16): linear/matmul outputs halve; parameters, "
        "gradients, fp32 optimizer state and layer-norm/softmax outputs stay fp32, and bf16 copies of the "
        "weights are kept for the backward", {"precision": "bf16"}, label="bf16 autocast",
        evidence=["tensors made under linear/conv/matmul frames halve; all others keep their size"])
    if m.grads_kept:
        add("zero_grad_set_to_none", Change(zero_grad_set_to_none=True),
            f"Call optimizer.zero_grad(set_to_none=True) right after optimizer.step(): the "
            f"{fb(sum(m.grads_live))} of gradients kept from the last step are then freed before the forward",
            {"zero_grad": "set_to_none after step"}, label="zero_grad(set_to_none=True) after the step")
    if m.states_per_param:
        if m.opt_temporaries == "foreach":
            add("optimizer_adam_fused", Change(optimizer="adam_fused"),
                "Use the fused optimizer (e.g. AdamW(fused=True)): the same state, no parameter-sized temporaries",
                {"optimizer": "adamw_fused"}, label="A fused optimizer (AdamW(fused=True))")
            add("optimizer_adam_foreach_off", Change(optimizer="adam_foreach_off"),
                "Use foreach=False: one parameter's temporaries at a time instead of all at once",
                {"optimizer": "adamw_foreach_off"}, label="The optimizer with foreach=False")
        add("optimizer_adam8bit", Change(optimizer="adam8bit"),
            "Use an 8-bit Adam (bitsandbytes): 2 states at 1 byte per element", {"optimizer": "adam8bit"},
            label="An 8-bit Adam")
        if m.states_per_param >= 2:
            add("optimizer_sgd_momentum", Change(optimizer="sgd_momentum"),
                "Use SGD with momentum: 1 state per parameter instead of 2", {"optimizer": "sgd_momentum"},
                label="SGD with momentum")
        add("optimizer_sgd", Change(optimizer="sgd"), "Use plain SGD: no optimizer state", {"optimizer": "sgd"},
            label="Plain SGD")
    if frag:
        _frag_items(analysis, rep_cap, items, cannot, exp_on, mss, cap, peak, m)
    # what the step needs: a bigger GPU
    items.append(_item("bigger_gpu", f"A device (or cap) of at least {fb(peak)} runs the step as it is"
                       + (f" ({fb(peak - cap)} more than the cap)" if cap else "") + ".",
                       {"cap_bytes": None}, peak, peak, cap, True, ev0))
    if not frag:
        cannot.append(_item(
            "allocator_settings",
            f"This is a capacity problem (the request for {fb(rep.requested_bytes)} exceeds all free reserved "
            f"memory, {fb(rep.free_in_reserved_bytes)}, plus the headroom under the cap: at least "
            f"{fb(rep.shortfall_bytes)} of live tensors must go): allocator settings (expandable segments, "
            "max_split_size) cannot help.", {}, peak, peak, cap, False, []))
    return _with_cap_note(rep, cap, _order(items, cannot)), m


def _with_cap_note(rep, cap: int, items: list) -> list:
    if not rep.cap_bytes:
        note = (f"no cap recorded (no capture_oom sidecar, no 'allowed' in torch's message): what may be held is "
                f"taken as {format_bytes(cap)}, reserved at the OOM" + (" plus the device's free memory"
                                                                      if cap != rep.reserved_bytes else ""))
        for it in items:
            it["evidence"].append(note)
    return items


def _frag_items(analysis, rep, items, cannot, exp_on, mss, cap, peak, m) -> None:
    fb = format_bytes
    ev = [f"{fb(rep.free_in_reserved_bytes)} is free inside reserved segments but the largest hole is "
          f"{fb(rep.largest_free_block_bytes)}, smaller than the {fb(rep.requested_bytes)} requested",
          "the recorded history is replayed with the setting, then the request"]
    if not exp_on:
        h = history_replay(analysis, rep, True)
        fits = h["fits"] and (m is None or replay_change(m, Change(expandable=True), True)["fits"])
        items.append(_item(
            "expandable_segments",
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the first CUDA call: "
            f"{fb(rep.free_in_reserved_bytes)} is free inside reserved segments but the largest hole is "
            f"{fb(rep.largest_free_block_bytes)}, smaller than the {fb(rep.requested_bytes)} requested; expandable "
            "segments map memory into one growing segment instead of leaving holes.",
            {"alloc_conf": "expandable_segments:True"}, peak, h["peak_bytes"], cap, fits, ev))
        if mss is None:
            val = max(2, min(128, 2 ** int(math.log2(max(rep.requested_bytes // 2**20, 2) - 1))))
            h2 = history_replay(analysis, rep, False, val * 2**20)
            fits2 = h2["fits"] and (m is None or replay_change(m, Change(max_split_size=val * 2**20), False)["fits"])
            items.append(_item(
                "max_split_size",
                f"Or cap splitting with PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{val} so big blocks are not "
                "carved up by small requests.",
                {"alloc_conf": f"max_split_size_mb:{val}"}, peak, h2["peak_bytes"], cap, fits2, ev))
    else:
        cannot.append(_item(
            "expandable_segments",
            f"expandable_segments is already on, yet {fb(rep.free_in_reserved_bytes)} free inside reserved memory "
            f"is in holes no larger than {fb(rep.largest_free_block_bytes)}: free or reorder the tensors that sit "
            "between the holes, or call torch.cuda.empty_cache() between phases that allocate very different sizes.",
            {}, peak, peak, cap, False, ev))
    if mss is not None:
        cannot.append(_item("max_split_size", f"max_split_size is already {fb(mss)}: blocks larger than that are "
                            "not split.", {}, peak, peak, cap, False, ev))


def _order(items: list, cannot: list) -> list:
    """The changes that fit first, cheapest first; then the ones that do not fit by peak; then those that
    cannot help, each once."""
    fit = sorted([i for i in items if i["what_if"]["fits"]], key=lambda i: (_COST.get(i["id"], 50)))
    nofit = sorted([i for i in items if not i["what_if"]["fits"]],
                   key=lambda i: i["what_if"]["peak_if_fixed_bytes"])
    seen, once = set(), []
    for i in cannot:
        if i["id"] not in seen:
            seen.add(i["id"])
            once.append(i)
    return fit + nofit + once


def advice_mark(item: dict) -> str:
    """``fits`` / ``does not fit`` / ``cannot help`` with the peak against the cap, for one advice item."""
    w = item.get("what_if") or {}
    cap = w.get("cap_bytes")
    fixed = w.get("peak_if_fixed_bytes")
    if w.get("fits"):
        mark = "fits"
    elif fixed is not None and w.get("peak_bytes") is not None and fixed >= w["peak_bytes"] * 0.995:
        mark = "cannot help"
    else:
        mark = "does not fit"
    if fixed is None:
        return mark
    if item.get("id") == "bigger_gpu":
        return f"needs {format_bytes(fixed)}" + (f" vs cap {format_bytes(cap)}" if cap else "")
    return f"{mark}: peak {format_bytes(fixed)}" + (f" vs cap {format_bytes(cap)}" if cap else "")


def advice_table(items: list) -> list:
    """Rows (dicts) for a table of advice items: fits, advice, peak if fixed, cap, margin."""
    fb = format_bytes
    rows = []
    for it in items:
        w = it.get("what_if") or {}
        rows.append({"fits": "yes" if w.get("fits") else "no", "advice": it.get("text", ""),
                     "peak if fixed": fb(w.get("peak_if_fixed_bytes")) if w.get("peak_if_fixed_bytes") is not None
                     else "", "cap": fb(w["cap_bytes"]) if w.get("cap_bytes") else "",
                     "margin": fb(w["margin_bytes"]) if w.get("margin_bytes") is not None else ""})
    return rows

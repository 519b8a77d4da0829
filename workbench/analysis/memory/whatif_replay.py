"""The memory what-if's replay: a :class:`~workbench.analysis.memory.whatif_model.Change` applied to the
step model, written out as two steps of alloc/free events (:func:`build_events`) and replayed under the
cap through the caching-allocator model (:func:`replay_change`), or the recorded history replayed with
other allocator settings (:func:`history_replay`). See :mod:`workbench.analysis.memory.whatif`."""

from __future__ import annotations

import numpy as np

from workbench.analysis.memory.allocator_expandable import replay_capped
from workbench.analysis.memory.whatif_model import Change, StepMemoryModel, recorded_events

__all__ = ["build_events", "replay_change", "history_replay", "replay_recorded"]


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


def _history_events(m: StepMemoryModel, ch: Change) -> list:
    """The recorded history (steps of different shapes) at batch x f, then the rest of the OOM's step: its live
    tensors are freed in reverse, each after a transient as large as it (the backward), the gradients made, the
    optimizer's state (first step) and temporaries, zero_grad."""
    f = ch.batch_fraction
    E = _Events()
    for i, s in enumerate(m.predating_segments):
        E.ev.append(("segment", f"predating {i}", int(s)))
    key = {}
    for op, j, size, scales in m.history:
        if op == "alloc":
            key[j] = E.alloc(_scaled(size, f) if scales else size, "recorded")
        else:
            E.free(key.pop(j, None))
    grads = []
    for j in reversed(m.history_live):
        size, scales = m.history_sizes[j]
        t = E.alloc(_scaled(size, f) if scales else size, "backward transient")
        E.free(key.pop(j, None))
        E.free(t)
    if not m.grads_kept:
        grads = [E.alloc(p, "gradients") for p in m.params]
    if m.states_per_param and not m.state_exists:
        for p in m.params:
            for _ in range(m.states_per_param):
                E.alloc(p, "optimizer state")
    if m.states_per_param and m.opt_temporaries == "foreach":
        t = [E.alloc(p, "optimizer temporaries") for p in m.params]
        for x in t:
            E.free(x)
    elif m.states_per_param and m.opt_temporaries == "single":
        for p in m.params:
            E.free(E.alloc(p, "optimizer temporaries"))
    for g in grads:
        E.free(g)
    return E.ev


def _history_change(ch: Change) -> bool:
    """Whether a change leaves the recorded steps as they were but for the batch, the allocator and the cap."""
    return not (ch.checkpointing or ch.bf16 or ch.optimizer is not None or ch.zero_grad_set_to_none
                or ch.remove_leak or ch.leaked_before is not None)


def build_events(m: StepMemoryModel, ch: Change) -> list:
    """The alloc/free events of ``ch.steps`` steps of the model with the change applied (steps of different
    shapes: the recorded history, then the rest of the OOM's step, see :func:`_history_events`)."""
    if m.history and _history_change(ch):
        return _history_events(m, ch)
    E = _Events()
    f = ch.batch_fraction
    if ch.optimizer is None:
        nstate, ratio, temps = m.states_per_param, 1.0, m.opt_temporaries
        keep_state = m.state_exists
    else:
        nstate, ratio, temps = _OPT[ch.optimizer]
        keep_state = m.state_exists and ch.optimizer in ("adam", "adam_fused", "adam_foreach_off") \
            and nstate == m.states_per_param
    for i, s in enumerate(m.predating_segments):  # cached before the history: the static tensors land there
        E.ev.append(("segment", f"predating {i}", int(s)))
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

    def run_no_grad(pattern, tag):
        """A checkpointed block's forward (autograd saves nothing): a tensor the recorded forward kept for
        the backward lives only until the next op has made its output (the op that reads it); the block's
        output stays, as the next block's input. Returns {pattern id: (key, bytes)} of the output."""
        kept_ids = set(j for op, j, _, _ in pattern if op == "alloc") - set(j for op, j, _, _ in pattern
                                                                             if op == "free")
        last = max(kept_ids) if kept_ids else None
        loc, waiting = {}, []
        for op, j, size, half in pattern:
            if op == "alloc":
                sz = _scaled(size, f, half and ch.bf16)
                loc[j] = (E.alloc(sz, tag), sz)
                for w in waiting:  # read by the op that made this one: no longer needed
                    E.free(loc.pop(w, (None, 0))[0])
                waiting = [j] if j in kept_ids and j != last else []
            else:
                E.free(loc.pop(j, (None, 0))[0])
        for w in waiting:
            E.free(loc.pop(w, (None, 0))[0])
        return {j: v for j, v in loc.items() if j == last}

    for _s in range(ch.steps):
        inputs = [E.alloc(_scaled(x, f), "inputs") for x in m.inputs]
        casts = [E.alloc(bf16_copy[-1], "bf16 weight copies")]
        pre = run(m.prefix, "activations")
        saved: list = []  # per block: dict of kept keys
        outs: list = []
        for b in range(nb):
            c = E.alloc(bf16_copy[b], "bf16 weight copies")
            kept = run_no_grad(m.block, "activations") if ch.checkpointing else run(m.block, "activations")
            if ch.checkpointing and kept:
                last = max(kept)
                outs.append((kept[last][0], c))
                saved.append({})
            else:
                saved.append(kept)
                outs.append((None, c))
        head = run(m.head, "activations")
        # what one step leaks is made here (forward outputs: bf16 halves them); with the leak removed the
        # tensors are still made, and go with the step's last reference to them, at the step's end
        step_leak = [E.alloc(_scaled(x, f, ch.bf16) if m.leak_scales else x,
                             "leak" if not ch.remove_leak else "activations") for x in m.leak_per_step]
        # backward, op by op in reverse: each saved tensor (the last first) meets the gradient flowing back;
        # the gradient of what it was made from (as large as it) is made while the one flowing in and the
        # tensor are still there, then both go. It starts with the gradient of the forward's last tensor.
        flow = [None]

        def back(kept: dict, make_grads=None) -> None:
            for n, (key, sz) in enumerate(reversed(list(kept.values()))):
                g = E.alloc(sz, "backward transient")
                if n == 0 and make_grads is not None:
                    make_grads()
                E.free(flow[0])
                flow[0] = g
                E.free(key)

        last = list(head.values()) or ([] if not saved or ch.checkpointing else list(saved[-1].values()))
        if last:
            flow[0] = E.alloc(last[-1][1], "backward transient")
        back(head)
        if nb:  # the last block's output (checkpointing: kept for the head) goes with the head's backward
            E.free(outs[nb - 1][0])
        for b in reversed(range(nb)):
            kept = saved[b]
            if ch.checkpointing:
                kept = run(m.block, "recomputed activations")

            def block_grads(b=b):
                if not grads_kept:
                    for i in per_block[b + 1] if b + 1 < len(per_block) else []:
                        if i not in grads:
                            grads[i] = E.alloc(m.params[i], "gradients")
            back(kept, block_grads)
            if not kept:
                block_grads()
            E.free(outs[b][1])  # the block's bf16 weight copies
            if b >= 1:  # its input, the previous block's output (checkpointing), is no longer needed
                E.free(outs[b - 1][0])
        for key, _ in pre.values():
            E.free(key)
        E.free(flow[0])
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
        if ch.remove_leak:
            for x in step_leak:
                E.free(x)
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


def _recorded_sequence(analysis, k: int) -> list:
    a = analysis.allocs
    size = a["size_bytes"].to_numpy()
    return [(op, j, int(size[j]) if op == "alloc" else 0) for op, j in recorded_events(a, k)]


def history_replay(analysis, rep, expandable: bool, max_split_size: int | None = None,
                   cap: bool = True) -> dict:
    """Replay the recorded history up to and including the failing request: what was live before the window
    first, then every allocation and free in order. ``{fits, peak_bytes}``."""
    seq = _recorded_sequence(analysis, rep.index)
    seq += [("alloc", "request", int(rep.requested_bytes), "the failing request")]
    r = replay_capped(seq, rep.cap_bytes if cap else None, expandable, None if expandable else max_split_size)
    return {"fits": r.fits, "peak_bytes": int(r.peak_reserved_bytes)}


def replay_recorded(analysis, cap_bytes: int | None = None, expandable: bool = False,
                    max_split_size: int | None = None):
    """The whole recorded history (every allocation and free torch recorded, what was live before it first)
    replayed through the allocator model with these settings: a
    :class:`~workbench.analysis.memory.allocator_expandable.CappedReplay` (``fits``, ``peak_reserved_bytes``:
    what ``torch.cuda.max_memory_reserved`` would say, ``peak_allocated_bytes``). Replaying a run's own
    history with the run's settings checks the allocator model alone against torch's peaks."""
    a = analysis.allocs
    end = int(max(a["alloc_index"].max(), a["free_index"].max(), -1)) + 1 if len(a) else 0
    return replay_capped(_recorded_sequence(analysis, end), cap_bytes, expandable,
                         None if expandable else max_split_size)

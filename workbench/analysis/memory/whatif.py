"""Memory what-if: a model of the training step's memory, built from the allocator history, in which
every OOM fix is applied and replayed through the caching-allocator model (issue 31). The advice is here; the
model is in ``whatif_model.py``, the replay in ``whatif_replay.py``.

The model (:func:`~workbench.analysis.memory.whatif_model.step_memory_model`), from the history up to the OOM:

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
- **segments that predate the recording** (a warm-up before the history began) start the replay cached.
- **steps of different shapes**: the recorded history is kept and replayed as it was (batch, allocator
  settings and cap changes), then the rest of the OOM's step.

A counterfactual edits the model and replays two steps (forward, backward block by block in reverse,
optimizer step, zero_grad) through :class:`~workbench.analysis.memory.allocator_model.CachingAllocatorModel`
(or :class:`~workbench.analysis.memory.allocator_expandable.ExpandableSegmentsModel`) under the cap
(:func:`~workbench.analysis.memory.allocator_expandable.replay_capped`): the peak reserved bytes it needs and
whether it fits. When the OOM fell in the first step before the step completed, the unseen rest is
extrapolated: the remaining blocks repeat the recorded block, the part after the blocks (final norm, head,
loss) is estimated from the parameters' sizes when they give its shapes (``StepMemoryModel.after_blocks``), the
backward runs op by op in reverse (each saved tensor, the last first, makes a gradient as large as it while
the one flowing back is there, then both go; each block's backward creates its parameters' gradients), and
the optimizer creates its state if it was not there. Each advice item states its assumptions.
"""

from __future__ import annotations

import math
from dataclasses import replace

from workbench.analysis.memory.whatif_model import Change, StepMemoryModel, step_memory_model
from workbench.analysis.memory.whatif_replay import history_replay, replay_change
from workbench.units import format_bytes

__all__ = [
    "obtainable_bytes",
    "whatif_advice",
    "RECORDER_FIX_ADVICE",
    "recorder_fix_advice",
    "advice_mark",
    "advice_table",
    "ADVICE_FIX_CODE",
    "advice_fix_code",
    "unseen_note",
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
    out["fix_code"] = advice_fix_code(id_, change)
    return out


# Each fix as one line a user can paste (``fix_code`` of an advice item; the panel and the report show it
# with a copy button). ``{alloc_conf}`` / ``{batch}``: from the fix's change.
ADVICE_FIX_CODE = {
    "remove_leak": "kept.append(loss.item())  # keep numbers (.item()) or .detach().cpu() copies, not tensors",
    "expandable_segments": 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "{alloc_conf}"  # before the first CUDA call',
    "max_split_size": 'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "{alloc_conf}"  # before the first CUDA call',
    "zero_grad_set_to_none": "optimizer.zero_grad(set_to_none=True)  # right after optimizer.step()",
    "optimizer_adam_fused": "optimizer = torch.optim.AdamW(model.parameters(), fused=True)",
    "optimizer_adam_foreach_off": "optimizer = torch.optim.AdamW(model.parameters(), foreach=False)",
    "optimizer_adam8bit": "optimizer = bitsandbytes.optim.AdamW8bit(model.parameters())",
    "optimizer_sgd_momentum": "optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)",
    "optimizer_sgd": "optimizer = torch.optim.SGD(model.parameters(), lr=lr)",
    "bf16_autocast": 'with torch.autocast("cuda", dtype=torch.bfloat16):  # around the forward and the loss',
    "checkpointing": "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # for each block",
    "batch": "DataLoader(dataset, batch_size={batch})",
    "free_live": "del tensor  # drop the references the step no longer needs",
}


def advice_fix_code(id_: str, change: dict | None) -> str:
    """The fix of advice ``id_`` as one line of code (:data:`ADVICE_FIX_CODE`); empty for advice without
    one (a bigger GPU, allocator settings that cannot help)."""
    ch = change or {}
    code = ADVICE_FIX_CODE.get(id_, "")
    if "{alloc_conf}" in code and not ch.get("alloc_conf"):
        return ""
    if id_ == "batch":
        if ch.get("batch_size"):
            batch = str(ch["batch_size"])
        elif ch.get("batch_fraction"):
            batch = f"int(batch_size * {ch['batch_fraction']:g})"
        else:
            return ""
        return code.format(batch=batch)
    return code.format(alloc_conf=ch.get("alloc_conf", ""))


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
        # the allocator's rounding and caching make "fits" not quite monotone in the batch: the whole batches
        # are replayed, down from the fraction found until one fits, then up while the next one fits
        while bs and largest and not replay_change(m, Change(batch_fraction=largest / bs), exp)["fits"]:
            largest -= 1
        while bs and largest is not None and largest + 1 < bs and \
                replay_change(m, Change(batch_fraction=(largest + 1) / bs), exp)["fits"]:
            largest += 1
        if bs and largest is not None:
            # the fraction stays below the next whole batch, which does not fit
            bf = largest / bs if bf * bs >= largest + 1 else max(bf, largest / bs)
        frac = (largest / bs) if bs and largest else bf
        bf_out = round(bf, 4)
        if bs and largest and bf_out * bs < largest:  # rounded, it still names the largest whole batch
            bf_out = math.ceil(bf * 1e4) / 1e4
        r = replay_change(m, Change(batch_fraction=frac), exp)
        txt = (f"Reduce the batch to {100 * frac:.1f}% of it (by at least {math.ceil(100 * (1 - frac))}%)"
               + (f"; with batch {bs}, the largest that fits is about {largest}" if largest is not None else ""))
        items.append(_item("batch", f"{txt}.",
                           {"batch_fraction": round(frac, 4), **({"batch_size": largest} if largest else {})},
                           peak, r["peak_bytes"], cap, r["fits"] and frac > 0,
                           ev0 + ["activations and inputs scale with the batch; parameters, gradients and "
                                  "optimizer state do not"], batch_fraction=bf_out, largest_batch=largest))
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


def unseen_note(step_model: dict | None) -> str:
    """One line on the part of the forward after the blocks that an OOM in the first forward never saw
    (``step_model.unseen_after_blocks``): how it was estimated and how much it adds, or that it is not
    counted; empty when the history showed it."""
    unseen = (step_model or {}).get("unseen_after_blocks")
    if not unseen:
        return ""
    if unseen.get("bytes"):
        return f"{unseen['how']} ({format_bytes(unseen['bytes'])} at this batch, in every replay)"
    return f"{unseen['how']}; a fix that fits with a small margin is a guess"


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

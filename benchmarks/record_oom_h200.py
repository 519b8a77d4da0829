"""Record the OOM post-mortem test data on a CUDA GPU (issue 21; made for the H200; ~60-90 s).

Run from the repository root::

    python benchmarks/record_oom_h200.py --out DIR
    python benchmarks/record_oom_h200.py --out DIR --smoke      # CPU: the code paths, tiny sizes, no OOM

Each case runs in its own subprocess (``PYTORCH_CUDA_ALLOC_CONF`` is read once per process) under a
per-process cap (``torch.cuda.set_per_process_memory_fraction``); everything goes to ``DIR`` with local
paths stripped from the stacks:

- ``oom_forward`` / ``oom_forward_expandable`` (``expandable_segments`` off / on): the 16-block decoder
  LM of ``examples/estimate_families.py`` (d=1024, seq 512, AdamW) at a batch that dies part way through
  its FIRST forward under a 6 GiB cap. The batch is chosen from a real probe in the same process: the
  peak allocated bytes inside every block at batch 1 and 2 (forward hooks, no history), extrapolated
  linearly, picks the batch whose forward crosses the cap in block ~9 of 16; dry runs (no history)
  confirm where it dies and move the batch if it did not die in the forward. Then the recorded run:
  a fresh model and optimizer built with allocator history on (python stacks), the snapshot written
  from inside the OOM observer (``<case>.pickle.gz`` + ``<case>.oom.json``, the sidecar
  ``workbench.capture.capture_oom`` writes: requested bytes, the cap, torch's message). The JSON: torch's
  message, the block it died in (hooks), the request, free-in-reserved at the OOM, the bytes each
  completed block kept. Then the truth for the advice: the largest batch whose two full AdamW steps fit
  under the same cap (binary search on real runs, with each trial's peaks), the workbench's own
  post-mortem run on the snapshot (``oom_postmortem(..., batch_size=B)``: its advised batch and advice
  text, exactly what the notebook shows), and whether that advised batch runs two full steps under the
  cap (the advice applied).
- ``capacity_expandable`` / ``capacity``: 6 x 200 MiB live under a 2 GiB cap, then 1 GiB asked (little free
  in reserved) with expandable segments on / off: it fails either way (expandable segments do not help a
  capacity OOM); then the post-mortem's shortfall is freed (whole 200 MiB tensors, the last allocated
  first) and the request retried, and one tensor fewer than that is tried first (does it still fail?).
- ``env.json``: GPU, driver, torch, CUDA, cuDNN, date, per-case wall times and failures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from record_memory_h200 import _first_line, _settings, save_snapshot, strip_path, write_json  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
BUDGET_S = 90.0

MODEL = dict(d_model=1024, layers=16, heads=16, vocab=8192, max_len=1024)
SEQ = 512
CAP = 6 * GiB
TARGET_BLOCK = 8  # 0-based: die in "block 9 of 16"
ACCEPT_BLOCKS = range(3, 14)  # a death in any of these (0-based) blocks is mid-forward enough


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cap(cap_bytes: int) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)


class Observer:
    """The OOM observer: the snapshot (paths stripped) and capture_oom's sidecar, once per arming."""

    def __init__(self, out: Path, case: str):
        self.snap_path = out / f"{case}.pickle.gz"
        self.side_path = out / f"{case}.oom.json"
        self.armed = False
        self.info: dict = {}

    def __call__(self, device, alloc, limit, device_free):
        if not self.armed:
            return
        self.armed = False
        try:
            self.info = {"device": int(device), "requested_bytes": int(alloc), "limit_bytes": int(limit),
                         "device_free_bytes": int(device_free),
                         "memory_allocated": torch.cuda.memory_allocated(),
                         "memory_reserved": torch.cuda.memory_reserved()}
            stats = dict(torch.cuda.memory_stats(device))
            save_snapshot(torch.cuda.memory._snapshot(), self.snap_path)
            write_json(self.side_path, {"device": int(device), "requested_bytes": int(alloc),
                                        "limit_bytes": int(limit), "device_free_bytes": int(device_free),
                                        "time_unix_s": time.time(), "torch_version": torch.__version__,
                                        "torch_message": None, "memory_stats": stats})
            self.info["written"] = True
        except BaseException as exc:  # noqa: BLE001 - never raise into the allocator
            self.info["observer_error"] = f"{type(exc).__name__}: {exc}"

    def add_message(self, exc: BaseException) -> None:
        if self.side_path.exists():
            d = json.loads(self.side_path.read_text())
            d["torch_message"] = str(exc).replace(str(ROOT), ".")
            write_json(self.side_path, d)


def post_mortem(snap_path: Path, batch: int | None) -> dict:
    """The workbench's own post-mortem on a recorded snapshot: what the notebook will show."""
    from workbench.analysis.memory.oom import analyze_snapshot, oom_postmortem
    from workbench.io.snapshot import load_snapshot

    t0 = time.perf_counter()
    snap = load_snapshot(snap_path)
    rep = oom_postmortem(snap, analyze_snapshot(snap), batch_size=batch)
    if rep is None:
        return {"error": "no oom event in the snapshot"}
    return {"cause": rep.cause, "requested_bytes": rep.requested_bytes, "allocated_bytes": rep.allocated_bytes,
            "reserved_bytes": rep.reserved_bytes, "free_in_reserved_bytes": rep.free_in_reserved_bytes,
            "largest_free_block_bytes": rep.largest_free_block_bytes, "shortfall_bytes": rep.shortfall_bytes,
            "cap_bytes": rep.cap_bytes, "position": rep.position, "step_need": rep.step_need,
            "advice": rep.advice, "allocator_settings": rep.allocator_settings,
            "seconds": round(time.perf_counter() - t0, 2)}


# --- the mid-forward OOM -------------------------------------------------------------------------------
class Where:
    """Forward hooks on the blocks: which block is running, the peak inside each, what each kept."""

    def __init__(self, model):
        self.block = None
        self.phase = "setup"
        self.peaks: dict[int, int] = {}
        self.start: dict[int, int] = {}
        self.end: dict[int, int] = {}
        self.hooks = []
        for i, blk in enumerate(model.blocks):
            self.hooks.append(blk.register_forward_pre_hook(self._pre(i)))
            self.hooks.append(blk.register_forward_hook(self._post(i)))

    def _pre(self, i):
        def hook(mod, args):
            self.block = i
            self.start[i] = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        return hook

    def _post(self, i):
        def hook(mod, args, out):
            self.peaks[i] = torch.cuda.max_memory_allocated()
            self.end[i] = torch.cuda.memory_allocated()
            self.block = None
        return hook

    def reset(self):
        self.block, self.phase = None, "setup"
        self.peaks.clear()
        self.start.clear()
        self.end.clear()

    def remove(self):
        for h in self.hooks:
            h.remove()


def _step(model, opt, batch, where=None):
    from estimate_families import lm_loss

    tokens = torch.randint(0, MODEL["vocab"], (batch, SEQ), device="cuda")
    if where is not None:
        where.phase = "forward"
    logits = model(tokens)
    if where is not None:
        where.phase = "loss"
    loss = lm_loss(logits)
    del logits
    if where is not None:
        where.phase = "backward"
    loss.backward()
    del loss, tokens
    if where is not None:
        where.phase = "optimizer"
    opt.step()
    opt.zero_grad(set_to_none=True)


def _clean(opt=None):
    if opt is not None:
        opt.zero_grad(set_to_none=True)
        opt.state.clear()  # each trial starts as a fresh run would: no optimizer state yet
    gc.collect()
    torch.cuda.empty_cache()


def two_steps(model, opt, batch) -> dict:
    """Two full AdamW steps from a fresh state: fits or not, and torch's peaks."""
    _clean(opt)
    torch.cuda.reset_peak_memory_stats()
    try:
        for _ in range(2):
            _step(model, opt, batch)
        torch.cuda.synchronize()
        row = {"batch": batch, "fits": True, "max_memory_allocated": torch.cuda.max_memory_allocated(),
               "max_memory_reserved": torch.cuda.max_memory_reserved()}
    except torch.OutOfMemoryError as exc:
        row = {"batch": batch, "fits": False, "message": _first_line(exc)}
    _clean(opt)
    return row


def forward_attempt(model, opt, batch, where: Where, obs: Observer | None = None) -> dict:
    """One first training step at ``batch`` (no optimizer state yet); where it died."""
    _clean(opt)
    where.reset()
    if obs is not None:
        obs.armed = True
    res: dict = {"batch": batch}
    try:
        _step(model, opt, batch, where)
        torch.cuda.synchronize()
        res.update(oom=False)
    except torch.OutOfMemoryError as exc:
        res.update(oom=True, message=_first_line(exc), phase=where.phase, block=where.block)
        if obs is not None:
            obs.add_message(exc)
    if obs is not None:
        obs.armed = False
    res["completed_blocks"] = sorted(where.end)
    res["block_start_allocated"] = [where.start[i] for i in sorted(where.start)]
    res["block_kept_bytes"] = [where.end[i] - where.start[i] for i in sorted(where.end)]
    res["block_peak_allocated"] = [where.peaks[i] for i in sorted(where.peaks)]
    _clean(opt)
    return res


def _good(res: dict) -> bool:
    return bool(res.get("oom")) and res.get("phase") == "forward" and res.get("block") in ACCEPT_BLOCKS


def _next_batch(res: dict, batch: int) -> int:
    """Move the batch toward a death in ACCEPT_BLOCKS: larger when it fit, died after the forward or
    after the blocks (in the head), or too late; smaller when it died before or too early in the blocks."""
    step = max(1, batch // 8)
    if not res.get("oom") or res.get("phase") != "forward":
        return batch + step
    blk = res.get("block")
    if blk is None:  # in the forward but outside the blocks: the embedding (none done) or the head (all done)
        return batch + step if len(res.get("completed_blocks") or ()) == MODEL["layers"] else max(2, batch - step)
    return max(2, batch - step) if blk < min(ACCEPT_BLOCKS) else batch + step


def child_forward(out: Path, case: str, t_end: float) -> dict:
    from estimate_families import DecoderLM

    rec: dict = {"case": case, "model": "DecoderLM", "model_config": MODEL, "seq_len": SEQ,
                 "optimizer": "AdamW(lr=1e-4)", "cap_bytes": CAP, "blocks": MODEL["layers"],
                 "settings": _settings(), "steps_in_truth": 2}
    torch.backends.cuda.matmul.allow_tf32 = False
    _cap(CAP)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = DecoderLM(**MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec["parameters"] = sum(p.numel() for p in model.parameters())
    rec["parameter_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    where = Where(model)

    # 1. the probe: peak allocated inside each block at batch 1 and 2 (a first pass takes the cuBLAS
    #    workspaces), extrapolated linearly in the batch
    forward_attempt(model, opt, 1, where)
    probe = {b: forward_attempt(model, opt, b, where) for b in (1, 2)}
    p1, p2 = probe[1]["block_peak_allocated"], probe[2]["block_peak_allocated"]
    slope = [b - a for a, b in zip(p1, p2)]
    icept = [a - s for a, s in zip(p1, slope)]
    cross = [(CAP - c) / s if s > 0 else math.inf for c, s in zip(icept, slope)]  # batch whose block i hits the cap
    k = TARGET_BLOCK
    batch = max(2, int(round((cross[k] + cross[k - 1]) / 2)))
    rec["probe"] = {"block_peak_allocated_b1": p1, "block_peak_allocated_b2": p2,
                    "block_kept_bytes_b1": probe[1]["block_kept_bytes"],
                    "block_kept_bytes_b2": probe[2]["block_kept_bytes"],
                    "crossing_batch_per_block": [round(c, 2) for c in cross], "first_batch": batch}
    log(f"  probe: block {k} crosses the cap at batch {cross[k]:.2f}, block {k - 1} at {cross[k - 1]:.2f}: batch {batch}")

    # 2. dry runs (no history): does it die in the forward, and in which block?
    dry = []
    for _ in range(6):
        r = forward_attempt(model, opt, batch, where)
        dry.append({k2: r.get(k2) for k2 in ("batch", "oom", "phase", "block")})
        log(f"  dry run batch {batch}: oom={r.get('oom')} phase={r.get('phase')} block={r.get('block')}")
        if _good(r):
            break
        batch = _next_batch(r, batch)
    rec["dry_runs"] = dry

    # 3. the recorded run: a fresh model and optimizer built under allocator history
    where.remove()
    del model, opt, where
    _clean()
    obs = Observer(out, case)
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: obs(*a))
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = DecoderLM(**MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    where = Where(model)
    rec["batch"] = batch
    r = forward_attempt(model, opt, batch, where, obs)
    tries = [{k2: r.get(k2) for k2 in ("batch", "oom", "phase", "block")}]
    while not _good(r) and time.perf_counter() < t_end - 18 and len(tries) < 3:
        # turning history off clears it; the next attempt records from scratch
        torch.cuda.memory._record_memory_history(enabled=None)
        batch = _next_batch(r, batch)
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        rec["batch"] = batch
        r = forward_attempt(model, opt, batch, where, obs)
        tries.append({k2: r.get(k2) for k2 in ("batch", "oom", "phase", "block")})
    torch.cuda.memory._record_memory_history(enabled=None)
    rec["recorded_tries"] = tries
    rec["oom"] = bool(r.get("oom"))
    rec["message"] = r.get("message")
    rec["oom_phase"] = r.get("phase")
    rec["oom_block_index"] = r.get("block")  # 0-based (hooks)
    rec["oom_block"] = f"blocks.{r['block']}" if r.get("block") is not None else None
    rec["block_kept_bytes"] = r["block_kept_bytes"]
    rec["block_start_allocated"] = r["block_start_allocated"]
    rec["observer"] = {k2: v for k2, v in obs.info.items() if k2 != "written"}
    if obs.info.get("written") and rec["oom"]:
        rec["snapshot"] = obs.snap_path.name
        rec["sidecar"] = obs.side_path.name
        rec["request_bytes"] = obs.info["requested_bytes"]
        rec["free_in_reserved_bytes"] = obs.info["memory_reserved"] - obs.info["memory_allocated"]
    stats = torch.cuda.memory_stats()
    rec["memory_stats"] = {k2: stats.get(k2) for k2 in ("num_ooms", "num_alloc_retries", "num_device_alloc",
                                                         "num_device_free")}
    where.remove()
    log(f"  recorded: batch {batch} oom={rec['oom']} phase={rec['oom_phase']} block={rec['oom_block_index']}")

    write_json(out / f"{case}.json", rec)  # a checkpoint: a later stage cut short loses nothing before it
    # 4. the workbench's post-mortem on the recorded snapshot, and its advised batch applied
    if rec.get("snapshot"):
        try:
            pm = post_mortem(obs.snap_path, batch)
            rec["postmortem"] = pm
            adv = (pm.get("step_need") or {}).get("largest_batch")
            rec["advised_batch"] = adv
            if adv and time.perf_counter() < t_end - 8:
                rec["advised_run"] = two_steps(model, opt, int(adv))
                if rec["advised_run"]["fits"] and time.perf_counter() < t_end - 8:
                    rec["advised_plus_one_run"] = two_steps(model, opt, int(adv) + 1)
            log(f"  post-mortem: {pm.get('cause')}, position {pm.get('position', {}).get('text')!r}, advised batch "
                f"{adv} -> {rec.get('advised_run', {}).get('fits')}")
        except Exception:
            rec["postmortem_error"] = traceback.format_exc()[-2000:].replace(str(ROOT), ".")
    write_json(out / f"{case}.json", rec)  # a checkpoint: a later stage cut short loses nothing before it
    # 5. the truth: the largest batch whose two full AdamW steps fit (binary search, real runs)
    t0 = time.perf_counter()
    lo, hi, best, tried = 1, batch, 0, []
    while lo <= hi and time.perf_counter() < t_end - 1.5:
        mid = (lo + hi) // 2
        row = two_steps(model, opt, mid)
        tried.append(row)
        if row["fits"]:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    rec["largest_batch_that_fits"] = best if lo > hi else None
    rec["largest_batch_search"] = tried
    rec["search_s"] = round(time.perf_counter() - t0, 2)
    log(f"  largest batch with two full steps under the cap: {rec['largest_batch_that_fits']} ({rec['search_s']} s)")
    # two more peaks (batch 1 and 2) for the linear truth of what a step needs at any batch
    for b in (1, 2):
        if time.perf_counter() < t_end - 1 and not any(t["batch"] == b for t in tried):
            rec.setdefault("extra_peaks", []).append(two_steps(model, opt, b))

    return rec


# --- the capacity OOM -----------------------------------------------------------------------------------
CAP_SMALL = 2 * GiB
PIECE = 200 * MiB
PIECES = 6


def child_capacity(out: Path, case: str, t_end: float) -> dict:
    rec: dict = {"case": case, "cap_bytes": CAP_SMALL, "settings": _settings(), "piece_bytes": PIECE,
                 "pieces": PIECES, "request_bytes": GiB}
    _cap(CAP_SMALL)
    obs = Observer(out, case)
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: obs(*a))
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    keep = [torch.empty(PIECE, dtype=torch.uint8, device="cuda") for _ in range(PIECES)]
    rec["allocated_before_request"] = torch.cuda.memory_allocated()
    rec["reserved_before_request"] = torch.cuda.memory_reserved()
    rec["free_in_reserved_before_request"] = rec["reserved_before_request"] - rec["allocated_before_request"]
    obs.armed = True
    try:
        x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        rec["oom"] = False
        del x
    except torch.OutOfMemoryError as exc:
        rec["oom"] = True
        rec["message"] = _first_line(exc)
        obs.add_message(exc)
    obs.armed = False
    torch.cuda.memory._record_memory_history(enabled=None)
    rec["observer"] = {k: v for k, v in obs.info.items() if k != "written"}
    rec["snapshot"] = obs.snap_path.name if obs.info.get("written") else None
    if rec["snapshot"]:
        try:
            pm = post_mortem(obs.snap_path, None)
            rec["postmortem"] = pm
            need = int(math.ceil(pm["shortfall_bytes"] / PIECE))
            rec["pieces_to_free"] = need
            runs = []
            freed = 0
            # one fewer piece than the advice first (freeing is cumulative), then the advice itself
            for n_free in sorted({max(need - 1, 0), need}):
                while freed < n_free and keep:
                    keep.pop()  # the last allocated first
                    freed += 1
                try:
                    x = torch.empty(GiB, dtype=torch.uint8, device="cuda")
                    ok = True
                    del x
                except torch.OutOfMemoryError:
                    ok = False
                runs.append({"freed_pieces": freed, "freed_bytes": freed * PIECE, "fits": ok,
                             "allocated_after": torch.cuda.memory_allocated(),
                             "reserved_after": torch.cuda.memory_reserved()})
            rec["free_and_retry"] = runs
        except Exception:
            rec["postmortem_error"] = traceback.format_exc()[-2000:].replace(str(ROOT), ".")
    del keep
    return rec


CHILDREN = {
    "oom_forward": (child_forward, "expandable_segments:False", 34),
    "capacity_expandable": (child_capacity, "expandable_segments:True", 10),
    "oom_forward_expandable": (child_forward, "expandable_segments:True", 34),
    "capacity": (child_capacity, "expandable_segments:False", 10),
}


def run_child(case: str, out: Path, timeout: float) -> dict:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=CHILDREN[case][1])
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", case, "--out", str(out),
                            "--child-budget", f"{max(timeout - 8, 4):.1f}"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        ok, tail = p.returncode == 0, p.stdout[-3000:]
    except subprocess.TimeoutExpired as exc:
        ok, tail = False, f"timed out after {timeout:.0f} s\n" + ((exc.stdout or b"")[-2000:].decode(errors="replace")
                                                                 if isinstance(exc.stdout, bytes) else str(exc.stdout or ""))
    wall = round(time.perf_counter() - t0, 1)
    log(tail.rstrip())
    log(f"  {case}: {'ok' if ok else 'FAILED'} in {wall} s")
    return {"case": case, "ok": ok, "wall_s": wall, "tail": None if ok else tail.replace(str(ROOT), ".")}


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:
        return None


# --- smoke (CPU) -------------------------------------------------------------------------------------------
def smoke(out: Path) -> int:
    """What a CPU can run: the workbench post-mortem call on a recorded snapshot, the probe arithmetic,
    the hooks on a tiny model, the path stripping."""
    from estimate_families import DecoderLM

    rec = {"smoke": True}
    snap = ROOT / "tests" / "data" / "h200_memory" / "oom_fragmented.snapshot.pickle.gz"
    rec["postmortem"] = post_mortem(snap, 8)
    m = DecoderLM(d_model=32, layers=4, heads=2, vocab=64, max_len=16)
    seen = []
    hooks = [b.register_forward_pre_hook(lambda mod, a, i=i: seen.append(i)) for i, b in enumerate(m.blocks)]
    m(torch.randint(0, 64, (2, 8)))
    for h in hooks:
        h.remove()
    rec["blocks_seen"] = seen
    rec["stripped"] = strip_path(str(ROOT / "examples" / "estimate_families.py"))
    p1, p2 = [100, 200, 300], [150, 300, 450]
    slope = [b - a for a, b in zip(p1, p2)]
    rec["cross"] = [(1000 - (a - s)) / s for a, s in zip(p1, slope)]
    write_json(out / "smoke.json", rec)
    log(json.dumps({k: rec[k] for k in ("blocks_seen", "stripped", "cross")}))
    log(f"post-mortem on the fragmentation snapshot: {rec['postmortem'].get('cause')}, "
        f"{len(rec['postmortem'].get('advice', []))} advice lines")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--child-budget", type=float, default=35.0, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="CPU: the code paths with tiny sizes")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        return smoke(out)
    if not torch.cuda.is_available():
        log("record_oom_h200: no CUDA device; run this on the GPU machine (or --smoke)")
        return 2
    if args.child:
        t_end = time.perf_counter() + args.child_budget
        fn = CHILDREN[args.child][0]
        t0 = time.perf_counter()
        try:
            rec = fn(out, args.child, t_end)
        except Exception:
            rec = {}
            ck = out / f"{args.child}.json"
            if ck.exists():  # the checkpoint of the stages done before the failure
                rec = json.loads(ck.read_text())
            rec.update(case=args.child, error=traceback.format_exc()[-3000:].replace(str(ROOT), "."))
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        write_json(out / f"{args.child}.json", rec)
        return 0 if "error" not in rec else 1
    t0 = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(0), "total_memory": torch.cuda.get_device_properties(0).total_memory,
           "driver": _driver(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "budget_s": BUDGET_S,
           "children": []}
    for case, (_, _, limit) in CHILDREN.items():
        remaining = BUDGET_S - 2 - (time.perf_counter() - t0)
        if remaining < 7:
            env["children"].append({"case": case, "ok": False, "skipped": "time budget"})
            log(f"  {case}: skipped (time budget)")
            continue
        log(f"{case}:")
        env["children"].append(run_child(case, out, timeout=min(limit, remaining)))
        write_json(out / "env.json", env)
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / "env.json", env)
    log(f"wrote {len(list(out.iterdir()))} files to {out.name} in {env['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Record notebook 35 (headroom and the 90% stress) on a CUDA GPU (made for the H200; ~170 s).

Run from the repository root::

    python benchmarks/record_lesson35_h200.py --out DIR     # writes DIR/h200_lesson35.json (+ one snapshot .gz)
    python benchmarks/record_lesson35_h200.py --out DIR --smoke   # tiny sizes; on a CPU only the estimator part

Every configuration runs in its own process, with ``PYTORCH_CUDA_ALLOC_CONF`` set before CUDA starts
(``expandable_segments:False`` or ``True``) and a per-process cap (``torch.cuda.set_per_process_memory_fraction``,
``CAP_GIB`` GiB), so that the runs are short and do not depend on the rest of the device.

1. ``search_off`` / ``search_on``: the largest batch whose two training steps fit at the longest sequence,
   by the harness's own search (``workbench.capture.runner.find_max_batch_size``: doubling, then bisecting,
   a real out-of-memory ending each failed try). ``estimator`` (CPU, in parallel): the estimator's answer
   (``largest_batch_that_fits``, reserved bytes under the cap) for the same workload.
2. ``run_<pct>_<off|on>``: training at 90/95/99% of the expandable-off maximum (rounded down), sequence
   lengths drawn per step from a fixed-seed distribution (``SEQ_MIN..SEQ_MAX`` in steps of 64; the same
   draws in every run), and an eval pass (no_grad, twice the batch at half the longest sequence) every
   ``EVAL_EVERY`` steps. An out-of-memory error is caught and the batch skipped, as a training loop would:
   gradients dropped (``zero_grad(set_to_none=True)``), references released, **no** ``empty_cache()``
   (the allocator has already freed its unused cached segments and retried before raising). Per step:
   sequence length, OOM or not, peak allocated/reserved within the step (peak stats reset per step), and
   allocated/reserved after it; per run the allocator's counters (``torch.cuda.memory_stats``).
   The 99% expandable-off run ends with an allocator snapshot (history of the last steps, paths stripped).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

GiB, MiB = 1 << 30, 1 << 20
BUDGET_S = 170.0
MODEL = dict(layers=4, d=256, heads=4, vocab=2048, max_seq=1024)
SEQ_MIN, SEQ_MAX, SEQ_STEP = 128, 1024, 64
CAP_GIB = 8
STEPS = 150
EVAL_EVERY = 25
HEADROOMS = (90, 95, 99)
SMOKE = dict(model=dict(layers=2, d=32, heads=2, vocab=64, max_seq=128), seq_min=16, seq_max=128, cap_gib=0.25,
             steps=6, eval_every=3)


def _cfg(smoke: bool) -> dict:
    if smoke:
        s = SMOKE
        return dict(model=s["model"], seq_min=s["seq_min"], seq_max=s["seq_max"], seq_step=16, cap_gib=s["cap_gib"],
                    steps=s["steps"], eval_every=s["eval_every"])
    return dict(model=MODEL, seq_min=SEQ_MIN, seq_max=SEQ_MAX, seq_step=SEQ_STEP, cap_gib=CAP_GIB, steps=STEPS,
                eval_every=EVAL_EVERY)


def seq_lengths(cfg: dict, n: int, seed: int = 0) -> list[int]:
    """The per-step sequence lengths: uniform over SEQ_MIN..SEQ_MAX in SEQ_STEP, fixed seed (same in every run)."""
    import random

    rng = random.Random(seed)
    choices = list(range(cfg["seq_min"], cfg["seq_max"] + 1, cfg["seq_step"]))
    return [rng.choice(choices) for _ in range(n)]


def workload(cfg: dict, seq: int | None = None):
    import torch
    import torch.nn.functional as F

    from workbench.capture.configurations import Workload
    from workbench.capture.models import LM

    m = cfg["model"]
    seq = seq or cfg["seq_max"]
    vocab = m["vocab"]

    def batch(n, device):
        t = torch.randint(0, vocab, (n, seq + 1), device=device)
        return t[:, :-1], t[:, 1:]

    def loss(model, b):
        x, y = b
        return F.cross_entropy(model(x).float().reshape(-1, vocab), y.reshape(-1))

    return Workload(model=lambda: LM(**m), batch=batch, loss=loss, batch_size=16, tokens_per_sample=seq)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    return s.splitlines()[0][:300] if s else type(exc).__name__


def _clean_tb() -> str:
    return traceback.format_exc()[-3000:].replace(str(ROOT), ".")


def _cap(cfg) -> int:
    import torch

    cap = int(cfg["cap_gib"] * GiB)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    return cap


STAT_KEYS = ("num_ooms", "num_alloc_retries", "segment.all.current", "segment.all.peak", "segment.large_pool.current",
             "segment.small_pool.current", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def _stats() -> dict:
    import torch

    s = torch.cuda.memory_stats()
    return {k: int(s.get(k, 0)) for k in STAT_KEYS}


# --- children --------------------------------------------------------------------------------------------
def child_search(cfg: dict, deadline: float) -> dict:
    import torch

    from workbench.capture.configurations import tf32
    from workbench.capture.runner import find_max_batch_size

    cap = _cap(cfg)
    t = time.perf_counter()
    room = find_max_batch_size(workload(cfg), tf32(), device="cuda", start=16, max_batch_size=2048, steps=2,
                               progress=False)
    tries = room.tries.astype(object).where(room.tries.notna(), None).to_dict("records")
    return {"cap_bytes": cap, "batch_size": int(room.batch_size), "peak_allocated_bytes": room.peak_allocated_bytes,
            "peak_reserved_bytes": room.peak_reserved_bytes, "tries": tries, "seconds": round(time.perf_counter() - t, 2),
            "stats_end": _stats(), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}


def child_estimator(cfg: dict, deadline: float) -> dict:
    import torch

    from workbench.capture.estimate import largest_batch_that_fits
    from workbench.capture.configurations import tf32

    torch.set_num_threads(1)
    cap = int(cfg["cap_gib"] * GiB)
    t = time.perf_counter()
    room = largest_batch_that_fits(workload(cfg), tf32(), cap, low=16, high=2048)
    est = room.estimate
    tries = room.tries.astype(object).where(room.tries.notna(), None).to_dict("records")
    return {"budget_bytes": cap, "batch_size": int(room.batch_size), "peak_allocated_bytes": room.peak_allocated_bytes,
            "peak_reserved_bytes": room.peak_reserved_bytes, "tries": tries,
            "by_category": {k: int(v) for k, v in est.by_category.items()}, "seconds": round(time.perf_counter() - t, 2)}


def _snapshot_save(path: Path) -> int:
    import torch
    from record_memory_h200 import save_snapshot

    save_snapshot(torch.cuda.memory._snapshot(), path)
    return path.stat().st_size


def child_run(cfg: dict, deadline: float, batch: int, snapshot: Path | None) -> dict:
    import torch
    import torch.nn.functional as F

    from workbench.capture.models import LM

    cap = _cap(cfg)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    m = cfg["model"]
    vocab = m["vocab"]
    torch.manual_seed(0)
    model = LM(**m).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = seq_lengths(cfg, cfg["steps"])
    gen = torch.Generator(device="cuda")
    eval_batch = 2 * batch

    def train_step(seq: int, i: int) -> None:
        gen.manual_seed(1000 + i)
        t = torch.randint(0, vocab, (batch, seq + 1), device="cuda", generator=gen)
        loss = F.cross_entropy(model(t[:, :-1]).float().reshape(-1, vocab), t[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def eval_pass(i: int) -> None:
        gen.manual_seed(5000 + i)
        seq = cfg["seq_max"] // 2
        with torch.no_grad():
            t = torch.randint(0, vocab, (eval_batch, seq + 1), device="cuda", generator=gen)
            F.cross_entropy(model(t[:, :-1]).float().reshape(-1, vocab), t[:, 1:].reshape(-1)).item()

    steps, evals = [], []
    ooms = eval_ooms = 0
    t0 = time.perf_counter()
    history_from = cfg["steps"] - 3 if snapshot is not None else None
    stopped = None
    for i, seq in enumerate(lengths):
        if time.perf_counter() > deadline:
            stopped = f"time budget: stopped after {i} of {cfg['steps']} steps"
            break
        if history_from is not None and i == history_from:
            torch.cuda.memory._record_memory_history(max_entries=4000, stacks="python")
        torch.cuda.reset_peak_memory_stats()
        oom = False
        try:
            train_step(seq, i)
            torch.cuda.synchronize()
        except torch.OutOfMemoryError as exc:
            oom, msg = True, _first_line(exc)
        if oom:  # outside the except block: the traceback (and the tensors its frames hold) is gone
            opt.zero_grad(set_to_none=True)
            gc.collect()
            ooms += 1
        steps.append({"step": i, "seq": seq, "oom": oom, "peak_allocated": torch.cuda.max_memory_allocated(),
                      "peak_reserved": torch.cuda.max_memory_reserved(), "allocated": torch.cuda.memory_allocated(),
                      "reserved": torch.cuda.memory_reserved(), "segments": _stats()["segment.all.current"],
                      **({"oom_message": msg.replace(str(ROOT), ".")} if oom else {})})
        if (i + 1) % cfg["eval_every"] == 0:
            torch.cuda.reset_peak_memory_stats()
            e_oom = False
            try:
                eval_pass(i)
                torch.cuda.synchronize()
            except torch.OutOfMemoryError:
                e_oom = True
            if e_oom:
                gc.collect()
                eval_ooms += 1
            evals.append({"after_step": i, "batch": eval_batch, "seq": cfg["seq_max"] // 2, "oom": e_oom,
                          "peak_allocated": torch.cuda.max_memory_allocated(),
                          "peak_reserved": torch.cuda.max_memory_reserved()})
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    share = lambda a, r: (r - a) / r if r else 0.0
    rec = {"cap_bytes": cap, "batch": batch, "eval_batch": eval_batch, "steps_planned": cfg["steps"],
           "steps_done": len(steps), "ooms": ooms, "eval_ooms": eval_ooms, "evals_done": len(evals),
           "seconds": round(seconds, 2), "stopped": stopped,
           "oom_policy": "catch torch.OutOfMemoryError, zero_grad(set_to_none=True), gc.collect(), skip the batch; "
                         "no empty_cache()",
           # peak stats are reset per step and per eval: the run's maxima are the maxima of those
           "max_memory_allocated": max((s["peak_allocated"] for s in steps + evals), default=None),
           "max_memory_reserved": max((s["peak_reserved"] for s in steps + evals), default=None),
           "allocated_end": allocated, "reserved_end": reserved, "cached_unused_share_end": share(allocated, reserved),
           "cached_unused_share_at_step_peak_max": max((share(s["peak_allocated"], s["peak_reserved"])
                                                        for s in steps if not s["oom"]), default=None),
           "stats": _stats(), "steps": steps, "evals": evals,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    if snapshot is not None:
        try:
            size = _snapshot_save(snapshot)
            if size > 2 * MiB:  # too big: the segments alone
                torch.cuda.memory._record_memory_history(enabled=None)
                size = _snapshot_save(snapshot)
            rec["snapshot"] = {"file": snapshot.name, "bytes": size}
        except Exception as exc:
            rec["snapshot_error"] = f"{type(exc).__name__}: {_first_line(exc)}"
    return rec


# --- parent ----------------------------------------------------------------------------------------------
def _spawn(args, name: str, out: Path, expandable: bool | None, deadline: float, extra: list[str]):
    env = dict(os.environ)
    if expandable is None:
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["PYTORCH_CUDA_ALLOC_CONF"] = f"expandable_segments:{expandable}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--child", name,
           "--deadline", str(deadline)] + (["--smoke"] if args.smoke else []) + extra
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _collect(proc, name: str, out: Path, timeout: float) -> dict:
    try:
        _, err = proc.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return {"error": f"killed after the time budget ({timeout:.0f} s)"}
    path = out / f"_{name}.json"
    if path.exists():
        rec = json.loads(path.read_text())
        path.unlink()
    else:
        rec = {"error": f"no result (exit {proc.returncode}): " + (err or "")[-1500:].replace(str(ROOT), ".")}
    return rec


def _env() -> dict:
    import torch

    e = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
         "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        e.update(device=torch.cuda.get_device_name(0), total_memory=torch.cuda.get_device_properties(0).total_memory,
                 cudnn=torch.backends.cudnn.version())
        try:
            import pynvml

            pynvml.nvmlInit()
            e["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:
            e["driver"] = f"unknown ({type(exc).__name__})"
    return e


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU runs the estimator part only)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _cfg(args.smoke)
    if args.child:
        deadline = time.perf_counter() + args.deadline
        try:
            if args.child == "estimator":
                rec = child_estimator(cfg, deadline)
            elif args.child.startswith("search"):
                rec = child_search(cfg, deadline)
            else:
                rec = child_run(cfg, deadline, args.batch, out / args.snapshot if args.snapshot else None)
        except Exception:
            rec = {"error": _clean_tb()}
        write_json(out / f"_{args.child}.json", rec)
        return 0
    import torch

    t0 = time.perf_counter()
    left = lambda: BUDGET_S - (time.perf_counter() - t0)
    result = {"env": _env(), "smoke": args.smoke, "budget_s": BUDGET_S,
              "config": {**cfg, "headrooms_pct": list(HEADROOMS), "optimizer": "AdamW lr 1e-4", "precision": "tf32",
                         "eval": "no_grad, 2x the batch at seq_max // 2", "seq_seed": 0,
                         "seq_lengths": seq_lengths(cfg, cfg["steps"])},
              "search": {}, "estimator": None, "runs": {}, "notes": []}
    gpu = torch.cuda.is_available()
    print(f"record_lesson35: gpu={gpu}; estimator in parallel on the CPU", file=sys.stderr, flush=True)
    est = _spawn(args, "estimator", out, None, BUDGET_S - 15, [])
    if gpu:
        procs = {m: _spawn(args, f"search_{m}", out, m == "on", 40, []) for m in ("off", "on")}
        for m, p in procs.items():
            result["search"][m] = _collect(p, f"search_{m}", out, 45 - (time.perf_counter() - t0))
            print(f"  search {m}: {result['search'][m].get('batch_size', result['search'][m].get('error'))}",
                  file=sys.stderr, flush=True)
        best = result["search"].get("off", {}).get("batch_size") or result["search"].get("on", {}).get("batch_size")
        result["max_batch"] = best
        write_json(out / "h200_lesson35.json", result)
        if best:
            for k, pct in enumerate(HEADROOMS):
                pairs_left = len(HEADROOMS) - k
                share = (left() - 12) / pairs_left
                if share < 10:
                    result["notes"].append(f"{pct}% not run: time budget")
                    continue
                batch = max(1, int(best * pct / 100))
                procs = {}
                for m in ("off", "on"):
                    name = f"run_{pct}_{m}"
                    snap = ["--snapshot", "h200_lesson35_99_off.snapshot.pickle.gz"] if (pct == 99 and m == "off") else []
                    procs[m] = _spawn(args, name, out, m == "on", share - 8, ["--batch", str(batch)] + snap)
                for m, p in procs.items():
                    name = f"run_{pct}_{m}"
                    rec = _collect(p, name, out, share + 5)
                    rec["headroom_pct"], rec["expandable_segments"] = pct, m == "on"
                    result["runs"][name] = rec
                    print(f"  {name}: batch {batch}, steps {rec.get('steps_done')}, ooms {rec.get('ooms')}, "
                          f"eval ooms {rec.get('eval_ooms')} {rec.get('error', '')[:200]}", file=sys.stderr, flush=True)
                write_json(out / "h200_lesson35.json", result)
    else:
        result["notes"].append("no CUDA device: only the estimator ran")
    result["estimator"] = _collect(est, "estimator", out, left() - 3)
    print(f"  estimator: {result['estimator'].get('batch_size', result['estimator'].get('error'))}", file=sys.stderr)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / "h200_lesson35.json", result)
    print(f"wrote {out / 'h200_lesson35.json'} in {result['wall_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

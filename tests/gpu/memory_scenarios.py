"""GPU memory scenarios, each run in a fresh process (a clean caching allocator, its own per-process
cap and OOM observer) by tests/gpu/test_memory_gpu.py; also runnable by hand:

    python tests/gpu/memory_scenarios.py train|capacity|fragmentation OUTDIR

Each prints one JSON line with what torch itself reported, for the test to compare with the
post-mortem read back from the files written.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

MiB = 2**20


def _stats():
    s = torch.cuda.memory_stats()
    return {"allocated": s["allocated_bytes.all.current"], "reserved": s["reserved_bytes.all.current"]}


def train(out: Path) -> dict:
    from workbench.capture.memory import record_memory_history

    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(16, 128, 256, device=dev)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    path = out / "train.snapshot.pickle.gz"
    with record_memory_history(path, max_entries=100_000, stacks="python") as rec:
        model = torch.nn.Sequential(*[torch.nn.TransformerEncoderLayer(
            d_model=256, nhead=4, dim_feedforward=1024, batch_first=True) for _ in range(2)]).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        end = _stats()
    return {"path": str(rec.path), "events": rec.events, "end": end,
            "max_allocated": torch.cuda.max_memory_allocated(),
            "params_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


def _cap(headroom: int) -> int:
    """Set the per-process cap to what is reserved now plus ``headroom``; return the cap in bytes."""
    total = torch.cuda.get_device_properties(0).total_memory
    want = torch.cuda.memory_reserved() + headroom
    torch.cuda.set_per_process_memory_fraction(want / total, 0)
    return int(want / total * total)


def capacity(out: Path) -> dict:
    from workbench.capture.memory import capture_oom

    torch.cuda.init()
    torch.cuda.empty_cache()
    keep = [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")]  # something live before the cap
    cap = _cap(1024 * MiB)
    error = error_type = None
    live_at_oom = 0
    try:
        with capture_oom(out, max_dumps=1) as h:  # the OOM must come out of this block unchanged
            while True:
                keep.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
                live_at_oom = sum(t.numel() * t.element_size() for t in keep)
    except torch.cuda.OutOfMemoryError as e:
        error, error_type = str(e), type(e).__name__
    # a removed handle writes nothing; a re-armed one stops at max_dumps=1
    with capture_oom(out / "second", max_dumps=1) as h2:
        h2.remove()
        try:
            torch.empty(4096 * MiB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            pass
    for _ in range(2):
        try:
            h.active = True
            torch.empty(4096 * MiB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            pass
    h.remove()
    side = json.loads(Path(h.sidecars[0]).read_text()) if h.sidecars else None
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    return {"dumps": [str(p) for p in h.dumps], "skipped": h.skipped, "errors": h.errors, "sidecar": side,
            "cap": cap, "error": error, "error_type": error_type, "live_bytes": live_at_oom,
            "second_dir_files": sorted(p.name for p in (out / "second").glob("*"))}


def fragmentation(out: Path) -> dict:
    """One 512 MiB segment carved into 16 blocks of 32 MiB; every other block freed leaves 8 holes of
    32 MiB (256 MiB free) none of which fits a 64 MiB request; the cap leaves 16 MiB for a new segment."""
    from workbench.capture.memory import capture_oom

    torch.cuda.init()
    gc.collect()
    torch.cuda.empty_cache()
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del big  # the 512 MiB segment stays cached as one free block
    blocks = [torch.empty(32 * MiB, dtype=torch.uint8, device="cuda") for _ in range(16)]
    addrs = [b.data_ptr() for b in blocks]
    for i in range(0, 16, 2):
        blocks[i] = None  # every other block: holes between live blocks
    torch.cuda.synchronize()
    cap = _cap(16 * MiB)
    error = None
    with capture_oom(out, max_dumps=2) as h:
        try:
            torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            error = str(e)
    side = json.loads(Path(h.sidecars[0]).read_text()) if h.sidecars else None
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    contiguous = all(addrs[i + 1] - addrs[i] == 32 * MiB for i in range(15))
    return {"dumps": [str(p) for p in h.dumps], "errors": h.errors, "sidecar": side, "cap": cap,
            "error": error, "contiguous": contiguous}


if __name__ == "__main__":
    which, outdir = sys.argv[1], Path(sys.argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    result = {"train": train, "capacity": capacity, "fragmentation": fragmentation}[which](outdir)
    print("RESULT " + json.dumps(result, default=str))

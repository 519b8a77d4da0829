"""Which half of the reserved-peak error is the allocator model's, and which the estimate's event order:
the caching allocator's own trace of a real step (``trace_<family>_<batch>_<precision>.json.gz`` from
benchmarks/record_cudnn_fp32_h200.py: alloc / free / segment events with addresses and sizes) is

1. replayed through :class:`workbench.analysis.memory.allocator_model.CachingAllocatorModel` (real requests, real
   order): if the model's reserved peak equals the real one, the model's rules are right for this step;
2. compared with the estimate's own event list (sizes in order, difflib alignment): the first places where
   the estimate allocates something the GPU did not, or in another order.

    python benchmarks/allocator_trace_check.py DIR/trace_lstm_64_bf16.json.gz [more ...] [--workspaces TABLE.json]
"""

from __future__ import annotations

import difflib
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from workbench.analysis.memory.allocator_model import CachingAllocatorModel, round_size  # noqa: E402

MiB = 2**20


def load(path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def real_sequence(trace) -> tuple[list, int]:
    """(('alloc', addr, size, segment address or None) / ('free', addr, 0, None) in order, real reserved
    peak from segment events). The segment address is cudaMalloc's, where the trace opened a segment for
    this request."""
    seq, reserved, peak = [], 0, 0
    live = set()
    pending = None
    for action, addr, size in trace:
        if action == "alloc":
            seq.append(("alloc", addr, size, pending))
            pending = None
            live.add(addr)
        elif action == "free_completed" and addr in live:
            seq.append(("free", addr, 0, None))
            live.discard(addr)
        elif action == "segment_alloc":
            pending = addr
            reserved += size
            peak = max(peak, reserved)
        elif action == "segment_free":
            reserved -= size
    return seq, peak


def replay_real(seq, real_addresses: bool = False) -> dict:
    """The real requests through the model; ``real_addresses``: new segments where cudaMalloc put them
    (ties between equal free blocks then break as on the GPU)."""
    m = CachingAllocatorModel()
    h = {}
    for action, addr, size, seg in seq:
        if action == "alloc":
            h[addr] = m.malloc(size, seg if real_addresses else None)
        elif addr in h:
            m.free(h.pop(addr))
    return {"peak_allocated": m.peak_allocated_bytes, "peak_reserved": m.peak_reserved_bytes}


WORKSPACES = None  # a ConvWorkspaces table (--workspaces PATH): the estimate's convolutions use measured bytes


def estimate_sequence(case: dict):
    from estimate_families import FAMILIES, adamw

    from workbench.capture.estimate import trace_step_memory

    build, batch, loss = FAMILIES[case["family"]]
    rec = trace_step_memory(build, batch, adamw, precision=case["precision"], batch_size=case["batch_size"],
                            loss_fn=loss, cublas_workspace_bytes=0,  # the measured process held them before
                            conv_workspaces=WORKSPACES)
    ev = rec["events"]
    return [(a, k, n, op) for a, k, n, op in zip(ev["action"], ev["key"], ev["nbytes"], ev["op"])]


def main(argv=None) -> int:
    global WORKSPACES
    args = list(argv or sys.argv[1:])
    if "--workspaces" in args:
        from workbench.analysis.memory.cudnn_model import ConvWorkspaces

        i = args.index("--workspaces")
        WORKSPACES = ConvWorkspaces.load(args[i + 1])
        del args[i:i + 2]
    for p in args:
        d = load(p)
        case = d["case"]
        seq, real_peak = real_sequence(d["trace"])
        rep = replay_real(seq)
        rep_addr = replay_real(seq, real_addresses=True)
        base = case.get("base_reserved_bytes", 0)
        print(f"== {Path(p).name}: {len(seq)} real events; reserved: torch {case['max_reserved_bytes'] / MiB:.0f} MiB, "
              f"segments in the trace {real_peak / MiB:.0f} MiB (+ {base / MiB:.0f} held before), model on the real "
              f"sequence {rep['peak_reserved'] / MiB:.0f} MiB (with cudaMalloc's addresses "
              f"{rep_addr['peak_reserved'] / MiB:.0f} MiB); allocated: torch {case['max_allocated_bytes'] / MiB:.0f}, "
              f"model on the real sequence {rep['peak_allocated'] / MiB:.0f} MiB")
        est = estimate_sequence(case)
        real_sizes = [s for a, _, s, _ in seq if a == "alloc"]
        est_sizes = [round_size(n) for a, _, n, _ in est if a == "alloc" and n > 0]
        est_ops = [op for a, _, n, op in est if a == "alloc" and n > 0]
        sm = difflib.SequenceMatcher(a=real_sizes, b=est_sizes, autojunk=False)
        shown = 0
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal" or shown >= 25:
                continue
            shown += 1
            print(f"  {tag:8} real[{i1}:{i2}] {[round(s / MiB, 2) for s in real_sizes[i1:i2]][:8]}  "
                  f"estimate[{j1}:{j2}] {[(round(s / MiB, 2), o) for s, o in zip(est_sizes[j1:j2], est_ops[j1:j2])][:8]}")
        print(f"  matching allocations: {sum(b.size for b in sm.get_matching_blocks())} of {len(real_sizes)} real, "
              f"{len(est_sizes)} estimated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Copy what benchmarks/record_cudnn_fp32_h200.py wrote on the H200 into tests/data/h200_memory/, made
small: the families' totals with their convolution and LSTM op rows (both steps; batch norm and the
other ops dropped), the convolution sweep's per-call bytes (no kernel lists: the profiler attributed none), the
workspace-cap rows, cuDNN frontend's chosen plans (engine, numerical notes, workspace size) from the log
summary, the LSTM sweep, and the allocator traces as they are (already small, no stacks).

    python benchmarks/store_cudnn_recording.py RUN_DIR tests/data/h200_memory
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

OP_KEYS = ("op", "phase", "output_bytes", "transient_bytes", "args", "outputs")
CALL_KEYS = ("cold_bytes", "warm_bytes")
ROW_KEYS = ("index", "split", "shape", "mode", "x", "w", "y", "error")


KEEP_OPS = ("convolution", "convolution_backward", "_cudnn_rnn", "_cudnn_rnn_backward")


def kept_ops(ops: list[dict]) -> list[dict]:
    return [{k: o[k] for k in OP_KEYS if k in o} for o in ops if o.get("op") in KEEP_OPS]


def trim_families(rec: dict) -> dict:
    rows = []
    for r in rec["rows"]:
        r = dict(r)
        if "ops" in r:
            r["ops"] = kept_ops(r["ops"])
        rows.append(r)
    return {"rows": rows}


def _calls(rows) -> list[dict]:
    out = []
    for r in rows or ():
        t = {k: r[k] for k in ROW_KEYS if k in r}
        for d in ("forward", "backward_data", "backward_weight"):
            if d in r:
                t[d] = {k: r[d][k] for k in CALL_KEYS}
        out.append(t)
    return out


_PLAN = re.compile(r"EXECUTION_PLAN_DESCRIPTOR : (\S+), numeric_notes:\[([^\]]*)\].*workSpaceSize: (\d+)")


def plans(log_summary: dict) -> list[dict]:
    """cuDNN frontend's execution plans (the engine cuDNN's heuristics chose) from the log summary."""
    seen, out = set(), []
    for groups in (log_summary.get("frontend", {}).get("matches") or {}).values():
        for grp in groups:
            for line in grp:
                m = _PLAN.search(line)
                if m and line not in seen:
                    seen.add(line)
                    out.append({"engine": m.group(1), "notes": [n for n in m.group(2).split(",") if n],
                                "workspace_bytes": int(m.group(3))})
    return out


def trim_sweep(rec: dict) -> dict:
    wscap = rec.get("parts", {}).get("wscap", {})
    logp = rec.get("parts", {}).get("log", {})
    return {"env": rec["env"], "held_out_rule": rec.get("held_out_rule"), "wscap_mib": rec.get("wscap_mib"),
            "sweep": {"rows": _calls(rec.get("sweep", {}).get("rows")),
                      "complete": rec.get("sweep", {}).get("complete")},
            "wscap": {"rows": _calls(wscap.get("rows")), "complete": wscap.get("complete")},
            "log": {"rows": _calls(logp.get("rows")), "frontend_plans": plans(rec.get("log", {}))},
            "parts_returncode": {k: v.get("returncode") for k, v in rec.get("parts", {}).items()}}


def main(argv=None) -> int:
    src, dst = (Path(a) for a in (argv or sys.argv[1:])[:2])
    dst.mkdir(parents=True, exist_ok=True)
    if (src / "families.json").exists():
        fam = trim_families(json.loads((src / "families.json").read_text()))
        (dst / "families.json").write_text(json.dumps(fam, indent=None, sort_keys=True) + "\n")
    if (src / "h200_cudnn_fp32.json").exists():
        sw = trim_sweep(json.loads((src / "h200_cudnn_fp32.json").read_text()))
        if sw["sweep"]["rows"]:  # a run of other --parts has none: keep the stored sweep
            (dst / "cudnn_conv_sweep.json").write_text(json.dumps(sw, indent=None, sort_keys=True) + "\n")
    if (src / "lstm_sweep.json").exists():
        shutil.copyfile(src / "lstm_sweep.json", dst / "lstm_sweep.json")
    for f in sorted(src.glob("trace_*.json.gz")):
        shutil.copyfile(f, dst / f.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

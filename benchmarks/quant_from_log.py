"""Recover the ``quant_compiled`` runs of benchmarks/record_lesson37_h200.py from its printed log.

When the recorder's ``quant_compiled`` child is killed (a call's time limit), its JSON part is lost, but every run
it finished was printed to stderr first, one line each::

    [lesson37   19.2s] quant bf16 eager_batch_1 {'first_call_s': 0.0006, 'median_ms': 0.1015, ...}

This script reads those lines back into a JSON of the part's shape (``configs`` -> config -> ``<mode>_batch_<m>``
-> the cell), with only what was printed: values rounded to 4 decimals as the recorder printed them, no
``weight_bytes`` or ``weight_class`` (not printed), no ``copy_gbps`` (the copy measurement is not printed).
``weight_bandwidth_fraction`` is added from the recording's datasheet peak (its ``peak.gbps``), as the recorder
does. The recording given with ``--recording`` (the same run's JSON, its other parts) supplies ``env`` and ``peak``.

    python benchmarks/quant_from_log.py LOG --recording workbench/samples/results/h100_lesson37.json \\
        --out workbench/samples/results/h100_quant_compiled_partial.json
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^\[lesson37\s+(?P<t>[\d.]+)s\] quant (?P<config>\S+) (?P<key>(?:eager|compiled)_batch_\d+) "
                  r"(?P<cell>\{.*\})\s*$")
# the recorder's constants (record_lesson37_h200.py, child_quant, not --smoke)
APIS = {"int8_weight_only": "Int8WeightOnlyConfig", "float8_weight_only": "Float8WeightOnlyConfig",
        "int8_dynamic": "Int8DynamicActivationInt8WeightConfig"}
CONFIGS = ("bf16", *APIS)
PLANNED_BATCHES = (1, 16, 4096)
D, HIDDEN = 4096, 14336


def parse(lines) -> dict:
    """``{config: {key: cell}}`` from the printed lines, in the order printed; ``child_s``: the child's clock."""
    configs: dict = {}
    for n, line in enumerate(lines, 1):
        m = LINE.match(line)
        if not m:
            continue
        cell = ast.literal_eval(m["cell"])
        if not isinstance(cell, dict):
            raise ValueError(f"line {n}: the run's values are not a dict")
        cell["child_s"] = float(m["t"])
        row = configs.setdefault(m["config"], {})
        if m["key"] in row and {k: v for k, v in row[m["key"]].items() if k != "child_s"} != \
                {k: v for k, v in cell.items() if k != "child_s"}:
            raise ValueError(f"line {n}: {m['config']} {m['key']} printed twice with different values")
        row[m["key"]] = cell
    return configs


def build(configs: dict, recording: dict, n_runs: int) -> dict:
    gbps = (recording.get("peak") or {}).get("gbps")
    for name, row in configs.items():
        if name in APIS:
            row["api"] = APIS[name]
        for cell in row.values():
            if isinstance(cell, dict) and "weight_gbps" in cell and gbps:
                cell["weight_bandwidth_fraction"] = cell["weight_gbps"] / gbps
    measured = sorted({int(k.rsplit("_", 1)[1]) for r in configs.values() for k in r if "_batch_" in k})
    planned = [f"{c}/{mode}_batch_{b}" for b in PLANNED_BATCHES for c in CONFIGS for mode in ("eager", "compiled")]
    got = {f"{c}/{k}" for c, r in configs.items() for k in r if "_batch_" in k}
    return {
        "source": f"recovered from the recorder's printed lines; the part was cut by the time limit after {n_runs} runs",
        "recorder": "benchmarks/record_lesson37_h200.py --out DIR (part quant_compiled)",
        "env": recording.get("env"), "peak": recording.get("peak"),
        "model": f"bf16 MLP Linear({D},{HIDDEN}) GELU Linear({HIDDEN},{D}), eval (lesson 36's)", "d": D, "hidden": HIDDEN,
        "batches": measured, "device": "cuda",
        "compile": "torch.compile(model, dynamic=False), default mode",
        "timing": "median over reps of (CUDA events around `inner` back-to-back calls) / inner; host_issue_ms: "
                  "perf_counter around the same calls, no synchronize; values rounded to 4 decimals by the log line",
        "not_measured": [p for p in planned if p not in got],
        "configs": configs,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", type=Path, help="the recorder's stderr (or any file holding its '[lesson37 ...] quant' lines)")
    p.add_argument("--recording", type=Path, required=True, help="the same run's JSON (for env and peak)")
    p.add_argument("--out", type=Path, required=True, help="the JSON to write")
    args = p.parse_args(argv)
    for path in (args.log, args.recording):
        if not path.is_file():
            print(f"{path}: no such file; give the recorder's log and its JSON", file=sys.stderr)
            return 2
    try:
        configs = parse(args.log.read_text(errors="replace").splitlines())
        recording = json.loads(args.recording.read_text())
    except (ValueError, SyntaxError) as exc:
        print(f"{args.log} / {args.recording}: {exc}; give the recorder's own log and JSON", file=sys.stderr)
        return 2
    n_runs = sum(1 for r in configs.values() for k in r if "_batch_" in k)
    if not n_runs:
        print(f"{args.log}: no '[lesson37 ...] quant <config> <mode>_batch_<m> {{...}}' lines; is it the recorder's "
              "stderr?", file=sys.stderr)
        return 2
    out = build(configs, recording, n_runs)
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out.name}: {n_runs} runs of {', '.join(configs)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

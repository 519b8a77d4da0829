"""Print the per-pair table of the diagnosis' predicted savings against the savings measured on the H200.

    python benchmarks/diagnosis_pairs.py            # markdown table (benchmarks/RESULTS.md, docs/diagnosis.md)

The pairs are tests/data/h200_pairs/pairs.json (recorded by benchmarks/record_diagnosis_h200.py); the
test tests/test_diagnosis_pairs.py asserts the same numbers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis import diagnose  # noqa: E402
from workbench.io.trace import load_trace  # noqa: E402

DATA = ROOT / "tests" / "data" / "h200_pairs"


def rows():
    pairs = json.loads((DATA / "pairs.json").read_text())["pairs"]
    cache = {}
    for p in pairs:
        truth = json.loads((DATA / p["case"] / "truth.json").read_text())["measured"]
        key = (p["case"], p["trace"])
        if key not in cache:
            cache[key] = diagnose(load_trace(DATA / p["case"] / p["trace"]))
        d = cache[key]
        w = d.what_if(p["cause"])
        after = truth[p["after"]]["median_ms"]
        before = d.step_ms if p["cause"] == "profiler" else truth[p["before"]]["median_ms"]
        meas = 1 - after / before
        yield {
            "case": p["case"], "trace": p["trace"].removesuffix(".trace.json.gz"), "cause": p["cause"],
            "before_ms": before, "after_ms": after, "predicted_ms": before * (1 - w.saved_fraction),
            "predicted": w.saved_fraction, "measured": meas, "rel_error": abs(w.saved_fraction - meas) / meas,
            "bound": d.bound, "how": "measured in trace" if w.measured else "model",
        }


def main() -> int:
    print("| case | trace (before) | fix (cause) | before ms | after ms (measured) | after ms (predicted) "
          "| saving measured | saving predicted | rel. error | bound named |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows():
        before = f"{r['before_ms']:.2f}" + (" (trace)" if r["cause"] == "profiler" else "")
        print(f"| {r['case']} | {r['trace']} | {r['cause']} | {before} | {r['after_ms']:.2f} | {r['predicted_ms']:.2f} "
              f"| {r['measured'] * 100:.1f}% | {r['predicted'] * 100:.1f}% | {r['rel_error'] * 100:.0f}% | {r['bound']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tour's fixes (``record_diagnosis_h200.py --case tour_fixes``) in one small JSON the tour reads.

    PYTHONPATH=. python benchmarks/tour_fixes_summary.py tests/data/h100_pairs/tour_fixes \
        workbench/samples/results/h100_tour_fixes.json

Holds the recorder's truth.json verbatim (the steps timed without the profiler) and, for each variant's light
trace, what the workbench's TraceAnalysis says of it (GPU busy a step, the bound, the step without the
profiler it estimates, the findings): the traces themselves (0.6 MB each) stay in tests/data, and
tests/test_notebook_sources.py checks this file against them."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def summarize(folder: Path) -> dict:
    from workbench.analysis.trace.analysis import TraceAnalysis

    truth = json.loads((folder / "truth.json").read_text())
    traces = {}
    for variant in sorted(truth["traces"]):
        a = TraceAnalysis(folder / truth["traces"][variant]["file"])
        d = a.diagnosis
        traces[variant] = {"bound": d.bound, "gpu_busy_ms": round(float(d.gpu_busy_ms), 3),
                           "step_ms_profiled": round(float(d.step_ms), 3),
                           "step_ms_unprofiled_estimate": round(float(d.step_ms_unprofiled), 3),
                           "findings": [f.id for f in a.findings]}
    return {"about": "benchmarks/tour_fixes_summary.py: the tour_fixes truth (verbatim) and the workbench's reading "
                     "of each variant's light trace (tests/data/h100_pairs/tour_fixes)",
            "truth": truth, "traces": traces}


def main(argv=None) -> int:
    src, dst = (Path(a) for a in (argv or sys.argv[1:]))
    dst.write_text(json.dumps(summarize(src), indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The table of benchmarks/RESULTS.md "Memory what-if against fixes that ran", from tests/data/oom_whatif/.

    PYTHONPATH=. python benchmarks/whatif_recordings_table.py        # CPU, ~20 s

For every recording of ``benchmarks/record_oom_whatif_h200.py``: each fix that was run and that an advice
item (or the batch replay) predicts, the prediction (fits / OOM), what the run did, the predicted peak
reserved and torch's ``max_memory_reserved`` of the run, and the error where the run got through; then the
primary advice, the batch fraction and the recorder's batch search per scenario. Markdown on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workbench.analysis.memory.oom import analyze_snapshot, oom_postmortem  # noqa: E402
from workbench.analysis.memory.whatif import recorder_fix_advice  # noqa: E402
from workbench.analysis.memory.whatif_model import Change, step_memory_model  # noqa: E402
from workbench.analysis.memory.whatif_replay import replay_change  # noqa: E402
from workbench.io.snapshot import load_oom_sidecar, load_snapshot  # noqa: E402

DATA = ROOT / "tests" / "data" / "oom_whatif"
GiB = 1 << 30


def recordings(folder: Path = DATA) -> list:
    out = []
    for j in sorted(folder.glob("*.json")):
        if j.name.endswith(".oom.json") or j.name == "env.json":
            continue
        rec = json.loads(j.read_text())
        if rec.get("scenario") and rec.get("oom_happened") and rec.get("snapshot") and not rec.get("smoke"):
            out.append((j.stem, rec))
    return out


def post_mortem(folder: Path, rec: dict):
    snap = load_snapshot(folder / rec["snapshot"])
    if "oom" not in snap.extra and rec.get("sidecar") and (folder / rec["sidecar"]).exists():
        oom, _ = load_oom_sidecar(folder / rec["sidecar"])
        if oom is not None:
            snap.extra["oom"] = oom
    a = analyze_snapshot(snap)
    return a, oom_postmortem(snap, a, batch_size=rec["batch_size"])


def rows(name: str, rec: dict, a, rep) -> list:
    m = step_memory_model(a, rep, rec["batch_size"])
    items = {x["id"]: x for x in rep.advice}
    exp = bool(rep.allocator_settings.get("expandable_segments"))
    out = []
    for fix in rec["fixes"]:
        if fix.get("skipped") or fix.get("ran") is None:
            continue
        aid = recorder_fix_advice(fix.get("change") or {})
        if aid == "batch" and m is not None:
            r = replay_change(m, Change(batch_fraction=fix["change"]["batch_size"] / rec["batch_size"]), exp)
            fits, pred = r["fits"], r["peak_bytes"]
        elif aid in items:
            w = items[aid]["what_if"]
            fits, pred = w["fits"], (w["peak_bytes"] if aid == "bigger_gpu" else w["peak_if_fixed_bytes"])
            if items[aid].get("oom_returns_at_step") is not None:  # a leak left in: the step it returns at
                fits = items[aid]["oom_returns_at_step"] > rec["steps"]
        else:
            continue
        run = "ran" if fix["ran"] else f"OOM at step {fix.get('oom_step')}"
        truth = fix.get("max_memory_reserved")
        err = f"{pred / truth - 1:+.1%}" if fix["ran"] and truth and pred else ""
        out.append(f"| {name} | {fix['id']} | {'fits' if fits else 'OOM'} | {run} | {pred / GiB:.2f} | "
                   f"{truth / GiB:.2f} | {err} |" if truth else "")
    return [r for r in out if r]


def main() -> int:
    print("| scenario | fix | predicted | measured | predicted peak GiB | max reserved GiB | error |")
    print("|---|---|---|---|---|---|---|")
    summary = []
    for name, rec in recordings():
        a, rep = post_mortem(DATA, rec)
        for line in rows(name, rec, a, rep):
            print(line)
        batch = next((x for x in rep.advice if x["id"] == "batch"), {})
        bs = rec.get("batch_search") or {}
        summary.append(f"- {name} primary: {rep.advice[0]['id']} batch_fraction: {batch.get('batch_fraction')} "
                       f"search: {bs.get('largest_ran')} {bs.get('smallest_failed')}")
    print("\nPrimary advice, batch fraction and the batch search per scenario:\n")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

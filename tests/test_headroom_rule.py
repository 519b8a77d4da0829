"""docs/memory.md's headroom rule ("Headroom: which batch to run"), which lessons 21, 34 and 35 apply with
workbench.lessons.headroom_rule: its number holds on the lesson 35 recording, and the fills the page quotes
are the recordings' own."""

from __future__ import annotations

import json
import re

from testdata import ROOT
from workbench.lessons import HEADROOM_PCT, RESULTS, headroom_rule

DOC = (ROOT / "docs" / "memory.md").read_text(encoding="utf-8")
SECTION = DOC[DOC.index("## Headroom: which batch to run"):]


def quoted(pct_before: str) -> float:
    """The percentage the section quotes right before ``pct_before``."""
    m = re.search(r"([\d.]+)% of the " + re.escape(pct_before), SECTION)
    assert m, pct_before
    return float(m.group(1))


def test_the_rule_is_what_lesson_35_ran_without_an_oom():
    rec = json.loads((RESULTS / "h200_lesson35.json").read_text())
    cap = rec["config"]["cap_gib"] * 2**30
    rule = headroom_rule(rec["max_batch"], rec["search"]["off"]["peak_allocated_bytes"], cap)
    ran = rec["runs"][f"run_{HEADROOM_PCT}_on"]
    assert ran["batch"] == rule["batch"] and ran["ooms"] == 0 and ran["steps_done"] == ran["steps_planned"]
    assert all(rec["runs"][f"run_{p}_off"]["ooms"] > 0 for p in rec["config"]["headrooms_pct"])
    assert f"**{HEADROOM_PCT}%**" in SECTION and rule["allocator_conf"] in SECTION
    assert round(100 * rule["fill"], 1) == quoted("cap (lesson 35")


def test_the_quoted_fills_are_the_recordings():
    t = json.loads((RESULTS / "h200_lesson21.json").read_text())
    ran = {r["batch"]: r for r in t["largest_batch_search"]}[t["largest_batch_that_fits"]]
    fill21 = headroom_rule(t["largest_batch_that_fits"], ran["max_memory_allocated"], t["cap_bytes"])["fill"]
    assert round(100 * fill21, 1) == quoted("cap (lesson 21")
    # lesson 34's search on the H200: the executed copy's printed Headroom (GiB to two decimals)
    nb = (ROOT / "docs" / "h200_notebooks" / "34_batch_size_and_accumulation.ipynb").read_text(encoding="utf-8")
    peak, total = map(float, re.search(r"fits: \d+, peak ([\d.]+) GiB of ([\d.]+) GiB \(device total\)", nb).groups())
    assert round(100 * peak / total, 1) == quoted("device (lesson 34")

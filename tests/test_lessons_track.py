"""notebooks/README.md's reading order: the table names every lesson once, the core track (a one-day
workshop) fits in 6 hours, the order keeps what the lessons lean on, and README.md's core line agrees."""

from __future__ import annotations

import re

from testdata import ROOT

NOTEBOOKS = ROOT / "notebooks"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*\[(\d\d_[a-z0-9_]+)\]\((\d\d_[a-z0-9_]+)\.ipynb\)\s*\|\s*(core|extended)\s*\|\s*(\d+)\s*\|")


def table() -> list[dict]:
    rows = []
    for line in (NOTEBOOKS / "README.md").read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            order, name, target, track, minutes = m.groups()
            assert name == target, line
            rows.append({"order": int(order), "name": name, "track": track, "minutes": int(minutes)})
    return rows


def test_the_table_lists_every_lesson_once_in_order():
    rows = table()
    names = [r["name"] for r in rows]
    on_disk = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert sorted(names) == on_disk and len(set(names)) == len(names)
    assert [r["order"] for r in rows] == list(range(1, len(rows) + 1))
    assert all((NOTEBOOKS / "src" / f"{n}.py").exists() for n in names)


def test_the_core_track_is_one_day_and_comes_first():
    rows = table()
    core = [r for r in rows if r["track"] == "core"]
    assert 0 < sum(r["minutes"] for r in core) <= 6 * 60
    assert [r["order"] for r in core] == list(range(1, len(core) + 1))     # core first, then extended
    assert all(r["minutes"] > 0 for r in rows)


def test_the_order_keeps_what_the_lessons_lean_on():
    pos = {r["name"][:2]: r["order"] for r in table()}
    assert pos["11"] < pos["10"]                 # time before you profile, then the step-time lesson
    assert abs(pos["33"] - pos["10"]) == 1       # streams next to step time
    assert pos["12"] > pos["31"]                 # CPU/GPU agreement after mixed precision


def test_readme_names_the_same_core_track():
    core = [r["name"][:2] for r in table() if r["track"] == "core"]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"core track[^:]*:\s*((?:\d\d(?:\s*→\s*)?)+)", text)
    assert m, "README.md should state the core track's order"
    assert re.findall(r"\d\d", m.group(1)) == core


def test_the_lesson_count_in_words_matches_the_table():
    units = "one two three four five six seven eight nine".split()
    words = {**{w: i + 1 for i, w in enumerate(units)}, "twenty": 20, "thirty": 30,
             **{f"{t}-{u}": base + i + 1 for t, base in (("twenty", 20), ("thirty", 30)) for i, u in enumerate(units)}}
    first = (NOTEBOOKS / "README.md").read_text(encoding="utf-8").split("\n\n")[1]
    m = re.match(r"([A-Za-z-]+) lessons", first)
    assert m and words.get(m.group(1).lower()) == len(table()), (m and m.group(1), len(table()))
    # README.md's reading-order line says the same count
    m = re.search(r"orders the ([A-Za-z-]+) lessons", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert m and words.get(m.group(1).lower()) == len(table()), (m and m.group(1), len(table()))

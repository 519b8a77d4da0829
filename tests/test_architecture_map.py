"""docs/architecture.md is a map of the code as it is: every module one row, nothing that does not exist.

The file tree is read at test time, so a new module fails here until its row is added to the map (one
line: `| `workbench/...py` | what it holds |`, in its package's table).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
MAX_WORDS = 5_000

# a table row whose first cell is one backticked path: | `workbench/x/y.py` | ...
_ROW = re.compile(r"^\|\s*`(workbench/[^`]+)`\s*\|")
# a module path named anywhere in a cell: `capture/profiler.py`, `analysis/trace/`, `workbench/cli.py`
_PATH = re.compile(r"`((?:workbench/)?[a-z_]+(?:/[a-z_]+)*(?:\.py|/))`")


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    """The text of the level-2 section whose heading starts with ``title``, up to the next level-2 heading."""
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert m, f"docs/architecture.md has no '## {title}' section"
    return m.group(1)


def _modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "workbench").rglob("*.py")}


def _map_rows() -> Counter:
    rows = Counter()
    for line in _section(_text(), "The map").splitlines():
        m = _ROW.match(line)
        if m:
            rows[m.group(1)] += 1
    return rows


def test_every_module_has_exactly_one_row_in_the_map():
    rows = _map_rows()
    missing = sorted(_modules() - set(rows))
    assert not missing, f"add a row to docs/architecture.md's map for: {missing}"
    repeated = sorted(p for p, n in rows.items() if n > 1)
    assert not repeated, f"one row per module in docs/architecture.md's map; repeated: {repeated}"


def test_the_map_names_no_file_that_does_not_exist():
    stale = sorted(set(_map_rows()) - _modules())
    assert not stale, f"docs/architecture.md's map has rows for files that do not exist: {stale}"


def test_map_rows_are_one_line_with_two_cells():
    for line in _section(_text(), "The map").splitlines():
        if _ROW.match(line):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            assert len(cells) == 2, f"a map row has a path and one line: {line[:120]}"


def test_the_grid_names_only_existing_modules():
    grid = _section(_text(), "Features across the layers")
    named = {m.group(1) for m in _PATH.finditer(grid)}
    assert len(named) > 30, "the feature x layer grid names the modules of each feature"
    for name in named:
        path = name if name.startswith("workbench/") else f"workbench/{name}"
        target = ROOT / path
        ok = target.is_dir() if path.endswith("/") else target.is_file()
        assert ok, f"docs/architecture.md's grid names {name}, which does not exist"


def test_the_doc_stays_a_map():
    words = len(_text().split())
    assert words < MAX_WORDS, f"docs/architecture.md has {words} words; a map stays under {MAX_WORDS}"

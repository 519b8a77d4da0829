"""The front door's rule (workbench/__init__.py): a name is on the door if the README or the tour types it, and
the guided notebooks and the README import a door name from the door, not from the module behind it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import workbench

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOUR = ROOT / "notebooks" / "src" / "00_tour.py"
DOOR = set(workbench._FRONT_DOOR)


def _readme_code() -> str:
    """The README's code: fenced blocks and `inline` spans (a name in prose alone is not 'typed')."""
    text = README.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return "\n".join(blocks + spans)


def _tour_code() -> str:
    """The tour's code cells (markdown cells are comments in the py:percent source)."""
    return "\n".join(line for line in TOUR.read_text().splitlines() if not line.lstrip().startswith("#"))


def test_every_name_on_the_door_is_typed_by_the_readme_or_the_tour():
    typed = _readme_code() + "\n" + _tour_code()
    untyped = sorted(n for n in DOOR if not re.search(rf"(?<![\w.]){re.escape(n)}\b", typed))
    assert untyped == [], f"on the front door but typed by neither the README nor the tour: {untyped}"


def test_the_door_stays_small():
    # about 27 names: loaders, the two analysis objects, capture, the harness (built-ins behind `configs`),
    # the estimator, seven panels, ranks, one clock, format_bytes
    assert 20 <= len(DOOR) <= 30, sorted(DOOR)
    assert set(workbench.__all__) == DOOR | {"__version__", "samples"}


def test_the_builtin_configurations_are_behind_one_name():
    from workbench.capture import configurations as C

    names = list(workbench.configs)
    assert names == ["fp32", "tf32", "amp_bf16", "amp_fp16", "pure_fp16", "pure_bf16", "checkpointing", "compiled",
                     "channels_last", "batch_size_sweep"]
    for n in names:
        assert getattr(workbench.configs, n) is getattr(C, n)
        assert n not in DOOR
    assert workbench.configs.amp_bf16().precision == "bf16"


def _imports_of(code: str, where: str):
    try:
        tree = ast.parse(code, where)
    except SyntaxError:  # an IPython cell (%load_ext, %%workbench): no imports to check
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workbench."):
            for alias in node.names:
                yield node.module, alias.name, node.lineno


def test_notebooks_and_readme_take_door_names_from_the_door():
    offenders = []
    for p in sorted((ROOT / "notebooks" / "src").glob("[0-9]*.py")):
        offenders += [f"{p.name}:{line}: from {mod} import {name}" for mod, name, line in _imports_of(p.read_text(), str(p))
                      if name in DOOR]
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
        offenders += [f"README.md: from {mod} import {name}" for mod, name, _ in _imports_of(block, "README.md")
                      if name in DOOR]
    assert offenders == [], "import these from `workbench` (they are on the door):\n" + "\n".join(offenders)

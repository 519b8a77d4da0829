"""Docs by question (docs/README.md, docs/howto/*.md): every page is linked from the index, and everything a
how-to names exists: each `workbench ...` line parses with the real command line parser (command and flags),
each lesson is a notebook, each panel and front-door name is on the door, each linked doc is there; the
command lines that need no file of yours (shipped sample names) run. The README says how to set up."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import workbench
from testdata import ROOT
from workbench import samples
from workbench.cli import COMMANDS, build_parser, main

DOCS = ROOT / "docs"
HOWTOS = sorted((DOCS / "howto").glob("*.md"))
INDEX = DOCS / "README.md"


def _blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def _command_lines(text: str) -> list[str]:
    """``workbench ...`` lines of the fenced blocks and of `inline` spans, comments dropped (a span that only
    names a command, `workbench trace`, is not a command line)."""
    lines = []
    for block in _blocks(text):
        for line in block.splitlines():
            line = line.strip()
            if line.startswith("workbench "):
                lines.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = [s for s in re.findall(r"`([^`\n]+)`", prose) if s.startswith("workbench ")]
    for span in spans:
        assert span.split()[1] in COMMANDS, span
    lines += [s for s in spans if len(s.split()) > 2]
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        out.append(" ".join(shlex.quote(w) for w in words))
    return out


def test_there_are_five_howtos_and_the_index_links_each():
    assert len(HOWTOS) >= 5
    index = INDEX.read_text()
    linked = set(re.findall(r"\]\((howto/[^)]+\.md)\)", index))
    assert linked == {f"howto/{p.name}" for p in HOWTOS}
    for target in re.findall(r"\]\(([^)#]+\.md)\)", index):
        assert (DOCS / target).is_file(), target


@pytest.mark.parametrize("page", HOWTOS, ids=[p.stem for p in HOWTOS])
def test_a_howto_names_commands_a_panel_and_a_lesson_that_exist(page):
    text = page.read_text()
    parser = build_parser()
    commands = _command_lines(text)
    assert commands, f"{page.name} names no command"
    for line in commands:
        argv = shlex.split(line)[1:]
        assert argv[0] in COMMANDS, line
        try:
            parser.parse_args(argv)
        except Exception as exc:  # the CLI's parser raises on an unknown command or flag
            pytest.fail(f"{page.name}: `{line}` does not parse: {exc}")
    lessons = re.findall(r"`(\d\d_[a-z_]+)`", text)
    assert lessons, f"{page.name} names no lesson"
    for lesson in lessons:
        assert (ROOT / "notebooks" / f"{lesson}.ipynb").is_file(), lesson
    panels = set(re.findall(r"\b([A-Z][A-Za-z]+Panel)\b", text))
    assert panels, f"{page.name} names no panel"
    for name in panels:
        assert name in workbench._FRONT_DOOR, name
    for names in re.findall(r"from workbench import ([\w, ]+)", text):
        for name in (n.strip() for n in names.split(",")):
            assert name in workbench.__all__, name
    for target in re.findall(r"\]\(([^)#]+\.md)\)", text):
        assert (page.parent / target).resolve().is_file(), target


def _runnable(line: str) -> bool:
    """A command line whose every file argument is a shipped sample's name (no file of the reader's needed)."""
    argv = shlex.split(line)[1:]
    if any(a in ("--html", "--csv") for a in argv) or argv[0] in ("monitor", "lab", "estimate"):
        return False
    values = [a for a in argv[1:] if not a.startswith("-")]
    return bool(values) and all(a in samples.SAMPLES or re.fullmatch(r"[\d.]+|\w+=[\d.]+", a) for a in values)


RUNNABLE = sorted({line for page in HOWTOS for line in _command_lines(page.read_text()) if _runnable(line)})


def test_some_howto_lines_run_on_the_samples():
    assert len(RUNNABLE) >= 4, RUNNABLE


@pytest.mark.parametrize("line", RUNNABLE)
def test_the_sample_command_lines_run(line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(line)[1:]
    if argv[0] == "ranks":
        argv += ["--no-cache", "--processes", "1"]
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip()


def test_the_readme_says_how_to_set_up_and_points_to_the_howtos():
    readme = (ROOT / "README.md").read_text()
    for needle in ("make setup", "source .venv/bin/activate", ".venv/bin/workbench", "docs/README.md"):
        assert needle in readme, needle
    assert re.search(r"^setup:", (ROOT / "Makefile").read_text(), flags=re.M)

"""Every guided notebook is a jupytext pair, and the two halves agree.

notebooks/NN_name.ipynb holds the outputs nbval checks; notebooks/src/NN_name.py (py:percent, paired by
notebooks/jupytext.toml) is the text to edit and review. An edit to one side that was not synced to the
other (`make notebooks-sync`) fails here, naming the notebook and the first cell that differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PAIRED = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
SOURCES = sorted(p.stem for p in (NOTEBOOKS / "src").glob("*.py"))
NBVAL_TAGS = {"nbval-skip", "nbval-check-output", "nbval-ignore-output", "nbval-raises-exception",
              "raises-exception"}


def _cells(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(c.cell_type, c.source.strip("\n"), tuple(c.metadata.get("tags", []))) for c in nb.cells]


def test_every_notebook_has_its_source_and_no_source_is_orphaned():
    assert PAIRED, "no guided notebooks found"
    assert PAIRED == SOURCES, "notebooks/*.ipynb and notebooks/src/*.py differ: run `make notebooks-sync`"


@pytest.mark.parametrize("stem", PAIRED)
def test_jupytext_pairs_each_notebook_with_its_source(stem):
    """The pairing JupyterLab and `jupytext --sync` use is the one notebooks/jupytext.toml declares."""
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file
    from jupytext.paired_paths import paired_paths

    found = find_jupytext_configuration_file(str(NOTEBOOKS))
    assert found and Path(found) == NOTEBOOKS / "jupytext.toml"
    ipynb = str(NOTEBOOKS / f"{stem}.ipynb")
    formats = load_jupytext_configuration_file(found).default_formats(ipynb)
    paths = {Path(path) for path, _ in paired_paths(ipynb, "ipynb", formats)}
    assert paths == {NOTEBOOKS / f"{stem}.ipynb", NOTEBOOKS / "src" / f"{stem}.py"}


@pytest.mark.parametrize("stem", PAIRED)
def test_ipynb_and_py_have_the_same_cells_and_tags(stem):
    ipynb = jupytext.read(NOTEBOOKS / f"{stem}.ipynb")
    py = jupytext.read(NOTEBOOKS / "src" / f"{stem}.py", fmt="py:percent")
    a, b = _cells(ipynb), _cells(py)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, (f"{stem}: cell {i} differs between {stem}.ipynb and src/{stem}.py "
                        f"(run `make notebooks-sync`):\n  ipynb: {x!r:.200}\n  py:    {y!r:.200}")
    assert len(a) == len(b), f"{stem}: {len(a)} cells in the .ipynb, {len(b)} in src/{stem}.py: run `make notebooks-sync`"


@pytest.mark.parametrize("stem", PAIRED)
def test_nbval_markers_are_tags_in_the_cell_header(stem):
    """nbval's behaviour per cell is a tag (visible in the .py cell header), not a comment in the code."""
    nb = jupytext.read(NOTEBOOKS / f"{stem}.ipynb")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert "NBVAL_" not in cell.source, f"{stem} cell {i}: an NBVAL_ comment; use a tag (e.g. nbval-check-output)"
        tags = set(cell.metadata.get("tags", []))
        unknown = {t for t in tags if t.startswith("nbval") or "exception" in t} - NBVAL_TAGS
        assert not unknown, f"{stem} cell {i}: tags nbval does not know: {sorted(unknown)}"
        assert not {"nbval-skip", "nbval-check-output"} <= tags, f"{stem} cell {i}: skipped and checked"


def test_the_recorded_pairs_the_notebooks_read_equal_their_recordings():
    """workbench/samples/results/h200_diagnosis_pairs.json is a verbatim copy of tests/data/h200_pairs/*/truth.json."""
    import json

    from workbench.lessons import RESULTS, h200_pair

    data = Path(__file__).resolve().parent / "data" / "h200_pairs"
    truths = {p.parent.name: json.loads(p.read_text()) for p in data.glob("*/truth.json")}
    bundled = json.loads((RESULTS / "h200_diagnosis_pairs.json").read_text())["cases"]
    assert bundled == truths, "re-copy tests/data/h200_pairs/*/truth.json into results/h200_diagnosis_pairs.json"
    assert h200_pair("overhead_fp32")["measured"]["unprofiled"]["median_ms"] > 0
    from workbench.errors import BadArgument

    with pytest.raises(BadArgument, match="no recorded H200 case"):
        h200_pair("nope")


def test_the_compile_pairs_lesson_15_reads_equal_their_recordings():
    """workbench/samples/results/cpu_compile_* are verbatim copies of tests/data/compile_pairs/<backend>-cpu/."""
    import json

    from workbench import samples
    from workbench.lessons import RESULTS

    data = Path(__file__).resolve().parent / "data" / "compile_pairs"
    bundled = json.loads((RESULTS / "cpu_compile_pairs.json").read_text())["backends"]
    assert set(bundled) == {"aot_eager", "inductor"}
    for backend, parts in bundled.items():
        d = data / f"{backend}-cpu"
        for key, name in (("measured", "measured.json"), ("recompile", "recompile.compile.json"),
                          ("dynamic", "dynamic.compile.json"), ("auto", "auto.compile.json")):
            assert parts[key] == json.loads((d / name).read_text()), f"re-copy {d / name} into cpu_compile_pairs.json"
        for v in ("break", "fixed"):
            shipped = samples.path(f"cpu_compile_{backend}_{v}").read_bytes()
            assert shipped == (d / f"{v}.pt.trace.json.gz").read_bytes(), f"re-copy {d / v}.pt.trace.json.gz"


def test_the_oom_whatif_recordings_lesson_21_reads_equal_their_recordings():
    """workbench/samples/oom_whatif/ (sample h100_oom_whatif) holds byte-for-byte copies of three scenarios of
    tests/data/oom_whatif/ (each: snapshot, sidecar, the fixes that were run), the run's env.json, and the
    allocator history the activations checkpointing fix's run kept."""
    from workbench import samples

    data = Path(__file__).resolve().parent / "data" / "oom_whatif"
    shipped = samples.path("h100_oom_whatif")
    names = sorted(p.name for p in shipped.iterdir())
    assert names == sorted(["env.json"] + [f"{s}{ext}" for s in ("activations", "leak", "optimizer_first_step")
                                           for ext in (".json", ".oom.json", ".snapshot.pickle.gz")]
                                          + ["activations.fix_checkpointing.snapshot.pickle.gz"])
    for name in names:
        assert (shipped / name).read_bytes() == (data / name).read_bytes(), f"re-copy {data / name}"


def test_the_tour_fixes_summary_reads_its_traces():
    """workbench/samples/results/h100_tour_fixes.json (the tour reads it) is benchmarks/tour_fixes_summary.py's
    output on tests/data/h100_pairs/tour_fixes: the truth verbatim, each trace read by TraceAnalysis now."""
    import importlib.util
    import json

    from workbench.lessons import RESULTS

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("tfs", root / "benchmarks" / "tour_fixes_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shipped = json.loads((RESULTS / "h100_tour_fixes.json").read_text())
    assert shipped == json.loads(json.dumps(mod.summarize(root / "tests" / "data" / "h100_pairs" / "tour_fixes"),
                                            sort_keys=True)), "rerun benchmarks/tour_fixes_summary.py"

"""The executed H200 copies in docs/h200_notebooks/ against what the lessons and their README say.

The copies are outputs of `tests/gpu/run_notebooks_gpu.py` on the H200; prose that quotes them must
agree with them, and the README must list every copy and no notebook that has none.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COPIES = ROOT / "docs" / "h200_notebooks"


def _outputs(nb_path: Path) -> list[str]:
    nb = json.loads(nb_path.read_text())
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            t = out.get("text") or out.get("data", {}).get("text/plain", "")
            texts.append("".join(t) if isinstance(t, list) else t)
    return texts


def _errors(nb_path: Path) -> list[str]:
    nb = json.loads(nb_path.read_text())
    return [o.get("ename", "") for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize("copy", sorted(COPIES.glob("*.ipynb")), ids=lambda p: p.stem)
def test_each_copy_ran_on_the_gpu_without_an_error(copy):
    text = "\n".join(_outputs(copy))
    assert _errors(copy) == []
    # the GPU cells were not skipped; the H200, or the H100 lent on a day the H200 was not (the README says which)
    assert re.search(r"mode: live CUDA capture on NVIDIA H(?:200|100 80GB HBM3)", text)
    assert not re.search(r"/(?:root|home|work|opt)/", text)  # machine paths stripped


def test_readme_lists_every_copy_and_only_those():
    readme = (COPIES / "README.md").read_text()
    copies = {p.stem for p in COPIES.glob("*.ipynb")}
    lessons = {p.stem for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")}
    assert copies <= lessons
    for name in lessons:
        assert name in readme, name
    for name in lessons - copies:  # a lesson with no executed copy must say so
        row = next(ln for ln in readme.splitlines() if name in ln)
        assert "no executed copy" in row, name


def _quant_tables(copy: Path) -> dict[int, dict[str, dict[str, float]]]:
    tables = {}
    for text in _outputs(copy):
        m = re.search(r"batch (\d+):\n(.*)", text, re.S)
        if not m:
            continue
        rows = {}
        for line in m.group(2).splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 5:
                rows[parts[1]] = {"speedup": float(parts[3]), "peak": float(parts[4])}
        tables[int(m.group(1))] = rows
    return tables


def test_notebook_32_prose_quotes_the_h200_copy():
    tables = _quant_tables(COPIES / "32_quantization.ipynb")
    assert set(tables) == {1, 64}
    prose = (ROOT / "notebooks" / "src" / "32_quantization.py").read_text()
    t1, t64 = tables[1], tables[64]
    for name in ("pure_bf16+int8wo", "pure_bf16+fp8wo"):
        for t in (t1, t64):
            assert f"{t[name]['speedup']:.2f}x" in prose, (name, t[name])
            assert t[name]["speedup"] < 1  # the prose says weight-only was slower than bf16
    for name in ("pure_bf16", "pure_bf16+int8wo", "pure_bf16+fp8wo"):
        assert f"{t1[name]['peak'] / 1e6:.0f} MB" in prose, name
    assert t1["pure_bf16+int8wo"]["peak"] < t1["pure_bf16"]["peak"] < t1["pure_bf16+fp8wo"]["peak"]

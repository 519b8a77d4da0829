"""The notebooks need nothing Binder (CPU only, this repository, binder/environment.yml) lacks.

Static checks of every notebook under notebooks/ and of tests/browser/panels.ipynb:
- no URL fetched from a code cell (a URL string anywhere but inside print()), no `pip install` in a cell,
  no markdown image loaded from the network;
- no machine paths (/work, /home, /root, /Users, /tmp, C:\\) in sources or in stored outputs;
- every cell that needs CUDA or NVML is tagged `nbval-skip` or sits under a CUDA check
  (`if torch.cuda.is_available():`, `"cuda" if torch.cuda.is_available() else "cpu"`, or a name set from one);
- every imported module comes from the standard library, this package, or a distribution that
  binder/environment.yml installs (directly or as a dependency of one it lists).

The browser tests run the same notebooks for real with the network cut and no CUDA device visible
(tests/browser/offline_site/sitecustomize.py, CUDA_VISIBLE_DEVICES=""); nbval runs them on CPU.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "tests" / "browser").glob("*.ipynb"))
IDS = [str(p.relative_to(ROOT)) for p in NOTEBOOKS]

URL = re.compile(r"https?://", re.IGNORECASE)
MACHINE_PATH = re.compile(r"(?<![\w.~-])(/(?:work|home|root|Users|tmp|mnt|scratch)/|[A-Za-z]:\\\\?[\w.-]+\\)")
MARKDOWN_REMOTE_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?https?://|<img[^>]+src=[\"']https?://", re.IGNORECASE)
# torch.cuda attributes that are safe without a GPU (they answer "no")
CUDA_QUERIES = {"is_available", "device_count", "is_initialized", "is_bf16_supported"}


def _code_cells(path: Path):
    from IPython.core.inputtransformer2 import TransformerManager

    tm = TransformerManager()
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            yield i, cell, tm.transform_cell(cell.source)  # magics -> get_ipython() calls: parseable Python


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


@pytest.fixture(params=NOTEBOOKS, ids=IDS)
def notebook(request) -> Path:
    return request.param


def test_there_are_notebooks_to_check():
    assert (ROOT / "tests" / "browser" / "panels.ipynb") in NOTEBOOKS


# -- network -----------------------------------------------------------------------------------------------
def _strings_outside_print(tree: ast.AST) -> list[str]:
    in_print: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            in_print |= {id(n) for n in ast.walk(node)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in in_print]


def test_no_network_fetches(notebook):
    problems = []
    for i, cell, code in _code_cells(notebook):
        tree = ast.parse(code)
        problems += [f"cell {i}: URL in code: {s[:120]!r}" for s in _strings_outside_print(tree) if URL.search(s)]
        if re.search(r"\b(pip|conda|mamba)\s+install\b", cell.source):
            problems.append(f"cell {i}: installs packages (Binder has them from binder/environment.yml)")
    nb = nbformat.read(notebook, as_version=4)
    problems += [f"cell {i}: markdown image from the network" for i, c in enumerate(nb.cells)
                 if c.cell_type == "markdown" and MARKDOWN_REMOTE_IMAGE.search(c.source)]
    assert not problems, f"{notebook.name} needs the network:\n" + "\n".join(problems)


# -- machine paths -----------------------------------------------------------------------------------------
def _output_text(output) -> str:
    parts = [output.get("text", ""), *output.get("traceback", [])]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def test_no_machine_paths(notebook):
    nb = nbformat.read(notebook, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if m := MACHINE_PATH.search(cell.source):
            problems.append(f"cell {i} source: {m.group(0)!r} (use workbench.samples.path(...) or a relative path)")
        for out in cell.get("outputs", []):
            if m := MACHINE_PATH.search(_output_text(out)):
                problems.append(f"cell {i} stored output: {m.group(0)!r} (print a name, not the path; or clear it)")
    assert not problems, f"{notebook.name}:\n" + "\n".join(problems)


# -- CUDA / NVML -------------------------------------------------------------------------------------------
def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    parts.append(node.id if isinstance(node, ast.Name) else "<expr>")
    return ".".join(reversed(parts))


def _cuda_use(n: ast.AST) -> str | None:
    """What node ``n`` itself does that needs a CUDA device or NVML, or None (torch.cuda.is_available() is fine)."""
    if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"cuda(:\d+)?", n.value):
        return repr(n.value)
    if isinstance(n, ast.Attribute):
        name = _dotted(n)
        if name in {"torch.cuda", "cuda"}:  # the module itself, e.g. the inside of torch.cuda.is_available
            return None
        if n.attr == "cuda":  # tensor.cuda(), model.cuda()
            return f"{name}()"
        if re.match(r"(torch\.)?cuda\.", name) and n.attr not in CUDA_QUERIES:
            return name
        if name.startswith("pynvml."):
            return name
    if isinstance(n, ast.Name) and n.id in {"NvmlSampler", "pynvml"}:
        return n.id
    if isinstance(n, (ast.Import, ast.ImportFrom)):
        mods = [a.name for a in n.names] + ([n.module] if isinstance(n, ast.ImportFrom) and n.module else [])
        if any(m.split(".")[0] == "pynvml" for m in mods):
            return "import pynvml"
    return None


def _mentions_check(node: ast.AST, guards: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in CUDA_QUERIES:
            return True
        if isinstance(n, ast.Name) and n.id in guards:
            return True
    return False


def _check_expr(n: ast.AST, guards: set[str]) -> bool:
    """Is ``n`` a CUDA check: torch.cuda.is_available(), a name set from one, or not/and/or/==/if-else of those
    (also torch.device(<check> ...), DEVICE.type)? A model built `.to(DEVICE)` is not a check."""
    if isinstance(n, ast.Call):
        if isinstance(n.func, ast.Attribute) and n.func.attr in CUDA_QUERIES:
            return True
        return _dotted(n.func).split(".")[-1] == "device" and any(_check_expr(a, guards) for a in n.args)
    if isinstance(n, ast.Name):
        return n.id in guards
    if isinstance(n, ast.Attribute):
        return _check_expr(n.value, guards)
    if isinstance(n, ast.UnaryOp):
        return _check_expr(n.operand, guards)
    if isinstance(n, ast.BoolOp):
        return any(_check_expr(v, guards) for v in n.values)
    if isinstance(n, ast.Compare):
        return any(_check_expr(v, guards) for v in (n.left, *n.comparators))
    if isinstance(n, ast.IfExp):
        return _check_expr(n.test, guards)
    return False


def _guard_names(trees: list[ast.AST]) -> set[str]:
    """Names the notebook sets from a CUDA check (GPU = torch.cuda.is_available(), DEVICE = "cuda" if GPU ...)."""
    guards: set[str] = set()
    for _ in range(3):  # names set from names set from a check
        for tree in trees:
            for n in ast.walk(tree):
                if isinstance(n, ast.Assign) and _check_expr(n.value, guards):
                    guards |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return guards


def _unguarded(tree: ast.AST, guards: set[str]) -> list[str]:
    """CUDA uses in ``tree`` outside conditionals on a CUDA check; for a.b.c only the longest chain is named."""
    uses, stack = [], [tree]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.If, ast.IfExp, ast.While, ast.Assert)) and _mentions_check(n.test, guards):
            continue
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
            stack.append(n.value)  # a key such as env["cuda"] (a recorded version string) is no device
            continue
        if (use := _cuda_use(n)) is not None:
            uses.append(use)
        stack.extend(ast.iter_child_nodes(n))
    return sorted(u for u in set(uses) if not any(o != u and o.startswith(u + ".") for o in uses))


def test_gpu_cells_are_tagged_or_guarded(notebook):
    cells = list(_code_cells(notebook))
    trees = [ast.parse(code) for _, _, code in cells]
    guards = _guard_names(trees)
    problems = []
    for (i, cell, _), tree in zip(cells, trees):
        if "nbval-skip" in _tags(cell):
            continue
        # A cell that stops early on CPU (`if not torch.cuda.is_available(): raise/...`) would still fail on
        # Binder, so only conditionals that contain the CUDA use count as guards.
        uses = _unguarded(tree, guards)
        if uses:
            problems.append(f"cell {i}: {', '.join(uses)}")
    assert not problems, (
        f"{notebook.name}: cells that need a GPU: tag them nbval-skip or put them under a CUDA check "
        "(if torch.cuda.is_available(): ...):\n" + "\n".join(problems)
    )


# -- imports against Binder's environment ------------------------------------------------------------------
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@lru_cache(maxsize=1)
def _binder_distributions() -> frozenset[str]:
    """Distributions binder/environment.yml installs, with everything they require (as installed here)."""
    env = yaml.safe_load((ROOT / "binder" / "environment.yml").read_text())
    listed = set()
    for dep in env["dependencies"]:
        for line in dep.get("pip", []) if isinstance(dep, dict) else [dep]:
            if not str(line).startswith("-"):
                listed.add(_norm(re.split(r"[<>=!~\[ ;]", str(line).strip(), maxsplit=1)[0]))
    listed.add("gpu-workbench")  # binder/postBuild installs this repository
    seen, todo = set(), list(listed)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:  # optional extras are not installed by Binder
                continue
            todo.append(_norm(re.split(r"[<>=!~\[ ;(]", req.strip(), maxsplit=1)[0]))
    return frozenset(seen)


def test_gpu_use_detector_on_snippets():
    """The checker itself: a device string or a .cuda() call outside a check is flagged, a dict key is not."""
    def uses(code):
        tree = ast.parse(code)
        return _unguarded(tree, _guard_names([tree]))

    assert uses('x = torch.ones(2, device="cuda")') == ["'cuda'"]
    assert uses("m.cuda()") == ["m.cuda()"]
    assert uses('print(env["cuda"], env["torch"])') == []
    assert uses('GPU = torch.cuda.is_available()\nif GPU:\n    m.cuda()') == []


def test_binder_environment_resolves_here():
    # The import check below walks requirements as installed here; it is blind if these are missing.
    assert {"torch", "plotly", "ipywidgets", "ipykernel", "gpu-workbench"} <= _binder_distributions()


def test_imports_come_from_binder_environment(notebook):
    module_dists = metadata.packages_distributions()
    allowed = _binder_distributions()
    problems = []
    for i, _cell, code in _code_cells(notebook):
        for n in ast.walk(ast.parse(code)):
            if isinstance(n, ast.Import):
                mods = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                mods = [n.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top == "workbench":
                    continue
                dists = {_norm(d) for d in module_dists.get(top, [])}
                if not dists:
                    problems.append(f"cell {i}: import {mod}: not installed in this environment either")
                elif not dists & allowed:
                    problems.append(f"cell {i}: import {mod} (from {sorted(dists)}) is not in binder/environment.yml")
    assert not problems, f"{notebook.name}:\n" + "\n".join(problems)

"""The import graph of ``workbench``: no cycles, and every name imported from the module that defines it.

Cycles are found on grimp's graph (the one import-linter checks its contracts on), imports inside
functions included: a function-level import that closes a cycle is still a cycle, only a later one. The
way out is to move the shared piece down into a module both sides import (``analysis/trace/kernel_names.py``
holds ``gemm_precision`` for ``analysis/trace/flops.py`` and ``analysis/trace/findings.py``).

One home per name: ``from workbench.<module> import name`` anywhere in the repository names the module
that defines ``name``, a module's ``__all__`` lists only what it defines, and no module answers old
names through a module ``__getattr__``. So nothing re-exports a name for an old path, and nothing but
the front door (``workbench._FRONT_DOOR``, the public contract) and the layer packages' ``__init__``
(``workbench.analysis``, ``workbench.io``, ...) gathers names from elsewhere.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
import types
from functools import lru_cache
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # ships with import-linter

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "workbench"
# where the repository's own code imports workbench from
CODE_DIRS = ("workbench", "tests", "benchmarks", "examples", "notebooks/src")
DOCS = ("README.md", "docs/*.md", "docs/h200_notebooks/*.ipynb")
# a module-level __getattr__ that is not a compatibility path: the IPython magics class is built on first
# use so that importing workbench.magic does not import IPython
GETATTR_ALLOWED = {"workbench.magic": {"WorkbenchMagics"}}


# --------------------------------------------------------------------------------------------------
# cycles


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.find_modules_directly_imported_by(v):
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph.modules) + 100))
    try:
        for module in sorted(graph.modules):
            if module not in index:
                visit(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def _describe(graph, component: list[str]) -> str:
    lines = []
    for a in component:
        for b in sorted(graph.find_modules_directly_imported_by(a)):
            if b in component:
                for d in graph.get_import_details(importer=a, imported=b):
                    lines.append(f"  {a}:{d['line_number']}  {d['line_contents']}")
    return "\n".join(lines)


def test_no_import_cycles_inside_workbench():
    graph = grimp.build_graph("workbench", cache_dir=None)
    assert "workbench.analysis.trace.flops" in graph.modules  # the graph is of this checkout
    cycles = _cycles(graph)
    assert cycles == [], "import cycles inside workbench:\n" + "\n\n".join(_describe(graph, c) for c in cycles)


def test_cycle_finder_finds_a_cycle_closed_inside_a_function(tmp_path, monkeypatch):
    # the finder itself: a -> b at module level, b -> a inside a function, c outside the cycle
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from cyclepkg.a import f\n    return f\n")
    (pkg / "c.py").write_text("import cyclepkg.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclepkg", cache_dir=None)
    cycles = _cycles(graph)
    assert cycles == [["cyclepkg.a", "cyclepkg.b"]]
    assert "cyclepkg.b:2" in _describe(graph, cycles[0])


# --------------------------------------------------------------------------------------------------
# one home per name


def _module_file(module: str) -> tuple[Path | None, bool]:
    """(path, is_package) of a workbench module in this checkout; (None, False) if there is none."""
    base = ROOT.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py", True
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None, False


def _bound_names(body: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """Names a module body binds itself (def, class, assignment, loop and with targets; inside module-level
    if/try blocks too) and names it binds by importing."""
    own: set[str] = set()
    imported: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = {
                ast.Assign: lambda n: n.targets,
                ast.AnnAssign: lambda n: [n.target],
                ast.AugAssign: lambda n: [n.target],
                ast.For: lambda n: [n.target],
                ast.With: lambda n: [i.optional_vars for i in n.items if i.optional_vars is not None],
            }[type(node)](node)
            own.update(x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name))
        if isinstance(node, (ast.If, ast.Try, ast.For, ast.With)):
            blocks = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                o, i = _bound_names(block)
                own |= o
                imported |= i
    return own, imported


@lru_cache(maxsize=None)
def _exports(module: str) -> frozenset[str] | None:
    """What ``from <module> import name`` may name: for a plain module what it defines; for a package
    (a layer's public surface) whatever its __init__ binds, its lazy names and its submodules."""
    path, is_package = _module_file(module)
    if path is None:
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own, imported = _bound_names(tree.body)
    if not is_package:
        return frozenset(own)
    folder = path.parent
    subs = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    lazy = set()
    for node in ast.walk(tree):  # _FRONT_DOOR / _NAMES: {"Name": "workbench.module"}
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if (isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(v.value, str)
                        and v.value.startswith("workbench")):
                    lazy.add(k.value)
    return frozenset(own | imported | subs | lazy)


def _sources():
    """(where, python source) of the repository's code, its notebooks' sources, and the code in its docs."""
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*.py")):
            yield str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")
    for pattern in DOCS:
        for p in sorted(ROOT.glob(pattern)):
            rel = str(p.relative_to(ROOT))
            if p.suffix == ".ipynb":
                cells = json.loads(p.read_text(encoding="utf-8"))["cells"]
                for i, cell in enumerate(cells):
                    if cell["cell_type"] == "code":
                        yield f"{rel} cell {i}", "".join(cell["source"])
            else:
                for block in re.findall(r"```(?:python|py)?\n(.*?)```", p.read_text(encoding="utf-8"), re.S):
                    yield rel, block


def _parse(source: str) -> list[ast.Module]:
    """The source as one tree; code that does not parse (a doc snippet with an ellipsis, a notebook cell
    with a magic, a fragment of a string) as one tree per import line."""
    try:
        return [ast.parse(textwrap.dedent(source))]
    except SyntaxError:
        trees = []
        for line in source.splitlines():
            for statement in line.split(";"):
                if statement.strip().startswith("from workbench"):
                    try:
                        trees.append(ast.parse(statement.strip()))
                    except SyntaxError:
                        pass
        return trees


def _from_imports(source: str):
    """(line, module, name) of each ``from workbench... import name``, also in string literals (code a test
    or a benchmark runs in a subprocess)."""
    pending = [(source, 0)]  # (code, line of the file it starts on - 1)
    while pending:
        code, offset = pending.pop()
        for tree in _parse(code):
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                        node.module == "workbench" or node.module.startswith("workbench.")):
                    for alias in node.names:
                        yield offset + node.lineno, node.module, alias.name
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "from workbench" in node.value:
                    pending.append((node.value, offset + node.lineno - 1))


def test_every_workbench_import_names_the_module_that_defines_the_name():
    wrong = []
    for where, source in _sources():
        for line, module, name in _from_imports(source):
            exports = _exports(module)
            if exports is None:
                wrong.append(f"{where}:{line}: from {module} import {name}: there is no module {module}")
            elif name not in exports and _module_file(f"{module}.{name}")[0] is None:
                wrong.append(f"{where}:{line}: from {module} import {name}: {module} does not define {name}")
    assert not wrong, "import each name from the module that defines it:\n" + "\n".join(wrong)


def _modules():
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), p, rel.name == "__init__"


def test_each_module_lists_in_all_only_what_it_defines():
    wrong = {}
    for module, path, is_package in _modules():
        if is_package:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own, _ = _bound_names(tree.body)
        for node in tree.body:
            if (isinstance(node, (ast.Assign, ast.AnnAssign)) and getattr(node, "value", None) is not None
                    and any(isinstance(t, ast.Name) and t.id == "__all__"
                            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                listed = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                others = [n for n in listed if n not in own and n not in GETATTR_ALLOWED.get(module, set())]
                if others:
                    wrong[module] = others
    assert wrong == {}, f"__all__ names that these modules only import (re-exports): {wrong}"


def test_no_module_answers_old_names_through_getattr():
    found = {}
    for module, path, is_package in _modules():
        if is_package:
            continue  # a package's lazy names are its public surface (_FRONT_DOOR, panels' _NAMES)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            found[module] = path.relative_to(ROOT)
    assert set(found) == set(GETATTR_ALLOWED), found


def test_the_package_is_a_plain_module_without_the_package_class():
    import workbench

    assert not hasattr(workbench, "_Package")
    assert type(sys.modules["workbench"]) is types.ModuleType
    # the reason it existed: a submodule named like a front-door name would replace the name on import
    clashes = [name for name in workbench._FRONT_DOOR if _module_file(f"workbench.{name}")[0] is not None]
    assert clashes == []

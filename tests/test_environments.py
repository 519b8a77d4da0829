"""environment.yml (conda) and binder/ list what pyproject.toml requires, with a CPU torch for Binder."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _env_packages(path: Path) -> tuple[set[str], list[str]]:
    env = yaml.safe_load(path.read_text())
    names, pip_lines = set(), []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip_lines = [str(x) for x in dep.get("pip", [])]
            names |= {_name(x) for x in pip_lines if not x.startswith("-")}
        else:
            names.add(_name(dep))
    return names, pip_lines


def test_conda_environment_lists_runtime_and_test_requirements():
    project = _pyproject()["project"]
    required = {_name(r) for r in project["dependencies"]} | {_name(r) for r in project["optional-dependencies"]["test"]}
    names, pip_lines = _env_packages(ROOT / "environment.yml")
    assert required - names == set(), f"environment.yml lacks {sorted(required - names)}"
    assert "-e ." in pip_lines, "environment.yml must install gpu-workbench itself"


def test_binder_lists_runtime_requirements_and_a_cpu_torch():
    project = _pyproject()["project"]
    required = {_name(r) for r in project["dependencies"]}
    names, pip_lines = _env_packages(ROOT / "binder" / "environment.yml")
    assert required - names == set(), f"binder/environment.yml lacks {sorted(required - names)}"
    assert any("download.pytorch.org/whl/cpu" in x for x in pip_lines), "Binder must take torch's CPU build"
    torch_pin = [x for x in pip_lines if x.startswith("torch")]
    tested = re.search(r"torch==([\w.]+)", (ROOT / "constraints.txt").read_text()).group(1)
    assert torch_pin and tested in torch_pin[0], (torch_pin, tested)
    post = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install" in post and " ." in post


def test_binder_folder_holds_only_files_binder_reads():
    # repo2docker reads only binder/ when it exists; anything else there would be dead weight.
    allowed = {"environment.yml", "postBuild", "overrides.json", "README.md"}
    assert {p.name for p in (ROOT / "binder").iterdir()} <= allowed


def test_no_deprecated_pynvml_distribution():
    deps = [_name(r) for r in _pyproject()["project"]["dependencies"]]
    assert "nvidia-ml-py" in deps and "pynvml" not in deps


def test_torch_range_admits_the_tested_release():
    from packaging.specifiers import SpecifierSet

    spec = next(r for r in _pyproject()["project"]["dependencies"] if _name(r) == "torch")
    tested = re.search(r"torch==([\w.]+)", (ROOT / "constraints.txt").read_text()).group(1)
    assert tested in SpecifierSet(spec[len("torch"):])

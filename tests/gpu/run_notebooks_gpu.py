"""Execute every guided notebook on a CUDA machine (GPU cells included) and save executed copies.

Usage (GPU machine, repository root):  python tests/gpu/run_notebooks_gpu.py OUT_DIR [NAME ...]
(NAME: a notebook's number or name prefix, e.g. 22 34; default: all)
The executed copies are what docs/h200_notebooks/ holds: the real numbers each lesson showed on a GPU.
The notebooks in notebooks/ keep their CPU outputs (nbval compares those in CI).
Machine paths in outputs are replaced by <path>.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

_PATHS = re.compile(r"(/(?:root|tmp|opt|home|work|usr|var)/[^\s'\"<>)]*)")


def _scrub(nb) -> None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = _PATHS.sub("<path>", out["text"])
            for key, val in list(out.get("data", {}).items()):
                if isinstance(val, str) and key.startswith("text/"):
                    out["data"][key] = _PATHS.sub("<path>", val)


def main(out_dir: str, only: list[str] = ()) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    for path in sorted(Path("notebooks").glob("[0-9]*.ipynb")):
        if only and not any(path.name.startswith(n) for n in only):
            continue
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                                store_widget_state=False, resources={"metadata": {"path": "notebooks"}})
        t0 = time.perf_counter()
        try:
            client.execute()
            status = "ok"
        except Exception as exc:  # a kernel death or timeout: keep what ran
            status = f"stopped: {type(exc).__name__}: {str(exc)[:200]}"
        errors = [c for c in nb.cells if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
        if errors:
            status += f"; {len(errors)} cell(s) raised"
            failures += 1
            for c in errors:
                err = next(o for o in c["outputs"] if o.get("output_type") == "error")
                print(f"  {path.name}: {err['ename']}: {err['evalue'][:300]}", flush=True)
        _scrub(nb)
        nbformat.write(nb, out / path.name)
        print(f"{path.name}: {status} in {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2:]))

"""Write tests/hostile/corpus/<kind>/<name> from the builders in hostile_cases.py.

Run it after adding a case (``python tests/hostile/make_corpus.py``), review the new files and
commit them: the committed bytes are what the tests read. Stale files are removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hostile_cases  # noqa: E402


def main() -> int:
    root = HERE / "corpus"
    n = 0
    for kind, files in hostile_cases.corpus().items():
        d = root / kind
        d.mkdir(parents=True, exist_ok=True)
        # model files are kept as NAME.py.case: broken Python must not look like a module to tools that
        # compile or lint every .py (the tests stage them as NAME.py)
        files = {(f"{k}.case" if kind == "estimate" else k): v for k, v in files.items()}
        for old in d.iterdir():
            if old.name not in files and old.is_file():
                old.unlink()
        for name, data in files.items():
            (d / name).write_bytes(data)
            n += 1
    print(f"wrote {n} files under {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

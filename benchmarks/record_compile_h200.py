"""The torch.compile pairs of docs/compile.md with inductor on the GPU (an H200), in the layout of
benchmarks/record_compile_pairs.py: tests/data/compile_pairs/inductor-cuda/.

    python benchmarks/record_compile_h200.py          # ~1-2 minutes on an H200 (inductor's caches off)
    python benchmarks/record_compile_h200.py --only auto   # the auto pair alone (the others' numbers kept)

Then tests/test_compile_pairs.py checks that pair too (counts against dynamo's counters, what-ifs within 25%).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record_compile_pairs import main  # noqa: E402

if __name__ == "__main__":
    # arguments given are added after these (the later wins): e.g. --only auto records the auto pair alone
    args = ["--backend", "inductor", "--device", "cuda", "--reps", "60", "--cold-steps", "300", "--cold-reps", "2",
            "--width", "1024", "--batch", "64"] + sys.argv[1:]
    sys.exit(main(args))

"""The shared set-up of the guided notebooks (``notebooks/``): one call at the top of each lesson.

::

    from workbench.lessons import setup
    setup()
    import torch
    GPU = torch.cuda.is_available()   # True: live CUDA capture; False: the recorded H200 samples and CPU runs

:func:`setup` quiets torch's C++ and Kineto logging, seeds Python, NumPy and torch, keeps torch to one
CPU thread when there is no GPU (the notebooks' CPU timings and nbval's runs stay stable on small
machines), hides UserWarnings and sets pandas' display, then prints where the lesson's data comes from.

This module imports torch, NumPy and pandas inside its functions only; it sits outside the layers of
docs/architecture.md (nothing in ``workbench`` imports it).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["setup", "h200_pair", "recording", "recorded_table", "checkout_recorder", "headroom_rule", "HEADROOM_PCT",
           "GIB", "MIB", "RESULTS"]

GIB, MIB = 2**30, 2**20
# Small JSON results recorded on the H200 (the harness ledger, the streams recording) and on an H100 (lessons 17
# and 37, prefixed h100_): see workbench/samples/README.md for where each came from.
RESULTS = Path(__file__).resolve().parent / "samples" / "results"
# docs/memory.md, "Headroom: which batch to run": the share of the largest batch (measured at the longest
# shape) that a long run with changing shapes may use, with expandable segments on (lesson 35's recording).
HEADROOM_PCT = 99


def setup(seed: int = 0, *, precision: int = 4, recorded_on: str = "H200") -> bool:
    """Prepare a lesson's kernel; return whether a CUDA device is there (``GPU``).

    ``seed`` seeds ``random``, NumPy and torch; ``precision`` is pandas' display precision; ``recorded_on``
    names the GPU of the recordings the lesson reads without one (the first line it prints says so).
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # before torch loads Kineto: no profiler chatter on stderr
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    import random
    import warnings

    import numpy as np
    import pandas as pd
    import torch

    gpu = torch.cuda.is_available()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if not gpu:
        torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=UserWarning)
    pd.set_option("display.width", 160, "display.max_colwidth", 70, "display.precision", precision)
    print("mode:", "live CUDA capture on " + torch.cuda.get_device_name(0) if gpu
          else f"recorded {recorded_on} samples (no CUDA device here); CPU runs for what a CPU can show")
    return gpu


def h200_pair(case: str) -> dict:
    """The recorded truth of one H200 before/after case (``results/h200_diagnosis_pairs.json``): its
    ``params``, ``env`` and ``measured`` step times (``median_ms`` etc. per variant, unprofiled)."""
    import json

    cases = json.loads((RESULTS / "h200_diagnosis_pairs.json").read_text())["cases"]
    if case not in cases:
        from workbench.errors import BadArgument

        raise BadArgument(f"no recorded H200 case {case!r}; the recorded ones: {', '.join(sorted(cases))}")
    return cases[case]


def recording(name: str) -> dict:
    """A lesson recorder's JSON shipped in ``results/``, named by the GPU that ran it (e.g.
    ``"h100_lesson17.json"``, ``"h200_lesson36.json"``); one line saying which recorder writes it when the file
    is not there. The recorders write ``h200_<lesson>.json``; a run on another GPU is shipped under that GPU's
    prefix (workbench/samples/README.md)."""
    import json

    path = RESULTS / name
    if not path.is_file():
        from workbench.errors import BadArgument

        gpu, _, stem = name.split(".")[0].partition("_")
        raise BadArgument(f"{path.name} is not in workbench/samples/results/: record it on a GPU with "
                          f"python benchmarks/record_{stem}_h200.py --out DIR and copy DIR/h200_{stem}.json there "
                          f"as {path.name}")
    return json.loads(path.read_text())


def recorded_table(part: dict, table: str = "runs"):
    """One table of a recorder's part (``{"columns": [...], "rows": [[...], ...]}`` under ``part[table]``) as a
    pandas DataFrame; an ``error`` column holding indices into ``part["errors"]`` gets their text.

    >>> part = {"runs": {"columns": ["backend", "error"], "rows": [["flash", 0], ["math", None]]},
    ...         "errors": ["RuntimeError: No available kernel."]}
    >>> recorded_table(part).loc[0, "error"]
    'RuntimeError: No available kernel.'
    """
    import pandas as pd

    t = part[table]
    cols = list(t["columns"])
    texts = part.get("errors") or []
    rows = [list(r) for r in t["rows"]]
    if "error" in cols:
        i = cols.index("error")
        for r in rows:
            if isinstance(r[i], int) and not isinstance(r[i], bool):
                r[i] = texts[r[i]]
    return pd.DataFrame(rows, columns=cols)


def checkout_recorder(script: str, what: str = "your own numbers") -> Path | None:
    """``benchmarks/<script>`` of a gpu-workbench checkout, found from the lesson's folder (a checkout's
    ``notebooks/``) or its parent; None, with one line saying how to get it, when the lesson runs elsewhere
    (the recorders are scripts of the repository, not of the package)."""
    for d in (Path.cwd(), Path.cwd().parent):
        if (d / "benchmarks" / script).is_file():
            return d / "benchmarks" / script
    print(f"This cell runs benchmarks/{script} of a gpu-workbench checkout: open the lesson from the checkout's "
          f"notebooks/ folder (git clone the repository) to record {what}.")
    return None


def headroom_rule(largest_batch: int, peak_allocated_bytes: int, budget_bytes: int) -> dict:
    """docs/memory.md's headroom rule applied to one largest-batch answer (lessons 21, 34 and 35 use it).

    ``fill``: the peak allocated at ``largest_batch`` over ``budget_bytes`` (a per-process cap or the device's
    total); ``batch``: what a long run with changing shapes may use, ``HEADROOM_PCT`` % of ``largest_batch``
    rounded down, with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``allocator_conf``); ``text``: one
    line saying both.

    >>> h = headroom_rule(88, 98 * 2**20, 100 * 2**20)
    >>> h["batch"], round(h["fill"], 2)
    (87, 0.98)
    """
    batch = largest_batch * HEADROOM_PCT // 100
    fill = peak_allocated_bytes / budget_bytes
    conf = "expandable_segments:True"
    return {"largest_batch": largest_batch, "fill": fill, "batch": batch, "allocator_conf": conf,
            "text": (f"largest batch {largest_batch} fills {fill:.1%} of the budget; for a long run with changing "
                     f"shapes: batch {batch} ({HEADROOM_PCT}%, rounded down) with PYTORCH_CUDA_ALLOC_CONF={conf} "
                     "(docs/memory.md, Headroom)")}

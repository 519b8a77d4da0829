"""What every subcommand checks before it starts work: its numeric flags (argparse ``type=``
functions that refuse nan/inf/out-of-range values with one line), its input files (:func:`input_kind`:
a regular file, and what kind of artifact by content, from the registry in ``io/kinds.py``) and its
output files (:func:`prepare_output`: writable, not an input, not a symlink/FIFO;
``io/_files.py::check_output``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable

__all__ = ["finite_float", "positive_float", "non_negative_float", "count", "port", "device_index",
           "gpu_list", "input_kind", "file_kind", "path_kind", "expect_kind", "wrong_file", "use_instead",
           "sample_or_path", "prepare_output", "wrote"]


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return v


def finite_float(text: str) -> float:
    return _float(text)


def positive_float(text: str) -> float:
    v = _float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return v


def non_negative_float(text: str) -> float:
    v = _float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return v


def _int(text: str, lo: int, hi: int, what: str) -> int:
    try:
        v = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"{text}: {what} must be between {lo} and {hi}")
    return v


def count(text: str) -> int:
    """1 .. 10^6 (how many rows to list, a batch size)."""
    return _int(text, 1, 10**6, "the count")


def port(text: str) -> int:
    return _int(text, 1, 65535, "a TCP port")


def device_index(text: str) -> int:
    return _int(text, 0, 4095, "a device index")


def gpu_list(text: str) -> list[int]:
    """``0,2``: NVML indices, each 0..4095."""
    try:
        gpus = [int(g, 10) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give NVML indices separated by commas, e.g. 0,2") from None
    if not gpus or any(not 0 <= g <= 4095 for g in gpus):
        raise argparse.ArgumentTypeError(f"{text!r}: each index must be between 0 and 4095")
    return gpus


def input_kind(path, flag: str, takes: str) -> str:
    """The artifact kind (``io/kinds.py``: ``trace``, ``snapshot``, ``nvml``, ...) of the input ``path``
    given to ``flag``; a missing path, a folder or anything but a regular file raises BadArtifact
    saying that ``flag`` takes ``takes``."""
    from workbench.io import kinds

    return kinds.sniff_file(kinds.check_path(path, flag, takes))


def file_kind(path) -> str:
    """The artifact kind of ``path``, or ``missing`` when it is not a readable regular file (the loader
    then names the problem)."""
    from pathlib import Path

    from workbench.io import kinds

    try:
        return kinds.sniff_file(path) if Path(path).is_file() else "missing"
    except (OSError, ValueError):  # a name too long, a NUL byte...: the loader names the problem
        return "missing"


def path_kind(path) -> str:
    """:func:`file_kind`, and for a folder ``watch`` (a flight recorder's), ``rank_folder`` (it holds
    traces) or ``folder``."""
    from pathlib import Path

    from workbench.io import kinds

    try:
        if Path(path).is_dir():
            kind = kinds.sniff_path(path)
            return kind if kind in ("rank_folder", "watch") else "folder"
    except (OSError, ValueError):
        return "missing"
    return file_kind(path)


def use_instead(kind: str, path) -> str:
    """What reads a file of ``kind``: the registry's ``workbench`` command line with ``path`` in it, else
    its ``fits`` (a panel, an image viewer)."""
    import shlex

    from workbench.io.kinds import KINDS

    k = KINDS[kind]
    if k.command_line:
        return f"Use `{k.command_line.format(path=shlex.quote(_sample_name(path) or str(path)))}`"
    if k.panel:
        return f"Use {k.fits} in a notebook (no workbench command reads it)"
    return f"Use {k.fits}"


def _sample_name(path) -> str | None:
    """The sample name of a shipped sample's path (the suggestion then reads `workbench memory NAME`)."""
    from pathlib import Path

    from workbench import samples

    try:
        p = Path(path).resolve()
        return next((n for n in samples.SAMPLES if samples.path(n) == p), None)
    except (OSError, ValueError, RuntimeError):
        return None


def wrong_file(path, kind: str, takes: str, fix: str | None = None):
    """The one-line BadArtifact for ``path``, recognised as ``kind``, given where ``takes`` is read:
    what it is and what reads it (``fix`` overrides the registry's suggestion)."""
    from workbench.errors import BadArtifact
    from workbench.io.kinds import describe

    return BadArtifact(path, f"is {describe(kind)}, not {takes}", fix or use_instead(kind, path))


def expect_kind(path, accepts: tuple[str, ...], takes: str) -> str:
    """The kind of the input ``path`` when it is one of ``accepts``; a file recognised as another kind of
    artifact (or a folder of per-rank traces) raises BadArtifact naming the command (or panel) that reads
    it (:func:`wrong_file`). A file not recognised, or not a readable file, passes: its loader then names
    the problem."""
    from workbench.io.kinds import KINDS

    kind = path_kind(path)  # a folder of per-rank traces is named as such; another folder: the loader says
    if kind in accepts:
        return kind
    if kind in KINDS:
        raise wrong_file(path, kind, takes)
    return kind


def sample_or_path(arg):
    """A command's file argument: the shipped sample of that name (``workbench.samples``, e.g.
    ``h200_train_step``) when no file or folder of that name exists here, else the path as given."""
    if isinstance(arg, str) and arg and not os.path.lexists(arg):  # lexists: False, not OSError, for odd names
        from workbench import samples

        if arg in samples.SAMPLES:
            return str(samples.path(arg))
    return arg


def prepare_output(path: str | None, inputs: Iterable[str | os.PathLike | None] = (), what: str = "output"):
    """The checked target for ``--csv``/``--html`` (None when the flag was not given), before any work."""
    if not path:
        return None
    from workbench.io._files import check_output

    return check_output(path, [p for p in inputs if p], what)


def wrote(target, what: str = "") -> str:
    """The stderr line after writing: says when an existing file was replaced."""
    from workbench.io._files import output_note

    return output_note(target, what)

"""The ``workbench`` command: one argparse front over io, analysis and report.

Each subcommand lives in ``workbench/commands/<name>.py`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``; those modules import heavy packages inside
``run`` so that ``workbench --help`` stays fast. Bad input never shows a traceback: any
:class:`~workbench.errors.WorkbenchError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workbench import __version__
from workbench.errors import WorkbenchError

__all__ = ["main", "build_parser", "COMMANDS"]

# name -> one-line help. Order is the order `--help` lists them.
COMMANDS = {
    "trace": "summary and findings of one Kineto trace (.json or .json.gz)",
    "diff": "before/after comparison of two Kineto traces or two allocator snapshots",
    "memory": "allocator snapshot summary, with an OOM post-mortem when it holds one",
    "monitor": "live NVML samples per GPU (or a replay of a recorded session)",
    "estimate": "predict a training step's peak GPU memory without a GPU",
    "lab": "open JupyterLab on the guided notebooks",
}


def _commands():
    for name, help_text in COMMANDS.items():
        yield name, help_text, importlib.import_module(f"workbench.commands.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="gpu-workbench: profile and optimize PyTorch on NVIDIA GPUs.",
        epilog="Exit codes: 0 ok, 2 bad input or missing device (one line on stderr), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-workbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, module in _commands():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except WorkbenchError as exc:
        print(f"workbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench trace x | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

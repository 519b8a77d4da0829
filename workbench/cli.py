"""The ``workbench`` command: one argparse front over io, analysis and report.

Each subcommand lives in ``workbench/commands/<name>.py`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``; those modules import heavy packages inside
``run`` so that ``workbench --help`` stays fast. Bad input never shows a traceback: any
:class:`~workbench.errors.WorkbenchError` becomes one line on stderr and exit code 2, and anything
else (a bug) one line naming the files, the exception and "please report" (:data:`REPORT_LINE`;
``--debug`` or ``WORKBENCH_DEBUG=1`` prints the traceback too), also exit code 2. A refusal that comes
from the user's own code (``workbench estimate FILE.py`` whose ``model()`` raises) is one line too; its
traceback is printed above that line under ``--debug``. Ctrl-C is "interrupted" and exit code 130, also
when it lands while the command line is parsed or while the interpreter shuts down (:func:`console_main`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback

from workbench import __version__
from workbench.errors import WorkbenchError

__all__ = ["main", "console_main", "keep_pyarrow_out", "build_parser", "COMMANDS", "NO_PYARROW"]

# name -> one-line help. Order is the order `--help` lists them.
COMMANDS = {
    "trace": "summary and findings of one Kineto trace (.json or .json.gz)",
    "ranks": "cross-rank view of a distributed run: per-rank time, collectives, straggler",
    "diff": "before/after comparison of two Kineto traces or two allocator snapshots",
    "memory": "allocator snapshot summary, with an OOM post-mortem when it holds one",
    "monitor": "live NVML samples per GPU (or a replay of a recorded session)",
    "estimate": "predict a training step's peak GPU memory without a GPU",
    "timeline": "a trace, an allocator snapshot and NVML/GPM samples of one run on one clock",
    "watch": "the captures a flight recorder (watch(...)) took in a long run, and why",
    "lab": "open JupyterLab on the guided notebooks",
}


def _commands():
    for name, help_text in COMMANDS.items():
        yield name, help_text, importlib.import_module(f"workbench.commands.{name}")


class _UsageError(Exception):
    """A bad command line (argparse's error), shown as one line by main()."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line raises _UsageError (one line, exit 2) instead of printing the
    usage block and exiting from inside the parser."""

    def error(self, message):
        raise _UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="workbench",
        description="gpu-workbench: profile and optimize PyTorch on NVIDIA GPUs.",
        epilog="Exit codes: 0 ok, 2 bad input or missing device (one line on stderr), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-workbench {__version__}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="on an error, print the traceback too (of your own code's exception, for estimate)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, module in _commands():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, print the traceback too")
        p.set_defaults(_run=module.run)
    return parser


# the flags that name files, for the last-resort line (which file was being worked on)
_FILE_ARGS = ("paths", "path", "base", "test", "file", "replay", "profiler_timeline", "csv", "html")
REPORT_LINE = "this is a bug in gpu-workbench, please report it"
DEBUG_ENV = "WORKBENCH_DEBUG"


def _files_of(args) -> str:
    names = []
    for k in _FILE_ARGS:
        v = getattr(args, k, None)
        names += [str(x) for x in v] if isinstance(v, list) else ([str(v)] if v else [])
    return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")


def _one_line(text: str, width: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"{exc.prog}: error: {_one_line(exc, 500)} (see {exc.prog} --help)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return 130
    if not getattr(args, "_run", None):
        print(f"workbench: error: give a command ({', '.join(COMMANDS)}); see workbench --help", file=sys.stderr)
        return 2
    debug = bool(getattr(args, "debug", False) or os.environ.get(DEBUG_ENV))
    try:
        return int(args._run(args) or 0)
    except WorkbenchError as exc:
        user = getattr(exc, "user_exception", None)  # the user's own exception (estimate FILE.py)
        if debug and isinstance(user, BaseException):
            traceback.print_exception(type(user), user, user.__traceback__)
        elif debug:
            traceback.print_exc()
        print(f"workbench {args.command}: error: {_one_line(exc, 2000)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench trace x | head`
        return 0
    except MemoryError:
        print(f"workbench {args.command}: error: ran out of memory on {_files_of(args) or 'the input'}; "
              "free memory or give a smaller file", file=sys.stderr)
        return 2
    except Exception as exc:  # the last resort: one line, never a traceback (--debug shows it)
        if debug:
            traceback.print_exc()
        files = _files_of(args)
        print(f"workbench {args.command}: unexpected error{' on ' + files if files else ''}: "
              f"{type(exc).__name__}: {_one_line(exc)}; {REPORT_LINE} (with the file if you can; "
              f"--debug shows the traceback)", file=sys.stderr)
        return 2


# Commands that never read or write Parquet. The executable runs them with pyarrow kept out of the process:
# pandas (3.x) imports pyarrow whenever it is installed and then backs its strings with it, which costs the
# process ~47 MiB of peak memory on a 15 MB trace (159 -> 112 MiB) for nothing this command needs; without
# it pandas keeps strings as Python objects, and `workbench trace` printed the same bytes (text and --json)
# on every trace of the test data and the samples (benchmarks/RESULTS.md). `ranks` (its Parquet cache) and
# the rest keep pyarrow. WORKBENCH_PYARROW=1 keeps it for these too.
NO_PYARROW = frozenset({"trace"})


def keep_pyarrow_out(argv: list[str] | None = None) -> bool:
    """For a process about to run ``workbench ARGV`` and nothing else: when the command is one of
    :data:`NO_PYARROW` and neither pandas nor pyarrow is imported yet, make ``import pyarrow`` fail in this
    process (``sys.modules['pyarrow'] = None``), so that pandas runs without it. Returns whether it did.
    :func:`console_main` calls it; :func:`main` (tests, notebooks) leaves the process alone."""
    args = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in args if not a.startswith("-")), None)
    if (command not in NO_PYARROW or os.environ.get("WORKBENCH_PYARROW")
            or "pandas" in sys.modules or "pyarrow" in sys.modules):
        return False
    sys.modules["pyarrow"] = None  # import pyarrow -> ImportError; pandas treats it as not installed
    return True


def _exit_130(signum, frame):  # pragma: no cover - runs in a subprocess while it winds down
    os._exit(130)


def console_main(argv: list[str] | None = None) -> int:
    """The ``workbench`` executable (and ``python -m workbench``): :func:`main`, then the process ends
    here, never returning. A Ctrl-C that lands after the command is done, while Python winds down, must
    not turn into a death by SIGINT (Python restores the default handler late in its shutdown, and
    torch's teardown can take a second): the winding down is done here under a handler that exits with
    130 (non-daemon threads joined, ``atexit`` callbacks run, output flushed), then ``os._exit`` ends
    the process without the interpreter's own teardown. (:func:`main` is what tests and notebooks call:
    it leaves signals and the process alone.)"""
    import atexit
    import threading

    keep_pyarrow_out(argv)
    try:
        rc = main(argv)
    except KeyboardInterrupt:  # landed between main()'s own handlers
        print("workbench: interrupted", file=sys.stderr)
        rc = 130
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _exit_130)
        for t in threading.enumerate():  # as the interpreter would: wait for non-daemon threads
            if t is not threading.current_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    except KeyboardInterrupt:
        rc = 130
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`workbench trace x | head`)
            pass
    os._exit(rc)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(console_main())

"""IPython magics: ``%load_ext workbench``, then

``%%workbench [--detail light|standard|full] [--memory] [--nvml] [--steps N] [--out DIR]`` on a cell
    profiles the cell (CPU always, CUDA when present; ``--steps N`` runs it N times, one ``ProfilerStep``
    each), records the allocator's history with ``--memory`` (CUDA; on a CPU-only machine the profiler's
    CPU ``[memory]`` events), samples NVML and the GPM counters meanwhile with ``--nvml``, then shows the
    :class:`~workbench.panels.ProfilerPanel` (its diagnosis on top) and the
    :class:`~workbench.panels.TimelinePanel` (trace, memory and NVML on one clock) under the cell. The
    artifacts stay on disk (``--out DIR``, default ``$WORKBENCH_RUN_DIR`` or ``<tmp>/gpu-workbench/runs``)
    and their paths are printed, for ``workbench timeline`` / ``trace`` / ``memory`` later. The
    :class:`~workbench.capture.session.RunResult` is left in the notebook as ``_workbench_run``.

    An exception in the cell propagates unchanged (IPython shows its traceback as for any cell); what
    was captured until then is kept and its paths printed first.

``%workbench monitor [--replay FILE] [--no-dock]``
    opens the live GPU panel (NVML + GPM; a replay where NVML is missing). With the ``sidecar`` package
    installed it docks in a JupyterLab side panel unless ``--no-dock``. The panel is shown once and left in
    the notebook as ``_workbench_monitor`` (``_workbench_monitor.close()`` stops it).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from workbench.errors import WorkbenchError

__all__ = ["WorkbenchMagics", "load_ipython_extension", "unload_ipython_extension", "cell_parser", "line_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # an IPython UsageError: one line, no SystemExit
        from IPython.core.error import UsageError

        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def cell_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%workbench", add_help=False,
                description="profile this cell; trace + allocator + NVML/GPM on one clock")
    p.add_argument("--detail", choices=("light", "standard", "full"), default="light",
                   help="profiler detail (default light: the cheapest)")
    p.add_argument("--memory", action="store_true", help="record allocations (CUDA allocator history; CPU [memory] events)")
    p.add_argument("--nvml", action="store_true", help="sample NVML and the GPM counters while the cell runs")
    p.add_argument("--steps", type=int, default=1, metavar="N", help="run the cell N times, one ProfilerStep each")
    p.add_argument("--out", metavar="DIR", default=None, help="where the artifacts go")
    return p


def line_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%workbench", add_help=False, description="%workbench monitor: the live GPU panel")
    p.add_argument("command", choices=("monitor",))
    p.add_argument("--replay", metavar="FILE", default=None, help="replay a recorded session instead of NVML")
    p.add_argument("--no-dock", dest="dock", action="store_false", help="show under the cell, not in a side panel")
    return p


def _display(obj) -> None:
    from IPython.display import display

    display(obj)


def run_cell_profiled(shell, cell: str, args) -> tuple:
    """Run ``cell`` in ``shell``'s namespace under :func:`~workbench.capture.session.record_run`;
    returns ``(RunResult, panels)``. Exceptions from the cell propagate (after the paths are printed)."""
    from workbench.capture.session import record_run

    if args.steps < 1:
        from IPython.core.error import UsageError

        raise UsageError("%%workbench: --steps must be >= 1")
    src = shell.transform_cell(cell)
    try:  # registered in linecache like any cell, so a traceback shows the cell's lines
        filename = shell.compile.cache(src, shell.execution_count, raw_code=cell)
    except Exception:
        filename = "<%%workbench cell>"
    code = compile(src, filename, "exec")
    rec = record_run(args.out, detail=args.detail, memory=args.memory, nvml=args.nvml)
    try:
        with rec:
            for _ in range(args.steps):
                exec(code, shell.user_ns)  # noqa: S102 - the user's own cell, as IPython would run it
                rec.step()  # after each run of the cell: code after the last step() is not a step
    except BaseException:
        _report(rec.result, failed=True)
        shell.user_ns["_workbench_run"] = rec.result
        raise
    result = rec.result
    shell.user_ns["_workbench_run"] = result
    _report(result, failed=False)
    panels = _panels(result)
    for p in panels:
        _display(p)
    return result, panels


def _report(result, failed: bool) -> None:
    head = ("gpu-workbench: the cell raised; partial capture kept" if failed else
            f"gpu-workbench: {result.steps} step(s) on {result.device}, {result.detail} detail, {result.wall_s:.2f} s")
    lines = [head]
    for kind, path in result.paths().items():
        lines.append(f"  {kind}: {path}")
    for note in result.notes:
        lines.append(f"  note: {note}")
    print("\n".join(lines), file=sys.stdout, flush=True)


def _panels(result) -> list:
    from workbench.panels.profiler import ProfilerPanel
    from workbench.panels.timeline import TimelinePanel

    panels = []
    if result.trace is not None:
        panels.append(ProfilerPanel(result.trace))          # its diagnosis and findings on top
    src = result.sources()
    if any(v is not None for v in src.values()):
        panels.append(TimelinePanel(**src))
    return panels


def open_monitor(args):
    """``%workbench monitor``: a LiveGpuPanel, docked with sidecar when it is installed."""
    from workbench.panels.nvml import LiveGpuPanel

    panel = LiveGpuPanel(replay=args.replay) if args.replay else LiveGpuPanel()
    if args.dock:
        try:
            from sidecar import Sidecar
        except ImportError:
            Sidecar = None
        if Sidecar is not None:
            car = Sidecar(title="GPU (workbench)")
            with car:
                _display(panel)
            panel.sidecar = car
            return panel
    _display(panel)
    return panel


def _magics_class():
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class WorkbenchMagics(Magics):
        """``%%workbench`` (profile a cell) and ``%workbench monitor`` (the live panel); module docstring."""

        @line_cell_magic
        def workbench(self, line, cell=None):
            try:
                if cell is None:
                    args = line_parser().parse_args(shlex.split(line))
                    # shown once, here (returning it would make IPython show it a second time as the
                    # cell's result); the panel stays in the notebook as _workbench_monitor
                    self.shell.user_ns["_workbench_monitor"] = open_monitor(args)
                    return None
                args = cell_parser().parse_args(shlex.split(line))
                run_cell_profiled(self.shell, cell, args)
                return None
            except WorkbenchError as exc:
                if getattr(exc, "workbench_run", None) is not None:
                    raise  # raised by the cell itself: unchanged
                from IPython.core.error import UsageError

                raise UsageError(f"%workbench: {exc}") from None  # our own: one line, like the CLI

    return WorkbenchMagics


def __getattr__(name):
    if name == "WorkbenchMagics":
        return _magics_class()
    raise AttributeError(name)


def load_ipython_extension(ipython) -> None:
    """``%load_ext workbench``: registers ``%workbench`` / ``%%workbench``."""
    ipython.register_magics(_magics_class())


def unload_ipython_extension(ipython) -> None:
    ipython.magics_manager.magics["line"].pop("workbench", None)
    ipython.magics_manager.magics["cell"].pop("workbench", None)

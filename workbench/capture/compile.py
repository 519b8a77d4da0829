"""What torch.compile (dynamo) did while some code ran: its graphs, graph breaks, recompiles and compile time.

    with record_compile() as rec:          # profile_steps, profile() and record_run open one themselves
        for x in batches:
            step(x)
            rec.call()                     # a call boundary: steps_until_stable counts them
    stamp = rec.stamp()                    # plain JSON: stamped into the trace as ``workbench_compile``

Dynamo reports through torch's structured trace log (the records ``TORCH_TRACE=DIR`` writes to files, read by
tlparse): while the block runs a logging handler sits on that log and keeps the few records that say what
happened (``compilation_metrics`` per frame compiled, the ``dynamo_graph_break_reason`` and
``recompile_reasons`` artifacts, ``create_symbol`` per size made dynamic), cut to what the analysis reads. The
stamp holds those records as a TORCH_TRACE folder would give them
(:func:`workbench.io.compile_log.load_compile_log` returns the same shape), dynamo's own counters over the
block (``torch._dynamo.utils.counters``: unique graphs, graph breaks, frames) and per call the wall time and
the number of frames compiled in it. Everything about those records (counts, reasons, compile time, what-ifs)
is computed in :mod:`workbench.analysis.trace.compile`, never here.

A handler on the structured log makes dynamo format its records (graphs, guards) while it compiles;
dynamo measures that (``structured_logging_overhead_s`` per frame) and the analysis takes it out of
the compile time. Nothing is attached when dynamo was never imported (no compiled code can run then), nor with
``WORKBENCH_COMPILE_LOG=0`` (then only the counters are stamped).

torch is imported inside the functions, never at module import.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from workbench.io.compile_log import keep_record

__all__ = ["record_compile", "CompileRecorder", "STAMP_KEY", "force_eager"]

STAMP_KEY = "workbench_compile"   # the trace metadata key (docs/compile.md)
STAMP_VERSION = 1

class _Handler(logging.Handler):
    def __init__(self, sink: list):
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if not isinstance(meta, dict):
            return
        try:
            kept = keep_record(meta, getattr(record, "payload", None))
        except Exception:  # a record of a shape we do not know: not ours to fail on
            return
        if kept is not None:
            self.sink.append(kept)


def _counters_now() -> dict | None:
    dyn = sys.modules.get("torch._dynamo.utils")
    if dyn is None:
        return None
    c = dyn.counters
    return {
        "unique_graphs": int(c["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(c["graph_break"].values())),
        "frames": int(c["frames"].get("total", 0)),
        "frames_ok": int(c["frames"].get("ok", 0)),
    }


class CompileRecorder:
    """See the module docstring. ``call(ms=None)`` closes a call (its wall time when known);
    ``stamp()`` the JSON-able record; ``compiled`` whether any frame was compiled in the block."""

    def __init__(self):
        self.records: list[dict] = []
        self.calls: list[dict] = []
        self.eager_step_ms: float | None = None
        self._handler = None
        self._log = None
        self._before = None
        self._after = None
        self._seen = 0
        self._t_call = 0.0

    # -- the block -------------------------------------------------------------------------------

    def __enter__(self) -> "CompileRecorder":
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def start(self) -> None:
        if "torch._dynamo" not in sys.modules:
            self._t_call = time.perf_counter()
            return   # nothing compiled can run without dynamo imported; check again at stop()
        self._attach()

    def _attach(self) -> None:
        if self._handler is not None:
            return
        try:
            from torch._logging._internal import trace_log
        except Exception:  # a torch without the structured log: counters only
            trace_log = None
        if os.environ.get("WORKBENCH_COMPILE_LOG", "1") == "0":
            trace_log = None   # the user's choice: counters only (no reasons, no compile time)
        self._before = _counters_now()
        if trace_log is not None:
            self._handler = _Handler(self.records)
            self._log = trace_log
            trace_log.addHandler(self._handler)
        self._t_call = time.perf_counter()

    def call(self, ms: float | None = None) -> None:
        """A call (a step) ended: how long it took (``ms``, else the time since the last boundary) and
        how many frames dynamo compiled during it."""
        if self._handler is None and "torch._dynamo" in sys.modules:
            self._attach()   # dynamo was imported by the first call itself (torch.compile inside it)
        now = time.perf_counter()
        if ms is None:
            ms = (now - self._t_call) * 1e3
        n = sum(1 for r in self.records[self._seen:] if r["kind"] == "compilation_metrics")
        self._seen = len(self.records)
        self.calls.append({"ms": round(float(ms), 4), "compiles": n})
        self._t_call = time.perf_counter()

    def stop(self) -> None:
        if self._handler is not None and self._log is not None:
            self._log.removeHandler(self._handler)
        self._handler = None
        self._after = _counters_now()

    @property
    def compiled(self) -> bool:
        return any(r["kind"] == "compilation_metrics" for r in self.records)

    def counters(self) -> dict | None:
        """Dynamo's own counters over the block (after minus before), None when dynamo never ran."""
        before, after = self._before, self._after or _counters_now()
        if after is None:
            return None
        before = before or {k: 0 for k in after}
        return {k: after[k] - before.get(k, 0) for k in after}

    def stamp(self) -> dict:
        """The ``workbench_compile`` trace metadata (docs/compile.md): plain JSON."""
        import torch

        return {
            "version": STAMP_VERSION,
            "source": "capture",
            "torch": str(torch.__version__),
            "records": list(self.records),
            "counters": self.counters(),
            "calls": list(self.calls),
            "eager_step_ms": self.eager_step_ms,
        }


def record_compile() -> CompileRecorder:
    """A :class:`CompileRecorder` to use as a context manager (see the module docstring)."""
    return CompileRecorder()


def force_eager():
    """``torch.compiler.set_stance("force_eager")`` (torch >= 2.6): compiled functions run their original
    code eagerly inside the block, so the same step can be timed without compiling. None when this torch
    has no stances."""
    import torch

    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:
        return None
    try:
        return set_stance("force_eager")
    except Exception:
        return None

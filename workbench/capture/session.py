"""Record one run's three artifacts together: a profiler trace, the allocator's history and NVML/GPM samples.

``with record_run(out_dir, detail="light", memory=True, nvml=True) as run: ...; run.step()`` profiles the
block (CPU always, CUDA when present, :class:`~workbench.capture.profiler.ProfileSession`), records the
allocator's history when asked and CUDA is there (:class:`~workbench.capture.memory.record_memory_history`;
on a CPU-only machine the profiler records CPU ``[memory]`` events instead, ``profile_memory=True``),
and samples NVML (+GPM) in the background meanwhile (:class:`~workbench.capture.nvml.NvmlSampler`, with
``time_ns``). All three land in ``out_dir`` under one stem and go on one clock with
:func:`workbench.analysis.timeline.align`. The ``%%workbench`` cell magic and ``TimelinePanel.from_step`` use it.

An exception in the block propagates unchanged; what was recorded up to then is written (``complete`` is
False) and the :class:`RunResult` is attached to the exception as ``workbench_run``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import NoNVML

__all__ = ["record_run", "RunResult", "default_run_dir"]

_COUNTER = itertools.count(1)


def default_run_dir() -> Path:
    """``$WORKBENCH_RUN_DIR``, else ``<tmp>/gpu-workbench/runs``."""
    env = os.environ.get("WORKBENCH_RUN_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "gpu-workbench" / "runs"


@dataclass
class RunResult:
    """What a recorded run left on disk (None for what was not recorded) and what happened."""

    trace: Path | None = None
    snapshot: Path | None = None
    nvml: Path | None = None
    device: str = "cpu"
    detail: str = "light"
    complete: bool = True
    wall_s: float = 0.0
    steps: int = 0
    memory_source: str | None = None     # "allocator" (CUDA history) | "profiler" (the trace's [memory] events)
    notes: list[str] = field(default_factory=list)

    def paths(self) -> dict[str, Path]:
        return {k: v for k, v in (("trace", self.trace), ("snapshot", self.snapshot), ("nvml", self.nvml))
                if v is not None}

    def sources(self) -> dict:
        """``trace=``, ``memory=``, ``nvml=`` for ``TimelinePanel`` / ``workbench.analysis.timeline.align``."""
        memory = self.snapshot if self.snapshot is not None else (self.trace if self.memory_source == "profiler" else None)
        return {"trace": self.trace, "memory": memory, "nvml": self.nvml}


class record_run:  # noqa: N801 - a context manager named for what it does
    """See the module docstring. ``detail``: the profiler's ``light``/``standard``/``full``; ``memory``:
    record allocations; ``nvml``: sample NVML/GPM every ``nvml_interval_s`` (0.1 s: the GPM refresh)."""

    def __init__(self, out_dir=None, *, detail: str = "light", memory: bool = False, nvml: bool = False,
                 nvml_interval_s: float = 0.1, device: str | None = None, name: str | None = None):
        from workbench.capture.profiler import detail_options

        detail_options(detail)   # a bad detail fails before anything starts
        self.out_dir = Path(out_dir) if out_dir is not None else default_run_dir()
        self.detail, self.memory, self.nvml = detail, bool(memory), bool(nvml)
        self.nvml_interval_s = float(nvml_interval_s)
        self.device = device
        self.stem = name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_COUNTER)}"
        self.result = RunResult(detail=detail)
        self._sampler = None
        self._mem = None
        self._prof = None
        self._t0 = 0.0
        self._marks = 0

    def _path(self, suffix: str) -> Path:
        return self.out_dir / f"{self.stem}{suffix}"

    def __enter__(self) -> "record_run":
        from workbench.capture.memory import cuda_available, record_memory_history
        from workbench.capture.profiler import ProfileSession

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._t0 = time.perf_counter()
        r = self.result
        cuda = cuda_available() and (self.device is None or str(self.device).startswith("cuda"))
        if self.nvml:
            from workbench.capture.nvml import NvmlSampler

            sampler = NvmlSampler(interval_s=self.nvml_interval_s, slow_interval_s=None)
            try:
                sampler.start()
                self._sampler = sampler
                r.notes.extend(sampler.notes)
            except NoNVML as exc:
                r.notes.append(f"NVML not sampled: {exc}")
        profile_memory = None
        if self.memory:
            if cuda:
                self._mem = record_memory_history(self._path(".snapshot.pickle.gz"))
                self._mem.__enter__()
                r.memory_source = "allocator"
            else:
                profile_memory = True   # CPU: the profiler's own [memory] events
                r.memory_source = "profiler"
                r.notes.append("no CUDA device: memory from the profiler's CPU [memory] events")
        session = ProfileSession(self._path(".pt.trace.json.gz"), detail=self.detail, device=self.device,
                                 profile_memory=profile_memory)
        try:
            session.__enter__()
        except BaseException:
            self._stop_side(None)
            raise
        self._prof = session
        r.device = session.device
        return self

    def step(self) -> None:
        """End the current step (``ProfilerStep#N`` in the trace); call it after each step: code after
        the last call is not a step (without any call the whole block is one)."""
        if self._prof is not None:
            self._prof.step()
            self._marks += 1

    def __exit__(self, exc_type, exc, tb) -> bool:
        r = self.result
        prof, self._prof = self._prof, None
        try:
            if prof is not None:
                try:
                    prof.__exit__(exc_type, exc, tb)
                finally:
                    r.steps = max(self._marks, 1)  # step() after each step; none: the block is one
                    if prof.result is not None:
                        r.trace = prof.result.path
        finally:
            self._stop_side(exc)
            r.complete = exc is None
            r.wall_s = time.perf_counter() - self._t0
            if exc is not None:
                try:
                    exc.workbench_run = r  # type: ignore[attr-defined]
                except Exception:
                    pass
                if hasattr(exc, "add_note") and r.paths():
                    exc.add_note("gpu-workbench: partial capture kept: "
                                 + ", ".join(f"{k} {v}" for k, v in r.paths().items()))
        return False   # never swallow the block's exception

    def _stop_side(self, exc) -> None:
        r = self.result
        if self._mem is not None:
            mem, self._mem = self._mem, None
            try:
                mem.__exit__(type(exc) if exc is not None else None, exc, None)
                r.snapshot = mem.result.path
            except Exception as err:  # the snapshot is a by-product: say so, keep the cell's own outcome
                r.notes.append(f"allocator snapshot not written: {type(err).__name__}: {err}")
        if self._sampler is not None:
            s, self._sampler = self._sampler, None
            s.stop()
            try:
                r.nvml = s.save(self._path(".nvml.jsonl.gz"))
            except Exception as err:
                r.notes.append(f"NVML session not written: {type(err).__name__}: {err}")

    def sources(self) -> dict:
        return self.result.sources()

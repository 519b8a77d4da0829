"""The cross-rank view of a distributed run: per-rank time, collectives matched across ranks, stragglers.

Each rank's trace is first reduced to a :class:`RankFrame` (its steps, its collectives, and where its
time went), which is small, picklable and cacheable: this is what worker processes or Dask workers send
back, never the trace itself (the loading, pool / Dask fan-out and cache are ``io/rank_loading.py``'s).
:func:`cross_rank` then puts the frames side by side.

>>> from workbench import samples
>>> from workbench.analysis.trace.ranks import load_ranks
>>> view = load_ranks(samples.path("ranks_straggler"), processes=1, cache=False)  # doctest: +SKIP
>>> view.straggler["rank"]  # doctest: +SKIP
2

Definitions:

* *Collectives* are the device kernels of NCCL/RCCL (``is_communication_kernel``) and the host
  collectives of gloo (``gloo:all_reduce`` etc., which move the data on host threads). A collective is
  keyed by process group and sequence number: the group comes from the event's ``Process Group Name``
  / ``Process Group ID`` args when Kineto wrote them (else, on a GPU, the stream, and for gloo the
  trace's only process group in ``distributedInfo``); the sequence from its ``Seq`` arg when present,
  else its position among the group's collectives of the same ProfilerStep. The same key on every rank
  is one collective.
* *Clocks*: ranks on one host (the trace's ``host_name``) share a clock and are taken as they are.
  When the ranks come from several hosts (or do not say), each host's clock is aligned on collective
  completion: all ranks leave a collective together (it cannot finish before the last one arrives),
  so a host's offset is the median, over its ranks' matched collectives, of their end time minus the
  median end time across ranks.
* A collective's *start skew* is the latest start minus the earliest; the rank that started last
  *arrived last*. Its *transfer* time is the median end minus the last start: what the collective
  takes once everyone is there. A rank *waits* in a collective from its own start to the last
  arrival; waits are unions of intervals, so collectives in flight together (DDP's buckets) count once.
* The *straggler* is the rank the others wait for: for each rank, the others' wait in the collectives
  it arrived last at, per step (median over the other ranks). It is named when that wait is at least
  ``STRAGGLER_MIN_STEP_FRACTION`` of the median step and it arrived last at more than
  ``STRAGGLER_MIN_LAST_FRACTION`` of the collectives (a majority: on a healthy run the last arrival
  moves from rank to rank); otherwise ``straggler`` is None.
* Per rank time (over its window: the ProfilerStep span, joined with GPU activity on a GPU): on a GPU,
  *compute* is compute-kernel time, *communication* the union of collective time (kernels and gloo),
  *exposed communication* the part of it no compute kernel overlaps, *idle* the window minus all
  device activity (memcpy/memset are in ``memory_us``). On a CPU-only trace compute is the time the
  step's thread spends in ops that are not collectives. *overlap* = 1 - exposed / communication.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from workbench.analysis import _intervals as iv
from workbench.analysis.trace import tables as ta
from workbench.analysis.findings import Finding
from workbench.errors import BadArgument, BadArtifact
from workbench.units import format_ms, format_pct

__all__ = [
    "RankFrame",
    "RanksView",
    "rank_frame",
    "cross_rank",
    "load_ranks",
    "ranks_summary",
    "STRAGGLER_MIN_STEP_FRACTION",
    "STRAGGLER_MIN_LAST_FRACTION",
    "EXPOSED_COMM_WARN",
    "TRANSFER_WARN",
]

# thresholds (module constants, so tests and users can see them)
STRAGGLER_MIN_STEP_FRACTION = 0.10  # the others wait >= 10% of a step for one rank
STRAGGLER_MIN_LAST_FRACTION = 0.5  # ... and it arrived last at more than half the collectives (a majority)
EXPOSED_COMM_WARN = 0.20  # exposed communication >= 20% of the window (median rank)
TRANSFER_WARN = 0.20  # collectives' own transfer time >= 20% of a step

_COLL_COLUMNS = ["pg", "name", "step", "seq", "seq_given", "ts_us", "dur_us", "msg_nelems", "where"]
_RANK_IN_NAME = re.compile(r"rank[-_ ]?(\d+)", re.I)
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


# ------------------------------------------------------------------------------------------- per rank


@dataclass
class RankFrame:
    """One rank reduced to what the cross-rank view needs (a few KB whatever the trace's size).

    ``steps``: step, start_us, dur_us. ``collectives``: pg, name, step, seq, seq_given, ts_us, dur_us,
    msg_nelems, where ('gpu' kernel or 'cpu' gloo op). ``time``: window_us, compute_us,
    communication_us, exposed_communication_us, memory_us, idle_us.
    """

    file: str  # the trace's file name (no folder: outputs must not depend on where the files are)
    rank: int | None  # from distributedInfo
    world_size: int | None
    backend: str | None
    device: str
    n_events: int
    steps: pd.DataFrame
    collectives: pd.DataFrame
    time: dict[str, float] = field(default_factory=dict)
    path: str = ""  # where it was read from (not in any JSON output)
    host: str | None = None  # the trace's host_name (ranks on one host share a clock)
    numbers: dict = field(default_factory=dict)  # StepNumbers.as_dict(): the one step/busy/idle/communication
    start_unix_ns: int | None = None  # the trace's first event on Unix time (None when it carries no Unix time)

    # cache form: the collectives as the table, everything else as JSON metadata
    def to_cache(self) -> tuple[pd.DataFrame, dict]:
        meta = {
            "file": self.file, "rank": self.rank, "world_size": self.world_size, "backend": self.backend,
            "device": self.device, "n_events": self.n_events, "time": self.time, "host": self.host,
            "numbers": self.numbers, "start_unix_ns": self.start_unix_ns,
            "steps": {c: self.steps[c].tolist() for c in ("step", "start_us", "dur_us")},
        }
        return self.collectives, meta

    @classmethod
    def from_trace(cls, trace) -> "RankFrame":
        """:func:`rank_frame` (what ``io.rank_loading`` calls in each worker)."""
        return rank_frame(trace)

    @classmethod
    def from_cache(cls, frame: pd.DataFrame, meta: dict, path: str = "") -> "RankFrame":
        """The frame of a cache entry; ``path``: the trace it was read for (its name becomes ``file``:
        two copies of one trace share an entry)."""
        steps = pd.DataFrame(meta["steps"]).astype({"step": "int64", "start_us": float, "dur_us": float})
        coll = frame.astype({"step": "int64", "seq": "int64", "seq_given": bool, "ts_us": float, "dur_us": float})
        coll["msg_nelems"] = coll["msg_nelems"].astype("Int64")
        return cls(Path(path).name if path else meta["file"], meta["rank"], meta["world_size"],
                   meta["backend"], meta["device"], int(meta["n_events"]), steps, coll[_COLL_COLUMNS],
                   dict(meta["time"]), path, meta.get("host"), dict(meta.get("numbers") or {}),
                   meta.get("start_unix_ns"))


def _int_or_none(v) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def _step_of(ts: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The ProfilerStep each time falls in (the last one started before it); -1 before the first."""
    if steps.empty:
        return np.full(ts.shape, -1, np.int64)
    order = np.argsort(steps["start_us"].to_numpy(), kind="stable")
    starts = steps["start_us"].to_numpy()[order]
    nums = steps["step"].to_numpy(np.int64)[order]
    i = np.searchsorted(starts, ts, side="right") - 1
    return np.where(i >= 0, nums[np.maximum(i, 0)], -1)


def _collectives(trace, steps: pd.DataFrame) -> pd.DataFrame:
    ev = trace.events
    dist = trace.metadata.get("distributedInfo") if isinstance(trace.metadata, dict) else None
    pgs = dist.get("pg_config") if isinstance(dist, dict) else None
    only_pg = None
    if isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict):
        only_pg = str(pgs[0].get("pg_name", "0"))
    parts = []
    k = ev[ev["cat"] == "kernel"]
    k = k[ta.is_communication_kernel(k["name"])]
    c = ta.cpu_collectives(ev)
    for rows, where in ((k, "gpu"), (c, "cpu")):
        if rows.empty:
            continue
        n = len(rows)
        if "pg" in rows:
            pg = rows["pg"].astype(object).to_numpy()
        else:
            pg = np.full(n, None, dtype=object)
        missing = pd.isna(pg)
        if missing.any():
            if where == "gpu":
                fallback = np.array([f"stream {s}" for s in rows["stream"].astype("Int64").astype(str)], dtype=object)
            else:
                fallback = np.full(n, only_pg if only_pg is not None else "gloo", dtype=object)
            pg = np.where(missing, fallback, pg)
        name = rows["name"].astype(str).to_numpy()
        if "coll_name" in rows:
            cn = rows["coll_name"].astype(object).to_numpy()
            name = np.where(pd.isna(cn), name, cn)
        seq = rows["seq"].to_numpy(np.int64, na_value=-1) if "seq" in rows else np.full(n, -1, np.int64)
        nel = rows["msg_nelems"].astype("Int64").to_numpy() if "msg_nelems" in rows else pd.array([pd.NA] * n, "Int64")
        ts = rows["ts_us"].to_numpy(np.float64)
        parts.append(pd.DataFrame({
            "pg": pg.astype(str), "name": name.astype(str), "step": _step_of(ts, steps), "seq": seq,
            "seq_given": seq >= 0, "ts_us": ts, "dur_us": rows["dur_us"].fillna(0.0).to_numpy(np.float64),
            "msg_nelems": pd.array(nel, dtype="Int64"), "where": where,
        }))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
            _COLL_COLUMNS, [object, object, "int64", "int64", bool, float, float, "Int64", object])})
    out = pd.concat(parts, ignore_index=True).sort_values(["pg", "ts_us"], kind="stable", ignore_index=True)
    # no Seq arg: the position among the group's collectives in the same step (steps are numbered
    # alike on every rank, so a rank whose profile starts a step later still lines up)
    derived = ~out["seq_given"].to_numpy()
    if derived.any():
        pos = out[derived].groupby(["pg", "step"], sort=False).cumcount().to_numpy()
        out.loc[derived, "seq"] = pos
    return out[_COLL_COLUMNS]


def _time_split(trace, steps: pd.DataFrame, coll: pd.DataFrame) -> dict[str, float]:
    ev = trace.events
    gs, ge = ta._gpu_intervals(ev)
    cpu = coll[coll["where"] == "cpu"]
    cs = cpu["ts_us"].to_numpy(np.float64)
    ce = cs + cpu["dur_us"].to_numpy(np.float64)
    out = dict.fromkeys(("window_us", "compute_us", "communication_us", "exposed_communication_us",
                         "memory_us", "idle_us"), 0.0)
    if gs.size:
        lo, hi = ta._window(ev, gs, ge)
    elif not steps.empty:
        lo, hi = float(steps["start_us"].min()), float((steps["start_us"] + steps["dur_us"]).max())
    elif cs.size:
        lo, hi = float(cs.min()), float(ce.max())
    else:
        return out

    def clip(s, e):
        return np.clip(s, lo, hi), np.clip(e, lo, hi)

    if gs.size:
        k = ev[ev["cat"] == "kernel"]
        kinds = ta._kind_by_category(k)
        ks_, ke_ = k["ts_us"].to_numpy(np.float64), ta._end(k)
        comp = clip(ks_[kinds == "compute"], ke_[kinds == "compute"])
        comm = clip(np.r_[ks_[kinds == "communication"], cs], np.r_[ke_[kinds == "communication"], ce])
        m = ev[ev["cat"].isin(("gpu_memcpy", "gpu_memset"))]
        mem = clip(np.r_[m["ts_us"].to_numpy(np.float64), ks_[kinds == "memory"]],
                   np.r_[ta._end(m), ke_[kinds == "memory"]])
    else:
        # CPU-only: the step threads' host ops that are not collectives are the compute
        host = ev[ev["cat"].isin(ta.HOST_OPS)]
        is_step = ta._by_name(host["name"], lambda s: s.str.match(ta._STEP_RE)).astype(bool)
        key = host["pid"].to_numpy(np.int64) * (1 << 32) + host["tid"].to_numpy(np.int64)
        step_threads = np.unique(key[is_step]) if is_step.any() else np.unique(key)[:0]
        if step_threads.size == 0 and len(host):
            # no steps: the thread with the most host time
            busiest = pd.Series(host["dur_us"].fillna(0.0).to_numpy()).groupby(key).sum().idxmax()
            step_threads = np.array([busiest])
        is_comm = (ta.is_communication_kernel(host["name"])
                   | ta._by_name(host["name"], lambda s: s.str.contains(ta.CPU_COLLECTIVE_RE)).astype(bool))
        keep = np.isin(key, step_threads) & ~is_step & ~is_comm
        h = host[keep]
        comp = clip(h["ts_us"].to_numpy(np.float64), ta._end(h))
        hc = host[np.isin(key, step_threads) & is_comm]  # c10d::allreduce_ etc. on the step thread
        comm = clip(np.r_[cs, hc["ts_us"].to_numpy(np.float64)], np.r_[ce, ta._end(hc)])
        mem = (np.zeros(0), np.zeros(0))
    u_comp = iv.total_length(*comp)
    u_comm = iv.total_length(*comm)
    u_cc = iv.total_length(np.r_[comp[0], comm[0]], np.r_[comp[1], comm[1]])
    u_all = iv.total_length(np.r_[comp[0], comm[0], mem[0]], np.r_[comp[1], comm[1], mem[1]])
    out.update(
        window_us=hi - lo, compute_us=u_comp, communication_us=u_comm, exposed_communication_us=u_cc - u_comp,
        memory_us=u_all - u_cc, idle_us=max((hi - lo) - u_all, 0.0),
    )
    return {k: float(v) for k, v in out.items()}


def rank_frame(trace) -> RankFrame:
    """Reduce one loaded :class:`~workbench.io.trace.Trace` to its :class:`RankFrame`."""
    md = trace.metadata if isinstance(trace.metadata, dict) else {}
    dist = md.get("distributedInfo") if isinstance(md.get("distributedInfo"), dict) else {}
    st = ta._steps(trace.events)[["step", "start_us", "dur_us"]].reset_index(drop=True)
    coll = _collectives(trace, st)
    return RankFrame(
        file=Path(trace.path).name,
        rank=trace.rank,
        world_size=_int_or_none(dist.get("world_size")),
        backend=str(dist["backend"]) if dist.get("backend") is not None else None,
        device=trace.device,
        n_events=int(trace.n_events),
        steps=st,
        collectives=coll,
        time=_time_split(trace, st, coll),
        path=str(trace.path),
        host=str(md["host_name"]) if md.get("host_name") is not None else None,
        numbers=ta.step_numbers(trace.events).as_dict(),
        start_unix_ns=_start_unix_ns(trace),
    )


def _start_unix_ns(trace) -> int | None:
    from workbench.analysis.timeline import trace_placement

    p = trace_placement(trace)
    return int(p.first_ns + p.offset_ns) if p.aligned else None


# ------------------------------------------------------------------------------------------- across


@dataclass
class RanksView:
    """The ranks side by side. ``ranks``: one row per rank (see :func:`ranks_summary` for the columns);
    ``events``: every rank's collectives with ``rank`` and clock-aligned ``start_us``/``end_us``;
    ``collectives``: one row per matched collective; ``straggler``: dict or None; ``findings``."""

    world_size: int
    ranks: pd.DataFrame
    events: pd.DataFrame
    collectives: pd.DataFrame
    straggler: dict | None
    findings: list[Finding]
    unmatched: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    frames: list[RankFrame] = field(default_factory=list)
    # (path, why) of the rank traces that were given but could not be read (corrupt, truncated, lost
    # on the cluster); also in ``skipped``. While any is missing there is no straggler verdict.
    unread: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # mixed devices, runs far apart (job_warnings)

    def __repr__(self) -> str:
        s = "none" if self.straggler is None else f"rank {self.straggler['rank']}"
        return (f"RanksView(world_size={self.world_size}, ranks={len(self.ranks)}, "
                f"collectives={len(self.collectives)}, straggler={s})")


def _assign_ranks(frames: list[RankFrame]) -> list[int]:
    """Ranks from distributedInfo; when some trace lacks one, from file names that say ``rank3``
    (``rank-3``, ``rank_3``; a name's other numbers are pids and timestamps, never a rank), else the
    order given."""
    ranks = [f.rank for f in frames]
    if all(r is not None for r in ranks):
        source = "distributedInfo"
    else:
        names = []
        for f in frames:
            m = _RANK_IN_NAME.search(f.file)
            names.append(f.rank if f.rank is not None else (int(m.group(1)) if m else None))
        if all(r is not None for r in names) and len(set(names)) == len(names):
            ranks, source = names, "distributedInfo and file names"
        else:
            ranks, source = list(range(len(frames))), "order"
    seen: dict[int, str] = {}
    for r, f in zip(ranks, frames):
        if r in seen:
            raise BadArgument(
                f"{seen[r]} and {f.file} both are rank {r} (from {source}); give one trace per rank"
            )
        seen[r] = f.file
    return ranks


def _union_by(group: np.ndarray, s: np.ndarray, e: np.ndarray) -> dict:
    out = {}
    for g in np.unique(group):
        m = group == g
        out[g] = iv.total_length(s[m], e[m])
    return out


def cross_rank(frames: Sequence[RankFrame], skipped: Sequence[tuple[str, str]] = (),
               unread: Sequence[tuple[str, str]] = ()) -> RanksView:
    """Put the ranks' frames side by side: match collectives, align clocks, find the straggler.

    ``unread``: the rank traces that were given but could not be read. The others are analysed; the
    straggler verdict is withheld (an unread rank may be the one the others wait for: a verdict among
    the rest could name the wrong rank), and an ``unread_ranks`` finding names them."""
    frames = list(frames)
    if not frames:
        raise BadArgument("no rank traces to compare; give the per-rank trace files, a folder or a glob")
    ranks = _assign_ranks(frames)
    order = np.argsort(ranks, kind="stable")
    frames = [frames[i] for i in order]
    ranks = [ranks[i] for i in order]
    sizes = {f.world_size for f in frames if f.world_size}
    world = max(sizes) if sizes else len(frames)

    ev = pd.concat(
        [f.collectives.assign(rank=r) for f, r in zip(frames, ranks)], ignore_index=True
    ) if frames else pd.DataFrame()
    ev["start_us"] = ev["ts_us"] if len(ev) else pd.Series(dtype=float)
    ev["end_us"] = ev["ts_us"] + ev["dur_us"] if len(ev) else pd.Series(dtype=float)
    ev["key_step"] = np.where(ev["seq_given"].to_numpy(bool), -1, ev["step"].to_numpy(np.int64)) if len(ev) else 0
    keys = ["pg", "key_step", "seq"]
    n_ranks = len(frames)
    offsets = dict.fromkeys(ranks, 0.0)
    matched = pd.DataFrame()
    unmatched = 0
    if len(ev):
        cnt = ev.groupby(keys, sort=False)["rank"].transform("nunique")
        full = cnt.to_numpy() == n_ranks
        unmatched = int(ev[~full].groupby(keys, sort=False).ngroups)
        ev["matched"] = full
        hosts = {r: (f.host if f.host is not None else f"rank {r}") for f, r in zip(frames, ranks)}
        if n_ranks > 1 and full.any() and len(set(hosts.values())) > 1:
            m = ev[full]
            med_end = m.groupby(keys, sort=False)["end_us"].transform("median")
            host_of = m["rank"].map(hosts)
            off = (m["end_us"] - med_end).groupby(host_of).median()
            offsets.update({r: float(off.get(h, 0.0)) for r, h in hosts.items()})
            shift = ev["rank"].map(offsets).to_numpy(np.float64)
            ev["start_us"] = ev["ts_us"] - shift
            ev["end_us"] = ev["start_us"] + ev["dur_us"]
        matched = _matched_table(ev[full], keys)
    else:
        ev["matched"] = pd.Series(dtype=bool)

    steps_n = {r: len(f.steps) for f, r in zip(frames, ranks)}
    # the one step definition (tables.step_numbers, the same median `workbench trace` shows)
    step_ms = {r: (float(f.numbers["step_ms"]) if f.numbers.get("delimited") else float("nan")) if f.numbers
               else (float(np.median(f.steps["dur_us"])) / 1e3 if len(f.steps) else float("nan"))
               for f, r in zip(frames, ranks)}
    wait_total, blame = _waits(ev[ev["matched"]] if len(ev) else ev, matched, ranks)
    rows = []
    for f, r in zip(frames, ranks):
        t = f.time
        comm = t.get("communication_us", 0.0)
        rows.append({
            "rank": r, "file": f.file, "steps": steps_n[r], "step_ms": step_ms[r],
            "window_us": t.get("window_us", 0.0), "compute_us": t.get("compute_us", 0.0),
            "communication_us": comm, "exposed_communication_us": t.get("exposed_communication_us", 0.0),
            "memory_us": t.get("memory_us", 0.0), "idle_us": t.get("idle_us", 0.0),
            "overlap": (1.0 - t.get("exposed_communication_us", 0.0) / comm) if comm > 0 else float("nan"),
            "wait_us": wait_total.get(r, 0.0), "clock_offset_us": offsets.get(r, 0.0),
            "collectives": int((f.collectives.shape[0])),
            "gpu_busy_ms": f.numbers.get("gpu_busy_ms", float("nan")),
            "idle_ms": f.numbers.get("idle_ms", float("nan")),
            "communication_ms": f.numbers.get("communication_ms", float("nan")),
            "device": f.device,
        })
    table = pd.DataFrame(rows)
    straggler = None if unread else _straggler(table, matched, blame)
    view = RanksView(world, table, ev, matched, straggler, [], unmatched, list(skipped), frames, list(unread))
    view.findings = _findings(view)
    view.warnings = job_warnings([(f.file, f.device, f.start_unix_ns) for f in frames])
    return view


FAR_APART_S = 6 * 3600.0  # ranks of one job start within seconds of each other; a day apart: other runs


def job_warnings(traces) -> list[str]:
    """What says that traces are not one job (or not one machine): ``traces``: ``(file, device,
    start_unix_ns)`` each. Mixed devices, and runs whose first events are more than ``FAR_APART_S``
    apart (traces without Unix time are not compared)."""
    out = []
    devices = {}
    for file, dev, _ in traces:
        if dev and str(dev) not in ("unknown GPU", "None"):  # a trace that does not say is no evidence
            devices.setdefault(str(dev), []).append(file)
    if len(devices) > 1:
        out.append("mixed devices: " + "; ".join(f"{d} ({', '.join(fs)})" for d, fs in devices.items())
                   + ": these traces are not one job on one kind of GPU")
    starts = [(t, file) for file, _, t in traces if t is not None]
    if len(starts) >= 2:
        (t0, f0), (t1, f1) = min(starts), max(starts)
        gap_s = (t1 - t0) / 1e9
        if gap_s > FAR_APART_S:
            out.append(f"runs far apart: {f1} starts {_span(gap_s)} after {f0}; ranks of one job start together")
    return out


def _span(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds:.0f} s"


def _matched_table(m: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    cols = ["pg", "name", "step", "seq", "ranks", "start_us", "duration_us", "transfer_us", "skew_us",
            "last_rank", "msg_nelems", "where"]
    if m.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols + ["key_step", "last_start_us", "end_us"]})
    g = m.groupby(keys, sort=False)
    last_idx = g["start_us"].idxmax()
    out = pd.DataFrame({
        "name": g["name"].first(),
        "step": g["step"].min(),
        "ranks": g["rank"].nunique(),
        "start_us": g["start_us"].min(),
        "last_start_us": g["start_us"].max(),
        "duration_us": g["dur_us"].median(),
        "end_us": g["end_us"].median(),
        "msg_nelems": g["msg_nelems"].max(),
        "where": g["where"].first(),
    })
    out["last_rank"] = m.loc[last_idx.to_numpy(), "rank"].to_numpy()
    out["skew_us"] = out["last_start_us"] - out["start_us"]
    out["transfer_us"] = np.maximum(out["end_us"] - out["last_start_us"], 0.0)
    out = out.reset_index()
    out = out.sort_values(["start_us", "pg", "seq"], kind="stable", ignore_index=True)
    return out[cols + ["key_step", "last_start_us", "end_us"]]


def _waits(m: pd.DataFrame, matched: pd.DataFrame, ranks: list[int]):
    """Per rank: total wait (union over its collectives of [own start, last arrival)); per candidate
    straggler s: {other rank: union of its waits in the collectives s arrived last at}."""
    if m.empty or matched.empty:
        return {}, {}
    keys = ["pg", "key_step", "seq"]
    info = matched.set_index(keys)[["last_start_us", "last_rank"]]
    j = m.join(info, on=keys)
    s = j["start_us"].to_numpy(np.float64)
    e = np.maximum(j["last_start_us"].to_numpy(np.float64), s)
    r = j["rank"].to_numpy(np.int64)
    last = j["last_rank"].to_numpy(np.int64)
    total = _union_by(r, s, e)
    blame: dict[int, dict[int, float]] = {}
    for cand in np.unique(last):
        sel = (last == cand) & (r != cand)
        blame[int(cand)] = {int(k): v for k, v in _union_by(r[sel], s[sel], e[sel]).items()}
    return {int(k): float(v) for k, v in total.items()}, blame


def _straggler(table: pd.DataFrame, matched: pd.DataFrame, blame: dict) -> dict | None:
    if matched.empty or len(table) < 2 or not blame:
        return None
    steps = max(int(np.nanmedian(table["steps"])) if len(table) else 0, 1)
    step_us = float(np.nanmedian(table["step_ms"])) * 1e3 if table["step_ms"].notna().any() else float("nan")
    others = table["rank"].tolist()
    best, best_wait = None, 0.0
    for cand, waits in blame.items():
        vals = [waits.get(o, 0.0) for o in others if o != cand]
        w = float(np.median(vals)) / steps if vals else 0.0
        if w > best_wait:
            best, best_wait = cand, w
    if best is None:
        return None
    n_last = int((matched["last_rank"] == best).sum())
    last_frac = n_last / len(matched)
    frac = best_wait / step_us if step_us == step_us and step_us > 0 else float("nan")
    if not (frac >= STRAGGLER_MIN_STEP_FRACTION and last_frac > STRAGGLER_MIN_LAST_FRACTION):
        return None
    mine = matched[matched["last_rank"] == best]
    row = table.set_index("rank")
    return {
        "rank": int(best),
        "wait_ms_per_step": best_wait / 1e3,
        "evidence": {
            "last_arrivals": n_last,
            "collectives": int(len(matched)),
            "last_arrival_fraction": last_frac,
            "others_wait_us_per_step": {str(o): blame[best].get(o, 0.0) / steps for o in others if o != best},
            "median_skew_us": float(mine["skew_us"].median()),
            "step_us": step_us,
            "wait_fraction_of_step": frac,
            "straggler_wait_us": float(row.loc[best, "wait_us"]),
            "steps": steps,
        },
    }


def _findings(view: RanksView) -> list[Finding]:
    out: list[Finding] = []
    t = view.ranks
    ms = lambda us: format_ms(us, decimals=1, small_in_us=True)  # noqa: E731
    step_us = float(np.nanmedian(t["step_ms"])) * 1e3 if len(t) and t["step_ms"].notna().any() else float("nan")
    steps = max(int(np.nanmedian(t["steps"])) if len(t) else 1, 1)
    if view.straggler is not None:
        s = view.straggler
        ev = s["evidence"]
        frac = ev["wait_fraction_of_step"]
        out.append(Finding(
            "straggler", "critical" if frac >= 0.25 else "warning",
            f"rank {s['rank']} arrives last at {ev['last_arrivals']} of {ev['collectives']} collectives; the other "
            f"ranks wait {ms(s['wait_ms_per_step'] * 1e3)} per step for it ({format_pct(frac, decimals=0)} of a "
            f"{ms(step_us)} step). Look at what rank {s['rank']} does before its collectives (data loading, "
            "uneven batch or sequence lengths, a slower GPU or host, extra logging on that rank)",
            {"rank": s["rank"], "wait_per_step_us": s["wait_ms_per_step"] * 1e3,
             "wait_fraction": frac, "last_arrivals": ev["last_arrivals"], "collectives": ev["collectives"],
             "median_skew_us": ev["median_skew_us"]},
        ))
    if len(t) and (t["window_us"] > 0).any():
        share = float(np.median(t["exposed_communication_us"] / t["window_us"].where(t["window_us"] > 0)))
        if share >= EXPOSED_COMM_WARN:
            wait = float(np.median(t["wait_us"])) if "wait_us" in t else 0.0
            exposed = float(np.median(t["exposed_communication_us"]))
            out.append(Finding(
                "exposed_communication", "critical" if share >= 0.5 else "warning",
                f"communication nothing overlaps takes {format_pct(share, decimals=0)} of the median rank's time "
                f"({ms(exposed)} over the profile), {ms(min(wait, exposed))} of it waiting for late ranks. "
                "Overlap it with compute (DDP: a smaller bucket_cap_mb starts each bucket's all-reduce earlier "
                "in backward; FSDP: forward/backward prefetch) or cut it (fewer, larger collectives; "
                "lower-precision gradients)",
                {"exposed_fraction": share, "exposed_communication_us": exposed, "wait_us": wait},
            ))
    c = view.collectives
    if len(c) and step_us == step_us and step_us > 0:
        # union: collectives in flight together (DDP buckets) count once
        per_step = iv.total_length(c["last_start_us"].to_numpy(np.float64),
                                   np.maximum(c["end_us"], c["last_start_us"]).to_numpy(np.float64)) / steps
        if per_step / step_us >= TRANSFER_WARN:
            top = c.sort_values("transfer_us", ascending=False).iloc[0]
            nel = top["msg_nelems"]
            size = f" of {int(nel):,} elements" if pd.notna(nel) else ""
            out.append(Finding(
                "slow_collective", "critical" if per_step / step_us >= 0.5 else "warning",
                f"the collectives themselves (after every rank has arrived) take {ms(per_step)} per step "
                f"({format_pct(per_step / step_us, decimals=0)} of the step); the longest, {top['name']}{size} "
                f"in group {top['pg']}, transfers for {ms(float(top['transfer_us']))}. Send less (bf16/fp16 "
                "gradients, compression hooks), fuse small collectives, or check the interconnect",
                {"transfer_per_step_us": per_step, "transfer_fraction": per_step / step_us,
                 "longest_name": str(top["name"]), "longest_pg": str(top["pg"]),
                 "longest_transfer_us": float(top["transfer_us"]), "longest_skew_us": float(top["skew_us"])},
            ))
    if view.unmatched:
        out.append(Finding(
            "unmatched_collectives", "info",
            f"{view.unmatched} collectives are not on every rank's trace (profiles of different steps, or a "
            "trace cut short); they are left out of skew and straggler figures. Profile the same steps on "
            "every rank (one torch.profiler schedule)",
            {"unmatched": view.unmatched},
        ))
    if view.unread:
        names = [Path(p).name for p, _ in view.unread]
        out.append(Finding(
            "unread_ranks", "warning",
            f"{len(names)} rank trace(s) could not be read ({', '.join(names[:8])}"
            f"{f' and {len(names) - 8} more' if len(names) > 8 else ''}); the other {len(t)} are analysed, but "
            "no straggler is named without them (the missing rank may be the one the others wait for). "
            "Re-copy or re-record those traces and run again",
            {"unread": len(names), "files": names[:64], "analysed": int(len(t))},
        ))
    if view.world_size > len(t):
        out.append(Finding(
            "missing_ranks", "info",
            f"{len(t)} of {view.world_size} ranks given; the straggler and skews are among those only",
            {"given": int(len(t)), "world_size": int(view.world_size)},
        ))
    return out


# what io.trace says of a readable JSON file that is no trace at all (a config.json beside the ranks):
# skipped, not an unread rank
_NOT_A_TRACE = ("has no 'traceEvents'", "with no trace events", "are not trace events")


def load_ranks(
    sources,
    *,
    processes: int | None = None,
    client=None,
    cache: bool = True,
    cache_dir=None,
) -> RanksView:
    """Files, a folder or a glob of per-rank traces -> :class:`RanksView`. Files that are not traces
    are skipped (``view.skipped`` says which and why). Loading is ``io.rank_loading.load_rank_frames``
    (in process with ``processes=1``, a local pool, or a Dask ``client``; the Parquet cache unless
    ``cache=False``); this module only puts the frames side by side."""
    from workbench.io.rank_loading import load_rank_frames
    from workbench.io.trace import expand_trace_paths

    paths, skipped = expand_trace_paths(sources)
    unread: list[tuple[str, str]] = []

    def on_skip(p, msg):  # skipped; a damaged trace (not a JSON file of another kind) is an unread rank
        skipped.append((p, msg))
        if not any(m in msg for m in _NOT_A_TRACE):
            unread.append((p, msg))

    frames = load_rank_frames(paths, RankFrame, processes=processes, client=client, cache=cache,
                              cache_dir=cache_dir, on_skip=on_skip)
    if not frames:
        where = ", ".join(str(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources))
        raise BadArtifact(where, "holds no loadable trace" + (f" ({len(skipped)} files skipped)" if skipped else ""),
                          "Give the per-rank torch.profiler traces (.json or .json.gz)")
    return cross_rank(frames, skipped, unread)


# --------------------------------------------------------------------------------------------- JSON


def _clean(v: Any):
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if f != f or f in (float("inf"), float("-inf")) else f
    if v is pd.NA or v is None:
        return None
    if isinstance(v, np.bool_):
        return bool(v)
    return v


RANK_KEYS = ["rank", "file", "steps", "step_ms", "compute_us", "communication_us", "exposed_communication_us",
             "idle_us", "memory_us", "window_us", "overlap", "wait_us", "clock_offset_us", "collectives",
             "gpu_busy_ms", "idle_ms", "communication_ms", "device"]
COLLECTIVE_KEYS = ["pg", "name", "step", "seq", "ranks", "duration_us", "transfer_us", "skew_us", "last_rank",
                   "msg_nelems", "where"]


def ranks_summary(view: RanksView) -> dict:
    """The ``workbench ranks --json`` document (every key in docs/json.md)."""
    c = view.collectives
    return _clean({
        "world_size": view.world_size,
        "ranks": view.ranks[RANK_KEYS].to_dict("records"),
        "straggler": view.straggler,
        "collectives": c[COLLECTIVE_KEYS].astype(object).to_dict("records") if len(c) else [],
        "collectives_matched": int(len(c)),
        "collectives_unmatched": int(view.unmatched),
        "skipped": [{"file": Path(p).name, "reason": _reason(p, msg)} for p, msg in view.skipped],
        "unread": [Path(p).name for p, _ in view.unread],
        "findings": [f.as_dict() for f in view.findings],
        "warnings": list(view.warnings),
    })


def _reason(path: str, msg: str) -> str:
    """A skip message without the path (which is machine-specific): the part after 'path: '."""
    prefix = f"{path}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg

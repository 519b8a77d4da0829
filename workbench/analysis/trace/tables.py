"""Where a profiled step's time goes: tables and typed records from a loaded Kineto trace.

Every function takes a :class:`~workbench.io.trace.Trace` (or its ``events`` frame) and returns a
DataFrame or a frozen dataclass. Times are microseconds (``*_us``), as in the trace file.

>>> from workbench import samples
>>> from workbench.io import load_trace
>>> t = load_trace(samples.path("h200_train_step"))
>>> kernel_summary(t).iloc[0]["name"][:28]
'sm80_xmma_gemm_f32f32_f32f32'
>>> gpu_busy(t).kernel_count
1122

Definitions used throughout:

* *GPU activity* is every kernel, memcpy and memset; on a GPU they are merged across streams (and
  devices), so overlapping work counts once.
* The *window* is the span of the ProfilerStep annotations joined with the span of GPU activity
  (kernels launched in the last step finish after its CPU side ends); without step annotations it is
  the span of GPU activity alone.
* The temporal breakdown splits the window with priority compute > communication (NCCL/RCCL kernels,
  and gloo's CPU collectives, which move the data on host threads) > memory (memcpy/memset) > idle, so
  its four parts add up to the window. On a CPU-only trace compute is 0 (it counts device kernels) and
  the window is the ProfilerStep span joined with the gloo collectives.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from workbench.analysis import _intervals as iv
from workbench.errors import BadArgument

__all__ = [
    # records
    "GpuBusy",
    "LaunchStats",
    # tables
    "kernel_summary",
    "op_summary",
    "memcpy_summary",
    "step_summary",
    "step_window",
    "StepNumbers",
    "step_numbers",
    "per_step_text",
    "idle_gaps",
    "kernel_launches",
    "launch_owners",
    # records from tables
    "gpu_busy",
    "temporal_breakdown",
    "launch_stats",
    # kernel classes
    "kernel_kind",
    "is_communication_kernel",
    "cpu_collectives",
]

GPU_ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_OPS = ("cpu_op", "user_annotation")
RUNTIME = ("cuda_runtime", "cuda_driver")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_COMM_RE = re.compile(r"nccl|rccl|cross_device_reduce|all_reduce|allreduce|all_gather|reduce_scatter", re.I)
_MEM_KERNEL_RE = re.compile(r"^(?:Memcpy|Memset)\b|__amd_rocclr_(?:copy|fill)", re.I)
# Host calls that block until the device (or a copy) is done.
SYNC_CALL_RE = re.compile(
    r"^(cuda|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|Memcpy|Memcpy2D|MemcpyWithStream"
    r"|MemcpyDtoH|MemcpyFromSymbol)$|^cu(CtxSynchronize|StreamSynchronize|EventSynchronize|MemcpyDtoH(_v2)?)$"
)
LAUNCH_CALL_RE = re.compile(r"Launch|^cu(?:da)?Graph")
# Collectives that run on host threads: ProcessGroupGloo annotates each one as ``gloo:<collective>``
# (user_annotation, on its pt_gloo_runloop threads), from enqueue to completion.
CPU_COLLECTIVE_RE = re.compile(r"^gloo:")


def _by_name(names: pd.Series, fn, default=False) -> np.ndarray:
    """Apply a vectorized test ``fn(pd.Series[str]) -> array`` to the *distinct* names only (the
    column is categorical) and broadcast the answers to the rows: string work per name, not per row."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories
        codes = names.cat.codes.to_numpy()
        # only the names these rows use (a column taken from the events keeps every name of the trace:
        # Python functions, ops, ... as categories); the others are never looked up
        used = np.flatnonzero(np.bincount(codes[codes >= 0], minlength=len(cats))) if len(cats) else []
        if 0 < len(used) < len(cats):
            part = np.asarray(fn(pd.Series(cats[used].astype(str), dtype=object)))
            dtype = part.dtype
            if dtype.kind in "US":  # wide enough for the default too
                dtype = np.result_type(dtype, np.asarray([default]).dtype)
            res = np.empty(len(cats), dtype=dtype)
            res[used] = part
        else:
            res = np.asarray(fn(pd.Series(cats.astype(str), dtype=object))) if len(cats) else np.asarray([default])
        out = res[np.maximum(codes, 0)]
        if (codes < 0).any():
            out = out.copy()
            out[codes < 0] = default
        return out
    return np.asarray(fn(pd.Series(names, dtype=object).astype(str)))


def _row_texts(col: pd.Series, rows: np.ndarray | None = None) -> np.ndarray:
    """``col.astype(str)`` (of ``rows``) as an object array; a categorical column through its categories
    (a missing value reads "nan", as ``astype(str)`` spells it)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        c = col if rows is None else col.iloc[rows]
        return np.asarray(c.astype(str).to_numpy(), dtype=object)
    codes = col.cat.codes.to_numpy()
    if rows is not None:
        codes = codes[rows]
    cats = col.cat.categories
    if len(codes) > 4 * len(cats):  # few categories: the text of each, then one lookup per row
        text = np.asarray([str(x) for x in cats] + ["nan"], dtype=object)
        return text[codes]  # code -1 (missing) -> the last entry
    used, inverse = np.unique(codes, return_inverse=True)  # the text of the categories these rows use
    known = used[used >= 0]
    text = ["nan"] * (used.size - known.size) + [str(x) for x in cats.take(known)]
    return np.asarray(text, dtype=object)[inverse.reshape(-1)]  # code -1 (missing) sorts first


def _events(trace) -> pd.DataFrame:
    return trace if isinstance(trace, pd.DataFrame) else trace.events


def _cat_mask(ev: pd.DataFrame, cats) -> np.ndarray:
    """The rows of ``ev`` whose ``cat`` is ``cats`` (one category or a tuple), found once per events frame
    (read-only)."""
    def mask(ev):
        m = (ev["cat"] == cats) if isinstance(cats, str) else ev["cat"].isin(cats)
        m = np.asarray(m, dtype=bool)
        m.flags.writeable = False
        return m

    return _memo(("cat_mask", cats), ev, mask)


def _sel(ev: pd.DataFrame, cats) -> pd.DataFrame:
    """The rows of ``ev`` whose ``cat`` is ``cats``: taken once per events frame, handed out as a shallow
    copy (a caller that adds or sets a column changes its own copy only: pandas' copy-on-write)."""
    return _memo(("sel", cats), ev, lambda ev: ev[_cat_mask(ev, cats)]).copy(deep=False)


def _end(df: pd.DataFrame) -> np.ndarray:
    return (df["ts_us"] + df["dur_us"].fillna(0.0)).to_numpy(np.float64)


# ------------------------------------------------------------------------------------- kernel classes


def is_communication_kernel(names: pd.Series) -> np.ndarray:
    """True for collective-communication kernels (NCCL/RCCL and custom all-reduce kernels)."""
    return _by_name(pd.Series(names), lambda s: s.str.contains(_COMM_RE)).astype(bool)


def kernel_kind(names: pd.Series) -> pd.Series:
    """'communication', 'memory' or 'compute' for each kernel name."""
    s = pd.Series(names).astype(str)
    out = np.where(s.str.contains(_COMM_RE), "communication", np.where(s.str.contains(_MEM_KERNEL_RE), "memory", "compute"))
    return pd.Series(out, index=s.index, dtype="category")


def cpu_collectives(trace) -> pd.DataFrame:
    """The host-side collectives that do the transfer themselves (gloo's ``gloo:all_reduce`` etc.):
    the rows of ``events`` (user_annotation or cpu_op) whose name matches ``CPU_COLLECTIVE_RE``."""
    ev = _events(trace)
    host = _sel(ev, HOST_OPS)
    return host[_by_name(host["name"], lambda s: s.str.contains(CPU_COLLECTIVE_RE)).astype(bool)]


def _kind_by_category(kernels: pd.DataFrame) -> np.ndarray:
    """kernel_kind on the distinct names only, broadcast to rows."""
    return _by_name(kernels["name"], lambda s: kernel_kind(s).astype(str).to_numpy(), default="compute")


# --------------------------------------------------------------------------------------------- tables


def _group_durations(df: pd.DataFrame, key: str = "name") -> pd.DataFrame:
    g = df.groupby(key, observed=True, sort=False)["dur_us"]
    out = pd.DataFrame(
        {"count": g.size(), "total_us": g.sum(), "mean_us": g.mean(), "min_us": g.min(), "max_us": g.max()}
    ).reset_index()
    out[key] = out[key].astype(str)
    return out


def kernel_summary(trace) -> pd.DataFrame:
    """One row per kernel name: count, total/mean/min/max duration and percent of all kernel time,
    sorted by total_us (descending)."""
    k = _sel(_events(trace), "kernel")
    if k.empty:
        return pd.DataFrame(
            {c: pd.Series(dtype=t) for c, t in [("name", object), ("count", "int64"), ("total_us", float),
                                                  ("mean_us", float), ("min_us", float), ("max_us", float),
                                                  ("percent", float)]}
        )
    out = _group_durations(k)
    total = out["total_us"].sum()
    out["percent"] = 100.0 * out["total_us"] / total if total > 0 else 0.0
    out["count"] = out["count"].astype("int64")
    return out.sort_values(["total_us", "name"], ascending=[False, True], ignore_index=True)


def _memcpy_kind(name: str) -> str:
    if name.startswith("Memset") or "memset" in name.lower():
        return "memset"
    m = re.search(r"\b(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD)\b", name)
    return m.group(1) if m else name


def memcpy_summary(trace) -> pd.DataFrame:
    """memcpy HtoD / DtoH / DtoD / PtoP and memset: count, total_us, bytes and achieved GB/s.

    ``pageable_count`` counts copies from/to pageable host memory (slow, and synchronous for DtoH).
    """
    ev = _events(trace)
    m = _sel(ev, ("gpu_memcpy", "gpu_memset"))
    cols = ["kind", "count", "total_us", "bytes", "gb_per_s", "pageable_count"]
    if m.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "kind" else float) for c in cols})
    names = m["name"].astype(str)
    kind = names.map({n: _memcpy_kind(n) for n in names.unique()})  # the name test once per distinct name
    nbytes = m["bytes"].astype("Float64").fillna(0.0).astype(float) if "bytes" in m else pd.Series(0.0, index=m.index)
    df = pd.DataFrame(
        {"kind": kind.to_numpy(), "dur_us": m["dur_us"].to_numpy(), "bytes": nbytes.to_numpy(),
         "pageable": names.str.contains("Pageable").to_numpy()}
    )
    g = df.groupby("kind", sort=False)
    out = pd.DataFrame(
        {"count": g.size(), "total_us": g["dur_us"].sum(), "bytes": g["bytes"].sum(),
         "pageable_count": g["pageable"].sum()}
    ).reset_index()
    out["gb_per_s"] = np.where(out["total_us"] > 0, out["bytes"] / (out["total_us"] * 1e3), np.nan)
    out["bytes"] = out["bytes"].astype("int64")
    out["count"] = out["count"].astype("int64")
    out["pageable_count"] = out["pageable_count"].astype("int64")
    return out[cols].sort_values("total_us", ascending=False, ignore_index=True)


_MEMO: dict = {}


def _memo(name: str, ev: pd.DataFrame, fn):
    """``fn(ev)`` computed once per events frame (frames are read, never changed, by the analyses): the
    host tree and the steps are asked for by several tables of one trace. Dropped with the frame."""
    key = (name, id(ev))
    hit = _MEMO.get(key)
    if hit is not None and hit[0]() is ev:
        return hit[1]
    out = fn(ev)
    try:
        ref = weakref.ref(ev)
        weakref.finalize(ev, _MEMO.pop, key, None)
    except TypeError:
        return out
    _MEMO[key] = (ref, out)
    return out


def _host_tree(ev: pd.DataFrame):
    """Host events (ops, annotations, runtime calls) with parent links, for self times and launches."""
    return _memo("host_tree", ev, _host_tree_of)


def _host_tree_of(ev: pd.DataFrame):
    host = ev[ev["cat"].isin(HOST_OPS + RUNTIME)]
    starts = host["ts_us"].to_numpy(np.float64)
    ends = _end(host)
    group = host["pid"].to_numpy(np.int64) * (1 << 32) + host["tid"].to_numpy(np.int64)
    parent, depth = iv.nesting_parents(group, starts, ends)
    return host, parent, depth


def gpu_launch_owners(ev: pd.DataFrame, host: pd.DataFrame | None = None, parent: np.ndarray | None = None):
    """Who launched each GPU activity: ``(gpu, launch, owner)`` with ``gpu`` the kernel/memcpy/memset rows
    of ``ev``, ``launch`` the position in ``host`` (the host tree of :func:`_host_tree`) of the runtime call
    with the same correlation id and ``owner`` the op around that call (its parent in the tree); -1 where
    unknown (GPU work launched before the trace started, or a call without an enclosing op). On the
    frame's own host tree the answer is found once per frame (the arrays are read-only)."""
    tree = _host_tree(ev)
    if host is None or parent is None:
        host, parent = tree[0], tree[1]
    if host is tree[0] and parent is tree[1]:
        gpu, launch, owner = _memo("launch_owners", ev, lambda ev: _launch_owners_of(ev, host, parent))
        return gpu.copy(deep=False), launch, owner
    return _launch_owners_of(ev, host, parent, keep=False)


def _launch_owners_of(ev: pd.DataFrame, host: pd.DataFrame, parent: np.ndarray, keep: bool = True):
    gpu = _sel(ev, GPU_ACTIVITY)
    launch = np.full(len(gpu), -1, np.int64)
    if len(host) and not gpu.empty:
        is_rt = host["cat"].isin(RUNTIME).to_numpy()
        rt_corr = host["correlation"].to_numpy(np.int64, na_value=-1)
        rt_pos = pd.Index(rt_corr[is_rt]).drop_duplicates()
        rt_rows = np.flatnonzero(is_rt)
        corr_to_row = pd.Series(rt_rows[~pd.Index(rt_corr[is_rt]).duplicated()], index=rt_pos)
        lr = corr_to_row.reindex(gpu["correlation"].to_numpy(np.int64, na_value=-1)).to_numpy()
        ok = ~np.isnan(lr)
        launch[ok] = lr[ok].astype(np.int64)
    owner = np.where(launch >= 0, parent[np.maximum(launch, 0)], -1) if len(host) else launch.copy()
    if keep:
        launch.flags.writeable = owner.flags.writeable = False
    return gpu, launch, owner


_BACKWARD_RE = re.compile(r"^autograd::engine::evaluate_function: ")


def launch_owners(trace) -> pd.DataFrame:
    """Who issues the GPU work: one row per *owner*, the outermost host range around each launch call
    below the ProfilerStep (``Optimizer.step#AdamW.step``, ``Optimizer.zero_grad#...``, a
    ``record_function`` range, ``nn.Module: ...``/``## forward ##`` when recorded; the backward pass'
    ``autograd::engine::evaluate_function: ...`` ranges are one owner, ``backward (autograd)``; eager ops
    outside any range are each their own owner). Columns: owner, launches (GPU activities launched),
    kernels, gpu_us (their time), sorted by launches."""
    ev = _events(trace)
    host, parent, depth = _host_tree(ev)
    gpu, launch, _ = gpu_launch_owners(ev, host, parent)
    cols = ["owner", "launches", "kernels", "gpu_us"]
    ok = launch >= 0
    if not ok.any():
        return pd.DataFrame({c: pd.Series(dtype=object if c == "owner" else float) for c in cols})
    is_step = _by_name(host["name"], lambda s: s.str.match(_STEP_RE)).astype(bool)
    # the outermost ancestor below a ProfilerStep (or the root)
    top = np.arange(len(host))
    for _ in range(int(depth.max()) + 1 if len(host) else 0):
        p = parent[top]
        up = (p >= 0) & ~is_step[np.maximum(p, 0)]
        if not up.any():
            break
        top = np.where(up, p, top)
    owner_row = top[launch[ok]]
    owner = _row_texts(host["name"], owner_row)
    owner = np.where(pd.Series(owner).str.contains(_BACKWARD_RE).to_numpy(), "backward (autograd)", owner)
    # a launch call with no range around it: the call itself names no owner
    bare = host["cat"].isin(RUNTIME).to_numpy()[owner_row]
    owner = np.where(bare, "(launches outside any op)", owner)
    df = pd.DataFrame({"owner": owner, "kernel": (gpu["cat"] == "kernel").to_numpy()[ok],
                       "gpu_us": gpu["dur_us"].fillna(0.0).to_numpy(np.float64)[ok]})
    g = df.groupby("owner", sort=False)
    out = pd.DataFrame({"launches": g.size(), "kernels": g["kernel"].sum(), "gpu_us": g["gpu_us"].sum()}).reset_index()
    return out.sort_values(["launches", "owner"], ascending=[False, True], ignore_index=True)[cols]


def _same_name_only_children(codes: np.ndarray, parent: np.ndarray, n: int) -> np.ndarray:
    """True for events that are the only child of a parent with the same name."""
    has = parent >= 0
    n_children = np.bincount(parent[has], minlength=n) if n else np.zeros(0, np.int64)
    p = np.maximum(parent, 0)
    return has & (codes == codes[p]) & (n_children[p] == 1)


def op_summary(trace, by_shape: bool = False) -> pd.DataFrame:
    """One row per host op (cpu_op and user_annotation; ProfilerStep#N rows are left to step_summary):
    count, cpu_total_us, cpu_self_us (minus child ops and runtime calls), device_total_us (GPU time
    of the kernels/memcpys it and its children launched) and device_self_us (launched directly),
    sorted by device_self_us then cpu_self_us. As in torch's ``key_averages()``, an op whose only
    child has its own name (``aten::mean`` redispatching to ``aten::mean``) counts once, with the
    child's self times added to it. ``by_shape=True`` adds ``input_shapes`` and groups by it.
    """
    ev = _events(trace)
    host, parent, depth = _host_tree(ev)
    n = len(host)
    dur = host["dur_us"].fillna(0.0).to_numpy(np.float64)
    child_sum = np.bincount(parent[parent >= 0], weights=dur[parent >= 0], minlength=n) if n else np.zeros(0)
    self_cpu = np.maximum(dur - child_sum, 0.0)

    # device time launched by each host event: GPU activity -> launching runtime call (correlation)
    # -> its parent op in the tree.
    gpu, _, owner = gpu_launch_owners(ev, host, parent)
    dev_self = np.zeros(n)
    has = owner >= 0
    if has.any():
        np.add.at(dev_self, owner[has], gpu["dur_us"].to_numpy(np.float64)[has])
    dev_total = dev_self.copy()
    for level in range(int(depth.max()) if n else 0, 0, -1):
        c = np.flatnonzero((depth == level) & (parent >= 0))
        np.add.at(dev_total, parent[c], dev_total[c])

    # torch's convention (key_averages): an event that is the only child of an event with the same
    # name (aten::mean calling aten::mean.dim, a nested record_function of one name) is one call, its
    # self times and launches folded into the outermost of the chain.
    names = host["name"]
    codes = names.cat.codes.to_numpy() if isinstance(names.dtype, pd.CategoricalDtype) else pd.factorize(names)[0]
    folded = _same_name_only_children(codes, parent, n)
    if folded.any():
        root = parent.copy()
        while (redo := folded & folded[np.maximum(root, 0)]).any():
            root[redo] = parent[root[redo]]
        np.add.at(self_cpu, root[folded], self_cpu[folded])
        np.add.at(dev_self, root[folded], dev_self[folded])

    is_step = _by_name(host["name"], lambda s: s.str.match(_STEP_RE)).astype(bool)
    is_op = host["cat"].isin(HOST_OPS).to_numpy() & ~is_step & ~folded
    if not by_shape:
        # grouped on the name codes (the same groups, met in the same order, as on the names; a missing
        # name is in none), the names put back after
        is_op &= codes >= 0
    table = pd.DataFrame(
        {
            "name": host["name"].to_numpy()[is_op] if by_shape else codes[is_op],
            "cpu_total_us": dur[is_op],
            "cpu_self_us": self_cpu[is_op],
            "device_total_us": dev_total[is_op],
            "device_self_us": dev_self[is_op],
        }
    )
    keys = ["name"]
    if by_shape:
        shapes = host["input_dims"].to_numpy()[is_op] if "input_dims" in host else np.full(is_op.sum(), "")
        table["input_shapes"] = pd.Series(shapes, dtype=object).fillna("").astype(str).to_numpy()
        keys.append("input_shapes")
    g = table.groupby(keys, sort=False, observed=True)
    out = g.agg(
        count=("cpu_total_us", "size"),
        cpu_total_us=("cpu_total_us", "sum"),
        cpu_self_us=("cpu_self_us", "sum"),
        device_total_us=("device_total_us", "sum"),
        device_self_us=("device_self_us", "sum"),
    ).reset_index()
    if by_shape:
        out["name"] = out["name"].astype(str)
    else:
        uniques = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else pd.factorize(names)[1]
        out["name"] = pd.Series([str(x) for x in uniques.take(out["name"].to_numpy())], dtype=object).astype(str)
    out["count"] = out["count"].astype("int64")
    return out.sort_values(["device_self_us", "cpu_self_us", "name"], ascending=[False, False, True], ignore_index=True)


# ------------------------------------------------------------------------------------------ busy/idle


@dataclass(frozen=True)
class GpuBusy:
    """GPU busy/idle over the window (see the module docstring). Times in microseconds."""

    busy_us: float
    idle_us: float
    idle_fraction: float
    kernel_count: int
    window_us: float
    window_start_us: float = float("nan")
    window_end_us: float = float("nan")

    def as_dict(self) -> dict:
        return asdict(self)


def _steps(ev: pd.DataFrame) -> pd.DataFrame:
    """CPU-side ProfilerStep#N spans (a copy: callers may change it)."""
    return _memo("steps", ev, _steps_of).copy()


def _steps_of(ev: pd.DataFrame) -> pd.DataFrame:
    num = _by_name(
        ev["name"], lambda s: pd.to_numeric(s.str.extract(_STEP_RE, expand=False)).fillna(-1).to_numpy(), -1
    ).astype(np.int64)
    mask = (num >= 0) & ev["cat"].isin(("user_annotation", "cpu_op")).to_numpy()
    if not mask.any():
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "start_us": [], "end_us": [], "dur_us": []})
    ts = ev["ts_us"].to_numpy()[mask]
    dur = np.nan_to_num(ev["dur_us"].to_numpy()[mask], nan=0.0)
    return (
        pd.DataFrame({"step": num[mask], "start_us": ts, "end_us": ts + dur, "dur_us": dur})
        .drop_duplicates("step")
        .sort_values("start_us", ignore_index=True)
    )


def _gpu_intervals(ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    mask = _cat_mask(ev, GPU_ACTIVITY)
    ts = ev["ts_us"].to_numpy(np.float64)[mask]
    return ts, ts + np.nan_to_num(ev["dur_us"].to_numpy(np.float64)[mask], nan=0.0)


def _window(ev: pd.DataFrame, gs: np.ndarray, ge: np.ndarray) -> tuple[float, float]:
    steps = _steps(ev)
    lo = [gs.min()] if gs.size else []
    hi = [ge.max()] if ge.size else []
    if not steps.empty:
        lo.append(steps["start_us"].min())
        hi.append(steps["end_us"].max())
    if not lo:
        return float("nan"), float("nan")
    return float(min(lo)), float(max(hi))


def gpu_busy(trace) -> GpuBusy:
    """Busy time of the GPU (kernels, memcpy, memset merged across streams) and idle time in the window."""
    return _memo("gpu_busy", _events(trace), _gpu_busy_of)


def _gpu_busy_of(ev: pd.DataFrame) -> GpuBusy:
    gs, ge = _gpu_intervals(ev)
    n_kernels = int((ev["cat"] == "kernel").sum())
    if gs.size == 0:
        return GpuBusy(0.0, 0.0, 0.0, n_kernels, 0.0)
    lo, hi = _window(ev, gs, ge)
    busy = iv.overlap_with(gs, ge, lo, hi)
    window = hi - lo
    idle = max(window - busy, 0.0)
    return GpuBusy(busy, idle, idle / window if window > 0 else 0.0, n_kernels, window, lo, hi)


def temporal_breakdown(trace) -> dict:
    """``{compute_us, communication_us, memory_us, idle_us}``: the window split with priority
    compute > communication > memory > idle (the four add up to ``gpu_busy(trace).window_us``)."""
    ev = _events(trace)
    gs, ge = _gpu_intervals(ev)
    out = {"compute_us": 0.0, "communication_us": 0.0, "memory_us": 0.0, "idle_us": 0.0}
    cc = cpu_collectives(ev)
    cs, ce = cc["ts_us"].to_numpy(np.float64), _end(cc)
    if gs.size == 0 and cs.size == 0:
        return out
    # host collectives are host work: they count inside the steps' span (or make the window when
    # there are no steps and no GPU activity)
    lo, hi = _window(ev, gs, ge) if gs.size else _window(ev, cs[:0], ce[:0])
    if lo != lo:
        lo, hi = float(cs.min()), float(ce.max())
    k = _sel(ev, "kernel")
    kinds = _kind_by_category(k)
    ks, ke = k["ts_us"].to_numpy(np.float64), _end(k)
    m = _sel(ev, ("gpu_memcpy", "gpu_memset"))
    ms_, me_ = m["ts_us"].to_numpy(np.float64), _end(m)

    def clip(s, e):
        return np.clip(s, lo, hi), np.clip(e, lo, hi)

    comp = clip(ks[kinds == "compute"], ke[kinds == "compute"])
    comm = clip(np.r_[ks[kinds == "communication"], cs], np.r_[ke[kinds == "communication"], ce])
    mem = clip(np.r_[ms_, ks[kinds == "memory"]], np.r_[me_, ke[kinds == "memory"]])
    u_comp = iv.total_length(*comp)
    u_comp_comm = iv.total_length(np.r_[comp[0], comm[0]], np.r_[comp[1], comm[1]])
    u_all = iv.total_length(np.r_[comp[0], comm[0], mem[0]], np.r_[comp[1], comm[1], mem[1]])
    out["compute_us"] = u_comp
    out["communication_us"] = u_comp_comm - u_comp
    out["memory_us"] = u_all - u_comp_comm
    out["idle_us"] = max((hi - lo) - u_all, 0.0)
    return out


def step_summary(trace) -> pd.DataFrame:
    """One row per ProfilerStep#N: start_us, dur_us (the annotation's host span), step_us (the step's
    time by :class:`StepNumbers`' definition: until the host and the GPU work it launched are done),
    gpu_busy_us (GPU activity inside the step's CPU span), gpu_idle_fraction, kernel_count (kernels that
    started inside the span)."""
    ev = _events(trace)
    steps = _steps(ev)
    cols = ["step", "start_us", "dur_us", "step_us", "gpu_busy_us", "gpu_idle_fraction", "kernel_count"]
    if steps.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("step", "kernel_count") else float) for c in cols})
    gs, ge = _gpu_intervals(ev)
    ms, me = iv.merge(gs, ge)
    a = steps["start_us"].to_numpy()
    b = steps["end_us"].to_numpy()
    busy = iv.covered(ms, me, a, b)
    ks = np.sort(_sel(ev, "kernel")["ts_us"].to_numpy(np.float64))
    kcount = np.searchsorted(ks, b, side="left") - np.searchsorted(ks, a, side="left")
    dur = steps["dur_us"].to_numpy()  # as in the file: end - start loses bits at epoch-sized timestamps
    return pd.DataFrame(
        {
            "step": steps["step"].to_numpy(),
            "start_us": a,
            "dur_us": dur,
            "step_us": np.asarray(step_numbers(ev).step_us, np.float64),
            "gpu_busy_us": busy,
            "gpu_idle_fraction": np.where(dur > 0, 1.0 - busy / np.where(dur > 0, dur, 1.0), 0.0),
            "kernel_count": kcount.astype("int64"),
        }
    )


def step_window(trace, step: int):
    """The trace cut to one ``ProfilerStep#<step>``: the host events that start inside the step's CPU
    span [start, start + dur), plus the GPU work they launched, matched by correlation id (so kernels
    that run after the span ends still come with the step that launched them), plus GPU events without
    a correlation id that start inside the span.

    Takes a Trace (returns a Trace with only ``events`` replaced; path, device and metadata still
    describe the file) or an events frame (returns a frame). Rows keep their order; the index is reset.
    An unknown step raises ValueError naming the steps the trace has.
    """
    ev = _events(trace)
    steps = _steps(ev)
    row = steps[steps["step"] == int(step)]
    if row.empty:
        have = ", ".join(str(n) for n in sorted(steps["step"])) or "none"
        raise BadArgument(
            f"no ProfilerStep#{step} in this trace (steps: {have}); pick one of step_summary(trace)['step']"
        )
    start = float(row["start_us"].iloc[0])
    end = start + float(row["dur_us"].iloc[0])
    ts = ev["ts_us"].to_numpy(np.float64)
    in_span = (ts >= start) & (ts < end)
    on_gpu = ev["cat"].isin(GPU_ACTIVITY + ("gpu_user_annotation",)).to_numpy()
    host = in_span & ~on_gpu
    keep = host.copy()
    if "correlation" in ev.columns:
        corr = ev["correlation"]
        has_corr = corr.notna().to_numpy()
        launched = pd.unique(corr[host & has_corr].to_numpy(np.int64))
        linked = on_gpu & has_corr & corr.isin(launched).to_numpy(bool, na_value=False)
        keep |= linked | (on_gpu & ~has_corr & in_span)
    else:
        keep |= on_gpu & in_span
    cut = ev[keep].reset_index(drop=True)
    return cut if isinstance(trace, pd.DataFrame) else dataclasses.replace(trace, events=cut)


# ------------------------------------------------------------------------- the numbers every front shows


@dataclass(frozen=True)
class StepNumbers:
    """The step and what the GPU did in it: the one definition every front reads (``workbench trace``,
    ``workbench diff``, ``workbench ranks``, the timeline, ProfilerPanel, the HTML reports; docs/definitions.md).
    Times in microseconds; ``*_per_step`` divide by ``steps``.

    * a *step* is a ``ProfilerStep#N``; it ends when the host has finished it (the annotation's end) and the
      GPU has finished the work launched in it (matched to its launch call by correlation id); it starts at
      the previous step's end, or at its own annotation when that is later (the first step, or steps
      recorded apart). ``step_us``: each step's time; ``step_median_us``: their median (``np.median``).
      Without ProfilerStep annotations the whole window is one step.
    * *GPU busy* is the union over streams (overlapping work counts once) of the kernels, copies and
      memsets the steps launched (work queued before the first step does not count), per step.
    * *idle* is the median step minus GPU busy (never below 0), per step: busy + idle = the step.
    * *communication* is the union of the collective-communication kernels (NCCL/RCCL) the steps
      launched and the host collectives (``gloo:*``) inside the steps, per step.
    """

    steps: int
    step_us: tuple
    step_median_us: float
    gpu_busy_us_per_step: float
    idle_us_per_step: float
    communication_us_per_step: float
    kernel_busy_us_per_step: float   # the union of the kernels alone (no copies/memsets), per step
    delimited: bool                  # True: ProfilerStep annotations; False: the whole window as one step
    start_us: float = float("nan")   # the first step's start and the last step's end (trace clock)
    end_us: float = float("nan")
    gpu_activity: bool = True        # False: the trace holds no kernel, copy or memset (a CPU-only trace)

    def as_dict(self) -> dict:
        """``{steps, step_ms, gpu_busy_ms, idle_ms, communication_ms, delimited}`` (the JSON ``per_step`` block)."""
        return {"steps": int(self.steps), "step_ms": self.step_ms, "gpu_busy_ms": self.gpu_busy_ms,
                "idle_ms": self.idle_ms, "communication_ms": self.communication_ms, "delimited": bool(self.delimited),
                "gpu_activity": bool(self.gpu_activity)}

    # milliseconds: the values every front prints and compares (the diagnosis too)
    @property
    def step_ms(self) -> float:
        return _ms4(self.step_median_us)

    @property
    def gpu_busy_ms(self) -> float:
        return _ms4(self.gpu_busy_us_per_step)

    @property
    def idle_ms(self) -> float:
        return _ms4(self.idle_us_per_step)

    @property
    def communication_ms(self) -> float:
        return _ms4(self.communication_us_per_step)


def _ms4(us: float) -> float:
    return float(us) / 1e3 if us == us else float("nan")


def per_step_text(d: dict | StepNumbers) -> str:
    """The step numbers in one line, as every front prints them (``d``: a StepNumbers or its ``as_dict()``,
    the JSON ``per_step`` block): ``steps: 3, median 32.61 ms; a step: GPU busy 14.74 ms, idle 17.87 ms,
    communication 0.00 ms``."""
    if isinstance(d, StepNumbers):
        d = d.as_dict()
    head = (f"steps: {d['steps']}, median {d['step_ms']:,.2f} ms" if d.get("delimited")
            else f"no ProfilerStep marks: the window ({d['step_ms']:,.2f} ms) is one step")
    if not d.get("gpu_activity", True):
        return f"{head}; a step: no GPU activity, communication {d['communication_ms']:,.2f} ms"
    return (f"{head}; a step: GPU busy {d['gpu_busy_ms']:,.2f} ms, idle {d['idle_ms']:,.2f} ms, "
            f"communication {d['communication_ms']:,.2f} ms")


def _launch_times(ev: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """The start of each GPU activity's launch call (matched by correlation id), NaN where unknown."""
    if "correlation" not in ev.columns or gpu.empty:
        return np.full(len(gpu), np.nan)
    rt = _sel(ev, RUNTIME)
    corr = rt["correlation"].to_numpy(np.float64, na_value=np.nan)
    ok = ~np.isnan(corr)
    if not ok.any():
        return np.full(len(gpu), np.nan)
    s = pd.Series(rt["ts_us"].to_numpy(np.float64)[ok], index=corr[ok])
    s = s[~s.index.duplicated()]
    return s.reindex(gpu["correlation"].to_numpy(np.float64, na_value=np.nan)).to_numpy()


def step_numbers(trace) -> StepNumbers:
    """The step time, GPU busy, idle and communication of a trace, by the one definition of
    :class:`StepNumbers` (found once per events frame)."""
    return _memo("step_numbers", _events(trace), _step_numbers_of)


def _step_numbers_of(ev: pd.DataFrame) -> StepNumbers:
    steps = _steps(ev)
    gpu = _sel(ev, GPU_ACTIVITY)
    gs = gpu["ts_us"].to_numpy(np.float64)
    ge = gs + np.nan_to_num(gpu["dur_us"].to_numpy(np.float64), nan=0.0)
    is_kernel = (gpu["cat"] == "kernel").to_numpy()
    is_comm = is_kernel & is_communication_kernel(gpu["name"]) if len(gpu) else np.zeros(0, bool)
    cc = cpu_collectives(ev)
    cs, ce = cc["ts_us"].to_numpy(np.float64), _end(cc)
    if steps.empty:
        lo, hi = _window(ev, gs, ge)
        if lo != lo:  # no GPU activity, no steps: the span of the host events
            host = ev[ev["cat"].isin(HOST_OPS + RUNTIME)]
            lo, hi = (float(host["ts_us"].min()), float(_end(host).max())) if len(host) else (0.0, 0.0)
        own = np.ones(len(gpu), bool)
        n, step_us, delimited = 1, np.array([hi - lo]), False
        start, end = lo, hi
    else:
        mark = steps["start_us"].to_numpy(np.float64)
        cpu_end = mark + steps["dur_us"].to_numpy(np.float64)
        n = len(steps)
        launch = _launch_times(ev, gpu)
        known = ~np.isnan(launch)
        # without a launch call in the trace the work was queued before it started (not the steps'),
        # unless the trace records no launches at all: then where the work ran says whose it is
        at = launch if known.any() else gs
        k = np.searchsorted(mark, np.nan_to_num(at, nan=-np.inf), "right") - 1
        own = (k >= 0) & ((k < n - 1) | (at <= cpu_end[-1])) & (known | ~known.any())
        gpu_end = np.full(n, -np.inf)
        if own.any():
            np.maximum.at(gpu_end, k[own], ge[own])
        ends = np.maximum(cpu_end, gpu_end)
        ends = np.maximum.accumulate(ends)
        starts = np.maximum(mark, np.r_[-np.inf, ends[:-1]])
        step_us = ends - starts
        delimited, start, end = True, float(mark[0]), float(ends[-1])
    busy = iv.total_length(gs[own], ge[own])
    kbusy = iv.total_length(gs[own & is_kernel], ge[own & is_kernel])
    c_s = np.clip(cs, start, end)
    c_e = np.clip(ce, start, end)
    comm = iv.total_length(np.r_[gs[own & is_comm], c_s], np.r_[ge[own & is_comm], c_e])
    median = float(np.median(step_us)) if len(step_us) else float("nan")
    busy_ps = busy / n
    return StepNumbers(
        steps=int(n), step_us=tuple(float(x) for x in step_us), step_median_us=median,
        gpu_busy_us_per_step=busy_ps, idle_us_per_step=max(median - busy_ps, 0.0) if median == median else 0.0,
        communication_us_per_step=comm / n, kernel_busy_us_per_step=kbusy / n, delimited=delimited,
        start_us=float(start), end_us=float(end), gpu_activity=bool(len(gpu)),
    )


# ------------------------------------------------------------------------------------ launches, gaps


def kernel_launches(trace) -> pd.DataFrame:
    """One row per GPU activity with its launching runtime call (matched by correlation id):
    name, cat, kernel_ts_us, kernel_dur_us, launch_name, launch_ts_us, launch_dur_us,
    delay_us (GPU start minus the start of the launch call)."""
    ev = _events(trace)
    g = _sel(ev, GPU_ACTIVITY)
    rt = _sel(ev, RUNTIME)
    rt = rt[rt["correlation"].notna()].drop_duplicates("correlation")
    left = pd.DataFrame(
        {"name": g["name"].astype(str).to_numpy(), "cat": g["cat"].astype(str).to_numpy(),
         "correlation": g["correlation"].to_numpy(np.int64, na_value=-1),
         "kernel_ts_us": g["ts_us"].to_numpy(), "kernel_dur_us": g["dur_us"].to_numpy()}
    )
    right = pd.DataFrame(
        {"correlation": rt["correlation"].to_numpy(np.int64), "launch_name": rt["name"].astype(str).to_numpy(),
         "launch_ts_us": rt["ts_us"].to_numpy(), "launch_dur_us": rt["dur_us"].to_numpy()}
    )
    out = left.merge(right, on="correlation", how="left", sort=False)
    out["delay_us"] = out["kernel_ts_us"] - out["launch_ts_us"]
    return out


@dataclass(frozen=True)
class LaunchStats:
    """Kernel launch statistics. Times in microseconds."""

    kernel_count: int
    launch_count: int  # kernels matched to their launch call
    median_kernel_us: float
    p90_kernel_us: float
    short_kernel_fraction: float  # kernels shorter than 10 us
    median_launch_us: float  # host time inside the launch call
    median_delay_us: float  # kernel start - launch call start
    p90_delay_us: float
    kernels_per_ms: float  # over the GPU window

    def as_dict(self) -> dict:
        return asdict(self)


SHORT_KERNEL_US = 10.0
# Gaps up to this long between kernels are put down to per-op dispatch/launch overhead.
LAUNCH_GAP_US = 50.0


def launch_stats(trace) -> LaunchStats:
    """Launch-to-start delay and kernel duration distribution (see :class:`LaunchStats`)."""
    ev = _events(trace)
    # kernel_launches' left join on the correlation id, on arrays (the kernels only)
    g = _sel(ev, GPU_ACTIVITY)
    is_k = (g["cat"] == "kernel").to_numpy()
    n = int(is_k.sum())
    if n == 0:
        return LaunchStats(0, 0, float("nan"), float("nan"), 0.0, float("nan"), float("nan"), float("nan"), 0.0)
    rt = _sel(ev, RUNTIME)
    rt = rt[rt["correlation"].notna()].drop_duplicates("correlation")
    pos = pd.Index(rt["correlation"].to_numpy(np.int64)).get_indexer(
        g["correlation"].to_numpy(np.int64, na_value=-1)[is_k])
    hit = pos >= 0
    d = g["dur_us"].to_numpy()[is_k]
    launch_ts = np.where(hit, rt["ts_us"].to_numpy()[np.maximum(pos, 0)], np.nan) if len(rt) else np.full(n, np.nan)
    launch_dur = np.where(hit, rt["dur_us"].to_numpy()[np.maximum(pos, 0)], np.nan) if len(rt) else np.full(n, np.nan)
    delay = g["ts_us"].to_numpy()[is_k] - launch_ts
    matched = ~np.isnan(launch_ts)
    gb = gpu_busy(ev)

    def q(x, p):
        return float(np.quantile(x, p)) if len(x) else float("nan")

    return LaunchStats(
        kernel_count=n,
        launch_count=int(matched.sum()),
        median_kernel_us=q(d, 0.5),
        p90_kernel_us=q(d, 0.9),
        short_kernel_fraction=float((d < SHORT_KERNEL_US).mean()),
        median_launch_us=q(launch_dur[matched], 0.5),
        median_delay_us=q(delay[matched], 0.5),
        p90_delay_us=q(delay[matched], 0.9),
        kernels_per_ms=float(n / (gb.window_us / 1e3)) if gb.window_us > 0 else 0.0,
    )


def idle_gaps(trace, min_us: float = 5.0) -> pd.DataFrame:
    """GPU idle gaps of at least ``min_us`` inside the window, each with its likely cause.

    Columns: start_us, end_us, dur_us, cause, launch_fraction (share of the gap the host spent in
    launch calls), sync_us (host time in blocking calls during the gap),
    next_kernel. Causes: ``sync`` (the host was blocked in a synchronize / blocking copy when the GPU
    ran dry, and the next work came only after it returned), ``launch`` (launch calls cover half the
    gap or more, or the gap is at most ``LAUNCH_GAP_US``: per-op dispatch and launch overhead between
    back-to-back kernels), ``host`` (a longer gap with the host busy elsewhere: Python, data loading,
    CPU ops, logging).
    """
    ev = _events(trace)
    gs, ge = _gpu_intervals(ev)
    cols = ["start_us", "end_us", "dur_us", "cause", "launch_fraction", "sync_us", "next_kernel"]
    if gs.size == 0:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("cause", "next_kernel") else float) for c in cols})
    lo, hi = _window(ev, gs, ge)
    ms, me = iv.merge(gs, ge)
    a = np.r_[lo, me]
    b = np.r_[ms, hi]
    keep = (b - a) >= min_us
    a, b = a[keep], b[keep]
    rt = _sel(ev, RUNTIME)
    is_launch = _by_name(rt["name"], lambda s: s.str.contains(LAUNCH_CALL_RE)).astype(bool)
    is_sync = _by_name(rt["name"], lambda s: s.str.match(SYNC_CALL_RE)).astype(bool)
    rs, re_ = rt["ts_us"].to_numpy(np.float64), _end(rt)
    ls, le = iv.merge(rs[is_launch], re_[is_launch])
    launch_cov = iv.covered(ls, le, a, b)
    # the host was inside a blocking call (synchronize, blocking copy) when the GPU ran dry: 2 us slack
    sms, sme = iv.merge(rs[is_sync], re_[is_sync])
    blocked_at_start = iv.covered(sms, sme, a - 2.0, a + 2.0) > 0
    sync_us = iv.covered(sms, sme, a - 2.0, b)
    dur = b - a
    frac = np.where(dur > 0, launch_cov / np.where(dur > 0, dur, 1.0), 0.0)
    cause = np.where(
        blocked_at_start, "sync", np.where((frac >= 0.5) | (dur <= LAUNCH_GAP_US), "launch", "host")
    )
    g = _sel(ev, GPU_ACTIVITY)
    gorder = np.argsort(g["ts_us"].to_numpy(), kind="stable")
    g_ts = g["ts_us"].to_numpy()[gorder]
    g_names = _row_texts(g["name"], gorder)  # a categorical column through its categories
    nxt = np.searchsorted(g_ts, b, side="left")
    next_kernel = np.where(nxt < g_ts.size, g_names[np.minimum(nxt, max(g_ts.size - 1, 0))], "")
    return pd.DataFrame(
        {"start_us": a, "end_us": b, "dur_us": dur, "cause": cause, "launch_fraction": frac,
         "sync_us": sync_us, "next_kernel": next_kernel}
    )

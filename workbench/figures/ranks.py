"""Figures of the cross-rank view (``analysis.trace.ranks.RanksView``): they only draw.

* :func:`rank_time_figure`: one stacked bar per rank (compute, communication overlapped with compute,
  exposed communication, memcpy/memset, idle), ms over the profile; the straggler's bar is marked.
* :func:`collective_skew_figure`: each matched collective's start skew (waiting for the last rank) and
  transfer time (after the last arrival), in time order; hover names the last rank.
* :func:`rank_timeline_figure`: one lane per rank, each collective a segment from its (clock-aligned)
  start to its end, the part spent waiting for the last arrival drawn apart (at most ``max_events``
  collectives, the ones with the most skew kept).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.figures._downsample import MAX_POINTS
from workbench.figures._style import legend_below

__all__ = ["rank_time_figure", "collective_skew_figure", "rank_timeline_figure", "RANK_PARTS"]

# (column or derived key, label, colour): Okabe-Ito, as the trace breakdown
RANK_PARTS = (
    ("compute_us", "compute", "#0072B2"),
    ("overlapped_communication_us", "communication under compute", "#56B4E9"),
    ("exposed_communication_us", "exposed communication", "#CC79A7"),
    ("memory_us", "memcpy/memset", "#E69F00"),
    ("idle_us", "idle", "#BBBBBB"),
)


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, template="plotly_white", height=height,
                      margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return fig


def _empty(fig: go.Figure, title: str, message: str) -> go.Figure:
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"size": 14, "color": "#666"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, 260)


def _view_parts(view):
    if hasattr(view, "ranks"):
        return view.ranks, view.collectives, view.events, view.straggler
    raise TypeError(f"expected a RanksView (workbench.analysis.trace.ranks), not {type(view).__name__}")


def rank_time_figure(view, sort_by: str = "rank", per_step: bool = False) -> go.Figure:
    """Stacked bars, one per rank, in the order of ``sort_by`` (``rank`` or any column of
    ``view.ranks``, largest first); ``per_step`` divides by each rank's step count."""
    ranks, _, _, straggler = _view_parts(view)
    title = "Where each rank's time went" + (" (per step)" if per_step else "")
    fig = go.Figure()
    if ranks.empty:
        return _empty(fig, title, "no ranks")
    t = ranks.copy()
    t["overlapped_communication_us"] = (t["communication_us"] - t["exposed_communication_us"]).clip(lower=0)
    if sort_by != "rank":
        if sort_by not in t.columns:
            raise ValueError(f"sort_by must be 'rank' or a column of view.ranks, not {sort_by!r}")
        t = t.sort_values([sort_by, "rank"], ascending=[False, True], kind="stable")
    div = t["steps"].clip(lower=1).to_numpy(float) if per_step else np.ones(len(t))
    s_rank = None if straggler is None else straggler["rank"]
    labels = [f"rank {r}" + (" (straggler)" if r == s_rank else "") for r in t["rank"]]
    for key, label, colour in RANK_PARTS:
        vals = t[key].to_numpy(float) / div / 1e3
        fig.add_trace(go.Bar(x=vals, y=labels, orientation="h", name=label, marker_color=colour,
                             hovertemplate=label + ": %{x:.2f} ms<extra>%{y}</extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="ms per step" if per_step else "ms over the profile")
    fig.update_yaxes(autorange="reversed")
    height = int(min(900, max(300, 150 + 28 * len(t))))
    return legend_below(_layout(fig, title, height), height, len(fig.data))


def collective_skew_figure(view, top: int | None = None) -> go.Figure:
    """Skew (waiting for the last rank) and transfer per matched collective, stacked, in time order;
    ``top`` keeps the collectives with the most skew (their order stays the time order)."""
    _, c, _, _ = _view_parts(view)
    title = "Collectives: waiting for the last rank vs transfer"
    fig = go.Figure()
    if c.empty:
        return _empty(fig, title, "no collective is on every rank's trace")
    c = c.reset_index(drop=True)
    if top is not None and len(c) > top:
        c = c.loc[np.sort(c["skew_us"].to_numpy().argsort()[::-1][:top])]
    cap = MAX_POINTS // 2
    if len(c) > cap:
        c = c.loc[np.sort(c["skew_us"].to_numpy().argsort()[::-1][:cap])]
    x = [f"{n} · step {s} #{q}" for n, s, q in zip(c["name"], c["step"], c["seq"])]
    custom = np.c_[c["last_rank"].to_numpy(object), c["pg"].to_numpy(object)]
    for key, label, colour in (("skew_us", "start skew (others wait)", "#D55E00"),
                               ("transfer_us", "transfer after the last arrival", "#009E73")):
        fig.add_trace(go.Bar(x=x, y=c[key].to_numpy(float) / 1e3, name=label, marker_color=colour,
                             customdata=custom,
                             hovertemplate=label + ": %{y:.2f} ms<br>last: rank %{customdata[0]}, group "
                                           "%{customdata[1]}<extra>%{x}</extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms")
    fig.update_xaxes(showticklabels=len(c) <= 40)
    return legend_below(_layout(fig, title, 420), 420, len(fig.data))


def rank_timeline_figure(view, max_events: int = 4000) -> go.Figure:
    """One lane per rank; each collective drawn from its start to its end, the wait for the last
    arrival (start to last start) in one colour and the rest in another; times in ms from the first
    collective. Keeps the ``max_events`` collectives with the most skew (each is one per rank)."""
    ranks, c, ev, _ = _view_parts(view)
    title = "Collectives per rank (clock-aligned)"
    fig = go.Figure()
    if ev is None or len(ev) == 0:
        return _empty(fig, title, "no collectives in these traces")
    ev = ev[ev["matched"]] if "matched" in ev else ev
    if ev.empty:
        return _empty(fig, title, "no collective is on every rank's trace")
    keys = ["pg", "key_step", "seq"]
    info = c.set_index(keys)[["last_start_us", "skew_us"]]
    j = ev.join(info, on=keys)
    n_coll = len(c)
    if n_coll > max_events:
        keep = c.nlargest(max_events, "skew_us").set_index(keys).index
        j = j[pd.MultiIndex.from_frame(j[keys]).isin(keep)]
    origin = float(j["start_us"].min())
    lane = j["rank"].to_numpy()
    s = (j["start_us"].to_numpy(float) - origin) / 1e3
    w = (np.maximum(j["last_start_us"].to_numpy(float), j["start_us"].to_numpy(float)) - origin) / 1e3
    e = (j["end_us"].to_numpy(float) - origin) / 1e3

    def segments(a, b):
        n = len(a)
        xs = np.empty(3 * n)
        ys = np.empty(3 * n, dtype=object)
        xs[0::3], xs[1::3], xs[2::3] = a, b, np.nan
        ys[0::3] = ys[1::3] = [f"rank {r}" for r in lane]
        ys[2::3] = None
        return xs, ys

    for (a, b), label, colour in (((s, w), "waiting for the last rank", "#D55E00"),
                                  ((w, e), "collective running", "#009E73")):
        xs, ys = segments(a, b)
        fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name=label, line={"color": colour, "width": 10},
                                   hoverinfo="x+y+name"))
    order = [f"rank {r}" for r in sorted(ranks["rank"])]
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed")
    fig.update_xaxes(title_text="ms from the first collective")
    height = int(min(900, max(300, 150 + 30 * len(order))))
    return legend_below(_layout(fig, title, height), height, len(fig.data))

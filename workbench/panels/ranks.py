"""RanksPanel: the cross-rank view of a distributed run (``workbench ranks`` in a notebook).

    RanksPanel("run/traces/")                    # a folder of per-rank traces (non-traces skipped)
    RanksPanel("run/traces/rank*.json.gz")       # a glob, or a list of files
    RanksPanel(view)                             # a RanksView from workbench.analysis.trace.ranks.load_ranks
    RanksPanel([trace0, trace1, ...])            # loaded Traces (or RankFrames)
    RanksPanel("run/traces/", client=client)     # reduce the traces on a Dask cluster

No ``from_step``: one notebook process cannot run every rank's step. Profile each rank with
``workbench.profile_steps`` (one trace per rank into one folder) and give RanksPanel the folder.

The straggler verdict and findings on top; tabs: each rank's time (stacked bars, sortable, per step or
over the profile), the collectives' skew vs transfer, and the per-rank collective timeline.

CSS classes for browser tests: ``wb-ranks``, ``wb-ranks-verdict``, ``wb-ranks-sort``, ``wb-ranks-perstep``,
``wb-ranks-tabs``, ``wb-ranks-table``.
"""

from __future__ import annotations

import html
import os

from workbench.errors import BadArgument
from workbench.figures.text import findings_html
from workbench.panels._base import PanelBase, table_html, widgets
from workbench.panels._plot import PlotWidget

__all__ = ["RanksPanel"]

_TAKES = ("per-rank Kineto traces (a folder, a glob, a list of files), a RanksView, or a list of loaded "
          "Traces / RankFrames")
_SORTS = [("rank", "rank"), ("step time", "step_ms"), ("waiting for others", "wait_us"),
          ("exposed communication", "exposed_communication_us"), ("compute", "compute_us")]


def _view(source, processes, client, cache, cache_dir):
    from workbench.analysis.trace import ranks as ar
    if isinstance(source, ar.RanksView):
        return source
    if isinstance(source, (str, os.PathLike)):
        return ar.load_ranks(source, processes=processes, client=client, cache=cache, cache_dir=cache_dir)
    if isinstance(source, (list, tuple)) and source:
        if all(isinstance(s, (str, os.PathLike)) for s in source):
            return ar.load_ranks(list(source), processes=processes, client=client, cache=cache, cache_dir=cache_dir)
        if all(isinstance(s, ar.RankFrame) for s in source):
            return ar.cross_rank(list(source))
        if all(hasattr(s, "events") and hasattr(s, "metadata") for s in source):
            return ar.cross_rank([ar.rank_frame(t) for t in source])
    raise BadArgument(f"RanksPanel takes {_TAKES}, not {type(source).__name__}")


class RanksPanel(PanelBase):
    """Per-rank time, collectives and the straggler of a distributed run. ``source``: see the module
    docstring; ``processes`` / ``client`` / ``cache`` / ``cache_dir`` as in ``load_ranks``."""

    def __init__(self, source, *, processes: int | None = None, client=None, cache: bool = True, cache_dir=None):
        self.view = _view(source, processes, client, cache, cache_dir)  # errors raise before any widget exists
        self.verdict = widgets.HTML()
        self.verdict.add_class("wb-ranks-verdict")
        self.sort = widgets.Dropdown(options=_SORTS, value="rank", description="sort ranks by",
                                     style={"description_width": "100px"})
        self.sort.add_class("wb-ranks-sort")
        self.per_step = widgets.Checkbox(value=True, description="per step")
        self.per_step.add_class("wb-ranks-perstep")
        self.time_fig = PlotWidget()
        self.skew_fig = PlotWidget()
        self.timeline_fig = PlotWidget()
        self.table = widgets.HTML()
        self.table.add_class("wb-ranks-table")
        self.coll_table = widgets.HTML()
        self.tabs = widgets.Tab(children=[
            widgets.VBox([widgets.HBox([self.sort, self.per_step]), self.time_fig, self.table]),
            widgets.VBox([self.skew_fig, self.coll_table]),
            widgets.VBox([self.timeline_fig]),
        ])
        for i, t in enumerate(["time per rank", "collectives", "timeline"]):
            self.tabs.set_title(i, t)
        self.tabs.add_class("wb-ranks-tabs")
        super().__init__()
        self.children = [self.status, self.verdict, self.tabs, self.errors]
        self.add_class("wb-ranks")
        self._drawn: set[int] = set()
        self.sort.observe(self.guard(lambda _c: self._draw_time()), names="value")
        self.per_step.observe(self.guard(lambda _c: self._draw_time()), names="value")
        self.tabs.observe(self.guard(self._on_tab), names="selected_index")
        self.guard(self._draw)()

    def _draw(self) -> None:
        from workbench.analysis.trace.ranks import ranks_summary

        v = self.view
        doc = ranks_summary(v)
        s = doc["straggler"]
        if s is None and doc.get("unread"):
            head = (f"<b style='color:#e65100'>straggler: not judged</b>: {len(doc['unread'])} rank trace(s) could "
                    "not be read, and the missing rank may be the one the others wait for")
        elif s is None:
            head = "<b style='color:#2e7d32'>no straggler</b>: no rank makes the others wait"
        else:
            head = (f"<b style='color:#c62828'>straggler: rank {s['rank']}</b>; the other ranks wait "
                    f"<b>{s['wait_ms_per_step']:.1f} ms</b> per step for it")
        skipped = ""
        if doc["skipped"]:
            skipped = "<div style='color:#666'>skipped: " + "; ".join(
                html.escape(f"{x['file']} ({x['reason'][:80]})") for x in doc["skipped"]) + "</div>"
        self.verdict.value = f"<div>{head}</div>{findings_html(v.findings, empty='')}{skipped}"
        self.set_status(f"{len(doc['ranks'])} ranks of world size {doc['world_size']}, "
                        f"{doc['collectives_matched']} collectives matched")
        self._draw_time()
        self._on_tab(None)

    def _draw_time(self) -> None:
        from workbench.analysis.trace.ranks import RANK_KEYS
        from workbench.figures.ranks import rank_time_figure

        self.time_fig.show(rank_time_figure(self.view, sort_by=self.sort.value, per_step=self.per_step.value))
        t = self.view.ranks[RANK_KEYS].drop(columns=["file", "clock_offset_us"])
        if self.sort.value != "rank":
            t = t.sort_values([self.sort.value, "rank"], ascending=[False, True])
        ms = t.assign(**{c.replace("_us", "_ms"): t[c] / 1e3 for c in t.columns if c.endswith("_us")})
        ms = ms.drop(columns=[c for c in t.columns if c.endswith("_us")])
        self.table.value = table_html(ms, formats={"overlap": "{:.2f}"})

    def _on_tab(self, _change) -> None:
        from workbench.figures.ranks import collective_skew_figure, rank_timeline_figure

        i = self.tabs.selected_index or 0
        if i in self._drawn:
            return
        if i == 1:
            self.skew_fig.show(collective_skew_figure(self.view))
            c = self.view.collectives
            cols = ["pg", "name", "step", "seq", "duration_us", "transfer_us", "skew_us", "last_rank"]
            self.coll_table.value = table_html(c[cols].sort_values("skew_us", ascending=False) if len(c) else None)
        elif i == 2:
            self.timeline_fig.show(rank_timeline_figure(self.view))
        self._drawn.add(i)

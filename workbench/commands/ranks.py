"""``workbench ranks PATHS|DIR|GLOB [--json] [--html OUT] [--scheduler ADDRESS]``: the cross-rank view.

Per-rank step time, compute / communication / exposed communication / idle, collectives matched
across ranks (duration, start skew, last arrival) and the straggler verdict, from one trace per rank.
Each trace is reduced to a compact per-rank frame in a local process pool, or on an existing Dask
cluster with ``--scheduler tcp://HOST:PORT`` (workers send back the frames, never the traces); the
frames are cached as Parquet (``--cache-dir``, ``--no-cache``; see ``workbench.io.rank_cache``), so a
second look at the same ranks is near-instant. Files in a folder or glob that are not traces are
skipped with a note on stderr (and under ``skipped`` in the JSON, keys in docs/json.md).
"""

from __future__ import annotations

import sys
import textwrap

from workbench.units import format_pct

__all__ = ["add_arguments", "run"]


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", metavar="PATHS",
                   help="one trace per rank: files, a folder holding them, or a quoted glob ('run/rank*.json.gz')")
    p.add_argument("--json", action="store_true", help="print the cross-rank summary as JSON (keys in docs/json.md)")
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report (opens offline)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="reduce the traces on this Dask cluster (tcp://HOST:PORT; needs gpu-workbench[dask]); "
                        "the workers must see the same paths")
    p.add_argument("--processes", type=int, default=None,
                   help="local worker processes (default: one per file, at most one per CPU; 1: in this process)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where the per-rank Parquet cache lives ('next': beside each trace; default "
                        "$WORKBENCH_CACHE_DIR or ~/.cache/gpu-workbench/ranks)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the per-rank cache")


def _client(address: str):
    from workbench._optional import import_optional
    from workbench.errors import BadArgument

    distributed = import_optional("distributed", "for --scheduler (fan-out over a Dask cluster)")
    try:
        return distributed.Client(address, timeout=5, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise BadArgument(
            f"--scheduler {address}: cannot connect ({type(exc).__name__}: {exc}); start one with "
            "`dask scheduler` and give its tcp://HOST:PORT address"
        ) from None




def _text(doc: dict) -> str:
    lines = [f"{len(doc['ranks'])} ranks (world size {doc['world_size']})"]
    lines += [f"warning: {w}" for w in doc.get("warnings") or []]
    head = f"{'rank':>5}{'steps':>7}{'step ms':>10}{'compute':>10}{'comm':>10}{'exposed':>10}{'idle':>10}" \
           f"{'overlap':>9}{'waits':>10}"
    lines += ["", head + "   (ms over the profile)"]
    for r in doc["ranks"]:
        ov = "-" if r["overlap"] is None else format_pct(r["overlap"], decimals=0)
        lines.append(
            f"{r['rank']:>5}{r['steps']:>7}{(r['step_ms'] or 0):>10.1f}{r['compute_us'] / 1e3:>10.1f}"
            f"{r['communication_us'] / 1e3:>10.1f}{r['exposed_communication_us'] / 1e3:>10.1f}"
            f"{r['idle_us'] / 1e3:>10.1f}{ov:>9}{r['wait_us'] / 1e3:>10.1f}"
        )
    c = doc["collectives"]
    lines += ["", f"collectives: {doc['collectives_matched']} matched across ranks"
              + (f", {doc['collectives_unmatched']} not on every rank" if doc["collectives_unmatched"] else "")]
    if c:
        worst = sorted(c, key=lambda x: -(x["skew_us"] or 0))[:5]
        lines.append(f"  {'collective':<28}{'group':>8}{'step':>6}{'seq':>5}{'dur ms':>9}{'transfer':>10}"
                     f"{'skew ms':>9}{'last':>6}")
        for x in worst:
            lines.append(f"  {x['name'][:28]:<28}{x['pg'][:8]:>8}{x['step']:>6}{x['seq']:>5}"
                         f"{x['duration_us'] / 1e3:>9.1f}{x['transfer_us'] / 1e3:>10.1f}{x['skew_us'] / 1e3:>9.1f}"
                         f"{x['last_rank']:>6}")
    s = doc["straggler"]
    if s is None and doc.get("unread"):
        lines += ["", f"straggler: not judged ({len(doc['unread'])} rank trace(s) could not be read: "
                      f"{', '.join(doc['unread'][:8])}{' ...' if len(doc['unread']) > 8 else ''})"]
    else:
        lines += ["", "straggler: none" if s is None else
                  f"straggler: rank {s['rank']}, the others wait {s['wait_ms_per_step']:.1f} ms per step for it"]
    lines += ["", "findings:" if doc["findings"] else "findings: none"]
    for f in doc["findings"]:
        lines += textwrap.wrap(f"[{f['severity']}] {f['id']}: {f['message']}", width=108,
                               initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def _check_paths(args) -> None:
    """Sample names become their folders; a file named on the command line must be a trace (a snapshot, a
    session, a picture...: one line saying what it is and what reads it). Folders and globs go to the
    loader, which skips what is not a trace in them."""
    from pathlib import Path

    from workbench.commands._checks import expect_kind, sample_or_path

    args.paths = [sample_or_path(p) for p in args.paths]
    for p in args.paths:
        try:
            is_file = Path(p).is_file()
        except (OSError, ValueError):
            is_file = False
        if is_file:
            expect_kind(p, ("trace",), "a per-rank Kineto trace")


def run(args) -> int:
    import json

    from workbench.analysis.trace.ranks import load_ranks, ranks_summary

    _check_paths(args)
    client = _client(args.scheduler) if args.scheduler else None
    try:
        view = load_ranks(args.paths, processes=args.processes, client=client, cache=not args.no_cache,
                          cache_dir=args.cache_dir)
    finally:
        if client is not None:
            client.close()
    for w in view.warnings:
        print(f"workbench ranks: warning: {w}", file=sys.stderr)
    for path, msg in view.skipped:
        shown = msg if str(msg).startswith(str(path)) else f"{path}: {msg}"
        print(f"workbench ranks: skipped {shown}", file=sys.stderr)
    doc = ranks_summary(view)
    if args.html:
        from workbench.report import ranks_report

        out = ranks_report(view, args.html)
        print(f"wrote {out}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else _text(doc))
    return 0

"""``workbench monitor``: the GPUs now, from NVML or from a recorded session.

    gpu0  util  97%  mem  34.1/139.8 GiB   312 W  61 C  1980 MHz  SM  93% occ 14% tensor 90% dram 16%  [sw_power_cap]

The SM/occupancy/tensor/DRAM part is the GPM counters (Hopper and newer; ``--no-gpm`` turns them off).
On a GPU without them a line on stderr says so, and when DCGM's host engine or exporter runs (it reads
the same counters) another line says that.
In a terminal the screen is redrawn in place (as nvitop does, drawn with ``rich``): a header, one row
per GPU with bars for utilisation, memory and power, the mean and max over each interval (every sample
of the interval, not the newest alone), the session's peaks so far, and the processes NVML lists on each
GPU (PID, command, GPU memory). With ``--plain``, or when stdout is not a terminal (a log, a pipe), one
line per GPU per interval instead, with the same interval statistics::

    12.00s  gpu0  util  45% (max  97%)  mem  34.1/139.8 GiB   312 W (max  577 W)   61 C  1980 MHz  [sw_power_cap]

Live, the sampler reads every 0.1 s (or ``--interval`` when shorter) so that an interval's max is a max.

``--csv OUT`` writes every sample at the end (also after Ctrl-C); ``--prometheus PORT`` serves the
latest sample of each GPU in Prometheus' text format (gauges labelled ``gpu``) for a fleet's scraper.
Ctrl-C stops cleanly with a summary line. Without NVML and without ``--replay``: one line, exit 2.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from workbench.commands._checks import (
    expect_kind,
    gpu_list,
    non_negative_float,
    port,
    positive_float,
    prepare_output,
    sample_or_path,
    wrote,
)

__all__ = ["add_arguments", "run", "format_line", "format_interval_line", "render_screen"]


def add_arguments(p):
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds between ticks (default 1; down to 0.01)")
    p.add_argument("--duration", type=non_negative_float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C, or the end of a replay)")
    p.add_argument("--replay", metavar="FILE",
                   help="play a recorded session (JSONL/CSV, .gz ok; an nvidia-smi --query-gpu CSV log, DCGM "
                        "exporter scrapes or a metrics table with a time column; or a sample name such as "
                        "h200_nvml_session)")
    p.add_argument("--speed", type=positive_float, default=1.0, metavar="X",
                   help="replay X times faster (default 1; a finite number > 0)")
    p.add_argument("--loop", action="store_true", help="start a replay over when it ends")
    p.add_argument("--csv", metavar="OUT", help="write every sample to OUT (.csv, .csv.gz, .jsonl, .jsonl.gz)")
    p.add_argument("--prometheus", type=port, metavar="PORT",
                   help="serve the latest samples on http://HOST:PORT/metrics (Prometheus text format)")
    p.add_argument("--bind", default="0.0.0.0", metavar="ADDR", help="address for --prometheus (default 0.0.0.0)")
    p.add_argument("--gpus", metavar="LIST", type=gpu_list, help="comma-separated NVML indices (default: all)")
    p.add_argument("--quiet", action="store_true", help="no per-tick lines (with --csv or --prometheus)")
    p.add_argument("--no-gpm", dest="gpm", action="store_false",
                   help="do not read the GPM counters (SM activity, tensor cores, DRAM bandwidth; Hopper and newer)")
    p.add_argument("--plain", action="store_true",
                   help="one line per GPU per interval, even in a terminal (the default when stdout is not one)")


def format_line(r) -> str:
    """One GPU sample (a mapping or a namedtuple of session columns) as a compact line."""
    get = (lambda k: r.get(k)) if hasattr(r, "get") else (lambda k: getattr(r, k, None))

    def num(k, fmt, scale=1.0, width=0):
        v = get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "?".rjust(width)
        return format(v * scale, fmt).rjust(width)

    reasons = get("throttle_reasons")
    shown = [x for x in (reasons or "").split(",") if x and x != "gpu_idle"]
    sm = get("gpm_sm_util_pct")
    gpm = ""
    if sm is not None and not (isinstance(sm, float) and math.isnan(sm)):
        gpm = (f"  SM {num('gpm_sm_util_pct', '.0f', width=3)}% occ {num('gpm_sm_occupancy_pct', '.0f', width=2)}% "
               f"tensor {num('gpm_tensor_util_pct', '.0f', width=2)}% dram {num('gpm_dram_bw_util_pct', '.0f', width=2)}%")
    return (f"gpu{int(get('gpu'))}  util {num('util_gpu_pct', '.0f', width=3)}%  "
            f"mem {num('mem_used_bytes', '.1f', 2**-30, 5)}/{num('mem_total_bytes', '.1f', 2**-30)} GiB  "
            f"{num('power_w', '.0f', width=4)} W  {num('temp_c', '.0f', width=3)} C  "
            f"{num('sm_clock_mhz', '.0f', width=4)} MHz" + gpm + (f"  [{','.join(shown)}]" if shown else ""))


def _num(v, fmt: str, scale: float = 1.0, width: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "?".rjust(width)
    return format(v * scale, fmt).rjust(width)


def format_interval_line(s) -> str:
    """One GPU over one interval (a row of :func:`workbench.analysis.nvml.interval_stats`): mean and max
    utilisation, the most memory used, mean and max power, the hottest temperature, the clock, and
    every throttle reason seen."""
    get = (lambda k: s.get(k)) if hasattr(s, "get") else (lambda k: getattr(s, k, None))
    reasons = get("throttle_reasons") or ""
    return (f"gpu{int(get('gpu'))}  util {_num(get('util_gpu_mean_pct'), '.0f', width=3)}% "
            f"(max {_num(get('util_gpu_max_pct'), '.0f', width=3)}%)  "
            f"mem {_num(get('mem_used_max_bytes'), '.1f', 2**-30, 5)}/{_num(get('mem_total_bytes'), '.1f', 2**-30)} GiB  "
            f"{_num(get('power_mean_w'), '.0f', width=4)} W (max {_num(get('power_max_w'), '.0f', width=4)} W)  "
            f"{_num(get('temp_max_c'), '.0f', width=3)} C  {_num(get('sm_clock_mhz'), '.0f', width=4)} MHz"
            + _gpm_part(get) + (f"  [{reasons}]" if reasons else ""))


def _gpm_part(get) -> str:
    """The interval's GPM means (SM activity, occupancy, tensor, DRAM), or nothing without GPM."""
    sm = get("gpm_sm_util_mean_pct")
    if sm is None or (isinstance(sm, float) and math.isnan(sm)):
        return ""
    return (f"  SM {_num(sm, '.0f', width=3)}% occ {_num(get('gpm_sm_occupancy_mean_pct'), '.0f', width=2)}% "
            f"tensor {_num(get('gpm_tensor_util_mean_pct'), '.0f', width=2)}% "
            f"dram {_num(get('gpm_dram_bw_util_mean_pct'), '.0f', width=2)}%")


def _bar(fraction: float, width: int):
    """A bar of ``width`` cells filled to ``fraction`` (green, yellow from 60%, red from 90%)."""
    from rich.text import Text

    f = 0.0 if fraction is None or math.isnan(fraction) else min(max(fraction, 0.0), 1.0)
    n = round(f * width)
    color = "red" if f >= 0.9 else "yellow" if f >= 0.6 else "green"
    return Text.assemble(("█" * n, color), ("░" * (width - n), "grey42"))


def render_screen(stats, *, source: str, interval_s: float, elapsed_s: float, samples: int,
                  peaks: dict | None = None, processes: list[dict] | None = None, processes_note: str = "",
                  width: int = 120):
    """The in-place screen (a ``rich`` renderable) for a terminal ``width`` columns wide: header, one
    row per GPU (bars + interval mean/max), the session's peaks, and the processes table (or
    ``processes_note`` when there is none to list)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    bar_w = max(6, min(40, (width - 58) // 2))
    head = Text.assemble(("workbench monitor", "bold"), f"  {source}  every {interval_s:g} s  ",
                         f"{elapsed_s:,.1f} s  {samples:,} samples  ", ("Ctrl-C stops", "dim"))
    head.no_wrap, head.overflow = True, "ellipsis"
    # two lines per GPU, as nvitop: utilisation and memory, then power, temperature, clock, throttling
    gpus = Table.grid(padding=(0, 1))
    for _ in range(7):
        gpus.add_column(no_wrap=True)
    peaks = peaks or {}
    for r in stats.itertuples(index=False):
        pk = peaks.get(int(r.gpu), {})
        p_scale = max(pk.get("power_w", 0.0) or 0.0, 0.0 if math.isnan(r.power_max_w) else r.power_max_w, 1.0)
        mem_frac = r.mem_used_max_bytes / r.mem_total_bytes if r.mem_total_bytes else math.nan
        gpus.add_row(
            Text(f"gpu{int(r.gpu)}", style="bold"), "util", _bar(r.util_gpu_mean_pct / 100.0, bar_w),
            f"{_num(r.util_gpu_mean_pct, '.0f', width=3)}% max {_num(r.util_gpu_max_pct, '.0f', width=3)}%",
            "mem", _bar(mem_frac, bar_w),
            f"{_num(r.mem_used_max_bytes, '.1f', 2**-30, 5)}/{_num(r.mem_total_bytes, '.1f', 2**-30)} GiB",
        )
        gpus.add_row(
            "", "power", _bar(r.power_mean_w / p_scale, bar_w),
            f"{_num(r.power_mean_w, '.0f', width=3)} W max {_num(r.power_max_w, '.0f', width=3)} W",
            "temp", f"{_num(r.temp_max_c, '.0f')} C  SM {_num(r.sm_clock_mhz, '.0f')} MHz",
            Text(r.throttle_reasons or "", style="yellow"),
        )
    legend = Text("bars: mean over the interval; max: the interval's highest sample; power bar against the "
                  "session's peak", style="dim")
    parts = [head, gpus, legend]
    if peaks:
        parts.append(Text("session peaks: " + "; ".join(
            f"gpu{g} util {_num(p.get('util_pct'), '.0f')}%, mem {_num(p.get('mem_bytes'), '.1f', 2**-30)} GiB, "
            f"power {_num(p.get('power_w'), '.0f')} W, temp {_num(p.get('temp_c'), '.0f')} C"
            for g, p in sorted(peaks.items()))))
    if processes:
        pt = Table(box=box.SIMPLE_HEAD, title="processes on the GPUs (NVML)", title_justify="left", pad_edge=False)
        for col, kw in (("GPU", {}), ("PID", {"justify": "right"}), ("type", {}),
                        ("GPU memory", {"justify": "right"}), ("command", {"overflow": "ellipsis", "max_width": 80})):
            pt.add_column(col, no_wrap=True, **kw)
        for p in processes:
            pt.add_row(f"gpu{p['gpu']}", str(p["pid"]), p["kind"],
                       "?" if math.isnan(p["used_bytes"]) else f"{p['used_bytes'] / 2**30:,.2f} GiB", p["name"])
        parts.append(pt)
    else:
        parts.append(Text(processes_note or "no processes on the GPUs", style="dim"))
    return Group(*parts)


def _short_source(source: str) -> str:
    """``replaying <file name>`` (the folder is in the startup line) or the sampler's own words."""
    if source.startswith("replaying "):
        return "replaying " + Path(source.removeprefix("replaying ")).name
    return source


def _update_peaks(peaks: dict, stats) -> None:
    for r in stats.itertuples(index=False):
        p = peaks.setdefault(int(r.gpu), {})
        for key, v in (("util_pct", r.util_gpu_max_pct), ("mem_bytes", r.mem_used_max_bytes),
                       ("power_w", r.power_max_w), ("temp_c", r.temp_max_c)):
            if v is not None and not math.isnan(v):
                p[key] = max(p.get(key, -math.inf), v)


class _Prometheus:
    """Gauges per GPU in a private registry, served by prometheus_client's HTTP server."""

    GAUGES = (  # column, metric, help, scale
        ("util_gpu_pct", "workbench_gpu_utilization_percent", "Share of time a kernel ran (NVML)", 1.0),
        ("util_mem_pct", "workbench_gpu_memory_utilization_percent", "Share of time memory was read/written", 1.0),
        ("mem_used_bytes", "workbench_gpu_memory_used_bytes", "Device memory used", 1.0),
        ("mem_total_bytes", "workbench_gpu_memory_total_bytes", "Device memory total", 1.0),
        ("power_w", "workbench_gpu_power_watts", "Board power draw", 1.0),
        ("temp_c", "workbench_gpu_temperature_celsius", "GPU temperature", 1.0),
        ("sm_clock_mhz", "workbench_gpu_sm_clock_hertz", "SM clock", 1e6),
        ("mem_clock_mhz", "workbench_gpu_memory_clock_hertz", "Memory clock", 1e6),
        ("pcie_tx_bytes_per_s", "workbench_gpu_pcie_tx_bytes_per_second", "PCIe transmit throughput", 1.0),
        ("pcie_rx_bytes_per_s", "workbench_gpu_pcie_rx_bytes_per_second", "PCIe receive throughput", 1.0),
        ("energy_j", "workbench_gpu_energy_joules", "Energy since the driver loaded", 1.0),
        # GPM counters (Hopper and newer): what the SMs do, not only whether a kernel ran
        ("gpm_sm_util_pct", "workbench_gpu_sm_activity_percent", "Share of SMs busy (GPM)", 1.0),
        ("gpm_sm_occupancy_pct", "workbench_gpu_sm_occupancy_percent", "Resident warps vs maximum (GPM)", 1.0),
        ("gpm_tensor_util_pct", "workbench_gpu_tensor_activity_percent", "Tensor-core activity, any precision (GPM)", 1.0),
        ("gpm_hmma_util_pct", "workbench_gpu_hmma_activity_percent", "fp16/bf16 tensor-core activity (GPM)", 1.0),
        ("gpm_dram_bw_util_pct", "workbench_gpu_dram_bandwidth_percent", "DRAM bandwidth used vs peak (GPM)", 1.0),
        ("gpm_fp32_util_pct", "workbench_gpu_fp32_activity_percent", "Non-tensor fp32 pipe activity (GPM)", 1.0),
        ("gpm_fp16_util_pct", "workbench_gpu_fp16_activity_percent", "Non-tensor fp16 pipe activity (GPM)", 1.0),
        ("gpm_fp64_util_pct", "workbench_gpu_fp64_activity_percent", "Non-tensor fp64 pipe activity (GPM)", 1.0),
        ("gpm_pcie_tx_bytes_per_s", "workbench_gpu_gpm_pcie_tx_bytes_per_second", "PCIe transmit rate (GPM)", 1.0),
        ("gpm_pcie_rx_bytes_per_s", "workbench_gpu_gpm_pcie_rx_bytes_per_second", "PCIe receive rate (GPM)", 1.0),
        ("gpm_nvlink_rx_bytes_per_s", "workbench_gpu_nvlink_rx_bytes_per_second", "NVLink receive rate, all links (GPM)", 1.0),
        ("gpm_nvlink_tx_bytes_per_s", "workbench_gpu_nvlink_tx_bytes_per_second", "NVLink transmit rate, all links (GPM)", 1.0),
    )

    def __init__(self, port: int, addr: str):
        from workbench._optional import import_optional

        pc = import_optional("prometheus_client", "for workbench monitor --prometheus")
        from workbench.io.nvml import THROTTLE_REASONS

        self.registry = pc.CollectorRegistry(auto_describe=True)
        self.gauges = {col: (pc.Gauge(name, doc, ["gpu"], registry=self.registry), scale)
                       for col, name, doc, scale in self.GAUGES}
        self.throttle = pc.Gauge("workbench_gpu_clocks_event_reason",
                                 "1 when NVML reports this clocks-event (throttle) reason", ["gpu", "reason"],
                                 registry=self.registry)
        self.reasons = list(THROTTLE_REASONS.values())
        self.samples = pc.Counter("workbench_samples", "Samples taken, per GPU", ["gpu"], registry=self.registry)
        try:
            self.server, self.thread = pc.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            from workbench.errors import WorkbenchError

            raise WorkbenchError(f"cannot serve Prometheus metrics on {addr}:{port} ({exc}); "
                                 "choose a free port with --prometheus PORT") from None

    def update(self, rows) -> None:
        for r in rows:
            gpu = str(int(r["gpu"]))
            for col, (gauge, scale) in self.gauges.items():
                v = r.get(col)
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    gauge.labels(gpu).set(v * scale)
            reasons = r.get("throttle_reasons")
            if isinstance(reasons, str):
                on = set(reasons.split(","))
                for name in self.reasons:
                    self.throttle.labels(gpu, name).set(1.0 if name in on else 0.0)
            self.samples.labels(gpu).inc()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run(args) -> int:
    from workbench.analysis.nvml import gpu_alerts, gpu_summary, interval_stats
    from workbench.capture.sampler import DEFAULT_INTERVAL_S
    from workbench.capture.nvml import NvmlSampler
    from workbench.capture.sampler import ReplaySampler, rows_to_frame
    from workbench.errors import BadArgument, WorkbenchError

    if not (0.01 <= args.interval <= 3600):
        raise BadArgument(f"--interval {args.interval}: choose between 0.01 and 3600 seconds")
    if args.speed <= 0:
        raise BadArgument(f"--speed {args.speed}: must be > 0")
    # Fail on a bad --csv before sampling for minutes: name, folder writable, not the replayed file.
    replay = Path(sample_or_path(args.replay)) if args.replay else None
    if replay is not None:
        from workbench.io.kinds import GPU_SAMPLE_KINDS

        expect_kind(replay, GPU_SAMPLE_KINDS, "an NVML session")
    if args.csv:
        name = args.csv.lower().removesuffix(".gz")
        if not name.endswith((".csv", ".jsonl", ".json")):
            raise BadArgument(f"--csv {args.csv}: name the file *.csv, *.csv.gz, *.jsonl or *.jsonl.gz")
    target = prepare_output(args.csv, [replay], "--csv")
    if args.replay:
        sampler = ReplaySampler(replay, speed=args.speed, loop=args.loop,
                                interval_s=min(args.interval, 0.05))
    else:
        gpus = args.gpus or None
        # several samples per displayed interval, so its max and mean mean something
        sampler = NvmlSampler(interval_s=min(args.interval, DEFAULT_INTERVAL_S), gpus=gpus,
                              gpm=getattr(args, "gpm", True))

    prom = None
    out = sys.stdout
    screen = not (args.plain or args.quiet) and out.isatty()
    live = None
    peaks: dict = {}
    processes_of = None
    if not args.replay:
        from workbench.capture.nvml import gpu_processes

        def processes_of():
            try:
                return gpu_processes(gpus), ""
            except Exception as exc:  # noqa: BLE001 - a listing NVML refuses is a note, not a stop
                return [], f"NVML lists no processes ({type(exc).__name__}: {exc})"
    t_start = time.perf_counter()
    interrupted = False
    sampler.start()  # NoNVML surfaces here: one line, exit 2 (cli.main)
    try:
        if args.prometheus is not None:
            prom = _Prometheus(args.prometheus, args.bind)
            print(f"workbench monitor: serving Prometheus metrics on http://{args.bind}:{args.prometheus}/metrics",
                  file=sys.stderr, flush=True)
        for note in getattr(sampler, "notes", ()):  # GPM not supported here; DCGM reading the same counters
            print(f"workbench monitor: {note}", file=sys.stderr, flush=True)
        print(f"workbench monitor: {sampler.source}; every {args.interval:g} s"
              + (f" for {args.duration:g} s" if args.duration else "") + "; Ctrl-C stops",
              file=sys.stderr, flush=True)
        if screen:
            from rich.console import Console
            from rich.live import Live

            live = Live(console=Console(file=out), auto_refresh=False, transient=False, redirect_stdout=False,
                        redirect_stderr=False)
            live.start()
        cursor = 0
        next_tick = time.perf_counter()
        while True:
            next_tick += args.interval
            delay = next_tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            rows, cursor = sampler.rows_since(cursor)
            if len(rows):
                frame = rows_to_frame(rows)
                stats = interval_stats(frame)
                _update_peaks(peaks, stats)
                if prom is not None:
                    latest = frame[frame["t_s"] == frame.groupby("gpu")["t_s"].transform("max")]
                    prom.update(latest.to_dict("records"))
                if live is not None:
                    procs, note = processes_of() if processes_of else ([], "processes are not recorded in a replay")
                    live.update(render_screen(stats, source=_short_source(sampler.source), interval_s=args.interval,
                                              elapsed_s=time.perf_counter() - t_start, samples=cursor,
                                              peaks=peaks, processes=procs, processes_note=note,
                                              width=live.console.width), refresh=True)
                elif not args.quiet:
                    out.write("".join(f"{r['t_s']:8.2f}s  " + format_interval_line(r) + "\n"
                                      for r in stats.to_dict("records")))
                    out.flush()
            if args.duration is not None and time.perf_counter() - t_start >= args.duration:
                break
            if not sampler.running and sampler.rows_since(cursor)[0].size == 0:
                break  # a replay reached its end (or the sampler stopped with an error)
    except KeyboardInterrupt:
        interrupted = True
    except BrokenPipeError:  # `workbench monitor --csv out | head`: stop, but still write the file
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if live is not None:
            live.stop()
        sampler.stop()
        if prom is not None:
            prom.close()
    if sampler.error is not None:
        raise WorkbenchError(f"the sampler stopped: {type(sampler.error).__name__}: {sampler.error}")
    frame = sampler.frame()
    wall = time.perf_counter() - t_start
    if args.csv:
        from workbench.io.nvml import save_nvml_session

        save_nvml_session(frame, target.path, marks=sampler.marks(), inputs=[replay] if replay else ())
        print(f"workbench monitor: {wrote(target, f'{len(frame)} samples to')}", file=sys.stderr)
    summary = gpu_summary(frame)
    alerts = gpu_alerts(frame)
    parts = [f"{'interrupted; ' if interrupted else ''}{len(frame)} samples from {len(summary)} GPU(s) in {wall:.1f} s"]
    for r in summary.itertuples():
        # a log from another tool may lack a metric (no power.draw queried): "?" rather than "nan"
        parts.append(f"gpu{r.gpu} mean util {_num(r.util_gpu_mean_pct, '.0f')}%, peak mem "
                     f"{_num(r.mem_used_peak_bytes, '.1f', 2.0**-30)} GiB, peak {_num(r.power_peak_w, '.0f')} W, "
                     f"max {_num(r.temp_peak_c, '.0f')} C")
    parts.append(f"{len(alerts)} alert(s)" + (f": {alerts.message.iloc[-1]}" if len(alerts) else ""))
    print("workbench monitor: " + "; ".join(parts), file=sys.stderr)
    return 0

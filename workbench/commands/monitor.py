"""``workbench monitor``: one compact line per GPU per tick, from NVML or from a recorded session.

    gpu0  util  97%  mem  34.1/139.8 GiB   312 W  61 C  1980 MHz  SM  93% occ 14% tensor 90% dram 16%  [sw_power_cap]

The SM/occupancy/tensor/DRAM part is the GPM counters (Hopper and newer; ``--no-gpm`` turns them off).
On a GPU without them a line on stderr says so, and when DCGM's host engine or exporter runs (it reads
the same counters) another line says that.

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

from workbench.commands._checks import gpu_list, non_negative_float, port, positive_float, prepare_output, wrote

__all__ = ["add_arguments", "run", "format_line"]


def add_arguments(p):
    p.add_argument("--interval", type=positive_float, default=1.0, metavar="S",
                   help="seconds between ticks (default 1; down to 0.01)")
    p.add_argument("--duration", type=non_negative_float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C, or the end of a replay)")
    p.add_argument("--replay", metavar="FILE",
                   help="play a recorded session (JSONL/CSV, .gz ok; or a sample name such as h200_nvml_session)")
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


def _replay_path(name: str) -> Path:
    from workbench import samples

    p = Path(name)
    if not os.path.lexists(p) and name in samples.names("nvml"):  # lexists: False (not OSError) for odd names
        return samples.path(name)
    return p


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
    from workbench.analysis.nvml import gpu_alerts, gpu_summary
    from workbench.capture.nvml import NvmlSampler, ReplaySampler, rows_to_frame
    from workbench.errors import BadArgument, WorkbenchError

    if not (0.01 <= args.interval <= 3600):
        raise BadArgument(f"--interval {args.interval}: choose between 0.01 and 3600 seconds")
    if args.speed <= 0:
        raise BadArgument(f"--speed {args.speed}: must be > 0")
    # Fail on a bad --csv before sampling for minutes: name, folder writable, not the replayed file.
    replay = _replay_path(args.replay) if args.replay else None
    if args.csv:
        name = args.csv.lower().removesuffix(".gz")
        if not name.endswith((".csv", ".jsonl", ".json")):
            raise BadArgument(f"--csv {args.csv}: name the file *.csv, *.csv.gz, *.jsonl or *.jsonl.gz")
    target = prepare_output(args.csv, [replay], "--csv")
    if args.replay:
        sampler = ReplaySampler(replay, speed=args.speed, loop=args.loop,
                                interval_s=min(args.interval, 0.05))
    else:
        sampler = NvmlSampler(interval_s=args.interval, gpus=args.gpus or None, gpm=getattr(args, "gpm", True))

    prom = None
    out = sys.stdout
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
                latest = frame[frame["t_s"] == frame.groupby("gpu")["t_s"].transform("max")]
                recs = latest.to_dict("records")
                if prom is not None:
                    prom.update(recs)
                if not args.quiet:
                    stamp = f"{recs[0]['t_s']:8.2f}s  "
                    out.write("".join(stamp + format_line(r) + "\n" for r in recs))
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
        parts.append(f"gpu{r.gpu} mean util {r.util_gpu_mean_pct:.0f}%, peak mem {r.mem_used_peak_bytes / 2**30:.1f} GiB, "
                     f"peak {r.power_peak_w:.0f} W, max {r.temp_peak_c:.0f} C")
    parts.append(f"{len(alerts)} alert(s)" + (f": {alerts.message.iloc[-1]}" if len(alerts) else ""))
    print("workbench monitor: " + "; ".join(parts), file=sys.stderr)
    return 0

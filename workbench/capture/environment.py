"""Where and with what a configuration runs: the device, the machine's description for the ledger,
NVML's energy counter, CPU peak memory from ``torch.profiler``'s memory events, and freeing memory
between configurations.

torch is imported inside functions, never at module import.
"""

from __future__ import annotations

import datetime as _dt
import gc
import platform
from typing import Any, Callable

from workbench.capture.configurations import _torch
from workbench.errors import NoDevice

__all__ = ["environment_info", "measure_cpu_peak_bytes"]


def _resolve_device(device):
    torch = _torch()
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise NoDevice(f"device {device!r} asked for but torch sees no CUDA device; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_info(device=None) -> dict:
    """Where and when: machine, device, gpu (device name, ``none`` on CPU), torch/CUDA versions, date (UTC)."""
    torch = _torch()
    dev = _resolve_device(device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none"
    return {
        "machine": platform.node(),
        "device": str(dev),
        "gpu": gpu,
        "cpu": _cpu_name(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "none",
        "python_version": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class _EnergyMeter:
    """NVML's total energy counter (millijoules since driver load) of the device, opened lazily."""

    def __init__(self, device):
        self.handle = None
        self.reason = None
        self._nvml = None
        if device.type != "cuda":
            self.reason = "energy needs an NVIDIA GPU (NVML)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # NVMLError_LibraryNotFound, ImportError
            self.reason = f"NVML unavailable: {exc}"
            return
        handle = None
        try:  # match by UUID: CUDA and NVML number devices differently under CUDA_VISIBLE_DEVICES
            handle = self._handle_by_uuid(pynvml, device)
        except Exception:
            handle = None
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception as exc:
                self.reason = f"NVML could not open the device: {exc}"
        if handle is not None:
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                self.handle = handle
            except Exception as exc:  # NotSupported on some boards and vGPUs
                self.reason = f"NVML total energy counter unavailable: {exc}"

    @staticmethod
    def _handle_by_uuid(pynvml, device):
        import re

        torch = _torch()

        def hex32(text):
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            m = re.search(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", str(text).lower())
            return m.group(0).replace("-", "") if m else None

        want = hex32(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
        if not want:
            return None
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if hex32(pynvml.nvmlDeviceGetUUID(h)) == want:
                return h
        return None

    def read_mj(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    def close(self):
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _tensor_bytes(objs) -> int:
    """Bytes of the distinct storages behind the tensors in ``objs`` (nested containers allowed)."""
    torch = _torch()
    seen = set()
    total = 0

    def visit(o):
        nonlocal total
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                key = (st.data_ptr(), st.device)
                if key not in seen:
                    seen.add(key)
                    total += st.nbytes()
            except Exception:  # tensor subclasses without storage
                total += o.numel() * o.element_size()
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)

    visit(objs)
    return total


def _memory_event_bytes(prof) -> list[tuple[int, int]]:
    """(time_ns, bytes) of every CPU memory event (+alloc, -free) a ``torch.profiler`` session saw."""
    try:
        events = prof.profiler.kineto_results.events()
        out = []
        for e in events:
            if e.name() == "[memory]" and "CPU" in str(e.device_type()):
                out.append((e.start_ns(), int(e.nbytes())))
        return out
    except AttributeError:
        pass
    # Fallback through the public export: "[memory]" instant events with args.Bytes.
    import json
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, encoding="utf-8") as f:
            data = json.load(f)
    finally:
        os.unlink(tmp)
    out = []
    for e in data.get("traceEvents", []):
        if e.get("name") == "[memory]":
            args = e.get("args", {})
            if args.get("Device Type", 0) == 0:  # CPU
                out.append((int(float(e.get("ts", 0)) * 1000), int(args.get("Bytes", 0))))
    return out


def measure_cpu_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated on the CPU by ``fn()`` above what was live when it started, from
    ``torch.profiler``'s memory accounting (``profile_memory=True``): the running sum of its
    allocation (+) and free (-) events, at its highest."""
    _torch()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(_memory_event_bytes(prof))
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return int(peak)


def _sync(device):
    torch = _torch()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory(device):
    torch = _torch()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _is_oom(exc: BaseException) -> bool:
    torch = _torch()
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)

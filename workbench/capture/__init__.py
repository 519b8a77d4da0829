"""capture: the ONLY layer that imports torch or pynvml or touches a device.

Profiler sessions, allocator history and the OOM hook, the NVML sampler. Every function here opens
the device lazily, on first use, never at import.
"""

__all__: list[str] = []

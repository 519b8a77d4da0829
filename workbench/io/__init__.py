"""io: load and save artifacts (Kineto traces, allocator snapshots, NVML sessions) as columns and dicts.

No torch, no pynvml: a snapshot copied off a cluster loads on a laptop.
"""

__all__: list[str] = []

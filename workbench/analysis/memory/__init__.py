"""analysis.memory: allocator snapshots and the peak-memory estimate (docs/memory.md).

docs/architecture.md maps its modules.
"""

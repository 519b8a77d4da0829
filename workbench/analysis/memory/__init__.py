"""workbench.analysis.memory.allocations: see docs/architecture.md."""

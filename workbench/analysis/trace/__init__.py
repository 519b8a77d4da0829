"""workbench.analysis.trace.tables: see docs/architecture.md."""

"""analysis.trace: Kineto traces (tables, diagnosis, roofline, findings, diff, ranks).

docs/architecture.md maps its modules.
"""

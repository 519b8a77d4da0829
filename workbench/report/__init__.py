"""report: figures and tables -> one self-contained HTML file that opens offline (plotly.js inline).

``trace_report`` / ``memory_report`` / ``diff_report`` (``assemble.py``) are what ``workbench trace|memory|diff
--html`` write, callable from a notebook; ``write_report`` (``html.py``) turns any sections into a file.
"""

from workbench.report.assemble import diff_report, memory_diff_report, memory_report, ranks_report, trace_report
from workbench.report.html import Section, render_report, write_report

__all__ = ["Section", "render_report", "write_report", "trace_report", "memory_report", "diff_report",
           "memory_diff_report", "ranks_report"]

"""report: figures and tables -> one self-contained HTML file that opens offline (plotly.js inline)."""

from workbench.report.html import Section, render_report, write_report

__all__ = ["Section", "render_report", "write_report"]

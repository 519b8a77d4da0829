"""report: figures and tables -> one self-contained HTML file that opens offline (plotly.js inline)."""

from workbench.report.html import Section, findings_html, render_report, write_report

__all__ = ["Section", "findings_html", "render_report", "write_report"]

"""report: figures and tables -> one self-contained HTML file that opens offline (plotly.js inline)."""

__all__: list[str] = []

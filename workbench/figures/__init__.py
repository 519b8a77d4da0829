"""figures: analysis frames -> plotly figures. Returns ``go.Figure``; never displays anything."""

__all__: list[str] = []

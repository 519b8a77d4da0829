"""panels: ipywidgets compositions (controls + figure widget + an Output for errors), one per tool."""

__all__: list[str] = []

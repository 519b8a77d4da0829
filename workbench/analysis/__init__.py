"""analysis: pandas only. Frames in, frames and typed records out.

Nothing here knows whether the data came from a live GPU or from ``workbench.samples``.
"""

__all__: list[str] = []

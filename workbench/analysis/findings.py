"""The one finding type: what an analysis reports about a trace, a snapshot or a set of ranks.

Trace rules (:mod:`workbench.analysis.trace_findings`), memory rules
(:mod:`workbench.analysis.memory_findings`) and the cross-rank view (:mod:`workbench.analysis.ranks`)
all return :class:`Finding`; the JSON summaries hold ``[f.as_dict() for f in ...]`` and
:func:`workbench.figures.text.findings_html` renders either shape.

>>> f = Finding("cache_overhead", "info", "Reserved ...", {"reserved_bytes": 2**31})
>>> f.as_dict()
{'id': 'cache_overhead', 'severity': 'info', 'message': 'Reserved ...', 'evidence': {'reserved_bytes': 2147483648}}
>>> [g.id for g in by_severity([f, Finding("oom_capacity", "critical", "...")])]
['oom_capacity', 'cache_overhead']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

__all__ = ["Finding", "SEVERITIES", "severity_rank", "by_severity"]

SEVERITIES = ("info", "warning", "critical")  # least to most severe
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``id``, ``severity`` (info/warning/critical), a ``message`` that carries the
    numbers and the fix, ``evidence`` (plain JSON-able numbers and names) and, where a model says what
    the fix would save, ``what_if`` (``{step_ms, step_ms_if_fixed, saved_fraction, change, measured}``)."""

    id: str
    severity: str
    message: str
    evidence: dict = field(default_factory=dict)
    what_if: dict | None = None

    def __post_init__(self):
        if self.severity not in _RANK:
            raise ValueError(f"Finding {self.id!r}: severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict:
        """The JSON form: ``{id, severity, message, evidence}``, plus ``what_if`` when there is one."""
        d = asdict(self)
        if d["what_if"] is None:
            d.pop("what_if")
        return d


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical; -1 for anything else (an old or foreign document)."""
    return _RANK.get(severity, -1)


def _severity_of(f) -> str:
    return f.get("severity") if isinstance(f, dict) else getattr(f, "severity", None)


def by_severity(findings: Iterable) -> list:
    """Findings (objects or their dicts) most severe first; equal severities keep their order."""
    return sorted(findings, key=lambda f: -severity_rank(_severity_of(f)))
